package pgtest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// namespace is a network namespace of the harness's own, joined to this
// one by a veth pair: the server inside listens on serverAddr, this side
// has hostAddr. Packets are dropped or rejected by nftables rules inside
// the namespace, so the host's own firewall is never touched.
type namespace struct {
	name, hostIf, nsIf   string
	hostAddr, serverAddr string
}

func (n *namespace) path() string { return "/run/netns/" + n.name }

// newNamespace creates a namespace with a veth pair on a free /30 of the
// link-local range 169.254.0.0/16 (addresses that exist only on this
// machine), and the nftables table its faults use.
func newNamespace(ctx context.Context) (*namespace, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("network namespaces need root")
	}
	for _, tool := range []string{"ip", "nft", "nsenter"} {
		if _, err := exec.LookPath(tool); err != nil {
			return nil, fmt.Errorf("%s not found (Debian: iproute2, nftables, util-linux): %w", tool, err)
		}
	}
	out, _ := exec.CommandContext(ctx, "ip", "-o", "-4", "addr", "show").Output()
	id := randomHex(3)
	n := &namespace{name: "pgtest-" + id, hostIf: "pgth" + id, nsIf: "pgtn" + id}
	for {
		a, b := 1+rand.IntN(254), 4*rand.IntN(64)
		prefix := "169.254." + strconv.Itoa(a) + "."
		if strings.Contains(string(out), prefix+strconv.Itoa(b+1)+"/") || strings.Contains(string(out), prefix+strconv.Itoa(b+2)+"/") {
			continue
		}
		n.hostAddr, n.serverAddr = prefix+strconv.Itoa(b+1), prefix+strconv.Itoa(b+2)
		break
	}
	steps := [][]string{
		{"ip", "netns", "add", n.name},
		{"ip", "link", "add", n.hostIf, "type", "veth", "peer", "name", n.nsIf},
		{"ip", "link", "set", n.nsIf, "netns", n.name},
		{"ip", "addr", "add", n.hostAddr + "/30", "dev", n.hostIf},
		{"ip", "link", "set", n.hostIf, "up"},
		{"ip", "netns", "exec", n.name, "ip", "addr", "add", n.serverAddr + "/30", "dev", n.nsIf},
		{"ip", "netns", "exec", n.name, "ip", "link", "set", n.nsIf, "up"},
		{"ip", "netns", "exec", n.name, "ip", "link", "set", "lo", "up"},
	}
	for _, st := range steps {
		if out, err := exec.CommandContext(ctx, st[0], st[1:]...).CombinedOutput(); err != nil {
			n.remove()
			return nil, fmt.Errorf("pgtest: %s: %v: %s", strings.Join(st, " "), err, out)
		}
	}
	if err := n.nft("add table inet pgtest\n" +
		"add chain inet pgtest in { type filter hook input priority 0; }\n" +
		"add chain inet pgtest out { type filter hook output priority 0; }\n"); err != nil {
		n.remove()
		return nil, err
	}
	return n, nil
}

// nft runs an nftables script inside the namespace.
func (n *namespace) nft(script string) error {
	cmd := exec.Command("ip", "netns", "exec", n.name, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("pgtest: nft in %s: %v: %s", n.name, err, out)
	}
	return nil
}

func (n *namespace) remove() {
	exec.Command("ip", "netns", "del", n.name).Run()
	exec.Command("ip", "link", "del", n.hostIf).Run()
}

// Isolated is a throwaway server in a network namespace of its own,
// reached from the test over a veth pair whose traffic tests can cut at the
// kernel level: Cut drops every packet (nothing answers, nothing is reset:
// a dead host, a partition), Reject answers with TCP resets, DropFlow cuts
// one client connection only (a middlebox dropping one flow). The Unix
// socket in [Server.SocketDir] stays reachable: an observer can watch the
// server while the network is cut ([Isolated.SocketDSN]).
type Isolated struct {
	*Server
	ns *namespace
}

// StartIsolated starts an Isolated server for tb and removes it (server
// and namespace) when tb ends. It needs root, iproute2, nftables and
// util-linux; without them it skips tb, or fails it when CI=true.
func StartIsolated(tb testing.TB) *Isolated {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := findBin(); err != nil {
		Unavailable(tb, "local PostgreSQL binaries (for an isolated server)", err)
	}
	ns, err := newNamespace(ctx)
	if err != nil {
		Unavailable(tb, "a network namespace", err)
	}
	c, adminPW, err := newCluster(ctx, "isolated", nil, inNamespace(ns))
	if err != nil {
		ns.remove()
		tb.Fatal(err)
	}
	s := &Server{Host: ns.serverAddr, Port: c.port, adminUser: "postgres", adminPassword: adminPW, local: c, database: Role}
	s.closer = c.destroy
	if err := s.bootstrap(ctx); err != nil {
		c.destroy()
		tb.Fatal(err)
	}
	tb.Cleanup(func() { s.Close() })
	return &Isolated{Server: s, ns: ns}
}

// Cut drops every packet between the server and the rest of the machine,
// in both directions, until Restore: established connections hang, new
// ones time out, nobody is told.
func (s *Isolated) Cut() error {
	return s.ns.nft("add rule inet pgtest in ip saddr " + s.ns.hostAddr + " drop\n" +
		"add rule inet pgtest out ip daddr " + s.ns.hostAddr + " drop\n")
}

// Reject answers every packet from the rest of the machine with a TCP
// reset (connections refused, established ones reset), until Restore.
func (s *Isolated) Reject() error {
	return s.ns.nft("add rule inet pgtest in ip saddr " + s.ns.hostAddr + " tcp flags != rst reject with tcp reset\n")
}

// DropFlow drops the packets of the one client connection whose local
// (client) port is clientPort, both ways, until Restore; the server's
// other connections keep working.
func (s *Isolated) DropFlow(clientPort int) error {
	p := strconv.Itoa(clientPort)
	return s.ns.nft("add rule inet pgtest in tcp sport " + p + " drop\n" +
		"add rule inet pgtest out tcp dport " + p + " drop\n")
}

// Restore removes every fault.
func (s *Isolated) Restore() error {
	return s.ns.nft("flush chain inet pgtest in\nflush chain inet pgtest out\n")
}

// SocketDSN returns the DSN of database db over the server's Unix socket,
// which no network fault affects.
func (s *Isolated) SocketDSN(db string) string {
	return fmt.Sprintf("host=%s port=%d user=%s password=%s dbname=%s sslmode=disable", s.SocketDir(), s.Port, Role, s.password, db)
}

package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Leader election against etcd: the time from a fault of the leader to
// the next candidate's election, for etcd's concurrency.Election and
// sqllock's Election, each candidate a process of its own (see
// candidateMain) that reaches its server through a freezer of its own;
// and which of two waiting candidates a resignation elects.

// electionConfig is one column of the comparison.
type electionConfig struct {
	name   string
	system string        // "etcd" or "sqllock"
	bound  time.Duration // the session TTL or the orphan bound asked for (0: the default)
	full   time.Duration // the session TTL or the orphan bound in force
	wait   time.Duration // how long a fault may take to elect the next leader
	trials int           // trials of the faults that wait for the bound
}

// Faults of the comparison.
const (
	faultKill   = "kill"
	faultStop   = "stop"
	faultFreeze = "freeze"
	faultResign = "resign"
)

var faults = []string{faultKill, faultStop, faultFreeze, faultResign}

var faultNames = map[string]string{
	faultKill:   "holder killed (`kill -9`)",
	faultStop:   "holder stopped (`SIGSTOP`; its kernel still answers)",
	faultFreeze: "holder's link frozen (nothing passes, nobody is told)",
	faultResign: "resign",
}

// electionServers is where the candidates campaign.
type electionServers struct {
	etcd string              // etcd's host:port
	pg   string              // PostgreSQL's host:port
	dsn  func(string) string // a DSN of PostgreSQL at another host:port
}

// dsnAt returns a func that rewrites the host:port of the URL dsn.
func dsnAt(dsn string) (func(string) string, error) {
	u, err := url.Parse(dsn)
	if err != nil || u.Host == "" {
		return nil, fmt.Errorf("bench: want a URL DSN with a host, not %q", dsn)
	}
	return func(hostPort string) string {
		v := *u
		v.Host = hostPort
		return v.String()
	}, nil
}

// electionResult is one column's measurements.
type electionResult struct {
	cfg   electionConfig
	times map[string]sample // by fault
	// Fairness trials, by how the first leader goes (faultResign,
	// faultKill): how many, and how many elected the first waiting
	// candidate.
	fairness, firstWins map[string]int
}

// settle is how long a candidate that started campaigning is given to be
// waiting in its server.
const settle = 500 * time.Millisecond

func (s electionServers) start(cfg electionConfig, name, key string) (*candidateProc, error) {
	if cfg.system == "etcd" {
		return startCandidate("etcd", name, s.etcd, func(a string) string { return a }, key, cfg.bound)
	}
	return startCandidate("sqllock", name, s.pg, s.dsn, key, cfg.bound)
}

// newKey returns a key no trial used: a candidate killed holding one may
// hold it until its bound.
func newKey(cfg electionConfig) string {
	n := rand.Int64N(1 << 40)
	if cfg.system == "etcd" {
		return "/sqllock-bench/" + strconv.FormatInt(n, 10)
	}
	return strconv.FormatInt(n, 10)
}

// waitsForBound reports whether fault leaves the next leader waiting for
// cfg's bound: every fault but resign for etcd, which keeps a dead
// holder's lease until its TTL; for sqllock, those that leave the holder's
// connection up.
func waitsForBound(cfg electionConfig, fault string) bool {
	return fault != faultResign && (cfg.system == "etcd" || fault != faultKill)
}

// electionTrial elects a first candidate, makes a second campaign, hits
// the first with fault, and returns the time from the fault to the second's
// election.
func electionTrial(s electionServers, cfg electionConfig, fault string) (time.Duration, error) {
	key := newKey(cfg)
	a, err := s.start(cfg, "a", key)
	if err != nil {
		return 0, err
	}
	defer a.kill()
	if _, err := a.wait("elected", 30*time.Second); err != nil {
		return 0, err
	}
	b, err := s.start(cfg, "b", key)
	if err != nil {
		return 0, err
	}
	defer b.kill()
	if _, err := b.wait("campaigning", 30*time.Second); err != nil {
		return 0, err
	}
	time.Sleep(settle)
	if waitsForBound(cfg, fault) {
		// A random moment of the term: how long the server keeps a silent
		// holder depends on when it last heard from it (etcd's client
		// renews its lease every third of its TTL; sqllock touches a
		// holder's session idle for a third of the orphan bound, at its
		// next keep-alive): half the bound spans a renewal of either.
		time.Sleep(rand.N(cfg.full / 2))
	}
	var t0 time.Time
	switch fault {
	case faultKill:
		t0 = time.Now()
		err = a.cmd.Process.Signal(syscall.SIGKILL)
	case faultStop:
		t0 = time.Now()
		err = a.cmd.Process.Signal(syscall.SIGSTOP)
	case faultFreeze:
		t0 = time.Now()
		a.link.Freeze()
	case faultResign:
		if err = a.resign(); err == nil {
			t0, err = a.wait("resigning", 10*time.Second)
		}
	}
	if err != nil {
		return 0, err
	}
	at, err := b.wait("elected", cfg.wait)
	if err != nil {
		return 0, fmt.Errorf("%s, %s: %w", cfg.name, fault, err)
	}
	return at.Sub(t0), nil
}

// fairnessTrial starts three candidates one after another, each once the
// one before is elected or waiting; the first resigns, or is killed
// (fault). It reports whether the second (the first to wait) was elected.
func fairnessTrial(s electionServers, cfg electionConfig, fault string) (bool, error) {
	key := newKey(cfg)
	var cs []*candidateProc
	defer func() {
		for _, c := range cs {
			c.kill()
		}
	}()
	for i, name := range []string{"a", "b", "c"} {
		c, err := s.start(cfg, name, key)
		if err != nil {
			return false, err
		}
		cs = append(cs, c)
		if i == 0 {
			_, err = c.wait("elected", 30*time.Second)
		} else {
			_, err = c.wait("campaigning", 30*time.Second)
			time.Sleep(settle)
		}
		if err != nil {
			return false, err
		}
	}
	if fault == faultKill {
		if err := cs[0].cmd.Process.Signal(syscall.SIGKILL); err != nil {
			return false, err
		}
	} else if err := cs[0].resign(); err != nil {
		return false, err
	}
	timeout := time.After(cfg.wait)
	for {
		select {
		case ev, ok := <-cs[1].events:
			if !ok {
				return false, fmt.Errorf("%s: candidate b exited", cfg.name)
			}
			if ev.what == "elected" {
				return true, nil
			}
		case ev, ok := <-cs[2].events:
			if !ok {
				return false, fmt.Errorf("%s: candidate c exited", cfg.name)
			}
			if ev.what == "elected" {
				return false, nil
			}
		case <-timeout:
			return false, fmt.Errorf("%s: nobody elected within %v of the first's going (%s)", cfg.name, cfg.wait, fault)
		}
	}
}

// measureElections runs every fault on every configuration, cfg.trials
// times those that wait for the bound (see waitsForBound) and quick times
// the others, and quick fairness trials; progress goes to log.
func measureElections(s electionServers, cfgs []electionConfig, quick int, log io.Writer) ([]electionResult, error) {
	var out []electionResult
	for _, cfg := range cfgs {
		r := electionResult{cfg: cfg, times: map[string]sample{}, fairness: map[string]int{}, firstWins: map[string]int{}}
		if err := fairnessTrials(s, &r, quick, log); err != nil {
			return nil, err
		}
		if onlyFairness {
			out = append(out, r)
			continue
		}
		for _, f := range faults {
			n := quick
			if waitsForBound(cfg, f) {
				n = cfg.trials
			}
			for range n {
				d, err := electionTrial(s, cfg, f)
				if err != nil {
					return nil, err
				}
				fmt.Fprintf(log, "%s, %s: %v\n", cfg.name, f, d.Round(time.Millisecond))
				r.times[f] = append(r.times[f], d)
			}
		}
		out = append(out, r)
	}
	return out, nil
}

// onlyFairness makes measureElections run the fairness trials alone (the
// -fairness mode).
var onlyFairness bool

// fairnessFaults are how the first leader goes in fairness trials.
var fairnessFaults = []string{faultResign, faultKill}

// fairnessTrials runs n fairness trials of each of fairnessFaults for r's
// configuration (fewer, for a kill that waits for a long bound: at least
// one), into r.
func fairnessTrials(s electionServers, r *electionResult, n int, log io.Writer) error {
	for _, f := range fairnessFaults {
		trials := n
		if waitsForBound(r.cfg, f) {
			trials = min(n, r.cfg.trials)
		}
		for range trials {
			first, err := fairnessTrial(s, r.cfg, f)
			if err != nil {
				return err
			}
			fmt.Fprintf(log, "%s, fairness (%s): the first waiting elected: %v\n", r.cfg.name, f, first)
			r.fairness[f]++
			if first {
				r.firstWins[f]++
			}
		}
	}
	return nil
}

// electionConfigs are the comparison's columns; short is the comparable
// bound (5 s in the documented run), longTrials and trials the trials of
// the faults that wait for the defaults and for short.
func electionConfigs(short time.Duration, longTrials, trials int) []electionConfig {
	secs := func(d time.Duration) string { return strconv.FormatFloat(d.Seconds(), 'f', -1, 64) + " s" }
	return []electionConfig{
		{name: "etcd, TTL 60 s (default)", system: "etcd", full: 60 * time.Second, wait: 2 * time.Minute, trials: longTrials},
		{name: "etcd, TTL " + secs(short), system: "etcd", bound: short, full: short, wait: 4*short + 20*time.Second, trials: trials},
		{name: "sqllock, defaults (orphan bound 30 s)", system: "sqllock", full: 30 * time.Second, wait: 90 * time.Second, trials: longTrials},
		{name: "sqllock, orphan bound " + secs(short), system: "sqllock", bound: short, full: short, wait: 4*short + 20*time.Second, trials: trials},
	}
}

// writeElections writes the comparison's table to w.
func writeElections(w io.Writer, rs []electionResult) {
	fmt.Fprintf(w, "| fault: time to the next leader |")
	for _, r := range rs {
		fmt.Fprintf(w, " %s |", r.cfg.name)
	}
	fmt.Fprintf(w, "\n|---|%s\n", strings.Repeat("---|", len(rs)))
	for _, f := range faults {
		fmt.Fprintf(w, "| %s |", faultNames[f])
		for _, r := range rs {
			fmt.Fprintf(w, " %s |", spread(r.times[f]))
		}
		fmt.Fprintln(w)
	}
	writeFairness(w, rs)
}

// writeFairness writes the fairness rows of the comparison's table to w.
func writeFairness(w io.Writer, rs []electionResult) {
	for _, f := range fairnessFaults {
		how := "resigns"
		if f == faultKill {
			how = "is killed (`kill -9`)"
		}
		fmt.Fprintf(w, "| fairness: 3 candidates one after another, the first %s: the second elected |", how)
		for _, r := range rs {
			fmt.Fprintf(w, " %d of %d |", r.firstWins[f], r.fairness[f])
		}
		fmt.Fprintln(w)
	}
}

// spread formats a sample as its median and range, and its size.
func spread(s sample) string {
	if len(s) == 0 {
		return "n/a"
	}
	lo, hi := slices.Min(s), slices.Max(s)
	if len(s) == 1 {
		return fmt.Sprintf("%s (1 trial)", fmtDur(lo))
	}
	c := slices.Clone(s)
	slices.Sort(c)
	med := (c[(len(c)-1)/2] + c[len(c)/2]) / 2
	return fmt.Sprintf("%s (%s–%s, %d trials)", fmtDur(med), fmtDur(lo), fmtDur(hi), len(s))
}

// runElections is the -etcd mode: an etcd server and a PostgreSQL server
// of its own, the comparison's table to w.
func runElections(dsn, etcdAddr string, longTrials, trials int, w io.Writer) error {
	at, err := dsnAt(dsn)
	if err != nil {
		return err
	}
	u, _ := url.Parse(dsn)
	s := electionServers{etcd: etcdAddr, pg: u.Host, dsn: at}
	rs, err := measureElections(s, electionConfigs(5*time.Second, longTrials, trials), trials, os.Stderr)
	if err != nil {
		return err
	}
	if onlyFairness {
		writeFairness(w, rs)
		return nil
	}
	writeElections(w, rs)
	return nil
}

// etcdVersion returns the version of the etcd server at clientURL.
func etcdVersion(clientURL string) string {
	r, err := http.Get(clientURL + "/version")
	if err != nil {
		return "?"
	}
	defer r.Body.Close()
	var v struct {
		Server string `json:"etcdserver"`
	}
	if json.NewDecoder(r.Body).Decode(&v) != nil {
		return "?"
	}
	return v.Server
}

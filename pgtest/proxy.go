package pgtest

import (
	"encoding/binary"
	"net"
	"net/url"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Proxy is a TCP proxy in front of a server for measurements: it counts
// the round trips clients make, and can add latency. It reads just enough
// of the PostgreSQL protocol to count, from each client, the messages
// that wait for the server's answer: Sync (the end of an extended-protocol
// exchange) and Query (a simple-protocol statement), but not pgx's health
// ping of a pooled connection (see pingBody). Everything else is
// forwarded as it is, and nothing is changed.
type Proxy struct {
	ln     net.Listener
	target string
	delay  time.Duration

	syncs, queries atomic.Int64

	mu    sync.Mutex
	conns []net.Conn // guarded by mu
}

// StartProxy starts a Proxy to target (host:port) on a free loopback port,
// adding oneWay of latency to every chunk in each direction (0: none), and
// stops it when tb ends.
func StartProxy(tb testing.TB, target string, oneWay time.Duration) *Proxy {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	p := &Proxy{ln: ln, target: target, delay: oneWay}
	go p.serve()
	tb.Cleanup(p.Close)
	return p
}

// Addr returns the proxy's host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// DSN returns dsn (a URL) with its host and port replaced by the proxy's.
func (p *Proxy) DSN(dsn string) string {
	u, err := url.Parse(dsn)
	if err != nil {
		return dsn
	}
	u.Host = p.Addr()
	return u.String()
}

// RoundTrips returns the Sync and Query messages counted so far.
func (p *Proxy) RoundTrips() int64 { return p.syncs.Load() + p.queries.Load() }

// Close stops the proxy and closes every connection through it.
func (p *Proxy) Close() {
	p.ln.Close()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

func (p *Proxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		for _, x := range []net.Conn{c, s} {
			if tc, ok := x.(*net.TCPConn); ok {
				tc.SetNoDelay(true)
			}
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, s)
		p.mu.Unlock()
		go p.pipe(s, c, true)
		go p.pipe(c, s, false)
	}
}

// pipe copies src to dst, delayed, counting messages when fromClient.
func (p *Proxy) pipe(dst, src net.Conn, fromClient bool) {
	defer dst.Close()
	defer src.Close()
	var parser *msgCounter
	if fromClient {
		parser = &msgCounter{p: p}
	}
	type chunk struct {
		b   []byte
		due time.Time
	}
	var out chan chunk
	done := make(chan struct{})
	if p.delay > 0 {
		out = make(chan chunk, 1024)
		go func() {
			defer close(done)
			for c := range out {
				waitUntil(c.due)
				if _, err := dst.Write(c.b); err != nil {
					return
				}
			}
		}()
	}
	buf := make([]byte, 64<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			b := buf[:n]
			if parser != nil {
				parser.feed(b)
			}
			if out != nil {
				out <- chunk{b: append([]byte(nil), b...), due: time.Now().Add(p.delay)}
			} else if _, werr := dst.Write(b); werr != nil {
				return
			}
		}
		if err != nil {
			if out != nil {
				close(out)
				<-done
			}
			_ = err // io.EOF or a closed connection: either way, done
			return
		}
	}
}

// msgCounter follows the client's side of the protocol: untyped messages
// (startup, SSL and GSS requests, a cancel request) until the startup
// packet, then typed ones.
type msgCounter struct {
	p       *Proxy
	started bool
	head    []byte // a message header being read
	skip    int    // bytes of the current message body still to skip
	ping    []byte // the body of a Query that may be pgx's health ping, being read
	pinging bool   // reading it
}

// pingBody is the Query that pgx's database/sql driver sends to check a
// pooled connection it gets back after a second or more (ResetSession):
// the pool's doing, not the caller's, so not counted.
var pingBody = []byte("-- ping\x00")

func (m *msgCounter) feed(b []byte) {
	for len(b) > 0 {
		if m.pinging {
			take := min(len(pingBody)-len(m.ping), len(b))
			m.ping = append(m.ping, b[:take]...)
			b = b[take:]
			if len(m.ping) == len(pingBody) {
				if string(m.ping) != string(pingBody) {
					m.p.queries.Add(1)
				}
				m.pinging, m.ping = false, m.ping[:0]
			}
			continue
		}
		if m.skip > 0 {
			n := min(m.skip, len(b))
			m.skip -= n
			b = b[n:]
			continue
		}
		need := 5
		if !m.started {
			need = 8
		}
		take := min(need-len(m.head), len(b))
		m.head = append(m.head, b[:take]...)
		b = b[take:]
		if len(m.head) < need {
			return
		}
		if !m.started {
			length := int(binary.BigEndian.Uint32(m.head[:4]))
			code := binary.BigEndian.Uint32(m.head[4:8])
			if code != 80877103 && code != 80877104 && code != 80877102 { // not SSL, GSS or cancel: the startup packet
				m.started = true
			}
			m.skip = length - 8
		} else {
			switch m.head[0] {
			case 'S':
				m.p.syncs.Add(1)
			}
			m.skip = int(binary.BigEndian.Uint32(m.head[1:5])) - 4
			switch {
			case m.head[0] == 'Q' && m.skip == len(pingBody):
				m.pinging, m.skip = true, 0
			case m.head[0] == 'Q':
				m.p.queries.Add(1)
			}
		}
		m.head = m.head[:0]
	}
}

// waitUntil returns at t. Timers on some machines fire a millisecond late
// whatever the delay, so the last stretch is spun: a latency of a few
// hundred microseconds stays what it says, at the cost of a core while a
// chunk is in flight.
func waitUntil(t time.Time) {
	if d := time.Until(t); d > 2*time.Millisecond {
		time.Sleep(d - 2*time.Millisecond)
	}
	for time.Now().Before(t) {
		runtime.Gosched()
	}
}

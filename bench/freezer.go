package main

import (
	"net"
	"sync"
)

// freezer is a TCP proxy on loopback whose link can be frozen: Freeze
// stops every byte in both directions, and closes nothing, so that
// neither end is told (both kernels still acknowledge what reached them,
// and no TCP timeout fires: what a link that drops every packet looks like
// to the programs at its ends, until their own timers run out).
//
// A freezer is safe for concurrent use; Close ends it and its
// connections.
type freezer struct {
	ln     net.Listener
	target string

	mu     sync.Mutex
	frozen chan struct{} // guarded by mu; non-nil while frozen, closed to thaw
	conns  []net.Conn    // guarded by mu
	closed bool          // guarded by mu
}

// newFreezer starts a freezer to target (host:port) on a free loopback
// port.
func newFreezer(target string) (*freezer, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	f := &freezer{ln: ln, target: target}
	go f.serve()
	return f, nil
}

// Addr returns the freezer's host:port.
func (f *freezer) Addr() string { return f.ln.Addr().String() }

// Freeze stops the traffic until Close.
func (f *freezer) Freeze() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.frozen == nil {
		f.frozen = make(chan struct{})
	}
}

// Close stops the freezer and closes its connections.
func (f *freezer) Close() {
	f.ln.Close()
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed = true
	if f.frozen != nil {
		close(f.frozen)
		f.frozen = nil
	}
	for _, c := range f.conns {
		c.Close()
	}
	f.conns = nil
}

func (f *freezer) serve() {
	for {
		c, err := f.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", f.target)
		if err != nil {
			c.Close()
			continue
		}
		f.mu.Lock()
		if f.closed {
			f.mu.Unlock()
			c.Close()
			s.Close()
			return
		}
		f.conns = append(f.conns, c, s)
		f.mu.Unlock()
		go f.pipe(s, c)
		go f.pipe(c, s)
	}
}

// pipe copies src to dst; while the link is frozen, it holds what it
// read, and the end of src too, until Close.
func (f *freezer) pipe(dst, src net.Conn) {
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		f.mu.Lock()
		frozen, closed := f.frozen, f.closed
		f.mu.Unlock()
		if closed {
			return
		}
		if frozen != nil {
			<-frozen
			return
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

package poolguard

import (
	"context"
	"database/sql/driver"
	"errors"
)

// conn is the guard's wrapper of one driver connection. database/sql uses
// it like any driver connection; it forwards every optional interface of the
// driver's connection and hands back the driver's own Stmt, Rows and Tx.
// It is unexported, as otelsql keeps its wrappers: users reach the
// driver's connection through [UnwrapAs], and sqllock reaches WithoutGuard
// through an interface.
//
// database/sql serialises all use of a driver connection, so conn needs no
// locking of its own.
type conn struct {
	inner driver.Conn
	c     *Connector

	dirty     bool   // an advisory statement ran, or a call ended with its context done, since the last check
	prepared  bool   // an advisory statement was prepared: check at every return
	lastQuery string // the last statement that made the connection dirty, this checkout
	lastAny   string // the last statement run on the connection, this checkout
}

var (
	_ driver.Conn               = (*conn)(nil)
	_ driver.ExecerContext      = (*conn)(nil)
	_ driver.QueryerContext     = (*conn)(nil)
	_ driver.ConnPrepareContext = (*conn)(nil)
	_ driver.ConnBeginTx        = (*conn)(nil)
	_ driver.NamedValueChecker  = (*conn)(nil)
	_ driver.SessionResetter    = (*conn)(nil)
	_ driver.Validator          = (*conn)(nil)
	_ driver.Pinger             = (*conn)(nil)
)

// Unwrap returns the driver's own connection.
func (g *conn) Unwrap() driver.Conn { return g.inner }

// WithoutGuard runs f on the driver's own connection without marking the
// connection dirty. It is meant for the sqllock package, which returns a
// connection to the pool only after PostgreSQL confirmed its unlock and
// otherwise discards it; its statements need no second check. Call it only
// from a Conn.Raw callback, which gives f exclusive use of the connection.
func (g *conn) WithoutGuard(f func(driver.Conn) error) error { return f(g.inner) }

// note marks the connection dirty when query mentions an advisory function
// or ctx ended during the call.
func (g *conn) note(ctx context.Context, query string) {
	g.lastAny = query
	if suspect(query) {
		g.dirty = true
		g.lastQuery = query
		if containsFold(query, "prepare") {
			// A server-side PREPARE: its later EXECUTE names no advisory
			// function, so check at every return from now on.
			g.prepared = true
		}
	} else if ctx.Err() != nil {
		g.dirty = true
		g.lastQuery = query
	}
}

// suspect reports whether a statement may take an advisory lock: it names
// an advisory function, or it spells an identifier with Unicode escapes
// (U&"..."), which can hide one.
func suspect(s string) bool {
	return mentionsAdvisory(s) || containsFold(s, `u&"`)
}

// containsFold reports whether s contains the lower-case ASCII word w in
// any case, without allocating.
func containsFold(s, w string) bool {
	for i := 0; i+len(w) <= len(s); i++ {
		j := 0
		for ; j < len(w); j++ {
			if s[i+j]|0x20 != w[j] && s[i+j] != w[j] {
				break
			}
		}
		if j == len(w) {
			return true
		}
	}
	return false
}

// mentionsAdvisory reports whether s contains "advisory" in any case,
// without allocating.
func mentionsAdvisory(s string) bool { return containsFold(s, "advisory") }

// Prepare implements driver.Conn.
func (g *conn) Prepare(query string) (driver.Stmt, error) {
	return g.PrepareContext(context.Background(), query)
}

// PrepareContext implements driver.ConnPrepareContext. A statement that
// mentions an advisory function makes the connection checked at every
// return from then on, since database/sql re-executes prepared statements
// without preparing them again.
func (g *conn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	if suspect(query) {
		g.prepared = true
		g.lastQuery = query
	}
	if p, ok := g.inner.(driver.ConnPrepareContext); ok {
		return p.PrepareContext(ctx, query)
	}
	return g.inner.Prepare(query)
}

// Close implements driver.Conn.
func (g *conn) Close() error { return g.inner.Close() }

// Begin implements driver.Conn.
func (g *conn) Begin() (driver.Tx, error) {
	return g.inner.Begin() //lint:ignore SA1019 driver.Conn requires forwarding Begin
}

// BeginTx implements driver.ConnBeginTx.
func (g *conn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	if b, ok := g.inner.(driver.ConnBeginTx); ok {
		return b.BeginTx(ctx, opts)
	}
	if opts.Isolation != 0 || opts.ReadOnly {
		return nil, errors.New("poolguard: the driver does not support transaction options")
	}
	return g.inner.Begin() //lint:ignore SA1019 the driver has no BeginTx
}

// ExecContext implements driver.ExecerContext; it returns driver.ErrSkip
// when the driver's connection has no ExecContext, as database/sql expects.
func (g *conn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	e, ok := g.inner.(driver.ExecerContext)
	if !ok {
		return nil, driver.ErrSkip
	}
	r, err := e.ExecContext(ctx, query, args)
	g.note(ctx, query)
	return r, err
}

// QueryContext implements driver.QueryerContext; it returns driver.ErrSkip
// when the driver's connection has no QueryContext.
func (g *conn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	q, ok := g.inner.(driver.QueryerContext)
	if !ok {
		return nil, driver.ErrSkip
	}
	r, err := q.QueryContext(ctx, query, args)
	g.note(ctx, query)
	return r, err
}

// CheckNamedValue implements driver.NamedValueChecker; it returns
// driver.ErrSkip when the driver's connection has none, so database/sql
// applies its default conversions.
func (g *conn) CheckNamedValue(nv *driver.NamedValue) error {
	if c, ok := g.inner.(driver.NamedValueChecker); ok {
		return c.CheckNamedValue(nv)
	}
	return driver.ErrSkip
}

// ResetSession implements driver.SessionResetter.
func (g *conn) ResetSession(ctx context.Context) error {
	if r, ok := g.inner.(driver.SessionResetter); ok {
		return r.ResetSession(ctx)
	}
	return nil
}

// Ping implements driver.Pinger.
func (g *conn) Ping(ctx context.Context) error {
	if p, ok := g.inner.(driver.Pinger); ok {
		return p.Ping(ctx)
	}
	return nil
}

// IsValid implements driver.Validator: database/sql calls it as the
// connection returns to the pool, and false closes it. This is where the
// guard checks a dirty connection for advisory locks.
func (g *conn) IsValid() bool {
	defer func() { g.lastQuery, g.lastAny = "", "" }() // per checkout
	if v, ok := g.inner.(driver.Validator); ok && !v.IsValid() {
		return false // closed anyway: the session and its locks end
	}
	if !g.dirty && !g.prepared && !g.c.cfg.always {
		return true
	}
	return g.check()
}

package poolguard

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"io"
	"log/slog"
	"sync/atomic"
)

// Connector is a driver.Connector whose connections are checked for
// advisory locks as they return to the pool. Create one with [Wrap] and
// open a pool on it with sql.OpenDB. It is safe for concurrent use.
type Connector struct {
	inner driver.Connector
	cfg   config

	checks, leaks, discarded, released atomic.Int64
}

var (
	_ driver.Connector = (*Connector)(nil)
	_ io.Closer        = (*Connector)(nil)
)

// Wrap returns a Connector around c.
func Wrap(c driver.Connector, opts ...Option) *Connector {
	if c == nil {
		panic("poolguard: Wrap called with a nil driver.Connector")
	}
	cfg := config{checkTimeout: DefaultCheckTimeout}
	for _, o := range opts {
		o.apply(&cfg)
	}
	if cfg.logger == nil {
		cfg.logger = slog.New(slog.DiscardHandler)
	}
	return &Connector{inner: c, cfg: cfg}
}

// Open opens a guarded pool for a registered driver, like sql.Open. The
// driver must be registered (imported) already. To read [Connector.Stats],
// use [OpenConnector] (or [Wrap]) and sql.OpenDB instead.
func Open(driverName, dsn string, opts ...Option) (*sql.DB, error) {
	c, err := OpenConnector(driverName, dsn, opts...)
	if err != nil {
		return nil, err
	}
	return sql.OpenDB(c), nil
}

// OpenConnector returns a guarded connector for a registered driver and
// dsn: sql.OpenDB(c) opens the pool, and c.Stats() reads its counters.
func OpenConnector(driverName, dsn string, opts ...Option) (*Connector, error) {
	probe, err := sql.Open(driverName, dsn)
	if err != nil {
		return nil, err
	}
	d := probe.Driver()
	probe.Close()
	var c driver.Connector
	if dc, ok := d.(driver.DriverContext); ok {
		if c, err = dc.OpenConnector(dsn); err != nil {
			return nil, err
		}
	} else {
		c = dsnConnector{dsn: dsn, d: d}
	}
	return Wrap(c, opts...), nil
}

type dsnConnector struct {
	dsn string
	d   driver.Driver
}

func (c dsnConnector) Connect(context.Context) (driver.Conn, error) { return c.d.Open(c.dsn) }
func (c dsnConnector) Driver() driver.Driver                        { return c.d }

// Connect opens a connection through the wrapped connector and wraps it.
func (c *Connector) Connect(ctx context.Context) (driver.Conn, error) {
	ic, err := c.inner.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &conn{inner: ic, c: c}, nil
}

// Driver returns the wrapped connector's driver, so that db.Driver() still
// tells which driver is in use.
func (c *Connector) Driver() driver.Driver { return c.inner.Driver() }

// Close closes the wrapped connector if it is an io.Closer. sql.DB.Close
// calls it.
func (c *Connector) Close() error {
	if cl, ok := c.inner.(io.Closer); ok {
		return cl.Close()
	}
	return nil
}

// Stats are a Connector's counters since Wrap.
type Stats struct {
	Checks    int64 // checks run on returning connections
	Leaks     int64 // leaks found (a failed check counts)
	Discarded int64 // connections closed because of a leak
	Released  int64 // connections cleaned with pg_advisory_unlock_all() and kept
}

// Stats returns the Connector's counters.
func (c *Connector) Stats() Stats {
	return Stats{Checks: c.checks.Load(), Leaks: c.leaks.Load(), Discarded: c.discarded.Load(), Released: c.released.Load()}
}

// UnwrapAs returns the first connection of type T found by following
// Unwrap() driver.Conn methods from dc: the value a Conn.Raw callback gets.
// It lets code that needs the driver's own connection type (pgx's
// *stdlib.Conn, say) reach it through the guard:
//
//	conn.Raw(func(dc any) error {
//		pc, ok := poolguard.UnwrapAs[*stdlib.Conn](dc)
//		...
//	})
func UnwrapAs[T any](dc any) (T, bool) {
	for dc != nil {
		if t, ok := dc.(T); ok {
			return t, true
		}
		u, ok := dc.(interface{ Unwrap() driver.Conn })
		if !ok {
			break
		}
		dc = u.Unwrap()
	}
	var zero T
	return zero, false
}

var errNotQueryer = errors.New("poolguard: the driver connection cannot run queries with a context")

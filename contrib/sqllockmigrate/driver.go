package sqllockmigrate

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/golang-migrate/migrate/v4/database"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/interop"
)

// DefaultWait is how long Lock waits unless [WithWait] says otherwise:
// shorter than golang-migrate's default LockTimeout (15 s), so that the
// wait's own error, not golang-migrate's, comes back.
const DefaultWait = 10 * time.Second

// Driver is a golang-migrate database.Driver whose Lock and Unlock take
// the lock through a [sqllock.Locker]. It is safe for concurrent use, as
// the driver it wraps is; golang-migrate calls Lock and Unlock in turn.
type Driver struct {
	inner database.Driver
	l     *sqllock.Locker
	key   sqllock.Key
	wait  time.Duration

	ctx  context.Context // ends when the Driver is closed: a wait ends with it
	stop context.CancelFunc

	session *sqllock.Session // the pinned session of OpenPostgres, closed by Close

	mu      sync.Mutex
	locking bool          // guarded by mu: a Lock waits
	held    *sqllock.Lock // guarded by mu
}

// nopDriver stands in for a driver where only a Driver's options matter.
type nopDriver struct{ database.Driver }

var _ database.Driver = (*Driver)(nil)

// Option configures Wrap and Open.
type Option interface{ apply(*Driver) }

type optionFunc func(*Driver)

func (f optionFunc) apply(d *Driver) { f(d) }

// WithWait bounds how long Lock waits for another instance's migrations:
// when d has passed, Lock returns an error matching database.ErrLocked and
// [sqllock.ErrNotAcquired], and the wait leaves no trace in the server.
// d must be positive ([DefaultWait] otherwise).
func WithWait(d time.Duration) Option {
	return optionFunc(func(dr *Driver) {
		if d > 0 {
			dr.wait = d
		}
	})
}

// Wrap returns a Driver that delegates to d and takes the lock key through
// l. key is golang-migrate's key for d's migrations table
// ([interop.GolangMigrate] for a driver made with WithInstance or
// WithConnection, [interop.GolangMigrateURL] for one opened from a URL).
// Wrap panics if d or l is nil.
//
// Wrap changes Lock and Unlock only: golang-migrate's PostgreSQL drivers
// also take the lock as they are made, with their own pg_advisory_lock,
// before Wrap sees them. For golang-migrate's postgres driver, [OpenPostgres]
// makes that wait safe too.
func Wrap(d database.Driver, l *sqllock.Locker, key sqllock.Key, opts ...Option) *Driver {
	if d == nil || l == nil {
		panic("sqllockmigrate: Wrap with a nil driver or *sqllock.Locker")
	}
	dr := &Driver{inner: d, l: l, key: key, wait: DefaultWait}
	dr.ctx, dr.stop = context.WithCancel(context.Background())
	for _, o := range opts {
		o.apply(dr)
	}
	return dr
}

// Key returns the key the Driver takes.
func (d *Driver) Key() sqllock.Key { return d.key }

// Unwrap returns the wrapped driver.
func (d *Driver) Unwrap() database.Driver { return d.inner }

// Open implements database.Driver: it opens rawURL with the wrapped
// driver's Open (which, for golang-migrate's PostgreSQL drivers, waits for
// the lock in pg_advisory_lock) and wraps the result with the same Locker
// and options, and the key for rawURL.
func (d *Driver) Open(rawURL string) (database.Driver, error) {
	key, err := interop.GolangMigrateURL(rawURL)
	if err != nil {
		return nil, err
	}
	inner, err := d.inner.Open(rawURL)
	if err != nil {
		return nil, err
	}
	return Wrap(inner, d.l, key, WithWait(d.wait)), nil
}

// Lock implements database.Driver: it waits for the key, at most for the
// Driver's wait (see [WithWait]). It returns database.ErrLocked when this
// Driver holds the lock or waits for it already, and an error matching
// database.ErrLocked and [sqllock.ErrNotAcquired] when the wait ended
// (or the Driver was closed) first; other errors are those of
// [sqllock.Locker.Lock].
func (d *Driver) Lock() error {
	d.mu.Lock()
	if d.locking || d.held != nil {
		d.mu.Unlock()
		return database.ErrLocked
	}
	d.locking = true
	d.mu.Unlock()

	ctx, cancel := context.WithTimeout(d.ctx, d.wait)
	lk, err := d.l.Lock(ctx, d.key)
	cancel()

	d.mu.Lock()
	defer d.mu.Unlock()
	d.locking = false
	if err == nil && d.ctx.Err() != nil { // closed while it waited
		err = errors.Join(sqllock.ErrNotAcquired, d.ctx.Err(), lk.Unlock(context.Background()))
	}
	switch {
	case errors.Is(err, sqllock.ErrNotAcquired):
		return fmt.Errorf("sqllockmigrate: lock %v not acquired within %v: %w: %w", d.key, d.wait, database.ErrLocked, err)
	case err != nil:
		return fmt.Errorf("sqllockmigrate: lock %v: %w", d.key, err)
	}
	d.held = lk
	return nil
}

// Unlock implements database.Driver: it releases the lock. It returns
// database.ErrNotLocked when the Driver holds none, and an error matching
// [sqllock.ErrLockLost] when the lock was lost while it was held (the
// migrations ran, at least in part, without it).
func (d *Driver) Unlock() error {
	d.mu.Lock()
	lk := d.held
	d.held = nil
	d.mu.Unlock()
	if lk == nil {
		return database.ErrNotLocked
	}
	if err := lk.Unlock(context.Background()); err != nil { // bounded by the Locker's unlock timeout
		return fmt.Errorf("sqllockmigrate: unlock %v: %w", d.key, err)
	}
	return nil
}

// Close implements database.Driver: it ends a wait, releases a lock still
// held, and closes the wrapped driver.
func (d *Driver) Close() error {
	d.stop()
	d.mu.Lock()
	lk := d.held
	d.held = nil
	d.mu.Unlock()
	var err error
	if lk != nil {
		err = lk.Unlock(context.Background())
	}
	err = errors.Join(err, d.inner.Close())
	if d.session != nil {
		// The driver closed the session's connection: what is left is to
		// let the Session go (its error, a closed connection, says nothing).
		d.session.Close(context.Background())
	}
	return err
}

// Run implements database.Driver with the wrapped driver's Run.
func (d *Driver) Run(migration io.Reader) error { return d.inner.Run(migration) }

// SetVersion implements database.Driver with the wrapped driver's
// SetVersion.
func (d *Driver) SetVersion(version int, dirty bool) error { return d.inner.SetVersion(version, dirty) }

// Version implements database.Driver with the wrapped driver's Version.
func (d *Driver) Version() (version int, dirty bool, err error) { return d.inner.Version() }

// Drop implements database.Driver with the wrapped driver's Drop.
func (d *Driver) Drop() error { return d.inner.Drop() }

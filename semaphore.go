package sqllock

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"

	"github.com/sqllock/sqllock/internal/core/stmt"

	"github.com/sqllock/sqllock/internal/core"
)

// Semaphore lets at most N holders, across every process that uses the
// same name and N, hold it at once: "at most 3 report generators in the
// fleet". It is made of N advisory locks, its slots: the pair keys
// (class, 0) to (class, N-1), where class is a 31-bit hash of the name
// with the top bit set.
//
// Each permit is an ordinary [Lock] on one slot: the same contract (it
// pins a connection, Done and Err report a loss, Unlock is confirmed on
// the backend that was granted it, doubt discards the connection), and the
// Locker's keep-alive watches it with its other locks.
//
// A Semaphore is safe for concurrent use. Processes must agree on N: a
// process with a larger N has more slots.
type Semaphore struct {
	l     *Locker
	name  string
	class int32
	n     int
	slots core.Slots
}

// maxSlots bounds N: each slot is one term of a statement.
const maxSlots = 1024

// Semaphore returns the semaphore name of n slots. It panics if n is not
// between 1 and 1024.
func (l *Locker) Semaphore(name string, n int) *Semaphore {
	if n < 1 || n > maxSlots {
		panic(fmt.Sprintf("sqllock: Semaphore(%q, %d): n must be 1 to %d", name, n, maxSlots))
	}
	c := semaphoreClass(name)
	s := &Semaphore{l: l, name: name, class: c, n: n, slots: core.NewSlots(c, n, fmt.Sprintf("semaphore %q", name))}
	return s
}

// semaphoreClass is the pair class of a semaphore's slots.
func semaphoreClass(name string) int32 {
	h := fnv.New32a()
	h.Write([]byte(name))
	return int32(h.Sum32() | 1<<31)
}

// semaphoreSlots returns the keys of the slots of the semaphore name of n
// slots; none for n below 1.
func semaphoreSlots(name string, n int) []Key {
	if n < 1 {
		return nil
	}
	c := semaphoreClass(name)
	keys := make([]Key, n)
	for i := range keys {
		keys[i] = Pair(c, int32(i))
	}
	return keys
}

// TryAcquire takes a free slot if there is one, in one round trip, and
// otherwise returns an error matching [ErrNotAcquired] at once. Release
// the permit with its Unlock. Other errors are those of [Locker.TryLock].
func (s *Semaphore) TryAcquire(ctx context.Context) (*Lock, error) {
	mustContext(ctx, "Semaphore.TryAcquire")
	return s.acquire(ctx, true)
}

// Acquire takes a slot, waiting while all are taken. The Locker's callers
// waiting for one Semaphore queue inside it, in arrival order, and only
// the first waits in the server: on one slot chosen at random, in
// statements no longer than half the server's deadlock_timeout (see
// [Locker.Lock]); between two, it tries every slot again. So it is woken
// at once when its slot is freed, and within half a deadlock_timeout
// (0.5 s by default) when another one is; it never polls faster. When ctx
// ends first, Acquire returns an error matching [ErrNotAcquired] and
// ctx.Err(), and no slot stays held.
func (s *Semaphore) Acquire(ctx context.Context) (*Lock, error) {
	mustContext(ctx, "Semaphore.Acquire")
	return s.acquire(ctx, false)
}

func (s *Semaphore) acquire(ctx context.Context, try bool) (lk *Lock, err error) {
	if end := s.l.startAcquire(ctx, Acquisition{Name: s.name, Wait: !try}); end != nil {
		defer func() { end(lk, err) }()
	}
	h, err := s.l.pool.AcquireSlot(ctx, s.slots, try)
	if err != nil {
		if s.l.cfg.holders && errors.Is(err, ErrNotAcquired) && !errors.Is(err, stmt.ErrAbandoned) {
			err = s.l.withHolders(Key{}, err, semaphoreSlots(s.name, s.n)...)
		}
		return nil, err
	}
	return newLock(s.l, h, keyOf(h.Key())), nil
}

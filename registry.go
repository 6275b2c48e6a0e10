package sqllock

import (
	"fmt"
	"iter"
	"maps"
	"slices"
	"strconv"
	"sync"
)

// Registry is a team's list of named locks: one place that says which key
// means what. Register refuses a second use of a name and, more
// importantly, a second name for the same key, so two jobs can never share a
// lock by accident.
//
// A *Registry is also an option of [New]: given to New
// (sqllock.New(db, reg)), the Locker names keys with it in errors, events
// and logs, the slots of a registered semaphore too ("name[i]"). Given to
// [Inspect], it fills [HeldLock].Name and the semaphore fields.
//
// A Registry is safe for concurrent use. The zero value is not usable; call
// [NewRegistry].
type Registry struct {
	mu     sync.RWMutex
	byName map[string]Key         // guarded by mu
	byKey  map[Key]string         // guarded by mu
	sems   map[int32]semaphoreRef // guarded by mu: by slot class
}

// semaphoreRef is a registered semaphore.
type semaphoreRef struct {
	name string
	n    int
}

// apply makes r an [Option] of [New].
func (r *Registry) apply(c *config) { c.registry = r }

// NewRegistry returns an empty Registry.
func NewRegistry() *Registry {
	return &Registry{byName: map[string]Key{}, byKey: map[Key]string{}, sems: map[int32]semaphoreRef{}}
}

// RegisterSemaphore records the semaphore name of n slots (see
// [Locker.Semaphore]), so that [Inspect] reports its slots as one
// semaphore: [HeldLock].Semaphore is name, and Name is "name[i]" for slot
// i; a Locker given the Registry names slot i "name[i]" in its errors,
// events ([Event].Name) and logs. It returns an error wrapping [ErrDuplicate] when another semaphore
// has the same slot class (a hash collision), when name is registered
// already with another n (registering the same name and n again is a
// no-op), or when one of its slots is registered as a named key; and an
// error wrapping [ErrInvalidKey] for an empty name or n out of 1 to 1024.
func (r *Registry) RegisterSemaphore(name string, n int) error {
	if name == "" || n < 1 || n > maxSlots {
		return fmt.Errorf("%w: semaphore %q of %d slots (want 1 to %d)", ErrInvalidKey, name, n, maxSlots)
	}
	c := semaphoreClass(name)
	r.mu.Lock()
	defer r.mu.Unlock()
	if old, ok := r.sems[c]; ok {
		switch {
		case old.name != name:
			return fmt.Errorf("%w: semaphore %q has the slots of %q", ErrDuplicate, name, old.name)
		case old.n != n:
			return fmt.Errorf("%w: semaphore %q is registered with %d slots, not %d", ErrDuplicate, name, old.n, n)
		}
		return nil
	}
	for i := range n {
		if other, ok := r.byKey[Pair(c, int32(i))]; ok {
			return fmt.Errorf("%w: slot %d of semaphore %q is registered as %q", ErrDuplicate, i, name, other)
		}
	}
	r.sems[c] = semaphoreRef{name: name, n: n}
	return nil
}

// semaphore returns the registered semaphore of slot k, and its slot.
func (r *Registry) semaphore(k Key) (name string, slot int, ok bool) {
	c, id, pair := k.Pair()
	if r == nil || !pair {
		return "", 0, false
	}
	r.mu.RLock()
	defer r.mu.RUnlock()
	s, ok := r.sems[c]
	if !ok || int(id) < 0 || int(id) >= s.n {
		return "", 0, false
	}
	return s.name, int(id), true
}

// Register records that name means key k. It returns an error wrapping
// [ErrDuplicate] when name is already registered, or when k already belongs
// to another name (a hash collision, or two teams picking the same number),
// or is a slot of a registered semaphore, and an error wrapping
// [ErrInvalidKey] for the zero Key or an empty name.
// Registering the same name with the same key again is a no-op.
func (r *Registry) Register(name string, k Key) error {
	if err := k.valid(); err != nil {
		return err
	}
	if name == "" {
		return fmt.Errorf("%w: empty name", ErrInvalidKey)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if old, ok := r.byName[name]; ok {
		if old == k {
			return nil
		}
		return fmt.Errorf("%w: name %q is already registered with key %s", ErrDuplicate, name, old)
	}
	if other, ok := r.byKey[k]; ok {
		return fmt.Errorf("%w: key %s of %q is already registered as %q", ErrDuplicate, k, name, other)
	}
	if c, id, pair := k.Pair(); pair {
		if s, ok := r.sems[c]; ok && id >= 0 && int(id) < s.n {
			return fmt.Errorf("%w: key %s of %q is slot %d of semaphore %q", ErrDuplicate, k, name, id, s.name)
		}
	}
	r.byName[name] = k
	r.byKey[k] = name
	return nil
}

// MustRegister is like Register but panics on error. It suits package-level
// registration of a program's fixed lock names, where a collision is a
// programming error; it returns k so that it can be used in a var
// declaration.
func (r *Registry) MustRegister(name string, k Key) Key {
	if err := r.Register(name, k); err != nil {
		panic(err)
	}
	return k
}

// name returns the name registered for k: a registered semaphore's slot i
// is "name[i]".
func (r *Registry) name(k Key) (string, bool) {
	if r == nil {
		return "", false
	}
	r.mu.RLock()
	n, ok := r.byKey[k]
	r.mu.RUnlock()
	if ok {
		return n, true
	}
	if sem, slot, ok := r.semaphore(k); ok {
		return sem + "[" + strconv.Itoa(slot) + "]", true
	}
	return "", false
}

// All returns every registered name and its key, sorted by name: a
// snapshot of the Registry when All is called.
//
//	for name, k := range locks.All() { ... }
func (r *Registry) All() iter.Seq2[string, Key] {
	var names []string
	var keys map[string]Key
	if r != nil {
		r.mu.RLock()
		keys = maps.Clone(r.byName)
		r.mu.RUnlock()
		names = slices.Sorted(maps.Keys(keys))
	}
	return func(yield func(string, Key) bool) {
		for _, n := range names {
			if !yield(n, keys[n]) {
				return
			}
		}
	}
}

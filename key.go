package sqllock

import (
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/sqllock/sqllock/internal/core"
	"github.com/sqllock/sqllock/internal/pglocks"
)

// keyForm tells which of PostgreSQL's two advisory key spaces a Key lives in.
// The values match pg_locks.objsubid: 1 for bigint keys, 2 for (int4, int4).
type keyForm uint8

const (
	formInvalid keyForm = 0
	formInt64   keyForm = 1
	formPair    keyForm = 2
)

// Key identifies one PostgreSQL advisory lock.
//
// PostgreSQL has two disjoint key spaces: a single bigint, and a pair of
// int4 values. pg_advisory_lock(1) and pg_advisory_lock(0, 1) are different
// locks, and a Key remembers which space it belongs to. Keys are comparable
// and can be used as map keys.
//
// The zero Key is not a valid key: every function that takes a Key rejects it
// with an error wrapping [ErrInvalidKey], so a forgotten key is never locked
// as 0 by accident. Build keys with [Int64], [Pair], [Hash],
// [ParseKey], or the constructors of package
// github.com/sqllock/sqllock/interop for keys other tools compute.
type Key struct {
	form keyForm
	// v holds the bigint for formInt64, and class<<32 | uint32(id) for formPair.
	v int64
}

// Int64 returns the bigint-form key k, as used by pg_advisory_lock(bigint).
func Int64(k int64) Key { return Key{form: formInt64, v: k} }

// Pair returns the two-integer key (class, id), as used by
// pg_advisory_lock(int4, int4). The usual convention is that class names a
// kind of lock (a namespace) and id the resource within it.
func Pair(class, id int32) Key {
	return Key{form: formPair, v: int64(class)<<32 | int64(uint32(id))}
}

// Hash returns the bigint-form key for name: the 64-bit FNV-1a hash of its
// UTF-8 bytes, read as a signed integer. The same name always gives the same
// key, in every process and every version of this module. Different names can
// collide (rarely, with 64 bits); a [Registry] detects collisions among the
// names a program knows.
func Hash(name string) Key { return Int64(int64(fnv64a(name))) }

func fnv64a(s string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(s)) // never fails
	return h.Sum64()
}

// Int64 returns the bigint value of k. ok is false when k is not a
// bigint-form key.
func (k Key) Int64() (v int64, ok bool) {
	if k.form != formInt64 {
		return 0, false
	}
	return k.v, true
}

// Pair returns the two integers of k. ok is false when k is not a pair-form
// key.
func (k Key) Pair() (class, id int32, ok bool) {
	if k.form != formPair {
		return 0, 0, false
	}
	return int32(k.v >> 32), int32(uint32(k.v)), true
}

// String returns "123" for a bigint key and "(1,2)" for a pair key; [ParseKey]
// reads both back. The zero Key prints as "<invalid key>".
func (k Key) String() string {
	switch k.form {
	case formInt64:
		return strconv.FormatInt(k.v, 10)
	case formPair:
		c, i, _ := k.Pair()
		return "(" + strconv.FormatInt(int64(c), 10) + "," + strconv.FormatInt(int64(i), 10) + ")"
	}
	return "<invalid key>"
}

// valid returns nil for a usable key and an error wrapping ErrInvalidKey for
// the zero Key.
func (k Key) valid() error {
	if k.form == formInt64 || k.form == formPair {
		return nil
	}
	return fmt.Errorf("%w: the zero Key; build one with Int64, Pair, Hash or ParseKey", ErrInvalidKey)
}

// lockTag returns how PostgreSQL stores k in pg_locks: classid, objid (both
// unsigned 32-bit) and objsubid.
func (k Key) lockTag() (classid, objid uint32, objsubid int) {
	return uint32(uint64(k.v) >> 32), uint32(k.v), int(k.form)
}

// keyFromLockTag is the inverse of lockTag. It returns false for an objsubid
// that is not an advisory form.
func keyFromLockTag(t pglocks.Tag) (Key, bool) {
	switch t.Objsubid {
	case pglocks.Bigint:
		return Int64(t.BigintKey()), true
	case pglocks.Pair:
		return Pair(t.PairKey()), true
	}
	return Key{}, false
}

// less orders keys: bigint keys first by value, then pair keys by class and
// id.
func (k Key) less(o Key) bool {
	if k.form != o.form {
		return k.form < o.form
	}
	if k.form == formPair {
		kc, ki, _ := k.Pair()
		oc, oi, _ := o.Pair()
		if kc != oc {
			return kc < oc
		}
		return ki < oi
	}
	return k.v < o.v
}

// ParseKey parses the text form of a key: "123" or "-5" for a bigint key;
// "1,2" or "(1,2)" for a pair key. Spaces around the numbers are allowed.
// It is the inverse of [Key.String]. Any other text, or a number out of
// range for its form, gives an error wrapping [ErrInvalidKey] that says what
// was wrong.
func ParseKey(s string) (Key, error) {
	t := strings.TrimSpace(s)
	if t == "" {
		return Key{}, keyError(s, "empty text")
	}
	open, close := strings.HasPrefix(t, "("), strings.HasSuffix(t, ")")
	if open != close {
		return Key{}, keyError(s, "unbalanced parentheses")
	}
	if open {
		t = t[1 : len(t)-1]
	}
	parts := strings.Split(t, ",")
	switch len(parts) {
	case 1:
		if open {
			return Key{}, keyError(s, "parentheses need two numbers, as in (1,2)")
		}
		v, err := parseInt(parts[0], 64)
		if err != nil {
			return Key{}, keyError(s, "bigint key: "+err.Error())
		}
		return Int64(v), nil
	case 2:
		c, err := parseInt(parts[0], 32)
		if err != nil {
			return Key{}, keyError(s, "first number of a pair: "+err.Error())
		}
		i, err := parseInt(parts[1], 32)
		if err != nil {
			return Key{}, keyError(s, "second number of a pair: "+err.Error())
		}
		return Pair(int32(c), int32(i)), nil
	}
	return Key{}, keyError(s, "a key is one number or two numbers separated by a comma")
}

func parseInt(s string, bits int) (int64, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return 0, errors.New("missing number")
	}
	v, err := strconv.ParseInt(s, 10, bits)
	if err != nil {
		var ne *strconv.NumError
		if errors.As(err, &ne) && errors.Is(ne.Err, strconv.ErrRange) {
			return 0, fmt.Errorf("%s is out of range for int%d", clip(s, maxEchoed), bits)
		}
		return 0, fmt.Errorf("%q is not a decimal integer", clip(s, maxEchoed))
	}
	return v, nil
}

func keyError(s, why string) error {
	return fmt.Errorf("%w %q: %s", ErrInvalidKey, clip(s, maxEchoed), why)
}

// maxEchoed is how many bytes of a caller's text an error quotes.
const maxEchoed = 40

// clip cuts s to at most n bytes, on a UTF-8 boundary, marking a cut with
// "…".
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	i := n
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	return s[:i] + "…"
}

// sqlKey returns k as the core and its statements take it.
func (k Key) sqlKey() core.Key {
	c, i, pair := k.Pair()
	v, _ := k.Int64()
	return core.Key{Pair: pair, V: v, Class: c, ID: i}
}

// sqlKeys returns keys as the core takes them.
func sqlKeys(keys []Key) []core.Key {
	out := make([]core.Key, len(keys))
	for i, k := range keys {
		out[i] = k.sqlKey()
	}
	return out
}

// keyOf returns the Key of k, a key as the core has it.
func keyOf(k core.Key) Key {
	if k.Pair {
		return Pair(k.Class, k.ID)
	}
	return Int64(k.V)
}

// keysOf returns the Keys of keys.
func keysOf(keys []core.Key) []Key {
	out := make([]Key, len(keys))
	for i, k := range keys {
		out[i] = keyOf(k)
	}
	return out
}

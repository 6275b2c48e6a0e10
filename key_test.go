package sqllock

import (
	"errors"
	"math"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/sqllock/sqllock/internal/pglocks"
)

func TestKeyConstructors(t *testing.T) {
	tests := []struct {
		name     string
		key      Key
		str      string
		pair     bool
		v        int64
		class    int32
		id       int32
		classid  uint32
		objid    uint32
		objsubid int
	}{
		{name: "zero int64", key: Int64(0), str: "0", v: 0, objsubid: 1},
		{name: "positive", key: Int64(12345), str: "12345", v: 12345, objid: 12345, objsubid: 1},
		{name: "negative one", key: Int64(-1), str: "-1", v: -1, classid: math.MaxUint32, objid: math.MaxUint32, objsubid: 1},
		{name: "above 2^32", key: Int64(1<<40 + 5), str: "1099511627781", v: 1<<40 + 5, classid: 256, objid: 5, objsubid: 1},
		{name: "max", key: Int64(math.MaxInt64), str: "9223372036854775807", v: math.MaxInt64, classid: math.MaxInt32, objid: math.MaxUint32, objsubid: 1},
		{name: "min", key: Int64(math.MinInt64), str: "-9223372036854775808", v: math.MinInt64, classid: 1 << 31, objid: 0, objsubid: 1},
		{name: "pair", key: Pair(1, 2), str: "(1,2)", pair: true, class: 1, id: 2, classid: 1, objid: 2, objsubid: 2},
		{name: "pair zero", key: Pair(0, 0), str: "(0,0)", pair: true, objsubid: 2},
		{name: "pair negative", key: Pair(-1, -2), str: "(-1,-2)", pair: true, class: -1, id: -2, classid: math.MaxUint32, objid: math.MaxUint32 - 1, objsubid: 2},
		{name: "pair extremes", key: Pair(math.MinInt32, math.MaxInt32), str: "(-2147483648,2147483647)", pair: true, class: math.MinInt32, id: math.MaxInt32, classid: 1 << 31, objid: math.MaxInt32, objsubid: 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.key.String(); got != tt.str {
				t.Errorf("String() = %q, want %q", got, tt.str)
			}
			v, ok := tt.key.Int64()
			if ok == tt.pair || (ok && v != tt.v) {
				t.Errorf("Int64() = %d, %v; want %d, %v", v, ok, tt.v, !tt.pair)
			}
			c, i, ok := tt.key.Pair()
			if ok != tt.pair || (ok && (c != tt.class || i != tt.id)) {
				t.Errorf("Pair() = %d, %d, %v; want %d, %d, %v", c, i, ok, tt.class, tt.id, tt.pair)
			}
			cid, oid, sub := tt.key.lockTag()
			if cid != tt.classid || oid != tt.objid || sub != tt.objsubid {
				t.Errorf("lockTag() = %d, %d, %d; want %d, %d, %d", cid, oid, sub, tt.classid, tt.objid, tt.objsubid)
			}
			back, ok := keyFromLockTag(pglocks.Tag{Classid: cid, Objid: oid, Objsubid: sub})
			if !ok || back != tt.key {
				t.Errorf("keyFromLockTag(lockTag()) = %v, %v; want %v", back, ok, tt.key)
			}
			parsed, err := ParseKey(tt.str)
			if err != nil || parsed != tt.key {
				t.Errorf("ParseKey(%q) = %v, %v; want %v", tt.str, parsed, err, tt.key)
			}
		})
	}
}

func TestKeySpacesAreDisjoint(t *testing.T) {
	if Int64(1) == Pair(0, 1) {
		t.Fatal("Int64(1) == Pair(0, 1); the key spaces must differ")
	}
	if Int64(1<<32|7) == Pair(1, 7) {
		t.Fatal("Int64(1<<32|7) == Pair(1, 7); the key spaces must differ")
	}
	if err := (Key{}).valid(); !errors.Is(err, ErrInvalidKey) {
		t.Fatalf("Key{}.valid() = %v, want ErrInvalidKey", err)
	}
	if got := (Key{}).String(); got != "<invalid key>" {
		t.Fatalf("Key{}.String() = %q", got)
	}
	if _, ok := keyFromLockTag(pglocks.Tag{Classid: 1, Objid: 2, Objsubid: 3}); ok {
		t.Fatal("keyFromLockTag accepted objsubid 3")
	}
}

func TestHash(t *testing.T) {
	// Reference values of 64-bit FNV-1a (offset basis 14695981039346656037,
	// prime 1099511628211), computed independently of hash/fnv.
	ref := func(s string) uint64 {
		h := uint64(14695981039346656037)
		for i := 0; i < len(s); i++ {
			h ^= uint64(s[i])
			h *= 1099511628211
		}
		return h
	}
	tests := []struct {
		name string
		want uint64
	}{
		{"", 0xcbf29ce484222325},
		{"a", 0xaf63dc4c8601ec8c},
		{"foobar", 0x85944171f73967e8},
		{"cron:reindex_posts", ref("cron:reindex_posts")},
		{"héllo", ref("héllo")},
	}
	for _, tt := range tests {
		if got, _ := Hash(tt.name).Int64(); uint64(got) != tt.want {
			t.Errorf("Hash(%q) = %d, want %d", tt.name, got, int64(tt.want))
		}
	}
	if Hash("a") == Hash("b") {
		t.Error("Hash(a) == Hash(b)")
	}
}

func TestParseKeyErrors(t *testing.T) {
	tests := []struct {
		in   string
		want string // part of the message
	}{
		{"", "empty"},
		{"   ", "empty"},
		{"abc", "not a decimal integer"},
		{"1.5", "not a decimal integer"},
		{"0x10", "not a decimal integer"},
		{"9223372036854775808", "out of range for int64"},
		{"-9223372036854775809", "out of range for int64"},
		{"(1,2", "unbalanced"},
		{"1,2)", "unbalanced"},
		{"(5)", "two numbers"},
		{"1,2,3", "one number or two"},
		{"1,", "missing number"},
		{",1", "missing number"},
		{"2147483648,1", "out of range for int32"},
		{"1,-2147483649", "out of range for int32"},
		{"(a,1)", "first number"},
		{"(1,b)", "second number"},
	}
	for _, tt := range tests {
		_, err := ParseKey(tt.in)
		if !errors.Is(err, ErrInvalidKey) {
			t.Errorf("ParseKey(%q) error = %v, want ErrInvalidKey", tt.in, err)
			continue
		}
		if !strings.Contains(err.Error(), tt.want) {
			t.Errorf("ParseKey(%q) error = %q, want it to mention %q", tt.in, err, tt.want)
		}
	}
	ok := map[string]Key{" 42 ": Int64(42), "1, 2": Pair(1, 2), "( -3 , 4 )": Pair(-3, 4), "+7": Int64(7)}
	for in, want := range ok {
		if got, err := ParseKey(in); err != nil || got != want {
			t.Errorf("ParseKey(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
}

func FuzzParseKey(f *testing.F) {
	for _, s := range []string{"0", "-1", "123", "(1,2)", "1,2", "9223372036854775807", "(-2147483648,2147483647)", "", "(", "1,2,3", " 5 "} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		k, err := ParseKey(s)
		if err != nil {
			if !errors.Is(err, ErrInvalidKey) {
				t.Fatalf("ParseKey(%q) error %v does not wrap ErrInvalidKey", s, err)
			}
			return
		}
		back, err := ParseKey(k.String())
		if err != nil || back != k {
			t.Fatalf("ParseKey(%q) = %v; ParseKey(String()) = %v, %v", s, k, back, err)
		}
	})
}

func TestKeyLess(t *testing.T) {
	ordered := []Key{Int64(math.MinInt64), Int64(-1), Int64(0), Int64(1 << 40), Pair(-5, 0), Pair(-5, 3), Pair(0, -1), Pair(2, 1)}
	for i := range ordered {
		for j := range ordered {
			if got := ordered[i].less(ordered[j]); got != (i < j) {
				t.Errorf("%v.less(%v) = %v, want %v", ordered[i], ordered[j], got, i < j)
			}
		}
	}
}

// TestParseKeyErrorIsShort: the error quotes at most a short prefix of the
// text, cut on a character boundary.
func TestParseKeyErrorIsShort(t *testing.T) {
	for _, in := range []string{strings.Repeat("9", 10000), strings.Repeat("é", 5000), "1," + strings.Repeat("x", 3000)} {
		_, err := ParseKey(in)
		if !errors.Is(err, ErrInvalidKey) {
			t.Fatalf("ParseKey(%d bytes) = %v, want ErrInvalidKey", len(in), err)
		}
		if msg := err.Error(); len(msg) > 200 || !utf8.ValidString(msg) {
			t.Fatalf("ParseKey(%d bytes) error is %d bytes (valid UTF-8: %v): %.120q", len(in), len(msg), utf8.ValidString(msg), msg)
		}
	}
}

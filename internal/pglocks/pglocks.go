// Package pglocks decodes advisory locks read from pg_locks (with
// sqltext.OwnSQL): the one decoding of lock tags that the sqllock and
// poolguard packages share.
package pglocks

import (
	"database/sql/driver"
	"strconv"
)

// Row is one row of sqltext.OwnSQL: a lock, or, with a zero Tag, the one
// row of a session that has none.
type Row struct {
	PID     int64
	Tag     Tag
	Shared  bool // ShareLock; otherwise ExclusiveLock
	Granted bool // false: still waiting
}

// Scan reads a row of sqltext.OwnSQL from the values a driver returned.
func Scan(v []driver.Value) Row {
	g, _ := v[5].(bool)
	return Row{
		PID:     Int(v[0]),
		Tag:     Tag{Classid: uint32(Int(v[1])), Objid: uint32(Int(v[2])), Objsubid: int(Int(v[3]))},
		Shared:  Text(v[4]) == "ShareLock",
		Granted: g,
	}
}

// Tag is how pg_locks stores an advisory key: classid and objid (oid
// columns, so negative halves read as values of 2^31 and above) and
// objsubid, 1 for the bigint form and 2 for the (int4, int4) form.
type Tag struct {
	Classid, Objid uint32
	Objsubid       int
}

// Objsubid values of the two key forms.
const (
	Bigint = 1
	Pair   = 2
)

// BigintKey returns the bigint key of a Tag of the bigint form:
// classid << 32 | objid, read as a signed 64-bit number.
func (t Tag) BigintKey() int64 { return int64(uint64(t.Classid)<<32 | uint64(t.Objid)) }

// PairKey returns the two int4 keys of a Tag of the pair form.
func (t Tag) PairKey() (class, id int32) { return int32(t.Classid), int32(t.Objid) }

// Int converts an integer column as drivers return it (int64, int32, or
// text) to int64; anything else is 0.
func Int(v driver.Value) int64 {
	switch n := v.(type) {
	case int64:
		return n
	case int32:
		return int64(n)
	case []byte:
		i, _ := strconv.ParseInt(string(n), 10, 64)
		return i
	case string:
		i, _ := strconv.ParseInt(n, 10, 64)
		return i
	}
	return 0
}

// Text converts a text column as drivers return it (string or []byte).
func Text(v driver.Value) string {
	switch s := v.(type) {
	case string:
		return s
	case []byte:
		return string(s)
	}
	return ""
}

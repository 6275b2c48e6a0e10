package stmt

import (
	"github.com/sqllock/sqllock/internal/pglocks"
	"github.com/sqllock/sqllock/internal/sqltext"
)

// Tag returns how PostgreSQL stores k in pg_locks: classid, objid (both
// unsigned 32-bit) and objsubid.
func Tag(k sqltext.Key) (classid, objid uint32, objsubid int) {
	if k.Pair {
		return uint32(k.Class), uint32(k.ID), pglocks.Pair
	}
	return uint32(uint64(k.V) >> 32), uint32(k.V), pglocks.Bigint
}

// KeyOfTag is the inverse of Tag. It returns false for an objsubid that is
// not an advisory form.
func KeyOfTag(t pglocks.Tag) (sqltext.Key, bool) {
	switch t.Objsubid {
	case pglocks.Bigint:
		return sqltext.Key{V: t.BigintKey()}, true
	case pglocks.Pair:
		c, i := t.PairKey()
		return sqltext.Key{Pair: true, Class: c, ID: i}, true
	}
	return sqltext.Key{}, false
}

package core

import (
	"github.com/sqllock/sqllock/internal/pglocks"
	"github.com/sqllock/sqllock/internal/sqltext"
)

// Key is an advisory lock key as the core and its statements take it.
type Key = sqltext.Key

// Kind is what a lock call asks for: one of PostgreSQL's eight advisory
// lock functions.
type Kind = sqltext.Kind

// statements are a Pool's session-level statements (see sqltext).
type statements = sqltext.Statements

// Tag returns how PostgreSQL stores k in pg_locks: classid, objid (both
// unsigned 32-bit) and objsubid.
func Tag(k Key) (classid, objid uint32, objsubid int) {
	if k.Pair {
		return uint32(k.Class), uint32(k.ID), pglocks.Pair
	}
	return uint32(uint64(k.V) >> 32), uint32(k.V), pglocks.Bigint
}

// KeyOfTag is the inverse of Tag. It returns false for an objsubid that is
// not an advisory form.
func KeyOfTag(t pglocks.Tag) (Key, bool) {
	switch t.Objsubid {
	case pglocks.Bigint:
		return Key{V: t.BigintKey()}, true
	case pglocks.Pair:
		c, i := t.PairKey()
		return Key{Pair: true, Class: c, ID: i}, true
	}
	return Key{}, false
}

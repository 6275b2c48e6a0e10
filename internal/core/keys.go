package core

import (
	"github.com/sqllock/sqllock/internal/sqltext"
)

// Key is an advisory lock key as the core and its statements take it.
type Key = sqltext.Key

// Kind is what a lock call asks for: one of PostgreSQL's eight advisory
// lock functions.
type Kind = sqltext.Kind

// statements are a Pool's session-level statements (see sqltext).
type statements = sqltext.Statements

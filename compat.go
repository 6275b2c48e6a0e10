package sqllock

import (
	"hash/crc32"
	"strings"
)

// Keys compatible with other tools. Each function computes the key another
// ecosystem uses for the same resource, so a Go program can take (or wait
// for) exactly the lock that a Ruby, Python or migration tool takes.

// CRC32 returns the bigint key zlib.crc32(name) & 0x7FFFFFFFFFFFFFFF, the
// string-hash convention used by many Python code bases (and by the
// advisory-locks lesson this module grew from). Because CRC-32 has only 32
// bits, names collide far more often than with [Hash]; prefer Hash for new
// code and use CRC32 to interoperate.
func CRC32(name string) Key {
	return Int64(int64(crc32.ChecksumIEEE([]byte(name))))
}

// RubyAdvisoryLock returns the pair key that the Ruby gem with_advisory_lock
// uses on PostgreSQL for lock name name: (crc32(name) & 0x7fffffff,
// prefix & 0x7fffffff), where prefix is the integer value of the gem's
// WITH_ADVISORY_LOCK_PREFIX environment variable (Ruby's String#to_i; 0 when
// it is unset).
func RubyAdvisoryLock(name string, prefix int64) Key {
	return Pair(int32(crc32.ChecksumIEEE([]byte(name))&0x7fffffff), int32(prefix&0x7fffffff))
}

// railsMigratorSalt is ActiveRecord::Migrator::MIGRATOR_SALT.
const railsMigratorSalt = 2053462845

// RailsMigration returns the bigint key Rails (ActiveRecord) takes while it
// runs migrations against the database named database:
// MIGRATOR_SALT (2053462845) × crc32(database). The product always fits in a
// bigint.
func RailsMigration(database string) Key {
	return Int64(railsMigratorSalt * int64(crc32.ChecksumIEEE([]byte(database))))
}

// Goose returns the bigint key of goose v3's session locker
// (lock.DefaultLockID, 4097083626): the CRC-32 of the text "goose".
func Goose() Key { return CRC32("goose") }

// golangMigrateSalt is advisoryLockIDSalt in golang-migrate's database
// package.
const golangMigrateSalt = 1486364155

// GolangMigrate returns the bigint key golang-migrate v4's postgres driver
// takes for a migrations table: the CRC-32 of schema, table and database
// joined by NUL bytes, multiplied by 1486364155 in 32-bit unsigned
// arithmetic. With the driver's defaults, schema is "public" (the current
// schema) and table is "schema_migrations".
func GolangMigrate(database, schema, table string) Key {
	s := strings.Join([]string{schema, table, database}, "\x00")
	return Int64(int64(crc32.ChecksumIEEE([]byte(s)) * golangMigrateSalt))
}

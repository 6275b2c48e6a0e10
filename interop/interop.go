// Package interop computes the advisory lock keys that other tools use for
// the same resource, so that a Go program can take (or wait for) exactly
// the lock a Ruby, Python or migration tool takes: Python's CRC-32 names,
// Ruby's with_advisory_lock, Rails migrations, goose and golang-migrate.
// Each function has a test vector computed from the other tool's
// published algorithm.
package interop

import (
	"fmt"
	"hash/crc32"
	"net/url"
	"regexp"
	"strconv"
	"strings"

	"github.com/sqllock/sqllock"
)

// CRC32 returns the bigint key zlib.crc32(name) & 0x7FFFFFFFFFFFFFFF, the
// string-hash convention used by many Python code bases. Because CRC-32 has only 32
// bits, names collide far more often than with [sqllock.Hash]; prefer Hash for new
// code and use CRC32 to interoperate.
func CRC32(name string) sqllock.Key {
	return sqllock.Int64(int64(crc32.ChecksumIEEE([]byte(name))))
}

// RubyAdvisoryLock returns the pair key that the Ruby gem with_advisory_lock
// uses on PostgreSQL for lock name name: (crc32(name) & 0x7fffffff,
// prefix & 0x7fffffff), where prefix is the integer value of the gem's
// WITH_ADVISORY_LOCK_PREFIX environment variable (Ruby's String#to_i; 0 when
// it is unset).
func RubyAdvisoryLock(name string, prefix int64) sqllock.Key {
	return sqllock.Pair(int32(crc32.ChecksumIEEE([]byte(name))&0x7fffffff), int32(prefix&0x7fffffff))
}

// RubyAdvisoryLockID returns the pair key with_advisory_lock uses for an
// Integer lock name: the gem takes an Integer as is, without CRC-32:
// (id & 0x7fffffff, prefix & 0x7fffffff).
func RubyAdvisoryLockID(id, prefix int64) sqllock.Key {
	return sqllock.Pair(int32(id&0x7fffffff), int32(prefix&0x7fffffff))
}

// railsMigratorSalt is ActiveRecord::Migrator::MIGRATOR_SALT.
const railsMigratorSalt = 2053462845

// RailsMigration returns the bigint key Rails (ActiveRecord) takes while it
// runs migrations against the database named database:
// MIGRATOR_SALT (2053462845) × crc32(database). The product always fits in a
// bigint.
func RailsMigration(database string) sqllock.Key {
	return sqllock.Int64(railsMigratorSalt * int64(crc32.ChecksumIEEE([]byte(database))))
}

// Goose returns the bigint key of goose v3's session locker
// (lock.DefaultLockID, 4097083626): the CRC-32 of the text "goose".
func Goose() sqllock.Key { return CRC32("goose") }

// golangMigrateSalt is advisoryLockIDSalt in golang-migrate's database
// package.
const golangMigrateSalt = 1486364155

// GolangMigrate returns the bigint key golang-migrate v4's postgres, pgx
// and pgx/v5 drivers take for a migrations table: the CRC-32 of schema,
// table and database joined by NUL bytes, multiplied by 1486364155 in
// 32-bit unsigned arithmetic. With the drivers' defaults, schema is
// "public" (the current schema) and table is "schema_migrations".
//
// database is what the driver was given, which depends on how it was
// opened: a driver made with WithInstance (from a *sql.DB) uses
// current_database(), such as "mydb"; one opened from a URL, as migrate.New
// and the migrate command do, uses the URL's path with its leading slash,
// "/mydb". For the second, use [GolangMigrateURL] with the same URL.
func GolangMigrate(database, schema, table string) sqllock.Key {
	s := strings.Join([]string{schema, table, database}, "\x00")
	return sqllock.Int64(int64(crc32.ChecksumIEEE([]byte(s)) * golangMigrateSalt))
}

// GolangMigrateURL returns the key that golang-migrate v4 takes when it is
// opened from rawURL (migrate.New, the migrate command; postgres://,
// postgresql://, pgx:// and pgx5:// URLs): the database is the URL's path,
// leading slash included; the table is x-migrations-table
// (schema_migrations by default); the schema is the one named in a quoted
// x-migrations-table ("schema"."table", with x-migrations-table-quoted=true),
// else the first schema of a search_path parameter in the URL, else
// "public". golang-migrate itself reads current_schema() from the server:
// if your role's search_path makes that something else, use
// [GolangMigrate] with the exact values.
func GolangMigrateURL(rawURL string) (sqllock.Key, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return sqllock.Key{}, fmt.Errorf("sqllock: golang-migrate URL: %w", err)
	}
	q := u.Query()
	table := q.Get("x-migrations-table")
	if table == "" {
		table = "schema_migrations"
	}
	schema := "public"
	if sp := q.Get("search_path"); sp != "" {
		first, _, _ := strings.Cut(sp, ",")
		if first = strings.Trim(strings.TrimSpace(first), `"`); first != "" && first != "$user" {
			schema = first
		}
	}
	if quoted, _ := strconv.ParseBool(q.Get("x-migrations-table-quoted")); quoted {
		parts := quotedNames.FindAllStringSubmatch(table, -1)
		switch len(parts) {
		case 1:
			table = parts[0][1]
		case 2:
			schema, table = parts[0][1], parts[1][1]
		default:
			return sqllock.Key{}, fmt.Errorf("sqllock: golang-migrate URL: x-migrations-table %q is not \"table\" or \"schema\".\"table\"", table)
		}
	}
	return GolangMigrate(u.Path, schema, table), nil
}

// quotedNames finds the double-quoted names of a quoted x-migrations-table.
var quotedNames = regexp.MustCompile(`"(.*?)"`)

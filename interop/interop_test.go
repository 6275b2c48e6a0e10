package interop_test

import (
	"testing"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/interop"
)

func TestCompatibleKeys(t *testing.T) {
	tests := []struct {
		name string
		got  sqllock.Key
		want sqllock.Key
	}{
		// The IEEE CRC-32 check value, and zlib.crc32(b"cron:reindex_posts") in Python.
		{"CRC32 check value", interop.CRC32("123456789"), sqllock.Int64(0xCBF43926)},
		{"CRC32 empty", interop.CRC32(""), sqllock.Int64(0)},
		{"CRC32 cron name", interop.CRC32("cron:reindex_posts"), sqllock.Int64(3230921880)},
		// goose v3 lock.DefaultLockID.
		{"goose default", interop.Goose(), sqllock.Int64(4097083626)},
		// with_advisory_lock: [Zlib.crc32(name), prefix.to_i].map { |ea| ea & 0x7fffffff }.
		// Zlib.crc32("123456789") = 3421780262 = 0xCBF43926; & 0x7fffffff = 1274296614.
		{"ruby with_advisory_lock", interop.RubyAdvisoryLock("123456789", 0), sqllock.Pair(1274296614, 0)},
		{"ruby with_advisory_lock prefix", interop.RubyAdvisoryLock("123456789", 1<<31+5), sqllock.Pair(1274296614, 5)},
		// Rails: MIGRATOR_SALT * Zlib.crc32("123456789") = 2053462845 * 3421780262.
		{"rails migrations", interop.RailsMigration("123456789"), sqllock.Int64(7026498631771365390)},
		{"rails migrations production", interop.RailsMigration("production"), sqllock.Int64(7301231183495299680)},
		// golang-migrate: zlib.crc32(b"public\0schema_migrations\0db") * 1486364155 % 2**32 in Python.
		{"golang-migrate", interop.GolangMigrate("db", "public", "schema_migrations"), sqllock.Int64(3256993429)},
		{"golang-migrate sqllock", interop.GolangMigrate("sqllock", "public", "schema_migrations"), sqllock.Int64(2790166279)},
		// with_advisory_lock takes an Integer name as is: [42, 0] & 0x7fffffff.
		{"ruby with_advisory_lock Integer", interop.RubyAdvisoryLockID(42, 0), sqllock.Pair(42, 0)},
		{"ruby with_advisory_lock negative Integer", interop.RubyAdvisoryLockID(-1, 7), sqllock.Pair(0x7fffffff, 7)},
	}
	for _, tt := range tests {
		if tt.got != tt.want {
			t.Errorf("%s: got %v, want %v", tt.name, tt.got, tt.want)
		}
	}
}

// TestGolangMigrateURL: opened from a URL, golang-migrate names the database
// by the URL's path, leading slash included. The bench module checks these
// against golang-migrate's own code and a real migrate.New.
func TestGolangMigrateURL(t *testing.T) {
	tests := []struct {
		url  string
		want sqllock.Key
	}{
		{"postgres://u:p@h:5432/db?sslmode=disable", interop.GolangMigrate("/db", "public", "schema_migrations")},
		{"pgx5://h/db?x-migrations-table=mig", interop.GolangMigrate("/db", "public", "mig")},
		{"postgres://h/db?search_path=app,public", interop.GolangMigrate("/db", "app", "schema_migrations")},
		{`postgres://h/db?x-migrations-table="s"."t"&x-migrations-table-quoted=1`, interop.GolangMigrate("/db", "s", "t")},
	}
	for _, tt := range tests {
		got, err := interop.GolangMigrateURL(tt.url)
		if err != nil || got != tt.want {
			t.Errorf("interop.GolangMigrateURL(%q) = %v, %v; want %v", tt.url, got, err, tt.want)
		}
	}
	if interop.GolangMigrate("/db", "public", "schema_migrations") == interop.GolangMigrate("db", "public", "schema_migrations") {
		t.Fatal("the two ways of opening should give different keys")
	}
	if _, err := interop.GolangMigrateURL("postgres://h/db?x-migrations-table=a.b&x-migrations-table-quoted=true"); err == nil {
		t.Error("an unquoted table with x-migrations-table-quoted = nil error")
	}
}

package sqllock

import "testing"

func TestCompatibleKeys(t *testing.T) {
	tests := []struct {
		name string
		got  Key
		want Key
	}{
		// The IEEE CRC-32 check value, and zlib.crc32(b"cron:reindex_posts") in Python.
		{"CRC32 check value", CRC32("123456789"), Int64(0xCBF43926)},
		{"CRC32 empty", CRC32(""), Int64(0)},
		{"CRC32 cron name", CRC32("cron:reindex_posts"), Int64(3230921880)},
		// goose v3 lock.DefaultLockID.
		{"goose default", Goose(), Int64(4097083626)},
		// with_advisory_lock: [Zlib.crc32(name), prefix.to_i].map { |ea| ea & 0x7fffffff }.
		// Zlib.crc32("123456789") = 3421780262 = 0xCBF43926; & 0x7fffffff = 1274296614.
		{"ruby with_advisory_lock", RubyAdvisoryLock("123456789", 0), Pair(1274296614, 0)},
		{"ruby with_advisory_lock prefix", RubyAdvisoryLock("123456789", 1<<31+5), Pair(1274296614, 5)},
		// Rails: MIGRATOR_SALT * Zlib.crc32("123456789") = 2053462845 * 3421780262.
		{"rails migrations", RailsMigration("123456789"), Int64(7026498631771365390)},
		{"rails migrations production", RailsMigration("production"), Int64(7301231183495299680)},
		// golang-migrate: zlib.crc32(b"public\0schema_migrations\0db") * 1486364155 % 2**32 in Python.
		{"golang-migrate", GolangMigrate("db", "public", "schema_migrations"), Int64(3256993429)},
		{"golang-migrate sqllock", GolangMigrate("sqllock", "public", "schema_migrations"), Int64(2790166279)},
		// with_advisory_lock takes an Integer name as is: [42, 0] & 0x7fffffff.
		{"ruby with_advisory_lock Integer", RubyAdvisoryLockID(42, 0), Pair(42, 0)},
		{"ruby with_advisory_lock negative Integer", RubyAdvisoryLockID(-1, 7), Pair(0x7fffffff, 7)},
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
		want Key
	}{
		{"postgres://u:p@h:5432/db?sslmode=disable", GolangMigrate("/db", "public", "schema_migrations")},
		{"pgx5://h/db?x-migrations-table=mig", GolangMigrate("/db", "public", "mig")},
		{"postgres://h/db?search_path=app,public", GolangMigrate("/db", "app", "schema_migrations")},
		{`postgres://h/db?x-migrations-table="s"."t"&x-migrations-table-quoted=1`, GolangMigrate("/db", "s", "t")},
	}
	for _, tt := range tests {
		got, err := GolangMigrateURL(tt.url)
		if err != nil || got != tt.want {
			t.Errorf("GolangMigrateURL(%q) = %v, %v; want %v", tt.url, got, err, tt.want)
		}
	}
	if GolangMigrate("/db", "public", "schema_migrations") == GolangMigrate("db", "public", "schema_migrations") {
		t.Fatal("the two ways of opening should give different keys")
	}
	if _, err := GolangMigrateURL("postgres://h/db?x-migrations-table=a.b&x-migrations-table-quoted=true"); err == nil {
		t.Error("an unquoted table with x-migrations-table-quoted = nil error")
	}
}

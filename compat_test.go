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
		{"CRC32 lesson name", CRC32("cron:reindex_posts"), Int64(3230921880)},
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
	}
	for _, tt := range tests {
		if tt.got != tt.want {
			t.Errorf("%s: got %v, want %v", tt.name, tt.got, tt.want)
		}
	}
}

package pgtest

import (
	"context"
	"database/sql"
	"fmt"
	"time"
)

// CreateDatabase creates a new database owned by Role and returns its name.
func (s *Server) CreateDatabase(ctx context.Context, prefix string) (string, error) {
	name := s.newName(prefix)
	db, err := s.Admin()
	if err != nil {
		return "", err
	}
	defer db.Close()
	owner := ""
	if s.external == "" {
		owner = " OWNER " + Role
	}
	if _, err := db.ExecContext(ctx, `CREATE DATABASE "`+name+`"`+owner); err != nil {
		return "", fmt.Errorf("pgtest: create database %s: %w", name, err)
	}
	return name, nil
}

// DropDatabase drops a database made by CreateDatabase, ending its sessions.
func (s *Server) DropDatabase(ctx context.Context, name string) error {
	db, err := s.Admin()
	if err != nil {
		return err
	}
	defer db.Close()
	_, err = db.ExecContext(ctx, `DROP DATABASE IF EXISTS "`+name+`" WITH (FORCE)`)
	return err
}

// newName returns a database name that no other database of the server's
// tests has.
func (s *Server) newName(prefix string) string {
	s.mu.Lock()
	s.dbSeq++
	n := s.dbSeq
	s.mu.Unlock()
	name := fmt.Sprintf("t%d_%s", n, sanitize(prefix))
	if s.external != "" {
		// Several test processes may share an external server.
		name = fmt.Sprintf("t%d_%s_%s", n, randomHex(4), sanitize(prefix))
	}
	if len(name) > 60 {
		name = name[:60]
	}
	return name
}

// takeDatabase renames a database that a test handed back clean to a name
// for prefix, or returns "" when there is none. Creating a database copies
// its template, and dropping one makes every backend pass a barrier; a
// rename changes one catalog row.
func (s *Server) takeDatabase(ctx context.Context, prefix string) string {
	s.mu.Lock()
	if len(s.free) == 0 {
		s.mu.Unlock()
		return ""
	}
	old := s.free[len(s.free)-1]
	s.free = s.free[:len(s.free)-1]
	s.mu.Unlock()
	name := s.newName(prefix)
	if err := s.adminExec(ctx, `ALTER DATABASE "`+old+`" RENAME TO "`+name+`"`); err != nil {
		s.DropDatabase(ctx, old)
		return ""
	}
	return name
}

// giveBack keeps database name for a later test when its test left it as
// it was made: no objects, no settings of its own, no prepared
// transactions. It ends the database's sessions and renames it, so that
// a client of the test still about can no longer reach it. It reports
// whether it kept the database; the caller drops it otherwise.
func (s *Server) giveBack(ctx context.Context, name string) bool {
	var clean bool
	if err := s.adminQuery(ctx, s.AdminDSN(), `
		SELECT d.datconnlimit = -1 AND d.datallowconn
		   AND NOT EXISTS (SELECT FROM pg_db_role_setting WHERE setdatabase = d.oid)
		   AND NOT EXISTS (SELECT FROM pg_prepared_xacts WHERE database = d.datname)
		  FROM pg_database d WHERE d.datname = $1`, &clean, name); err != nil || !clean {
		return false
	}
	// Objects made in it (the schema of a session's temporary tables stays
	// once made, and is empty when the session ends).
	if err := s.adminQuery(ctx, s.AdminDSNFor(name), `
		SELECT NOT EXISTS (SELECT FROM pg_class WHERE oid >= 16384)
		   AND NOT EXISTS (SELECT FROM pg_proc WHERE oid >= 16384)
		   AND NOT EXISTS (SELECT FROM pg_type WHERE oid >= 16384)
		   AND NOT EXISTS (SELECT FROM pg_namespace WHERE oid >= 16384 AND nspname !~ '^pg_(toast_)?temp_')`,
		&clean); err != nil || !clean {
		return false
	}
	if err := s.adminExec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()`, name); err != nil {
		return false
	}
	// The server renames a database only when no session is on it (it
	// waits a few seconds for ended ones to exit): once renamed, the
	// database has no session, and so no advisory lock.
	free := s.newName("free")
	if err := s.adminExec(ctx, `ALTER DATABASE "`+name+`" RENAME TO "`+free+`"`); err != nil {
		return false
	}
	s.mu.Lock()
	s.free = append(s.free, free)
	s.mu.Unlock()
	return true
}

// dropFree drops the databases kept for reuse (an external server's; a
// local one's go with its files).
func (s *Server) dropFree() {
	s.mu.Lock()
	free := s.free
	s.free = nil
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, name := range free {
		s.DropDatabase(ctx, name)
	}
}

func (s *Server) adminExec(ctx context.Context, query string, args ...any) error {
	db, err := s.Admin()
	if err != nil {
		return err
	}
	defer db.Close()
	_, err = db.ExecContext(ctx, query, args...)
	return err
}

func (s *Server) adminQuery(ctx context.Context, dsn, query string, dest any, args ...any) error {
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	return db.QueryRowContext(ctx, query, args...).Scan(dest)
}

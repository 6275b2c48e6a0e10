package pgtest

import (
	"context"
	"database/sql"
	"fmt"
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

// takeDatabase renames a database that a test handed back as it was made
// to a name for prefix, or returns "" when there is none. Creating a
// database copies its template, and dropping one makes every backend pass
// a barrier; a rename changes one catalog row.
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

// giveBack keeps database name, made by CreateDatabase, for a later test
// when its test left it as it was made. It returns the database's name
// now and whether it kept it; the caller drops it otherwise. Only a local
// cluster's databases are kept: they go with its files, whatever happens
// to the process.
//
// It ends the database's sessions and renames it at once, so that no
// client of the test can reach it any more (the server renames a
// database only when no session is on it, waiting a few seconds for ended
// ones to exit: renamed, it has no session, and so no advisory lock); then
// it compares the database with a new one (fingerprint).
func (s *Server) giveBack(ctx context.Context, name string) (string, bool) {
	if s.local == nil {
		return name, false
	}
	if err := s.adminExec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()`, name); err != nil {
		return name, false
	}
	free := s.newName("free")
	if err := s.adminExec(ctx, `ALTER DATABASE "`+name+`" RENAME TO "`+free+`"`); err != nil {
		return name, false
	}
	if fp, err := s.fingerprint(ctx, free); err != nil || fp != s.pristine(ctx) {
		return free, false
	}
	s.mu.Lock()
	s.free = append(s.free, free)
	s.mu.Unlock()
	return free, true
}

// pristine is the fingerprint of a database as CreateDatabase makes it,
// taken once per server ("" when it cannot be had: nothing is then kept).
func (s *Server) pristine(ctx context.Context) string {
	s.freshMu.Lock()
	defer s.freshMu.Unlock()
	if s.fresh == "" {
		if name, err := s.CreateDatabase(ctx, "pristine"); err == nil {
			s.fresh, _ = s.fingerprint(ctx, name)
			s.DropDatabase(ctx, name)
		}
	}
	return s.fresh
}

// fingerprint describes what a test can leave in database name: every
// object of its own (a row with an oid past the initial ones in any of the
// database's catalogs, bar the schemas that hold temporary tables, which
// stay once made and are emptied as their session ends), comments, the
// privileges and owner of the database and of its public schema, its
// settings and flags, and prepared transactions.
func (s *Server) fingerprint(ctx context.Context, name string) (string, error) {
	db, err := sql.Open("pgx", s.AdminDSNFor(name))
	if err != nil {
		return "", err
	}
	defer db.Close()
	var objects string
	if err := db.QueryRowContext(ctx, `
		SELECT string_agg(format('(SELECT count(*) FROM pg_catalog.%I WHERE oid >= 16384%s)', c.relname,
		           CASE c.relname WHEN 'pg_namespace' THEN $$ AND nspname !~ '^pg_(toast_)?temp_'$$ ELSE '' END), ' + ')
		  FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid AND a.attname = 'oid'
		 WHERE c.relnamespace = 'pg_catalog'::regnamespace AND c.relkind = 'r' AND NOT c.relisshared`).Scan(&objects); err != nil {
		return "", err
	}
	var fp string
	err = db.QueryRowContext(ctx, `
		SELECT concat_ws(' | ', `+objects+`,
		       (SELECT md5(string_agg(concat_ws(':', classoid, objoid, objsubid, description), ',' ORDER BY classoid, objoid, objsubid)) FROM pg_description),
		       (SELECT nspowner::text || coalesce(nspacl::text, '') FROM pg_namespace WHERE nspname = 'public'),
		       (SELECT concat_ws(',', datdba, datacl, datistemplate, datallowconn, datconnlimit) FROM pg_database WHERE datname = current_database()),
		       (SELECT count(*) FROM pg_db_role_setting WHERE setdatabase = (SELECT oid FROM pg_database WHERE datname = current_database())),
		       (SELECT count(*) FROM pg_shdescription WHERE objoid = (SELECT oid FROM pg_database WHERE datname = current_database())),
		       (SELECT count(*) FROM pg_prepared_xacts WHERE database = current_database()))`).Scan(&fp)
	return fp, err
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

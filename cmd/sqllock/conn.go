package main

import (
	"context"
	"database/sql"
	"errors"
	"net"
	"net/url"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"
)

// dsnFrom returns the DSN to use: the flag, else DATABASE_URL, else "" (pgx
// then reads the libpq PG* environment variables).
func dsnFrom(flag string) string {
	if flag != "" {
		return flag
	}
	return os.Getenv("DATABASE_URL")
}

// maxAppName is the longest application_name PostgreSQL keeps
// (NAMEDATALEN - 1 bytes); a longer one can overflow the startup packet.
const maxAppName = 63

// connect opens a pool for dsn with application_name set, and checks within
// timeout (or ctx) that the server answers. Errors are exitErrors with a
// redacted DSN: an authentication failure is exitNoPerm, any other failure
// to reach the server exitUnavailable.
func connect(ctx context.Context, dsn, appName string, timeout time.Duration) (*sql.DB, error) {
	cfg, err := parseDSN(dsn, appName)
	if err != nil {
		return nil, err
	}
	return openConfig(ctx, cfg, timeout)
}

// parseDSN reads dsn, with application_name set; its error is an
// exitError with a redacted DSN (exitConfig).
func parseDSN(dsn, appName string) (*pgx.ConnConfig, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, fail(exitConfig, "bad DSN %s: %s", redact(dsn), redact(oneLine(err)))
	}
	cfg.RuntimeParams["application_name"] = clip(printable(appName), maxAppName)
	return cfg, nil
}

// openConfig opens a pool for cfg and checks within timeout (or ctx) that the
// server answers, with connect's errors.
func openConfig(ctx context.Context, cfg *pgx.ConnConfig, timeout time.Duration) (*sql.DB, error) {
	db := stdlib.OpenDB(*cfg)
	pctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := db.PingContext(pctx); err != nil {
		db.Close()
		addr := net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port)))
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && (pgErr.Code == "28P01" || pgErr.Code == "28000") {
			return nil, fail(exitNoPerm, "authentication failed at %s for user %q (database %q): %s",
				addr, cfg.User, cfg.Database, redact(oneLine(err)))
		}
		if pctx.Err() != nil && ctx.Err() == nil {
			return nil, fail(exitUnavailable, "cannot reach PostgreSQL at %s (database %q, user %q): no answer within --connect-timeout %v",
				addr, cfg.Database, cfg.User, timeout)
		}
		return nil, fail(exitUnavailable, "cannot reach PostgreSQL at %s (database %q, user %q): %s",
			addr, cfg.Database, cfg.User, redact(oneLine(err)))
	}
	return db, nil
}

// oneLine returns the innermost cause of err on one line, without the
// library prefix.
func oneLine(err error) string {
	for {
		u := errors.Unwrap(err)
		if u == nil {
			break
		}
		err = u
	}
	msg, _, _ := strings.Cut(err.Error(), "\n")
	return strings.TrimPrefix(strings.Join(strings.Fields(msg), " "), "sqllock: ")
}

var (
	urlPassword = regexp.MustCompile(`(://[^:/@\s]*:)[^@\s]*@`)
	kvPassword  = regexp.MustCompile(`(?i)(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S*)`)
)

// redact hides passwords in a DSN, or in text that may quote one.
func redact(s string) string {
	if u, err := url.Parse(s); err == nil && u.User != nil {
		if _, has := u.User.Password(); has {
			u.User = url.UserPassword(u.User.Username(), "xxxxx")
			q := u.Query()
			if q.Has("password") {
				q.Set("password", "xxxxx")
				u.RawQuery = q.Encode()
			}
			return u.Redacted()
		}
	}
	s = urlPassword.ReplaceAllString(s, "${1}xxxxx@")
	return kvPassword.ReplaceAllString(s, "${1}xxxxx")
}

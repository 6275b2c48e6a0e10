package pgtest

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"time"

	"github.com/ory/dockertest/v3"
)

// startDocker runs the postgres image when a Docker daemon answers.
func startDocker(ctx context.Context) (*Server, error) {
	pool, err := dockertest.NewPool("")
	if err != nil {
		return nil, err
	}
	if err := pool.Client.PingWithContext(ctx); err != nil {
		return nil, fmt.Errorf("no Docker daemon: %w", err)
	}
	adminPW := randomHex(12)
	res, err := pool.Run("postgres", "16", []string{"POSTGRES_PASSWORD=" + adminPW})
	if err != nil {
		return nil, err
	}
	_ = res.Expire(1800)
	port, _ := strconv.Atoi(res.GetPort("5432/tcp"))
	s := &Server{Host: "127.0.0.1", Port: port, adminUser: "postgres", adminPassword: adminPW, database: Role}
	s.closer = func() error { return pool.Purge(res) }
	pool.MaxWait = 2 * time.Minute
	if err := pool.Retry(func() error {
		db, err := sql.Open("pgx", s.AdminDSN())
		if err != nil {
			return err
		}
		defer db.Close()
		return db.PingContext(ctx)
	}); err != nil {
		s.Close()
		return nil, err
	}
	if err := s.bootstrap(ctx); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

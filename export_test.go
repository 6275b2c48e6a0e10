package sqllock

import "context"

// SetAfterBlindStatement makes f run after each statement on a blind
// driver (lib/pq) returns, before its result is handed over (see
// boundedRaw); the returned func takes f away.
func SetAfterBlindStatement(f func(ctx context.Context, err error, left func() bool)) (restore func()) {
	afterBlindStatement.Store(&f)
	return func() { afterBlindStatement.Store(nil) }
}

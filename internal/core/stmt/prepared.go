package stmt

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/sqllock/sqllock/internal/sqltext"
)

// Prepared statements, on a blind driver's shared sessions. A driver whose
// statements with arguments cost two round trips (lib/pq: an unnamed
// prepare, then the execution) gets each key rendered into the text of its
// statement (sqltext.Inline), which the server then parses and plans every
// time. A shared session that has sent preparedAfter of its plain
// statements (its single-key tries and unlocks, its batches) prepares
// each of their texts once instead (PREPARE, a round trip the first time)
// and from then on sends EXECUTE with the keys: still one round trip,
// the statement not planned again. A session that sends a few statements
// and idles, a cron job's, prepares none. Its statements are deallocated
// before the connection goes back to the pool: a session leaves as it
// came.
//
// They are named by SQL, with the session's owner mark, which no other
// session carries (the names a driver gives its own prepared statements
// repeat from one connection to the next, and one sent through a
// transaction pooler to a server session of another client's would run
// that client's statement): one that reaches another server session finds
// no statement of that name (SQLSTATE 26000), runs nothing, and the
// session ends with ErrSessionChanged.

// preparedAfter is how many plain statements a shared session sends before
// it prepares them.
const preparedAfter = 4

// Prepared is one session's prepared statements. Only the runner of the
// session's queue uses it, its statements under the core session's connMu (see its withConn); the
// session's end deallocates them, under connMu too.
type Prepared struct {
	prefix string            // of the names: the session's mark, made a name
	sent   int               // plain statements sent so far, up to preparedAfter
	names  map[string]string // by text: the name it was prepared as
}

// NewPrepared returns the prepared statements of a session marked mark.
func NewPrepared(mark string) *Prepared {
	return &Prepared{prefix: "sqllock_" + strings.NewReplacer(".", "_", "-", "_").Replace(mark)}
}

// Bound reports whether the next plain statement is to be sent bound and
// prepared, and counts it.
func (pr *Prepared) Bound() bool {
	if pr == nil {
		return false
	}
	if pr.sent < preparedAfter {
		pr.sent++
		return false
	}
	return true
}

// run runs q, with its arguments nv, on dc: when q has arguments and pr is
// not nil, as an EXECUTE of q prepared on dc (preparing it the first time),
// its arguments rendered into its text.
func (pr *Prepared) run(ctx context.Context, dc any, q string, nv []driver.NamedValue) (driver.Rows, error) {
	if pr == nil || len(nv) == 0 {
		return driverQuery(ctx, dc, q, nv)
	}
	name, ok := pr.names[q]
	if !ok {
		name = pr.prefix + "_" + strconv.Itoa(len(pr.names)+1)
		if err := execRows(driverQuery(ctx, dc, sqltext.PrepareSQL(name, q), nil)); err != nil {
			return nil, err
		}
		if pr.names == nil {
			pr.names = map[string]string{}
		}
		pr.names[q] = name
	}
	var b strings.Builder
	b.WriteString(sqltext.Marker(q)) // the statement's, as the server shows it
	b.WriteString("EXECUTE ")
	b.WriteString(name)
	for i, a := range nv {
		if i == 0 {
			b.WriteByte('(')
		} else {
			b.WriteString(", ")
		}
		if err := writeLiteral(&b, a.Value); err != nil {
			return nil, err
		}
	}
	b.WriteByte(')')
	rows, err := driverQuery(ctx, dc, b.String(), nil)
	if preparedMissing(err) {
		// Not the server session it was prepared on: nothing ran. (The
		// driver's error is quoted, not wrapped: its SQLSTATE would read
		// as the server's refusal of a statement that ran.)
		return nil, NewPoolerError(fmt.Sprintf("a statement prepared on the lock session's server session reached another, which does not have it (%v)", err))
	}
	return rows, err
}

// writeLiteral writes v, an argument of one of the library's statements
// (an integer, or a text it made: a mark, a number, an array literal of
// numbers and booleans), as a quoted literal, which EXECUTE converts to
// its parameter's type.
func writeLiteral(b *strings.Builder, v any) error {
	switch t := v.(type) {
	case int64:
		b.WriteByte('\'')
		b.WriteString(strconv.FormatInt(t, 10))
		b.WriteByte('\'')
	case string:
		if strings.ContainsAny(t, `'\`) {
			return fmt.Errorf("sqllock: argument %q cannot be rendered", t)
		}
		b.WriteByte('\'')
		b.WriteString(t)
		b.WriteByte('\'')
	default:
		return fmt.Errorf("sqllock: argument of type %T cannot be rendered", v)
	}
	return nil
}

// execRows closes the rows of a statement that returns none.
func execRows(rows driver.Rows, err error) error {
	if err != nil {
		return err
	}
	return rows.Close()
}

// Close deallocates the statements on conn, and reports whether the server
// confirmed it (the connection is otherwise not as it came). ctx bounds it
// (see BoundedRaw).
func (pr *Prepared) Close(ctx context.Context, blind *AbandonSet, conn *sql.Conn) error {
	if pr == nil || len(pr.names) == 0 {
		return nil
	}
	names := make([]string, 0, len(pr.names))
	for _, name := range pr.names {
		names = append(names, name)
	}
	q := sqltext.DeallocateSQL(names)
	pr.names = nil
	return BoundedRaw(ctx, blind, conn, func(dc any) error {
		err := execRows(driverQuery(ctx, dc, q, nil))
		if errors.Is(err, errNoFastPath) {
			return errors.New("sqllock: driver has no QueryerContext")
		}
		return err
	})
}

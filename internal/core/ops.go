// What a session's operations do on the server, once its runner sends
// them (see queue.go): tries, unlocks, and the two together; the answers
// read and what they mean for the session.

package core

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"slices"

	"github.com/sqllock/sqllock/internal/core/stmt"

	"github.com/sqllock/sqllock/internal/pglocks"
	"github.com/sqllock/sqllock/internal/sqltext"
)

// runMany sends ops (all unlocks, or all tries) in statements of up to
// BatchMax keys.
func (b *batcher) runMany(ops []*op, unlock bool) {
	s := b.s
	for len(ops) > 0 {
		n := min(len(ops), sqltext.BatchMax)
		if s.dead() {
			for _, o := range ops {
				o.err = s.err()
				s.answer(o)
			}
			return
		}
		switch {
		case unlock:
			s.runUnlocks(ops[:n])
		case n == 1:
			s.runTry(ops[0])
		case !s.tuned && s.tune() != nil:
			continue // failed, and so ended: the loop's next turn tells ops
		default:
			s.runTries(ops[:n])
		}
		ops = ops[n:]
	}
}

// answerOf are the answers of a single-key unlock, shared (read only): a
// call allocates none.
var answerOf = [2][]bool{{false}, {true}}

// sendUnlocks renders and sends every unlock statement of the core (as
// internal/layout's TestOnePlacePromises checks): it releases keys[:n] (in
// mode shared) on s's backend, and tries keys[n:], if any, in the same
// statement, after them (exclusive, on a shared session: see runMixed).
// It returns, by position, whether the server released, or granted, each
// (a slice its callers only read, and, when sc is given, only until sc's
// next batch: see stmt.Many). One unlock alone goes in the single-key
// statement (which also sets a dedicated session's settings back: the
// session is then no longer tuned); more, or unlocks with tries, in one
// batch, run on the backend only. ctx bounds the statement.
//
// sc is the session's scratch for the caller that runs its queue, nil for
// any other caller.
func (b *batcher) sendUnlocks(ctx context.Context, sc *scratch, keys []Key, n int, shared bool) ([]bool, error) {
	s := b.s
	if len(keys) == 1 && n == 1 {
		dedicated := s.kind == kindDedicated
		st := s.st
		if !dedicated {
			st, _ = s.plainSQL()
		}
		if sc == nil {
			sc = new(scratch)
		}
		q, args := st.UnlockSQLTo(sc.args[:0], shared, keys[0], sc.pidArg(s.pid))
		sc.ok = false
		err := s.queryRowCtx(ctx, q, args, &sc.ok)
		ok := sc.ok
		if errors.Is(err, sql.ErrNoRows) {
			err = stmt.SessionChanged(s.pid, 0) // another backend answered: it ran nothing
		}
		if err == nil && ok && dedicated {
			s.mu.Lock()
			s.tuned = false
			s.mu.Unlock()
		}
		return answerOf[stmt.B2i(ok)], err
	}
	query := func(q string, args []any, dest ...any) error {
		return s.queryRowCtx(ctx, q, args, dest...)
	}
	var bb *stmt.BatchBufs
	if sc != nil {
		bb = &sc.batch
	}
	_, mode := s.plainSQL()
	if n < len(keys) {
		return stmt.Batch(mode, query, sqltext.BatchMixed, n, s.pid, keys, bb)
	}
	return stmt.Many(mode, query, sqltext.BatchUnlock, s.pid, keys, bb)
}

// runUnlocks sends the unlocks ops; a failed statement ends the session
// (the server releases what it held as it ends).
func (b *batcher) runUnlocks(ops []*op) {
	s := b.s
	keys := s.scratch.keys[:]
	if len(ops) > len(keys) {
		keys = make([]Key, len(ops))
	}
	keys = keys[:len(ops)]
	shared := false
	for i, o := range ops {
		keys[i] = o.key
		shared = o.shared // a shared-mode unlock comes alone (a dedicated session's one lock)
	}
	got, err := s.sendUnlocks(s.p.UnlockContext(), &s.scratch, keys, len(keys), shared)
	for i, o := range ops {
		o.ok, o.err = got[i], err
	}
	if err != nil {
		s.discard(err)
	}
	for _, o := range ops {
		s.answer(o)
	}
}

// runTry sends one try: the single-key statement, the cheapest.
func (b *batcher) runTry(o *op) {
	s := b.s
	if !o.state.CompareAndSwap(opPending, opSent) {
		s.answer(o) // its caller left first: never sent
		return
	}
	// Until a try is granted on it, the session's settings are not
	// applied: its tries are a dedicated lock's, which apply them when
	// granted.
	st, plain := s.p.sql(), s.tuned
	switch {
	case plain && o.class != 0:
		st = s.p.plain // a polite try: a statement of its own kind
	case plain:
		st, _ = s.plainSQL()
	}
	sc := &s.scratch
	var q string
	var args []any
	if o.class != 0 {
		q, args = st.PoliteTrySQL(0, o.key, o.class, s.mark)
	} else {
		q, args = st.TrySQLTo(sc.args[:0], sqltext.Try, o.key, sc.markArg(s.mark))
	}
	ctx := o.cut // run by its caller (runSole)
	if ctx == nil {
		ctx = s.p.UnlockContext()
	}
	var err error
	sc.got, sc.gotPid, sc.standby = sql.NullBool{}, 0, false
	if plain {
		// On a session set up already the try answers whether it took
		// the key, only: the mark, compared in the statement, stands for
		// the backend, which was judged standby or not as it was set up
		// (a backend never becomes a standby).
		err = s.queryRowCtx(ctx, q, args, &sc.got, stmt.SkipRest)
		sc.gotPid = s.pid
	} else {
		err = s.queryRowCtx(ctx, q, args, &sc.got, &sc.gotPid, &sc.standby)
	}
	ok, pid, standby := sc.got, sc.gotPid, sc.standby
	o.ok = ok.Bool
	if err == nil && !ok.Valid {
		err = stmt.ForeignSession() // nothing was tried
	}
	if err == nil {
		err = s.sameBackend(pid, o.ok, o.key)
	}
	if err == nil {
		err = s.answered(pid, standby, o.ok && !s.tuned)
	}
	if err != nil && o.ok && standby {
		// Granted on a standby that is refused: released here, before
		// the call returns, not left to the discard (the server frees a
		// discarded session's locks a moment after the call).
		s.sendUnlocks(s.p.UnlockContext(), sc, []Key{o.key}, 1, false)
	}
	if err != nil {
		o.ok = false
		o.err = err
		// A try the server failed may have taken its key before it failed
		// (a statement that applies the settings fails after the grant;
		// session-level locks outlive a failed statement): released, as in
		// a batch, or the session goes.
		if !serverRefused(err) || s.releaseStray([]Key{o.key}) != nil {
			s.discard(err)
		}
	}
	s.answer(o)
}

// plainSQL returns the statements of a session set up already, for the
// next one sent on s, and how they send keys: bound, to run prepared, once
// s prepares its statements (see stmt's prepared.go), else as the Pool's do. The
// runner of s's queue calls it, once per statement.
func (b *batcher) plainSQL() (*statements, sqltext.Mode) {
	s := b.s
	if s.prep.Bound() {
		return s.p.bindPlain, sqltext.Bind
	}
	return s.p.plain, s.p.Mode
}

// answered records what a statement's answer says of the session: its
// backend pid (learnt from the first answer, the same in every later one),
// whether it is a standby (refused unless AllowStandby), and, when tuned,
// that its settings are now applied.
func (b *batcher) answered(pid int64, standby, tuned bool) error {
	s := b.s
	if s.pid != 0 && pid != s.pid {
		return stmt.SessionChanged(s.pid, pid)
	}
	if s.pid == 0 || tuned {
		s.mu.Lock()
		s.pid = pid
		s.tuned = s.tuned || tuned
		s.mu.Unlock()
	}
	if standby && !s.p.cfg.AllowStandby {
		// Discarded: what it took there goes with the session.
		return stmt.StandbyError("lock")
	}
	return nil
}

// tune applies the lock session's settings before a batch of tries (a
// single try applies them itself when granted); on failure the session
// ends.
func (b *batcher) tune() error {
	s := b.s
	var pid int64
	var standby bool
	q, args := s.p.sql().SessionSQL(s.mark)
	err := s.queryRow(q, args, &pid, &standby, stmt.Skip)
	if err == nil && pid == 0 {
		err = stmt.ForeignSession() // nothing was applied
	}
	if err == nil {
		err = s.sameBackend(pid, false, Key{})
	}
	if err == nil {
		err = s.answered(pid, standby, true)
	}
	if err != nil {
		s.discard(err)
	}
	return err
}

// serverRefused reports whether err is the server's own answer to a try
// statement (a full lock table, say): the statement failed as a whole;
// once what it may have taken is released (releaseStray), a certain answer
// touches that one call, and the session and its other locks are not
// concerned.
func serverRefused(err error) bool {
	return stmt.SQLState(err) != "" && !stmt.ConnectionBroken(err) && !errors.Is(err, stmt.ErrSessionChanged)
}

// releaseStray unlocks those of keys (the keys of a try statement that the
// server failed) that the session holds: the statement took them before it
// failed, and session-level locks outlive a failed statement. No lock of
// the session's holds any of them (the keys of a shared session's
// operations are reserved; an Owned tries only keys it does not hold).
// It reads the locks of s's backend only: an answer from another is an
// error, and the caller ends s.
func (b *batcher) releaseStray(keys []Key) error {
	s := b.s
	stray, err := s.holding(keys)
	for err == nil && len(stray) > 0 {
		n := min(len(stray), sqltext.BatchMax)
		var released []bool
		if released, err = s.sendUnlocks(s.p.UnlockContext(), nil, stray[:n], n, false); err == nil && slices.Contains(released, false) {
			err = errors.New("sqllock: a key the failed statement took was not held")
		}
		stray = stray[n:]
	}
	return err
}

// holding returns those of keys that s's backend holds, in exclusive mode,
// as its server reads them now (an answer from another backend is an
// error).
func (b *batcher) holding(keys []Key) ([]Key, error) {
	s := b.s
	want := map[Key]bool{}
	for _, k := range keys {
		want[k] = true
	}
	var held []Key
	rows := 0
	err := s.queryRows(sqltext.OwnSQL, nil, func(v []driver.Value) error {
		rows++
		r := pglocks.Scan(v)
		if r.PID != s.pid {
			// A pooler sent it to another server session: what the
			// failed statement took on s's backend is not known.
			return stmt.SessionChanged(s.pid, r.PID)
		}
		if !r.Granted || r.Shared {
			return nil
		}
		if k, ok := stmt.KeyOfTag(r.Tag); ok && want[k] {
			held = append(held, k)
		}
		return nil
	})
	if err == nil && rows == 0 {
		err = stmt.SessionChanged(s.pid, 0)
	}
	return held, err
}

// runTries sends many tries in one statement.
func (b *batcher) runTries(ops []*op) {
	s := b.s
	ops = s.claim(ops)
	if len(ops) == 0 {
		return
	}
	keys := s.scratch.batchKeys[:0]
	for _, o := range ops {
		keys = append(keys, o.key)
	}
	s.scratch.batchKeys = keys[:0]
	_, mode := s.plainSQL()
	got, err := stmt.Many(mode, s.queryRow, sqltext.BatchTry, s.pid, keys, &s.scratch.batch)
	for i, o := range ops {
		o.ok = got[i]
	}
	if err != nil {
		for _, o := range ops {
			o.ok, o.err = false, err
		}
		// The server failed the tries (a full lock table): what the
		// statement took before it failed is released, and the calls are
		// told, certainly, that they took nothing; anything less certain
		// costs the session.
		if !serverRefused(err) || s.releaseStray(keys) != nil {
			s.discard(err)
		}
	}
	for _, o := range ops {
		s.answer(o)
	}
}

// canMix reports whether unlocks and tries can go in one statement
// (runMixed): both are there, the unlocks are of exclusive locks (a
// shared-mode unlock is a dedicated session's one lock), the session's
// settings are applied, and the keys fit in one statement.
func (b *batcher) canMix(unlocks, tries []*op) bool {
	s := b.s
	if len(unlocks) == 0 || len(tries) == 0 || len(unlocks)+len(tries) > sqltext.BatchMax || !s.tuned || s.dead() {
		return false
	}
	for _, o := range unlocks {
		if o.shared {
			return false
		}
	}
	return true
}

// runMixed sends unlocks and then tries in one statement, one round trip
// for both where two statements took two: the calls of a busy shared
// session wait half as long. The server answers a batch as a whole, and
// runs its unlocks first: when it failed the statement (a try refused by a
// full lock table), it is asked whether every unlock ran (ranUnlocks);
// then the answer is certain for the tries alone: what the statement took
// is released (releaseStray), as after a batch of tries, and the unlocks
// stand. Any other failure ends the session (which unlocks ran is not
// known; the server releases what the session held as it ends), and every
// op is told why.
func (b *batcher) runMixed(unlocks, tries []*op) {
	s := b.s
	tries = s.claim(tries)
	keys := s.scratch.batchKeys[:0]
	for _, o := range unlocks {
		keys = append(keys, o.key)
	}
	for _, o := range tries {
		keys = append(keys, o.key)
	}
	s.scratch.batchKeys = keys[:0]
	got, err := s.sendUnlocks(s.p.UnlockContext(), &s.scratch, keys, len(unlocks), false)
	s.p.share.mixed.Add(1)
	certain := err != nil && serverRefused(err) && s.ranUnlocks(keys[:len(unlocks)])
	for i, o := range unlocks {
		switch {
		case err == nil:
			o.ok = got[i]
		case certain:
			o.ok = true
		default:
			o.ok, o.err = false, err
		}
	}
	for i, o := range tries {
		o.ok, o.err = false, err
		if err == nil {
			o.ok = got[len(unlocks)+i]
		}
	}
	if err != nil && (!certain || s.releaseStray(keys[len(unlocks):]) != nil) {
		s.discard(err)
	}
	for _, o := range unlocks {
		s.answer(o)
	}
	for _, o := range tries {
		s.answer(o)
	}
}

// ranUnlocks reports whether the unlocks of keys, sent in a statement
// that the server failed, ran: each of a key that s held once (a Hold's,
// reserved for it, so no other call of the Pool takes it on a shared
// session), which its backend holds no more once it ran. When any is
// still held, or the server cannot say, what the statement did is not
// known (the caller ends s).
func (b *batcher) ranUnlocks(keys []Key) bool {
	s := b.s
	held, err := s.holding(keys)
	return err == nil && len(held) == 0
}

// claim marks tries as sent, as they are about to be, and returns them;
// one whose caller left first (abandoned) is told, and never sent.
func (b *batcher) claim(ops []*op) []*op {
	s := b.s
	n := 0
	for _, o := range ops {
		if o.state.CompareAndSwap(opPending, opSent) {
			ops[n] = o
			n++
		} else {
			s.answer(o)
		}
	}
	return ops[:n]
}

// runTag runs a statement about one lock's tag.
func (b *batcher) runTag(o *op) {
	s := b.s
	err := s.queryRow(o.q, o.args, &o.v)
	switch {
	case errors.Is(err, sql.ErrNoRows):
	case err != nil:
		o.err = err
		if stmt.ConnectionBroken(err) || errors.Is(err, stmt.ErrAbandoned) {
			s.discard(err)
		}
	default:
		o.ok = true
	}
	s.answer(o)
}

// unlock sends the unlock of k (in mode shared) through s's queue, and
// returns the answer as unlockAnswer reads it. An uncertain one has ended
// s already.
func (b *batcher) unlock(k Key, shared bool) (uncertain bool, err error) {
	s := b.s
	o := takeOp(opUnlock, k)
	o.shared = shared
	s.submit(o)
	ok, oerr := o.ok, o.err
	putOp(o)
	return unlockAnswer(s.p, k, s.pid, oerr, ok)
}

// onTag runs q, a statement about a lock's tag, on s: ok reports whether
// it answered a row. ctx bounds the caller's wait for the answer, not the
// statement (a token's commit may wait long for synchronous standbys; a
// driver that gives a statement up poisons its connection): the queue
// runs aside.
func (b *batcher) onTag(ctx context.Context, q string, args []any) (v int64, ok bool, err error) {
	s := b.s
	o := newOp(opTag, Key{})
	o.q, o.args = q, args
	o.done = make(chan struct{})
	s.submitAside(o)
	select {
	case <-o.done:
	case <-ctx.Done():
		return 0, false, ctx.Err()
	}
	return o.v, o.ok, o.err
}

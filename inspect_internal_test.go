package sqllock

import (
	"slices"
	"testing"
)

// TestInspectWaitEndedAsRead: a wait that pg_locks shows but that ended
// before pg_blocking_pids was read (a wait's slice ran out, to be sent
// again) is reported blocked by its key's holders in pg_locks, of a
// conflicting mode, rather than by no one.
func TestInspectWaitEndedAsRead(t *testing.T) {
	k, other := Int64(71), Int64(72)
	out := inLine([]HeldLock{
		{Key: k, Granted: true, PID: 10},
		{Key: k, Granted: true, PID: 11, Shared: true},
		{Key: other, Granted: true, PID: 12},
		{Key: k, PID: 20},                           // exclusive: 10 and 11 block it
		{Key: k, PID: 21, Shared: true},             // shared: 10 alone
		{Key: k, PID: 22, BlockedBy: []int{10, 20}}, // read in time: as read
		{Key: k, PID: 11},                           // its own shared hold is no blocker
	}, nil, nil)
	want := map[int][]int{20: {10, 11}, 21: {10}, 22: {10, 20}}
	for _, h := range out {
		if w, ok := want[h.PID]; ok && !slices.Equal(h.BlockedBy, w) {
			t.Errorf("pid %d blocked by %v, want %v", h.PID, h.BlockedBy, w)
		}
	}
	for _, h := range out {
		if h.PID == 11 && !h.Granted && !slices.Equal(h.BlockedBy, []int{10}) {
			t.Errorf("pid 11, waiting, blocked by %v, want [10]", h.BlockedBy)
		}
	}
	if len(out) != 7 {
		t.Errorf("inLine kept %d rows, want 7: %+v", len(out), out)
	}
}

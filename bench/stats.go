package main

import (
	"slices"
	"time"
)

// sample is a set of measured durations.
type sample []time.Duration

func (s sample) quantile(q float64) time.Duration {
	if len(s) == 0 {
		return 0
	}
	c := slices.Clone(s)
	slices.Sort(c)
	i := int(q * float64(len(c)-1))
	return c[i]
}

func (s sample) median() time.Duration { return s.quantile(0.5) }

// opsPerSec returns the throughput of one operation of median duration d.
func opsPerSec(d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(time.Second) / float64(d)
}

// interleave runs the operations in turn, one call each, rounds × n
// times, so that every variant sees the same machine (on a small virtual
// machine, a process that runs without pause is served several times
// faster than one that waits), and returns each operation's durations.
// The order rotates every turn, so that no variant always follows the same
// neighbour.
func interleave(rounds, n int, ops []namedOp) (map[string]sample, error) {
	out := map[string]sample{}
	for i := 0; i < rounds*n; i++ {
		for j := range ops {
			op := ops[(i+j)%len(ops)]
			t := time.Now()
			if err := op.run(); err != nil {
				return nil, err
			}
			out[op.name] = append(out[op.name], time.Since(t))
		}
	}
	return out, nil
}

type namedOp struct {
	name string
	run  func() error
}

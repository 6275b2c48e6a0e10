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

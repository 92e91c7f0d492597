package bench

import (
	"slices"
	"time"
)

// summary is the distribution of one batch of samples.
type summary struct {
	p50, p99, mean time.Duration
	n              int
}

func summarize(ds []time.Duration) summary {
	if len(ds) == 0 {
		return summary{}
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	var total time.Duration
	for _, d := range s {
		total += d
	}
	return summary{p50: quantile(s, 0.50), p99: quantile(s, 0.99), mean: total / time.Duration(len(s)), n: len(s)}
}

// quantile of sorted samples, nearest rank.
func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted))+0.5) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// median of per-round figures: what the report shows, so that one round
// spoiled by the machine does not move it.
func median[T int | int64 | float64 | time.Duration](xs []T) T {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// medianSummary is the median, over rounds, of each figure of the rounds'
// summaries.
func medianSummary(rs []summary) summary {
	var p50, p99, mean []time.Duration
	n := 0
	for _, r := range rs {
		if r.n == 0 {
			continue
		}
		p50, p99, mean = append(p50, r.p50), append(p99, r.p99), append(mean, r.mean)
		n += r.n
	}
	return summary{p50: median(p50), p99: median(p99), mean: median(mean), n: n}
}

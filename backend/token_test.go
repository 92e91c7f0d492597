package backend_test

import (
	"testing"
	"time"

	"github.com/ubgo/lock/backend"
)

func TestNextToken(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	ns := uint64(now.UnixNano())
	for _, c := range []struct {
		what   string
		stored uint64
		now    time.Time
		want   uint64
	}{
		{"a missing or corrupt counter starts at the clock", 0, now, ns},
		{"a counter behind the clock (reverted by a crash) is lifted to it", ns - 1e9, now, ns},
		{"a counter ahead of the clock (clock set back) keeps counting", ns + 1000, now, ns + 1001},
		{"a counter at the clock counts on", ns, now, ns + 1},
		{"a clock before 1970 is no floor", 5, time.Unix(0, -1), 6},
	} {
		if got := backend.NextToken(c.stored, c.now); got != c.want {
			t.Errorf("%s: NextToken(%d, %v) = %d, want %d", c.what, c.stored, c.now, got, c.want)
		}
	}
}

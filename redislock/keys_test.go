package redislock

import (
	"strings"
	"testing"

	"github.com/ubgo/lock/backend"
)

// escape must map every name exactly as backend.Escape does, or keys
// would differ between versions of this package.
func TestEscapeMatchesBackend(t *testing.T) {
	names := []string{"a", "job-1_x", "a/b", "a:b", "x.0", "é", "a b", "%41", "{x}"}
	for n := 1; n <= 300; n++ {
		names = append(names, strings.Repeat("a", n), strings.Repeat("a", n-1)+"/")
	}
	for _, name := range names {
		if got, want := escape(name), backend.Escape(name); got != want {
			t.Errorf("escape(%q) = %q, backend.Escape: %q", name, got, want)
		}
	}
	k := keysFor("p:", "a/b")
	want := keys{lock: "p:{a%2Fb}:lock", token: "p:{a%2Fb}:token", slots: "p:{a%2Fb}:slots", permits: "p:{a%2Fb}:permits", channel: "p:{a%2Fb}:released"}
	if k != want {
		t.Errorf("keysFor = %+v, want %+v", k, want)
	}
}

package redislock

import "testing"

// The keys of a name share its hash tag.
func TestKeysFor(t *testing.T) {
	k := keysFor("p:", "a/b")
	want := keys{lock: "p:{a%2Fb}:lock", token: "p:{a%2Fb}:token", slots: "p:{a%2Fb}:slots", permits: "p:{a%2Fb}:permits", channel: "p:{a%2Fb}:released", tomb: "p:{a%2Fb}:tomb:"}
	if k != want {
		t.Errorf("keysFor = %+v, want %+v", k, want)
	}
}

package dirwatch

import "testing"

// First is the oldest subscription of a name; Leave says whether the one
// that leaves was.
func TestFirst(t *testing.T) {
	dir := t.TempDir()
	a, b := Subscribe(dir, "job"), Subscribe(dir, "job")
	other := Subscribe(dir, "other")
	defer b.Close()
	defer other.Close()
	if !a.First() || b.First() || !other.First() {
		t.Fatalf("First: a %v, b %v, other %v; want true, false, true", a.First(), b.First(), other.First())
	}
	c := Subscribe(dir, "job")
	if !a.Leave() || !b.First() || c.First() {
		t.Fatal("a left first, b is not First after it, or c is")
	}
	if c.Leave() || a.Leave() {
		t.Fatal("c, or a twice, left first")
	}
}

package dirwatch

import (
	"testing"
	"time"
)

// woken waits for a wake-up of ch, with a deadline far beyond any delay.
func woken(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(30 * time.Second):
		t.Fatalf("no wake-up after %s", what)
	}
}

func TestSignal(t *testing.T) {
	dir := t.TempDir()
	s := Subscribe(dir, "job")
	defer s.Close()
	other := Subscribe(dir, "other")
	defer other.Close()
	ch := s.Wake()
	Signal(dir, "job")
	woken(t, ch, "Signal")
	select {
	case <-other.Wake():
		t.Fatal("Signal of job woke the waiter of other")
	default:
	}
	if s.Wake() == ch {
		t.Fatal("Wake returned a channel already closed")
	}
}

package backend_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/backend"
)

type widthKey struct{}

// A backend's own option is taken by it and refused by another; errors
// read "<backend>: <sentinel>: detail", said once.
func TestConfigOwnOptions(t *testing.T) {
	width := backend.Value("a", "WithWidth", widthKey{}, 3)
	c := backend.NewConfig("a", []lock.Option{width}, nil)
	if c.Err != nil || c.Options.Value(widthKey{}) != 3 {
		t.Fatalf("own option: err %v, value %v", c.Err, c.Options.Value(widthKey{}))
	}
	b := backend.NewConfig("b", []lock.Option{width}, nil)
	if !errors.Is(b.Err, lock.ErrInvalidOption) || b.Err.Error() != "b: lock: invalid option: a.WithWidth is not an option of b" {
		t.Fatalf("foreign option: %v", b.Err)
	}
	if _, err := c.Resolve("x", []lock.Option{width}, nil); err != nil {
		t.Fatalf("own option per call: %v", err)
	}
	if _, err := b.Resolve("x", nil, nil); err != b.Err {
		t.Fatalf("a factory's error is every call's: %v", err)
	}
	ok := backend.NewConfig("b", nil, nil)
	if _, err := ok.Resolve("x", []lock.Option{width}, nil); !errors.Is(err, lock.ErrInvalidOption) {
		t.Fatalf("foreign option per call: %v", err)
	}
	if _, err := ok.Resolve("", nil, nil); !errors.Is(err, lock.ErrInvalidName) || !strings.HasPrefix(err.Error(), "b: lock: invalid name") {
		t.Fatalf("bad name: %v", err)
	}
	ok.Fail(errors.New("b: nil client"))
	if ok.Err.Error() != "b: nil client" {
		t.Fatalf("prefix said twice: %v", ok.Err)
	}
}

package lock

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// MaxNameLen is the longest name, in bytes, every backend accepts.
const MaxNameLen = 4096

// ValidateName reports whether name is acceptable to every backend: non-empty
// valid UTF-8 of at most MaxNameLen bytes without NUL. Backends call it
// before mapping a name to their storage; the error matches ErrInvalidName.
func ValidateName(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("%w: empty", ErrInvalidName)
	case len(name) > MaxNameLen:
		return fmt.Errorf("%w: %d bytes, more than %d", ErrInvalidName, len(name), MaxNameLen)
	case !utf8.ValidString(name):
		return fmt.Errorf("%w: not valid UTF-8", ErrInvalidName)
	case strings.IndexByte(name, 0) >= 0:
		return fmt.Errorf("%w: contains NUL", ErrInvalidName)
	}
	return nil
}

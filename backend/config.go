package backend

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/ubgo/lock"
)

// Config is a factory's defaults: its backend's name, the options given to
// NewFactory, and their error (an invalid option, a nil client), which every
// call reports and Factory.Err returns. Build it with NewConfig.
type Config struct {
	Backend string
	Options lock.Options
	Err     error
}

// ownerKey marks the options of one backend, so that an option of another
// (Value) is refused instead of silently ignored.
type ownerKey struct{}

// Options returns the empty options of backend, which accept its own
// options (see Value) and refuse other backends'. Stores (Fence, Ledger)
// apply their options over it too.
func Options(backend string) lock.Options {
	o, _ := lock.Apply(lock.Options{}, lock.WithValue(ownerKey{}, backend))
	return o
}

// NewConfig applies opts as backend's defaults, then the backend's own
// check (may be nil).
func NewConfig(backend string, opts []lock.Option, check func(*lock.Options) error) Config {
	c := Config{Backend: backend}
	var err error
	c.Options, err = lock.Apply(Options(backend), opts...)
	if err == nil && check != nil {
		err = check(&c.Options)
	}
	c.Fail(err)
	return c
}

// Fail adds err to the factory's error, said as one of backend's.
func (c *Config) Fail(err error) {
	if err != nil {
		c.Err = errors.Join(c.Err, c.wrap(err))
	}
}

// wrap makes err read "<backend>: <sentinel>: detail", the family's shape.
func (c *Config) wrap(err error) error {
	if err == nil || strings.HasPrefix(err.Error(), c.Backend+": ") {
		return err
	}
	return fmt.Errorf("%s: %w", c.Backend, err)
}

// Resolve applies a call's options over the factory's defaults, then the
// backend's own check (may be nil), then checks the name. The factory's
// error comes first: every call reports it.
func (c *Config) Resolve(name string, opts []lock.Option, check func(*lock.Options) error) (lock.Options, error) {
	if c.Err != nil {
		return c.Options, c.Err
	}
	o, err := lock.Apply(c.Options, opts...)
	if err == nil && check != nil {
		err = check(&o)
	}
	if err == nil {
		err = lock.ValidateName(name)
	}
	return o, c.wrap(err)
}

// Value returns backend's own option called option (for messages, as
// "WithSchema"), which stores value under key. Given to another backend, it
// makes that backend's options invalid: a setting that would be silently
// ignored is a mistake the user should hear of.
func Value(backend, option string, key, value any) lock.Option {
	return func(o *lock.Options) {
		if owner, _ := o.Value(ownerKey{}).(string); owner != backend {
			if owner == "" {
				owner = "these options"
			}
			o.Invalid(fmt.Sprintf("%s.%s is not an option of %s", backend, option, owner))
			return
		}
		lock.WithValue(key, value)(o)
	}
}

// Locker adapts a factory's Acquire, with opts applied to every call, to a
// lock.Configured Locker, without hiding the concrete holder type: callers
// can still assert lock.Extender on it.
func Locker[H lock.Holder](c *Config, opts []lock.Option, acquire func(ctx context.Context, name string, opts ...lock.Option) (H, error)) lock.Locker {
	return &locker[H]{c: c, opts: opts, acquire: acquire}
}

type locker[H lock.Holder] struct {
	c       *Config
	opts    []lock.Option
	acquire func(ctx context.Context, name string, opts ...lock.Option) (H, error)
}

func (l *locker[H]) Acquire(ctx context.Context, name string) (lock.Holder, error) {
	h, err := l.acquire(ctx, name, l.opts...)
	if err != nil {
		return nil, err
	}
	return h, nil
}

// Config returns the options of every Acquire through l and their error
// (the factory's included).
func (l *locker[H]) Config() (lock.Options, error) {
	if l.c.Err != nil {
		return l.c.Options, l.c.Err
	}
	o, err := lock.Apply(l.c.Options, l.opts...)
	return o, l.c.wrap(err)
}

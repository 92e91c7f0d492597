package bench

import (
	"context"
	"errors"

	"github.com/ubgo/lock/pglock"
)

const (
	idPgMixRaw = "postgres/pg_advisory_lock_shared or pg_advisory_lock"
	idPgMix    = "postgres/pglock"
)

// mixCasesPostgres builds the Postgres mixes: pglock, a factory (and a
// pool) each as separate processes have, beside the raw advisory locks,
// blocking pg_advisory_lock_shared for the readers and pg_advisory_lock
// for the writer, on a connection each: Postgres's own queue, which makes
// later shared requests wait behind a waiting exclusive one.
func mixCasesPostgres(ctx context.Context, e *env) []*mixCase {
	if !e.available(Postgres) {
		return nil
	}
	var out []*mixCase
	add := func(c *mixCase, mk func(shared bool) (contender, error)) {
		for i := 0; i <= mixReaders && c.err == nil; i++ {
			var ct contender
			if ct, c.err = mk(i < mixReaders); i < mixReaders {
				c.readers = append(c.readers, ct)
			} else {
				c.writer = ct
			}
		}
		out = append(out, c)
	}
	pool, err := dialPostgresApp(ctx, e.pgConns(ctx, mixReaders+1), benchApp)
	if err == nil {
		e.defer_(pool.Close)
	}
	const key = int64(0x75626f2d6d697821) // arbitrary, outside pglock's keys
	add(&mixCase{id: idPgMixRaw, label: "pg_advisory_lock_shared or pg_advisory_lock (blocking), a connection each", kind: floorKind, err: err},
		func(shared bool) (contender, error) {
			pc, err := pool.Acquire(ctx)
			if err != nil {
				return contender{}, err
			}
			e.defer_(pc.Release)
			conn := pc.Conn()
			lock, unlock := "SELECT pg_advisory_lock($1)", "SELECT pg_advisory_unlock($1)"
			if shared {
				lock, unlock = "SELECT pg_advisory_lock_shared($1)", "SELECT pg_advisory_unlock_shared($1)"
			}
			return contender{
				lock: func(ctx context.Context) error {
					_, err := conn.Exec(ctx, lock, key)
					return err
				},
				unlock: func() error {
					var ok bool
					err := conn.QueryRow(context.Background(), unlock, key).Scan(&ok)
					if err == nil && !ok {
						err = errors.New("advisory unlock: not held")
					}
					return err
				},
			}, nil
		})
	add(&mixCase{id: idPgMix, label: "pglock, a factory each", kind: oursKind},
		func(shared bool) (contender, error) {
			pool, err := dialPostgresApp(ctx, 0, benchApp)
			if err != nil {
				return contender{}, err
			}
			e.defer_(pool.Close)
			f := pglock.NewFactory(pool, pglock.WithLogger(nil), pglock.WithWait(), pglock.WithKeyPrefix(e.prefix),
				pglock.WithApplicationName(benchApp))
			e.defer_(func() { f.Close() })
			return holding(func(ctx context.Context) (*pglock.Holder, error) { return f.Acquire(ctx, "mix", opts(shared)...) }), nil
		})
	return out
}

// pgMixNote puts pglock's mix beside the raw advisory locks': readers/s,
// the writer's wait p50 and its longest wait, as ratios.
func pgMixNote(w func(format string, args ...any), cs []*mixCase, cd cond) {
	var ours, raw *mixCase
	for _, c := range cs {
		switch {
		case c.err != nil || len(c.res[cd]) == 0:
		case c.id == idPgMix:
			ours = c
		case c.id == idPgMixRaw:
			raw = c
		}
	}
	if ours == nil || raw == nil {
		return
	}
	rs, _, ww, maxW, _, _ := ours.agg(cd)
	frs, _, fww, fmaxW, _, _ := raw.agg(cd)
	w("\npglock, a factory each, against the raw advisory locks: readers/s %s, writer wait p50 %s, writer max wait %s.\n",
		ratio(rs, frs), ratio(float64(ww.p50), float64(fww.p50)), ratio(float64(maxW), float64(fmaxW)))
}

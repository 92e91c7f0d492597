package pglock

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"sort"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/ubgo/lock"
)

// Inspect reports who holds name (under the factory's key prefix), from
// any process: the advisory locks in pg_locks, joined with the holder rows
// in pglock_holders and the sessions in pg_stat_activity. Each holder's
// Metadata carries, besides what WithMetadata set, "pg.pid",
// "pg.application_name", "pg.client_addr" and, for a semaphore,
// "pg.slot". Token, Since and Owner come from the holder's row, which the
// acquire writes only when the call set WithOwner or WithMetadata; a
// holder without a row is reported with its session and slot, Token 0. A
// name held shared (WithShared) shows one holder per session, with the row
// of its newest reader. It runs on a pool connection, taken within
// WithConnectTimeout.
func (f *Factory) Inspect(ctx context.Context, name string) (lock.Info, error) {
	if err := lock.ValidateName(name); err != nil {
		return lock.Info{}, err
	}
	if f.cfg.Err != nil {
		return lock.Info{}, f.cfg.Err
	}
	info := lock.Info{Name: name}
	pc, err := f.poolConn(ctx, "inspect")
	if err != nil {
		return info, err
	}
	defer pc.Release()
	prefix := f.cfg.Options.KeyPrefix
	limit, err := f.storedLimit(ctx, pc, prefix, name)
	if err != nil || limit == 0 {
		return info, err
	}
	// The mutex key, and a semaphore's permit keys by slot.
	keys, slots := []int64{keysOf(prefix, name).mutex}, map[int64]int{}
	for i := 0; limit > 1 && i < limit; i++ {
		key := advisoryKey(kindSlot, prefix, name, i)
		keys = append(keys, key)
		slots[key] = i
	}
	rows, err := pc.Query(ctx, f.st.inspect, readMode, keys)
	if err != nil {
		return info, fmt.Errorf("pglock: inspect: %w", err)
	}
	defer rows.Close()
	mutex := false
	for rows.Next() {
		hi, key, err := scanHolder(rows)
		if err != nil {
			return info, fmt.Errorf("pglock: inspect: %w", err)
		}
		if slot, ok := slots[key]; ok {
			hi.Metadata["pg.slot"] = strconv.Itoa(slot)
		} else {
			mutex = true
		}
		info.Holders = append(info.Holders, hi)
	}
	if err := rows.Err(); err != nil {
		return info, fmt.Errorf("pglock: inspect: %w", err)
	}
	if len(info.Holders) > 0 {
		info.Limit = limit
		if mutex {
			info.Limit = 1
		}
	}
	sort.Slice(info.Holders, func(i, j int) bool { return info.Holders[i].Token < info.Holders[j].Token })
	return info, nil
}

// storedLimit is the limit stored for name (1 without a row of its own);
// 0 when pglock's objects do not exist: nothing was ever locked in the
// schema. Unnamed statements (see readMode): pool connections may reach
// the server through a transaction-mode pooler.
func (f *Factory) storedLimit(ctx context.Context, pc *pgxpool.Conn, prefix, name string) (int, error) {
	var (
		lim        int32
		rowNS, row string
	)
	err := pc.QueryRow(ctx, f.st.inspectLimit, readMode, keysOf(prefix, name).limit).Scan(&lim, &rowNS, &row)
	switch {
	case err == nil && rowNS == prefix && row == name:
		return int(lim), nil
	case err == nil, errors.Is(err, pgx.ErrNoRows):
		return 1, nil
	case isUndefined(err):
		return 0, nil
	}
	return 0, fmt.Errorf("pglock: inspect: %w", err)
}

// scanHolder reads one row of inspect.sql: the holder and its key.
func scanHolder(rows pgx.Rows) (lock.HolderInfo, int64, error) {
	var (
		key                      int64
		pid                      int32
		token                    *int64
		since                    *time.Time
		owner, meta, app, client *string
	)
	if err := rows.Scan(&key, &pid, &token, &since, &owner, &meta, &app, &client); err != nil {
		return lock.HolderInfo{}, 0, err
	}
	hi := lock.HolderInfo{Metadata: map[string]string{}, ID: "pid " + strconv.Itoa(int(pid))}
	if meta != nil {
		json.Unmarshal([]byte(*meta), &hi.Metadata)
	}
	hi.Metadata["pg.pid"] = strconv.Itoa(int(pid))
	if app != nil {
		hi.Metadata["pg.application_name"] = *app
		if *app != "" {
			hi.ID += " (" + *app + ")"
		}
	}
	if client != nil {
		hi.Metadata["pg.client_addr"] = *client
	}
	if token != nil {
		hi.Token, hi.Since = uint64(*token), *since
	}
	if owner != nil {
		hi.Owner = *owner
	}
	return hi, key, nil
}

// List yields the names under the factory's key prefix that start with
// prefix and have a holder row, in byte order, each as Inspect reports it
// (with every holder in pg_locks, rowless ones too). A holder has a row
// only when its Acquire set WithOwner or WithMetadata: a name whose
// holders set neither is not listed, because pg_locks keeps only a hash
// of it and writing a row on every Acquire would slow the plain ones
// down. It reads the names lock.ListPageSize at a time, each page a scan
// of pglock_holders (an unlogged table of current holders), and holds no
// connection between pages. Waiting is 0: waiters are not recorded.
func (f *Factory) List(ctx context.Context, prefix string) iter.Seq2[lock.Info, error] {
	return func(yield func(lock.Info, error) bool) {
		if f.cfg.Err != nil {
			yield(lock.Info{}, f.cfg.Err)
			return
		}
		ns := f.cfg.Options.KeyPrefix
		for after := ""; ; {
			names, err := f.listPage(ctx, ns, prefix, after)
			if err != nil {
				yield(lock.Info{}, err)
				return
			}
			for _, name := range names {
				info, err := f.Inspect(ctx, name)
				if err != nil {
					yield(lock.Info{}, err)
					return
				}
				if len(info.Holders) > 0 && !yield(info, nil) {
					return
				}
			}
			if len(names) < lock.ListPageSize {
				return
			}
			after = names[len(names)-1]
		}
	}
}

// listPage returns the next names with holder rows after after.
func (f *Factory) listPage(ctx context.Context, ns, prefix, after string) ([]string, error) {
	pc, err := f.poolConn(ctx, "list")
	if err != nil {
		return nil, err
	}
	defer pc.Release()
	rows, err := pc.Query(ctx, f.st.list, readMode, ns, prefix, after, lock.ListPageSize)
	if err != nil {
		if isUndefined(err) {
			return nil, nil // nothing was ever locked in this schema
		}
		return nil, fmt.Errorf("pglock: list: %w", err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		if isUndefined(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("pglock: list: %w", err)
	}
	return names, nil
}

// readMode is how Inspect and List run their statements on pool
// connections: unnamed (one round trip, nothing prepared), so that they
// work behind a transaction-mode pooler too, where AcquireInTx's users
// are; pgx's statement cache would prepare a statement on one server
// connection and run it on another.
const readMode = pgx.QueryExecModeExec

func isUndefined(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "42P01" || pgErr.Code == "42883" || pgErr.Code == "3F000")
}

func jsonObject(m map[string]string) string {
	b, _ := json.Marshal(m)
	return string(b)
}

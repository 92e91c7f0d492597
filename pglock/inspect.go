package pglock

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/ubgo/lock"
)

// Inspect reports who holds name (under the factory's key prefix), from
// any process: the advisory locks in pg_locks, joined with the holder rows
// in pglock_holders and the sessions in pg_stat_activity. Each holder's
// Metadata carries, besides what WithMetadata set, "pg.pid",
// "pg.application_name", "pg.client_addr" and "pg.slot". Holders are
// written to pglock_holders a few milliseconds after they acquire; Inspect
// waits briefly for rows that are due, and reports a holder it still
// cannot find a row for with its pid but no token. It runs on a pool
// connection, taken within WithConnectTimeout.
func (f *Factory) Inspect(ctx context.Context, name string) (lock.Info, error) {
	if err := lock.ValidateName(name); err != nil {
		return lock.Info{}, err
	}
	if f.err != nil {
		return lock.Info{}, f.err
	}
	info := lock.Info{Name: name}
	prefix := f.opts.KeyPrefix
	k := keysOf(prefix, name)
	actx, cancel := context.WithTimeout(ctx, f.cfg.connectTimeout)
	pc, err := f.pool.Acquire(actx)
	cancel()
	if err != nil {
		if ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
			return info, fmt.Errorf("%w within %v: %w", ErrPoolExhausted, f.cfg.connectTimeout, err)
		}
		return info, fmt.Errorf("pglock: inspect: %w", err)
	}
	defer pc.Release()

	limit := 1
	var (
		lim        int32
		rowNS, row string
	)
	err = pc.QueryRow(ctx, f.st.inspectLimit, k.limit).Scan(&lim, &rowNS, &row)
	switch {
	case err == nil && rowNS == prefix && row == name:
		limit = int(lim)
	case err == nil, errors.Is(err, pgx.ErrNoRows):
	case isUndefined(err):
		return info, nil // nothing was ever locked in this schema
	default:
		return info, fmt.Errorf("pglock: inspect: %w", err)
	}
	keys := []int64{k.mutex}
	for i := 0; limit > 1 && i < limit; i++ {
		keys = append(keys, advisoryKey(kindSlot, prefix, name, i))
	}
	for attempt := 0; ; attempt++ {
		holders, missing, err := f.inspectOnce(ctx, pc.Conn(), keys, k.mutex)
		if err != nil {
			return info, err
		}
		if missing && attempt < 20 {
			select {
			case <-time.After(5 * time.Millisecond):
				continue
			case <-ctx.Done():
			}
		}
		if len(holders) > 0 {
			info.Limit = limit
			if holders[0].Metadata["pg.slot"] == "" {
				info.Limit = 1
			}
		}
		for i := range holders {
			if info.Limit == 1 {
				delete(holders[i].Metadata, "pg.slot")
			}
		}
		sort.Slice(holders, func(i, j int) bool { return holders[i].Token < holders[j].Token })
		info.Holders = holders
		return info, nil
	}
}

func (f *Factory) inspectOnce(ctx context.Context, c *pgx.Conn, keys []int64, mutexKey int64) ([]lock.HolderInfo, bool, error) {
	rows, err := c.Query(ctx, f.st.inspect, keys)
	if err != nil {
		return nil, false, fmt.Errorf("pglock: inspect: %w", err)
	}
	defer rows.Close()
	var (
		out     []lock.HolderInfo
		missing bool
	)
	for rows.Next() {
		var (
			key                      int64
			pid                      int32
			token                    *int64
			slot, lim                *int32
			since, backendStart      *time.Time
			owner, meta, app, client *string
		)
		if err := rows.Scan(&key, &pid, &token, &slot, &lim, &since, &owner, &meta, &app, &client, &backendStart); err != nil {
			return nil, false, fmt.Errorf("pglock: inspect: %w", err)
		}
		hi := lock.HolderInfo{Metadata: map[string]string{}}
		if meta != nil {
			json.Unmarshal([]byte(*meta), &hi.Metadata)
		}
		hi.Metadata["pg.pid"] = strconv.Itoa(int(pid))
		if app != nil {
			hi.Metadata["pg.application_name"] = *app
		}
		if client != nil {
			hi.Metadata["pg.client_addr"] = *client
		}
		if key != mutexKey {
			hi.Metadata["pg.slot"] = "?"
		}
		if token == nil {
			missing = true
		} else {
			hi.Token, hi.Since = uint64(*token), *since
			if key != mutexKey {
				hi.Metadata["pg.slot"] = strconv.Itoa(int(*slot))
			}
			if owner != nil {
				hi.Owner = *owner
			}
		}
		hi.ID = "pid " + strconv.Itoa(int(pid))
		if app != nil && *app != "" {
			hi.ID += " (" + *app + ")"
		}
		out = append(out, hi)
	}
	if err := rows.Err(); err != nil {
		return nil, false, fmt.Errorf("pglock: inspect: %w", err)
	}
	return out, missing, nil
}

func isUndefined(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "42P01" || pgErr.Code == "42883" || pgErr.Code == "3F000")
}

func jsonObject(m map[string]string) string {
	b, _ := json.Marshal(m)
	return string(b)
}

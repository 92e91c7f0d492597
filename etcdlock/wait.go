package etcdlock

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/metadata"
)

// Waiting. A waiting Acquire's key is queued in revision order, and the
// transaction that writes it also reads the keys ahead of it that it
// waits for (enqueue): the exclusive keys for a shared key, every key for
// an exclusive one. It holds a permit once fewer than its limit of those
// are left. Until then it watches the closest limit of them (its window:
// the key just before its own for a mutex, the last exclusive key for a
// reader, the limit keys just before it in a semaphore), each on a watch
// of that one key, as concurrency.Mutex watches its predecessor: while
// none of them goes, at least limit keys are ahead, whatever happens
// further up the queue. A release therefore wakes the waiters that have
// the released key in their window (one, for a mutex), not every waiter.
//
// A waiter woken by a deletion looks at the queue again (look: one read
// transaction that also checks that its own key is still there, so that
// a waiter that was paused never takes a permit on an old answer), then
// holds or watches its new window. Keys ahead may go out of order (a
// waiter ahead gives up), but none can appear ahead: revisions only grow.
// So when the last read showed every key it waits for, a deletion among
// them is counted without a look (see await for why its own key needs
// none). A watch of the window is created at etcd's current revision, so
// that etcd sends its events as they happen (a watch from an older
// revision waits for etcd's catch-up, up to 100ms, as one created while
// etcd commits a write now and then does); the deletions between
// the last read and its start are covered by looking again when it
// starts after that read. A watch broken or compacted is set up again
// the same way. Its own key's deletion the waiter learns from the
// factory's watch of its keys (watch.go), and a lease that ends from its
// session. It is not backend.Wait's loop of attempts: a queued key needs
// no second attempt, and nothing polls.

// A window is one waiting attempt's watches of the keys it waits for.
// They share a gRPC stream of their own (metadata of the window's keeps it
// apart from the client's other watches), which ends with the last of
// them: etcd is then sent no cancellation and answers none. A window whose
// keys all change (a mutex's new predecessor) moves to a new stream for
// that reason.
type window struct {
	cli    *clientv3.Client
	ctx    context.Context // the current stream's
	cancel context.CancelFunc
	keys   map[string]context.CancelFunc // the watched keys
	events chan windowEvent
	wg     sync.WaitGroup
}

// A windowEvent is what one watch of a window reports: that it started
// after revision created, or (created 0) that its key was deleted.
type windowEvent struct {
	key     string
	created int64
}

// streams numbers the windows' streams.
var streams atomic.Uint64

func newWindow(cli *clientv3.Client) *window {
	return &window{cli: cli, keys: map[string]context.CancelFunc{}, events: make(chan windowEvent, 4)}
}

// set watches exactly keys: the watches of keys no longer in the window
// end, and the new ones start.
func (wn *window) set(keys []string) {
	in := map[string]bool{}
	stays := false
	for _, k := range keys {
		in[k] = true
		stays = stays || wn.keys[k] != nil
	}
	if !stays {
		wn.end()
		ctx := metadata.AppendToOutgoingContext(clientv3.WithRequireLeader(context.Background()), "ubgo-lock-wait", strconv.FormatUint(streams.Add(1), 10))
		wn.ctx, wn.cancel = context.WithCancel(ctx)
	}
	for k, cancel := range wn.keys {
		if !in[k] {
			cancel()
			delete(wn.keys, k)
		}
	}
	for _, k := range keys {
		if wn.keys[k] == nil {
			ctx, cancel := context.WithCancel(wn.ctx)
			wn.keys[k] = cancel
			wn.wg.Add(1)
			go wn.watch(ctx, k)
		}
	}
}

// end ends the current stream's watches.
func (wn *window) end() {
	if wn.cancel != nil {
		wn.cancel()
	}
	clear(wn.keys)
}

// watch follows the deletion of key until ctx ends, setting its watch up
// again when etcd ends it (compaction, no leader), after a pause.
func (wn *window) watch(ctx context.Context, key string) {
	defer wn.wg.Done()
	for ctx.Err() == nil {
		wch := wn.cli.Watch(ctx, key, clientv3.WithFilterPut(), clientv3.WithCreatedNotify())
		for resp := range wch {
			if resp.Err() != nil || resp.Canceled {
				break
			}
			ev := windowEvent{key: key}
			switch {
			case resp.Created:
				ev.created = resp.Header.Revision
			case len(resp.Events) == 0:
				continue // a progress notice
			}
			select {
			case wn.events <- ev:
			case <-ctx.Done():
				return
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// close ends the window's watches and waits for their goroutines.
func (wn *window) close() {
	wn.end()
	wn.wg.Wait()
}

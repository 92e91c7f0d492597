// Command 03-idempotent-webhook is use case 3: a payment processor retries
// webhooks aggressively; the same event delivered twice, 10ms apart or an
// hour apart, to the same or another replica, must be processed once.
//
// The lock name encodes the dedup key (the event id). A lock alone only
// stops two deliveries of one event from being processed at the same time:
// a retry that arrives after the first delivery finished finds it free. So
// the handler runs the event through lock.RunOnce with a Ledger, which
// checks the ledger, takes the event's lock (a concurrent delivery gets
// ErrLocked, and is answered 200: the other worker is on it), checks the
// ledger again under the lock, processes, records the event id with the
// holder's fencing token, and releases. A processing error records nothing
// and answers 500, so the processor's retry processes the event again.
//
// With no infrastructure the replicas are filelock factories of this
// process on one directory (one host), with a stale window of 5 minutes
// for a worker that dies mid-event on another host, and the ledger is
// filelock.NewLedger on that directory. With -backend=postgres (the
// multi-host choice) the locks are pglock advisory locks and the ledger
// pglock.NewLedger, a Postgres table.
//
//	go run ./03-idempotent-webhook
//	go run ./03-idempotent-webhook -backend=postgres
package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"time"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/examples/internal/replica"
)

// WebhookHandler receives the processor's webhooks on one replica.
type WebhookHandler struct {
	Locks   lock.Locker // this replica's
	Ledger  lock.Ledger // processed event ids, shared by every replica
	Process func(ctx context.Context, eventID string) error
}

// HandleStripe processes the event unless another delivery of it is being
// or was processed.
func (h *WebhookHandler) HandleStripe(w http.ResponseWriter, r *http.Request) {
	eventID := r.Header.Get("Stripe-Event-Id")
	if eventID == "" {
		http.Error(w, "missing event id", http.StatusBadRequest)
		return
	}
	_, err := lock.RunOnce(r.Context(), h.Locks, h.Ledger, "stripe-event:"+eventID,
		func(ctx context.Context) error { return h.Process(ctx, eventID) })
	switch {
	case errors.Is(err, lock.ErrLocked):
		// Another worker is processing this event right now. Tell the
		// processor we got it; the other worker answers its own delivery.
		w.WriteHeader(http.StatusOK)
	case err != nil:
		http.Error(w, err.Error(), http.StatusInternalServerError)
	default:
		w.WriteHeader(http.StatusOK) // processed now, or already processed
	}
}

// config is the simulated fleet and the processing time of one event.
type config struct {
	Replicas int
	Work     time.Duration
}

// delivery is one webhook delivery and its answer.
type delivery struct {
	Event   string
	Replica int
	Status  int
}

// result says how often each event was processed, and every answer.
type result struct {
	Processed  map[string]int
	Deliveries []delivery
}

// run delivers the processor's traffic to the replicas over HTTP:
// evt_1 twice 10ms apart to two replicas and again after it was processed;
// evt_2 once; evt_3, whose first processing fails, then its retry.
func run(ctx context.Context, c *replica.Cluster, cfg config) (result, error) {
	res := result{Processed: map[string]int{}}
	var mu sync.Mutex
	failOnce := map[string]bool{"evt_3": true}
	urls := make([]string, cfg.Replicas)
	for i := range urls {
		// Locks of a deduplicated event are held only while it is being
		// processed; the TTL is the lease a crashed worker keeps it for
		// (filelock's stale window; pglock needs none and ignores it).
		r, err := c.Replica(ctx, lock.WithTTL(5*time.Minute))
		if err != nil {
			return res, err
		}
		h := &WebhookHandler{Locks: r.Locker(), Ledger: c.Ledger(r), Process: func(ctx context.Context, id string) error {
			time.Sleep(cfg.Work)
			mu.Lock()
			defer mu.Unlock()
			if failOnce[id] {
				delete(failOnce, id)
				return fmt.Errorf("processing %s: payment service timed out", id)
			}
			res.Processed[id]++
			fmt.Printf("replica-%d: processed %s\n", i+1, id)
			return nil
		}}
		srv := httptest.NewServer(http.HandlerFunc(h.HandleStripe))
		defer srv.Close()
		urls[i] = srv.URL
	}

	deliver := func(event string, replica int) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, urls[replica], nil)
		if err != nil {
			return err
		}
		req.Header.Set("Stripe-Event-Id", event)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		mu.Lock()
		res.Deliveries = append(res.Deliveries, delivery{event, replica + 1, resp.StatusCode})
		mu.Unlock()
		fmt.Printf("deliver %s to replica-%d: %d %s\n", event, replica+1, resp.StatusCode, http.StatusText(resp.StatusCode))
		return nil
	}

	// The processor's first attempts, all at once: evt_1 twice, 10ms apart.
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i, d := range []struct {
		event   string
		replica int
		after   time.Duration
	}{{"evt_1", 0, 0}, {"evt_1", 1 % cfg.Replicas, 10 * time.Millisecond}, {"evt_2", 0, 0}, {"evt_3", 0, 0}} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			time.Sleep(d.after)
			errs[i] = deliver(d.event, d.replica)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return res, err
	}
	// Its retries, later: evt_1 (already processed) and evt_3 (failed).
	for _, ev := range []string{"evt_1", "evt_3"} {
		if err := deliver(ev, cfg.Replicas-1); err != nil {
			return res, err
		}
	}
	return res, nil
}

func main() {
	replica.Main(demo, replica.Filelock, replica.Postgres)
}

func demo(ctx context.Context, c *replica.Cluster) error {
	res, err := run(ctx, c, config{Replicas: 2, Work: 50 * time.Millisecond})
	if err != nil {
		return err
	}
	fmt.Printf("processed: %v\n", res.Processed)
	return nil
}

package etcdlock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/backend"
)

// A session is one lease. Renewed sessions are shared by every lock of the
// factory with the same TTL and kept alive by one goroutine while they are
// in use (and for idleLinger after); an idle session stays in the factory,
// without a goroutine, and is taken up again while its lease still has a
// third of its TTL to live. A session that is not renewed belongs to one
// holder, and only Extend renews it.
//
// The session tracks, on the local monotonic clock, the latest moment the
// lease is sure to live: the send time of the last successful grant or
// keepalive plus the TTL the server answered, less a margin. The server
// cannot expire the lease before then, because it counts from when it
// received the request. When that moment passes without a renewal the
// session is dead: its holders lose their locks, then the lease is revoked
// (best effort) so that successors need not wait for the server to expire
// it.
type session struct {
	f       *Factory
	ttl     time.Duration // as asked
	renew   bool
	ready   chan struct{} // closed when the grant is done; then err, id and granted are set
	err     error
	id      clientv3.LeaseID
	granted time.Duration // as the server granted (it may raise short TTLs)

	// Guarded by f.mu.
	refs     int         // acquires in progress and holders
	idle     *time.Timer // stops renewal once unused
	gone     bool        // no longer in the factory's maps
	ok       bool        // granted
	looping  bool        // the renewal goroutine runs
	loopStop chan struct{}

	mu       sync.Mutex
	deadline time.Time
	renewed  time.Time   // send time of the last successful grant or keepalive
	timer    *time.Timer // fires at deadline
	dead     bool
	stop     chan struct{} // closed when the session ends
	holders  map[*Holder]struct{}
	orphans  map[string]orphan
}

// An orphan is a key the session could not delete, or whose write may be
// applied late; the renewal loop deletes it again.
type orphan struct {
	c     claim
	rev   int64     // its create revision; 0: any
	until time.Time // keep deleting until then (writes of unknown outcome)
}

// idleLinger is how long a renewed lease is kept alive after its last use.
const idleLinger = 2 * time.Second

// margin is how long before the earliest possible expiry on the server a
// lease that could not be renewed is declared lost.
func (s *session) margin() time.Duration { return s.granted / 10 }

// session returns a granted, live lease for ttl, with a reference the caller
// drops with unrefSession.
func (f *Factory) session(ctx context.Context, ttl time.Duration, renew bool) (*session, error) {
	for {
		f.mu.Lock()
		if f.closed {
			f.mu.Unlock()
			return nil, lock.ErrClosed
		}
		var s *session
		if renew {
			s = f.sessions[ttl]
			if s != nil && s.ok && s.refs == 0 && !s.fresh() {
				f.retireLocked(s)
				s = nil
			}
		}
		if s == nil {
			s = &session{f: f, ttl: ttl, renew: renew, ready: make(chan struct{}), stop: make(chan struct{}),
				holders: map[*Holder]struct{}{}, orphans: map[string]orphan{}}
			if renew {
				f.sessions[ttl] = s
			} else {
				f.private[s] = struct{}{}
			}
			f.goLocked(s.grant)
		}
		s.refs++
		if s.idle != nil {
			s.idle.Stop()
			s.idle = nil
		}
		f.wakeLocked(s)
		f.mu.Unlock()
		select {
		case <-s.ready:
		case <-ctx.Done():
			f.unrefSession(s)
			return nil, ctx.Err()
		}
		if s.err != nil {
			f.unrefSession(s)
			return nil, s.err
		}
		if s.alive() {
			return s, nil
		}
		f.unrefSession(s)
	}
}

// alive reports whether the session is not dead: its lease is renewed,
// or may still be.
func (s *session) alive() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return !s.dead
}

// fresh reports whether an idle lease has enough life left to be taken up
// again (its renewal restarts at once).
func (s *session) fresh() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return !s.dead && time.Until(s.deadline) >= s.granted/3
}

// goLocked runs fn in a goroutine Close waits for. f.mu is held and the
// factory is not closed.
func (f *Factory) goLocked(fn func()) {
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		fn()
	}()
}

// wakeLocked starts the renewal of a granted, renewed session in use. f.mu
// is held and the factory is not closed.
func (f *Factory) wakeLocked(s *session) {
	if !s.renew || !s.ok || s.looping || s.refs == 0 || s.gone {
		return
	}
	s.looping = true
	s.loopStop = make(chan struct{})
	stop := s.loopStop
	f.goLocked(func() { s.loop(stop) })
}

func (f *Factory) sleepLocked(s *session) {
	if s.looping {
		close(s.loopStop)
		s.looping = false
	}
}

func (f *Factory) refSession(s *session) {
	f.mu.Lock()
	s.refs++
	f.mu.Unlock()
}

func (f *Factory) unrefSession(s *session) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s.refs--
	if s.refs > 0 || s.gone {
		return
	}
	if !s.renew {
		f.retireLocked(s)
		return
	}
	s.idle = time.AfterFunc(idleLinger, func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		if s.refs == 0 {
			f.sleepLocked(s)
		}
	})
}

// retireLocked takes an unused session out of the factory and revokes its
// lease. f.mu is held.
func (f *Factory) retireLocked(s *session) {
	f.forgetLocked(s)
	if f.closed {
		return // Close ends every session it found
	}
	f.goLocked(func() {
		<-s.ready
		if s.err == nil {
			s.kill()
			s.revoke()
		}
	})
}

func (f *Factory) forget(s *session) {
	f.mu.Lock()
	f.forgetLocked(s)
	f.mu.Unlock()
}

func (f *Factory) forgetLocked(s *session) {
	f.sleepLocked(s)
	if s.gone {
		return
	}
	s.gone = true
	if s.idle != nil {
		s.idle.Stop()
		s.idle = nil
	}
	if s.renew {
		if f.sessions[s.ttl] == s {
			delete(f.sessions, s.ttl)
		}
	} else {
		delete(f.private, s)
	}
}

func (s *session) grant() {
	ctx, cancel := context.WithTimeout(s.f.ctx, opTimeout)
	sent := time.Now()
	resp, err := s.f.cli.Grant(ctx, int64(s.ttl/time.Second))
	cancel()
	switch {
	case err != nil && s.f.ctx.Err() == nil:
		err = fmt.Errorf("etcdlock: acquire: lease grant: %w", err)
	case err == nil && resp.TTL <= 0:
		err = errors.New("etcdlock: acquire: lease granted with no TTL")
	}
	if err != nil {
		if s.f.ctx.Err() != nil {
			err = lock.ErrClosed
		}
		s.err = err
		s.f.forget(s)
		close(s.ready)
		return
	}
	s.id, s.granted = resp.ID, time.Duration(resp.TTL)*time.Second
	s.mu.Lock()
	s.renewed = sent
	s.deadline = sent.Add(s.granted - s.margin())
	s.timer = time.AfterFunc(time.Until(s.deadline), s.expire)
	s.mu.Unlock()
	s.f.mu.Lock()
	s.ok = true
	if !s.f.closed {
		s.f.wakeLocked(s)
	}
	s.f.mu.Unlock()
	close(s.ready)
}

// renewWhile keeps a lease that is not otherwise renewed alive until the
// returned function is called.
func (s *session) renewWhile() (stop func()) {
	ch := make(chan struct{})
	s.f.spawn(func() { s.loop(ch) })
	return sync.OnceFunc(func() { close(ch) })
}

// loop renews the lease every third of its TTL, and sooner after a failure,
// until stop closes or the session ends.
func (s *session) loop(stop <-chan struct{}) {
	interval := s.granted / 3
	retry := max(s.granted/20, 50*time.Millisecond)
	s.mu.Lock()
	first := max(time.Until(s.renewed.Add(interval)), 0)
	s.mu.Unlock()
	t := time.NewTimer(first)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-s.stop:
			return
		case <-s.f.ctx.Done():
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(s.f.ctx, interval)
		err := s.keepAlive(ctx)
		cancel()
		next := interval
		switch {
		case errors.Is(err, ErrLockLost):
			return
		case err != nil:
			next = retry
		default:
			s.retryOrphans()
		}
		t.Reset(next)
	}
}

// keepAlive renews the lease once and moves the deadline.
func (s *session) keepAlive(ctx context.Context) error {
	s.mu.Lock()
	dead, deadline := s.dead, s.deadline
	s.mu.Unlock()
	if dead {
		return ErrLockLost
	}
	sent := time.Now()
	kctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	resp, err := s.f.cli.KeepAliveOnce(clientv3.WithRequireLeader(kctx), s.id)
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		s.die(false, backend.Loss(ErrLockLost, lock.ErrSessionEnded, "lease %x no longer exists in etcd", s.id))
		return ErrLockLost
	}
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.dead {
		return ErrLockLost // too late: never revive a lease declared lost
	}
	s.renewed = sent
	if d := sent.Add(time.Duration(resp.TTL)*time.Second - s.margin()); d.After(s.deadline) {
		s.deadline = d
		s.timer.Reset(time.Until(d))
	}
	return nil
}

func (s *session) expire() {
	s.mu.Lock()
	if s.dead {
		s.mu.Unlock()
		return
	}
	if d := time.Until(s.deadline); d > 0 {
		s.timer.Reset(d)
		s.mu.Unlock()
		return
	}
	s.mu.Unlock()
	s.die(true, backend.Loss(ErrLockLost, lock.ErrLeaseExpired, "lease %x not renewed in time", s.id))
}

// die ends a session whose lease is lost or about to be: its holders lose
// their locks first, with loss, then the lease is revoked, if it may still
// exist and hold keys.
func (s *session) die(revoke bool, loss error) {
	holders, orphans, ok := s.kill()
	if !ok {
		return
	}
	s.f.forget(s)
	for _, h := range holders {
		h.lose(loss)
	}
	if revoke && len(holders)+orphans > 0 {
		s.f.spawn(func() { s.revoke() })
	}
}

// kill marks the session dead and stops its renewal; it returns the holders
// it had and how many orphans, and false if it was dead already.
func (s *session) kill() ([]*Holder, int, bool) {
	s.mu.Lock()
	if s.dead {
		s.mu.Unlock()
		return nil, 0, false
	}
	s.dead = true
	if s.timer != nil {
		s.timer.Stop()
	}
	close(s.stop)
	var hs []*Holder
	for h := range s.holders {
		hs = append(hs, h)
	}
	clear(s.holders)
	orphans := s.orphans
	s.orphans = nil
	s.mu.Unlock()
	// The lease takes the orphans with it; the names may be used again
	// (an acquire checks that a name is free before writing it).
	for _, o := range orphans {
		s.f.unclaim(o.c)
	}
	return hs, len(orphans), true
}

func (s *session) revoke() error {
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	_, err := s.f.cli.Revoke(ctx, s.id)
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		err = nil
	}
	return err
}

// end is Close's: holders lose their locks and the lease is revoked.
func (s *session) end() error {
	holders, _, ok := s.kill()
	if !ok {
		return nil
	}
	closed := fmt.Errorf("%w: %w", ErrLockLost, lock.ErrClosed)
	for _, h := range holders {
		h.lose(closed)
	}
	return s.revoke()
}

// addHolder registers h with the session, unless the session is dead or
// past its deadline: a process paused across its lease (SIGSTOP, a frozen
// VM) may run again before the timer that ends the session fires.
func (s *session) addHolder(h *Holder) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.dead || !time.Now().Before(s.deadline) {
		return false
	}
	s.holders[h] = struct{}{}
	return true
}

func (s *session) removeHolder(h *Holder) {
	s.mu.Lock()
	delete(s.holders, h)
	s.mu.Unlock()
}

// addOrphan hands a key to the renewal loop to delete; revoking the lease
// removes it in the end.
func (s *session) addOrphan(c claim, rev int64) {
	o := orphan{c: c, rev: rev}
	if rev == 0 {
		o.until = time.Now().Add(opTimeout)
	}
	s.mu.Lock()
	dead := s.dead
	if !dead {
		s.orphans[c.key] = o
	}
	s.mu.Unlock()
	if dead {
		s.f.unclaim(c)
	}
}

func (s *session) retryOrphans() {
	s.mu.Lock()
	todo := make([]orphan, 0, len(s.orphans))
	for _, o := range s.orphans {
		todo = append(todo, o)
	}
	s.mu.Unlock()
	for _, o := range todo {
		ctx, cancel := context.WithTimeout(s.f.ctx, opTimeout)
		_, err := s.f.del(ctx, o.c.key, o.rev)
		cancel()
		if err != nil || time.Now().Before(o.until) {
			continue
		}
		s.mu.Lock()
		_, still := s.orphans[o.c.key]
		if still {
			delete(s.orphans, o.c.key)
		}
		s.mu.Unlock()
		if still {
			s.f.unclaim(o.c)
		}
	}
}

// remove deletes the key of c if it is still the one created at rev, and
// drops the claim. rev 0 means the outcome of the write is unknown: the key
// is deleted whatever its revision, and again while the session lives, in
// case the write is applied late. On failure the session retries.
func (f *Factory) remove(s *session, c claim, rev int64) {
	ctx, cancel := backend.ReleaseContext(context.Background())
	defer cancel()
	_, err := f.del(ctx, c.key, rev)
	if err != nil || rev == 0 {
		s.addOrphan(c, rev)
		return
	}
	f.unclaim(c)
}

// del deletes key if it is still the one created at rev (whatever it is
// when rev is 0), and reports whether it was.
func (f *Factory) del(ctx context.Context, key string, rev int64) (bool, error) {
	if rev == 0 {
		_, err := f.cli.Delete(ctx, key)
		return err == nil, err
	}
	resp, err := f.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", rev)).Then(clientv3.OpDelete(key)).Commit()
	return err == nil && resp.Succeeded, err
}

package pglock

// Waiting is how many Acquires of f wait on name under f's default key
// prefix, so tests can act once a waiter waits.
func (f *Factory) Waiting(name string) int {
	k := keysOf(f.cfg.Options.KeyPrefix, name)
	f.lis.mu.Lock()
	defer f.lis.mu.Unlock()
	return len(f.lis.subs[k.waiters])
}

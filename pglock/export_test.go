package pglock

// Waiting is how many Acquires of f wait on name under f's default key
// prefix, so tests can act once a waiter waits.
func (f *Factory) Waiting(name string) int {
	k := keysOf(f.cfg.Options.KeyPrefix, name)
	f.mu.Lock()
	defer f.mu.Unlock()
	if e := f.entries[k.mutex]; e != nil {
		return len(e.queue)
	}
	return 0
}

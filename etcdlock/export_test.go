package etcdlock

// Renewing is how many of f's shared leases its renewal keeps alive now:
// one stops idleLinger after its last lock, so tests can wait for that.
func (f *Factory) Renewing() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, s := range f.sessions {
		if s.looping {
			n++
		}
	}
	return n
}

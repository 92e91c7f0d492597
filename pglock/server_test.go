package pglock

import (
	"errors"
	"testing"
)

// The server is refused by what version() (or CockroachDB's crdb_version
// parameter) says: CockroachDB's advisory lock functions return true to
// every session without locking.
func TestCheckVersion(t *testing.T) {
	for _, c := range []struct {
		version string
		refused bool
	}{
		{"PostgreSQL 16.4 (Debian 16.4-1.pgdg120+1) on x86_64-pc-linux-gnu, compiled by gcc (Debian 12.2.0-14) 12.2.0, 64-bit", false},
		{"PostgreSQL 15.8 on aarch64-unknown-linux-gnu, compiled by gcc (GCC) 7.3.1 20180712 (Red Hat 7.3.1-12), 64-bit", false},
		{"PostgreSQL 11.2-YB-2.20.1.0-b0 on x86_64-pc-linux-gnu, compiled by clang version 16.0.6, 64-bit", false},
		{"", false}, // no crdb_version parameter
		{"CockroachDB CCL v23.1.11 (x86_64-pc-linux-gnu, built 2023/09/27 01:53:43, go1.19.10)", true},
		{"CockroachDB OSS v21.2.17 (x86_64-unknown-linux-gnu, built 2022/10/17 18:03:25, go1.16.6)", true},
		{"CockroachDB CCL v24.2.0 (aarch64-unknown-linux-gnu, built 2024/08/12 10:40:00, go1.22.5 X:nocoverageredesign)", true},
	} {
		err := checkVersion(c.version)
		if got := errors.Is(err, ErrNoAdvisoryLocks); got != c.refused || (err != nil) != c.refused {
			t.Errorf("checkVersion(%q) = %v; want refused %v", c.version, err, c.refused)
		}
	}
}

package pglock

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ubgo/lock/internal/testenv"
)

// Every file of sql/ runs by hand with psql as its header and sql.go say:
// setup.sql and the tables with -f, the statements prepared, in a schema
// of their own given as -v schema=...; and the code loads every file.
func TestSQLRunsWithPsql(t *testing.T) {
	psql, err := exec.LookPath("psql")
	if err != nil {
		t.Skip("no psql")
	}
	pool := testPool(t)
	schema := fmt.Sprintf("pglock psql %d", time.Now().UnixNano()%1e9) // a name that needs quoting
	if _, err := pool.Exec(context.Background(), `CREATE SCHEMA "`+schema+`"`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pool.Exec(context.Background(), `DROP SCHEMA "`+schema+`" CASCADE`) })
	run := func(stdin string, args ...string) {
		t.Helper()
		cmd := exec.Command(psql, append([]string{"-X", "-q", "-v", "ON_ERROR_STOP=1", "-v", "schema=" + schema, testenv.PostgresDSN()}, args...)...)
		cmd.Stdin = strings.NewReader(stdin)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("psql %v: %v\n%s", args, err, out)
		}
	}
	run("", "-1", "-f", "sql/setup.sql")
	run("", "-1", "-f", "sql/fences_table.sql")
	run("", "-1", "-f", "sql/ledger_table.sql")
	files, err := filepath.Glob("sql/*.sql")
	if err != nil {
		t.Fatal(err)
	}
	code := goSource(t)
	for _, file := range files {
		name := strings.TrimSuffix(filepath.Base(file), ".sql")
		if !strings.Contains(code, `"`+name+`"`) {
			t.Errorf("%s: no code loads it", file)
		}
		if name == "setup" || strings.HasSuffix(name, "_table") {
			continue
		}
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasSuffix(strings.TrimSpace(string(b)), ";") {
			t.Errorf("%s: a statement ends without ';', so that it can follow PREPARE", file)
		}
		run("PREPARE s AS\n" + string(b) + ";\nDEALLOCATE s;\n")
	}
	// What psql made is what the factory uses.
	f := NewFactory(pool, WithLogger(nil), WithSchema(schema))
	defer f.Close()
	for _, opts := range [][]Option{nil, {WithShared()}, {WithMaxConcurrent(2)}} {
		h, err := f.Acquire(context.Background(), "psql", opts...)
		if err != nil {
			t.Fatalf("Acquire in the schema psql set up: %v", err)
		}
		h.Release()
	}
	if err := NewFence(pool, WithSchema(schema)).RejectIfStale(context.Background(), "psql", 1); err != nil {
		t.Fatalf("RejectIfStale in the schema psql set up: %v", err)
	}
}

// goSource is the package's Go code, tests aside.
func goSource(t *testing.T) string {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		b.Write(src)
	}
	return b.String()
}

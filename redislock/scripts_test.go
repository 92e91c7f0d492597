package redislock

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/redis/go-redis/v9"
)

// Every script in lua/ loads on the real server (SCRIPT LOAD compiles it)
// and is the one the package runs, and the package runs no other.
func TestScriptsLoad(t *testing.T) {
	rdb := newClient(t)
	ctx := ctxT(t)
	used := map[string]bool{}
	for _, s := range []*redis.Script{mutexAcquire, mutexRelease, mutexExtend, mutexExtendN, sharedAcquire, sharedRelease, semAcquire, semRelease, semExtend, inspectScript, fenceScript, breakScript} {
		used[s.Hash()] = false
	}
	files, err := filepath.Glob("lua/*.lua")
	if err != nil || len(files) == 0 {
		t.Fatalf("no scripts in lua/: %v", err)
	}
	for _, file := range files {
		src, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		sha, err := rdb.ScriptLoad(ctx, string(src)).Result()
		if err != nil {
			t.Errorf("%s: SCRIPT LOAD: %v", file, err)
			continue
		}
		if _, ok := used[sha]; !ok {
			t.Errorf("%s is not a script the package runs", file)
		}
		used[sha] = true
	}
	for sha, loaded := range used {
		if !loaded {
			t.Errorf("script %s is not in lua/", sha)
		}
	}
}

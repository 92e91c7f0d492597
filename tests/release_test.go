package tests

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/module"
	"golang.org/x/mod/zip"
)

// TestRelease releases a copy of the work tree with scripts/release.sh and
// installs the result the way a user would: go get of every published
// module from a module proxy made of the release tags, then build and vet
// a program that uses each, and go install of the lock command at the
// version (refused while a released go.mod has replace directives). A
// require of a version that was never tagged (v0.0.0) fails here, as it
// would for every user.
func TestRelease(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and installs every module from a local proxy (20 s): not in -short")
	}
	const version = "v0.1.0"
	// The tags a release makes, one per published module: a module that
	// is to be published has to be added here.
	wantTags := []string{
		version,
		"cmd/lock/" + version,
		"contrib/gocronlock/" + version,
		"contrib/otellock/" + version,
		"contrib/promlock/" + version,
		"etcdlock/" + version,
		"filelock/" + version,
		"flock/" + version,
		"memlock/" + version,
		"pglock/" + version,
		"redislock/" + version,
	}

	start := time.Now()
	step := func(what string) { t.Logf("%6.1fs %s", time.Since(start).Seconds(), what) }
	src, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		t.Skipf("not in a git work tree (%v): nothing to release", err)
	}
	work := t.TempDir()
	repo := filepath.Join(work, "repo")
	copyWorkTree(t, strings.TrimSpace(string(src)), repo)
	git(t, repo, "init", "-q")
	git(t, repo, "add", "-A")
	git(t, repo, "commit", "-q", "-m", "snapshot of the work tree")
	snapshot := git(t, repo, "rev-parse", "HEAD")
	replaces := replaceDirectives(t, repo, "HEAD")
	step("copied the work tree")

	release := func(args ...string) (string, error) {
		cmd := exec.Command(filepath.Join(repo, "scripts", "release.sh"), args...)
		cmd.Dir = repo
		cmd.Env = gitEnv()
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	// state is what a refused or planned release must leave as it was.
	state := func() string {
		return git(t, repo, "rev-parse", "HEAD") + "\n" + git(t, repo, "tag", "-l") + "\n" + git(t, repo, "status", "--porcelain")
	}
	refused := func(why, want string, args ...string) {
		t.Helper()
		before := state()
		out, err := release(args...)
		if err == nil || !strings.Contains(out, want) {
			t.Errorf("%s: release.sh %s = %v, want a refusal saying %q; output:\n%s", why, strings.Join(args, " "), err, want, out)
		}
		if after := state(); after != before {
			t.Errorf("%s: the refusal changed the repository:\n%s\nwas:\n%s", why, after, before)
		}
	}

	// The plan names every tag and changes nothing.
	before := state()
	out, err := release(version)
	if err != nil {
		t.Fatalf("release.sh %s: %v\n%s", version, err, out)
	}
	for _, tag := range wantTags {
		if !strings.Contains(out, "  "+tag+"\n") {
			t.Errorf("the plan does not name tag %s:\n%s", tag, out)
		}
	}
	if after := state(); after != before {
		t.Errorf("the plan changed the repository:\n%s", after)
	}

	for _, v := range []string{"0.1.0", "v0.1", "v0.1.0.0", "v01.1.0", "v0.1.0-", "v0.1.0+meta", "V0.1.0"} {
		refused("bad version", "malformed version", "--apply", v)
	}
	refused("no version", "usage", "--apply")
	writeFile(t, filepath.Join(repo, "README.md"), "edited\n")
	refused("modified file", "not clean", "--apply", version)
	git(t, repo, "checkout", "--", "README.md")
	writeFile(t, filepath.Join(repo, "stray.txt"), "new\n")
	refused("untracked file", "not clean", "--apply", version)
	os.Remove(filepath.Join(repo, "stray.txt"))

	if out, err := release("--apply", version); err != nil {
		t.Fatalf("release.sh --apply %s: %v\n%s", version, err, out)
	}
	tags := strings.Fields(git(t, repo, "tag", "-l"))
	if !sameSet(tags, wantTags) {
		t.Fatalf("tags %v, want %v", tags, wantTags)
	}
	// The release commit, which every tag names, follows the snapshot;
	// then one commit puts the replace directives back.
	released := git(t, repo, "rev-parse", version+"^{commit}")
	for _, tag := range tags {
		if c := git(t, repo, "rev-parse", tag+"^{commit}"); c != released {
			t.Errorf("tag %s is on %s, not the release commit %s", tag, c, released)
		}
	}
	if released != snapshot && git(t, repo, "rev-parse", released+"^") != snapshot {
		t.Errorf("more than one release commit after the snapshot")
	}
	if head := git(t, repo, "rev-parse", "HEAD"); head != released && git(t, repo, "rev-parse", "HEAD^") != released {
		t.Errorf("more than one commit after the release commit")
	}
	if s := git(t, repo, "status", "--porcelain"); s != "" {
		t.Errorf("the release left the tree dirty:\n%s", s)
	}
	checkRequires(t, repo, version, version)
	checkRequires(t, repo, "HEAD", version)
	// No released go.mod of a published module has a replace directive
	// (go install pkg@version refuses any); the tree goes on with them.
	for _, r := range replaceDirectives(t, repo, version) {
		for _, tag := range wantTags {
			if dir := strings.TrimSuffix(tag, version); strings.HasPrefix(r, dir+"go.mod:") {
				t.Errorf("at %s, a published module's %s", version, r)
			}
		}
	}
	if got := replaceDirectives(t, repo, "HEAD"); !slices.Equal(got, replaces) {
		t.Errorf("replace directives changed:\n%v\nwere:\n%v", got, replaces)
	}
	// The workspace builds from the tree, and from the release commit.
	goCmd(t, repo, append(os.Environ(), "GOWORK="+filepath.Join(repo, "go.work")), "list", "github.com/ubgo/lock/...")
	atRelease := filepath.Join(work, "at-release")
	git(t, repo, "worktree", "add", "-q", "--detach", atRelease, version)
	goCmd(t, atRelease, append(os.Environ(), "GOWORK="+filepath.Join(atRelease, "go.work")), "list", "github.com/ubgo/lock/...")
	git(t, repo, "worktree", "remove", atRelease)

	step("released")
	refused("released version", "already exists", "--apply", version)
	git(t, repo, "tag", "etcdlock/v0.2.0") // one module's tag is enough to refuse
	refused("partly released version", "already exists", "--apply", "v0.2.0")
	git(t, repo, "tag", "-d", "etcdlock/v0.2.0")

	proxy := filepath.Join(work, "proxy")
	paths := buildProxy(t, repo, proxy)
	env := userEnv(t, work, proxy)
	step("built the proxy")

	// A user of every published module.
	app := filepath.Join(work, "app")
	writeFile(t, filepath.Join(app, "go.mod"), "module example.com/app\n\ngo 1.26.0\n")
	get := []string{"get"}
	for _, p := range paths {
		if p != "github.com/ubgo/lock" && p != lockCmdPath {
			get = append(get, p+"@"+version)
		}
	}
	goCmd(t, app, env, get...)
	step("go get")
	writeFile(t, filepath.Join(app, "main.go"), appMain)
	goCmd(t, app, env, "mod", "tidy")
	step("go mod tidy")
	goCmd(t, app, env, "build", "-o", filepath.Join(work, "app.bin"), ".")
	step("go build")
	goCmd(t, app, env, "vet", "./...")
	step("go vet")
	// The command, installed as its guide says, outside any module and
	// with no -mod=mod (which a user does not set).
	bin := filepath.Join(work, "bin")
	install := append(env, "GOBIN="+bin, "GOFLAGS=-modcacherw -trimpath")
	goCmd(t, work, install, "install", lockCmdPath+"@"+version)
	help := exec.Command(filepath.Join(bin, "lock"), "help")
	if out, err := help.CombinedOutput(); err != nil || !strings.Contains(string(out), "lock run") {
		t.Errorf("the installed lock help: %v\n%s", err, out)
	}
	step("go install " + lockCmdPath + "@" + version)
	mods := listModules(t, app, env)
	for _, p := range paths {
		if p == lockCmdPath {
			continue // installed, not required
		}
		m, ok := mods[p]
		if !ok || m.Version != version || m.Replace != nil || !strings.HasPrefix(m.Dir, filepath.Join(work, "modcache")+string(filepath.Separator)) {
			t.Errorf("%s in the user's build: %+v, want %s from the module cache", p, m, version)
		}
	}
	if _, ok := mods["github.com/redis/go-redis/v9"]; !ok {
		t.Error("redislock's user has no go-redis in the module graph")
	}
	// The root module's zip holds none of the nested modules.
	if _, err := os.Stat(filepath.Join(mods["github.com/ubgo/lock"].Dir, "memlock", "go.mod")); !os.IsNotExist(err) {
		t.Errorf("the root module at %s contains memlock/go.mod (stat: %v)", version, err)
	}

	// A user of gocronlock over memlock gets no Redis client, pgx or etcd
	// in the module graph: the published modules carry no test-only
	// requirements.
	cron := filepath.Join(work, "cron")
	writeFile(t, filepath.Join(cron, "go.mod"), "module example.com/cron\n\ngo 1.26.0\n")
	writeFile(t, filepath.Join(cron, "main.go"), cronMain)
	goCmd(t, cron, env, "get", "github.com/ubgo/lock/contrib/gocronlock@"+version, "github.com/ubgo/lock/memlock@"+version)
	goCmd(t, cron, env, "mod", "tidy")
	step("gocronlock user")
	for p := range listModules(t, cron, env) {
		for _, bad := range []string{"github.com/redis/", "github.com/ubgo/lock/redislock", "github.com/jackc/", "go.etcd.io/"} {
			if strings.HasPrefix(p, bad) {
				t.Errorf("a user of gocronlock and memlock has %s in the module graph", p)
			}
		}
	}
}

const lockCmdPath = "github.com/ubgo/lock/cmd/lock"

// appMain uses a Factory of each backend, the gocron adapter over one,
// and the two metrics observers.
const appMain = `package main

import (
	"context"
	"fmt"
	"os"

	"github.com/go-co-op/gocron/v2"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/contrib/gocronlock"
	"github.com/ubgo/lock/contrib/otellock"
	"github.com/ubgo/lock/contrib/promlock"
	"github.com/ubgo/lock/etcdlock"
	"github.com/ubgo/lock/filelock"
	"github.com/ubgo/lock/flock"
	"github.com/ubgo/lock/memlock"
	"github.com/ubgo/lock/pglock"
	"github.com/ubgo/lock/redislock"
)

func main() {
	ctx := context.Background()
	mem := memlock.NewFactory(memlock.WithObserver(otellock.New()))
	defer mem.Close()
	lockers := []lock.Locker{
		mem.AsLocker(),
		flock.NewFactory(flock.WithDir(os.TempDir()), flock.WithObserver(promlock.New())).AsLocker(),
		filelock.NewFactory(filelock.WithDir(os.TempDir())).AsLocker(),
		redislock.NewFactory(redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})).AsLocker(),
	}
	if pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL")); err == nil {
		lockers = append(lockers, pglock.NewFactory(pool).AsLocker())
	}
	if cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"127.0.0.1:2379"}}); err == nil {
		lockers = append(lockers, etcdlock.NewFactory(cli).AsLocker())
	}
	s, err := gocron.NewScheduler(gocron.WithDistributedLocker(gocronlock.New(mem.AsLocker())))
	if err != nil {
		panic(err)
	}
	defer s.Shutdown()
	fmt.Println(len(lockers), "lockers")
}
`

const cronMain = `package main

import (
	"github.com/go-co-op/gocron/v2"

	"github.com/ubgo/lock/contrib/gocronlock"
	"github.com/ubgo/lock/memlock"
)

func main() {
	s, err := gocron.NewScheduler(gocron.WithDistributedLocker(gocronlock.New(memlock.NewFactory().AsLocker())))
	if err != nil {
		panic(err)
	}
	s.Shutdown()
}
`

// copyWorkTree copies the tracked and the untracked, not ignored, files of
// the work tree at src to dst, so that uncommitted work is released too.
func copyWorkTree(t *testing.T, src, dst string) {
	t.Helper()
	out, err := exec.Command("git", "-C", src, "ls-files", "-z", "-co", "--exclude-standard").Output()
	if err != nil {
		t.Fatalf("git ls-files: %v", err)
	}
	for _, name := range strings.Split(strings.TrimSuffix(string(out), "\x00"), "\x00") {
		from, to := filepath.Join(src, name), filepath.Join(dst, name)
		fi, err := os.Lstat(from)
		if os.IsNotExist(err) {
			continue // deleted in the work tree, not yet in the index
		}
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
			t.Fatal(err)
		}
		if fi.Mode()&os.ModeSymlink != 0 {
			target, err := os.Readlink(from)
			if err == nil {
				err = os.Symlink(target, to)
			}
			if err != nil {
				t.Fatal(err)
			}
			continue
		}
		data, err := os.ReadFile(from)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(to, data, fi.Mode().Perm()); err != nil {
			t.Fatal(err)
		}
	}
}

// gitEnv is the environment for git in the throw-away repository: no
// configuration of the developer's (signing, hooks), a fixed identity.
func gitEnv() []string {
	return append(os.Environ(),
		"GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_NOSYSTEM=1",
		"GIT_AUTHOR_NAME=release test", "GIT_AUTHOR_EMAIL=release-test@example.com",
		"GIT_COMMITTER_NAME=release test", "GIT_COMMITTER_EMAIL=release-test@example.com")
}

func git(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = gitEnv()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}

func goCmd(t *testing.T, dir string, env []string, args ...string) string {
	t.Helper()
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("in %s: go %s: %v\n%s", dir, strings.Join(args, " "), err, out)
	}
	return string(out)
}

func writeFile(t *testing.T, name, data string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(name), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(name, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

// goModFiles parses every go.mod of repo at revision rev, by path.
func goModFiles(t *testing.T, repo, rev string) map[string]*modfile.File {
	t.Helper()
	files := map[string]*modfile.File{}
	for _, name := range strings.Fields(git(t, repo, "ls-tree", "-r", "--name-only", rev)) {
		if name != "go.mod" && !strings.HasSuffix(name, "/go.mod") {
			continue
		}
		data := []byte(git(t, repo, "show", rev+":"+name) + "\n")
		f, err := modfile.Parse(name, data, nil)
		if err != nil {
			t.Fatal(err)
		}
		files[name] = f
	}
	return files
}

// checkRequires fails t unless every require of a module of the
// repository, in every go.mod at revision rev, is version.
func checkRequires(t *testing.T, repo, rev, version string) {
	t.Helper()
	n := 0
	for name, f := range goModFiles(t, repo, rev) {
		for _, r := range f.Require {
			if r.Mod.Path == "github.com/ubgo/lock" || strings.HasPrefix(r.Mod.Path, "github.com/ubgo/lock/") {
				n++
				if r.Mod.Version != version {
					t.Errorf("at %s, %s requires %s, want %s", rev, name, r.Mod, version)
				}
			}
		}
	}
	if n == 0 {
		t.Error("no go.mod requires a module of the repository")
	}
}

// replaceDirectives lists the replace directives of every go.mod at
// revision rev.
func replaceDirectives(t *testing.T, repo, rev string) []string {
	t.Helper()
	var out []string
	for name, f := range goModFiles(t, repo, rev) {
		for _, r := range f.Replace {
			out = append(out, fmt.Sprintf("%s: %s => %s", name, r.Old, r.New))
		}
	}
	slices.Sort(out)
	return out
}

// buildProxy lays out a file-based module proxy (GOPROXY=file://dir) with
// every version that the tags of repo name, and returns the module paths.
func buildProxy(t *testing.T, repo, dir string) []string {
	t.Helper()
	var paths []string
	for _, tag := range strings.Fields(git(t, repo, "tag", "-l")) {
		subdir, version := "", tag
		if i := strings.LastIndex(tag, "/"); i >= 0 {
			subdir, version = tag[:i], tag[i+1:]
		}
		show := exec.Command("git", "show", tag+":"+filepath.ToSlash(filepath.Join(subdir, "go.mod")))
		show.Dir = repo
		modData, err := show.Output()
		if err != nil {
			t.Fatalf("go.mod at %s: %v", tag, err)
		}
		path := modfile.ModulePath(modData)
		if want := strings.TrimSuffix("github.com/ubgo/lock/"+subdir, "/"); path != want {
			t.Fatalf("tag %s: go.mod declares %q, want %q", tag, path, want)
		}
		esc, err := module.EscapePath(path)
		if err != nil {
			t.Fatal(err)
		}
		vdir := filepath.Join(dir, filepath.FromSlash(esc), "@v")
		info, err := json.Marshal(map[string]string{"Version": version, "Time": git(t, repo, "log", "-1", "--format=%cI", tag)})
		if err != nil {
			t.Fatal(err)
		}
		writeFile(t, filepath.Join(vdir, version+".info"), string(info))
		writeFile(t, filepath.Join(vdir, version+".mod"), string(modData))
		f, err := os.Create(filepath.Join(vdir, version+".zip"))
		if err != nil {
			t.Fatal(err)
		}
		err = zip.CreateFromVCS(f, module.Version{Path: path, Version: version}, repo, tag, subdir)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			t.Fatalf("zip of %s: %v", tag, err)
		}
		list, err := os.OpenFile(filepath.Join(vdir, "list"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintln(list, version)
		list.Close()
		paths = append(paths, path)
	}
	slices.Sort(paths)
	return slices.Compact(paths)
}

// userEnv is the environment of a user outside the repository: no
// workspace, no replace, a module cache of its own (the fake releases must
// never reach the developer's), modules from proxy first, then from the
// developer's module cache and proxy; ours skip the checksum database.
// The build cache is shared: it is content-addressed, and with -trimpath
// the packages of the private module cache hit what an earlier run built.
func userEnv(t *testing.T, work, proxy string) []string {
	t.Helper()
	out, err := exec.Command("go", "env", "-json", "GOPROXY", "GOMODCACHE", "GOCACHE", "GOSUMDB", "GONOSUMDB").Output()
	if err != nil {
		t.Fatalf("go env: %v", err)
	}
	var dev map[string]string
	if err := json.Unmarshal(out, &dev); err != nil {
		t.Fatal(err)
	}
	nosumdb := "github.com/ubgo/lock"
	if dev["GONOSUMDB"] != "" {
		nosumdb += "," + dev["GONOSUMDB"]
	}
	return append(os.Environ(),
		"GOENV=off", // the developer's go env file must not add GOPRIVATE or a replace-like GOFLAGS
		"GOTOOLCHAIN=local",
		"GOWORK=off",
		"GOFLAGS=-mod=mod -modcacherw -trimpath",
		"GOMODCACHE="+filepath.Join(work, "modcache"),
		"GOCACHE="+dev["GOCACHE"],
		"GOPROXY=file://"+filepath.ToSlash(proxy)+",file://"+filepath.ToSlash(filepath.Join(dev["GOMODCACHE"], "cache", "download"))+","+dev["GOPROXY"],
		"GOSUMDB="+dev["GOSUMDB"],
		"GONOSUMDB="+nosumdb,
		"GOPRIVATE=", "GONOPROXY=", "GOINSECURE=",
	)
}

// listModules returns the modules of the build list of the module in dir.
func listModules(t *testing.T, dir string, env []string) map[string]*moduleInfo {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader([]byte(goCmd(t, dir, env, "list", "-m", "-json", "all"))))
	mods := map[string]*moduleInfo{}
	for dec.More() {
		m := new(moduleInfo)
		if err := dec.Decode(m); err != nil {
			t.Fatal(err)
		}
		mods[m.Path] = m
	}
	return mods
}

type moduleInfo struct {
	Path, Version, Dir string
	Replace            *moduleInfo
}

func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

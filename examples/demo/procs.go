package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// A group is the children of one step: this program re-run in a role.
// What they print comes to the parent line by line on one channel; a
// child's stdin closing is its signal to go on.
type group struct {
	spawn func(role string) *exec.Cmd
	lines chan line
	done  chan struct{}
	procs []*proc
}

type proc struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	pid   int
}

type line struct {
	p    *proc
	text string
}

func newGroup(spawn func(role string) *exec.Cmd) *group {
	return &group{spawn: spawn, lines: make(chan line), done: make(chan struct{})}
}

// start starts a child playing role with env added to its environment.
func (g *group) start(role string, env ...string) (*proc, error) {
	cmd := g.spawn(role)
	cmd.Env = append(cmd.Env, env...)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &proc{cmd: cmd, stdin: stdin, pid: cmd.Process.Pid}
	g.procs = append(g.procs, p)
	go func() {
		s := bufio.NewScanner(stdout)
		for s.Scan() {
			select {
			case g.lines <- line{p, s.Text()}:
			case <-g.done:
				return
			}
		}
	}()
	return p, nil
}

// next returns the next line a child printed.
func (g *group) next(ctx context.Context) (line, error) {
	select {
	case l := <-g.lines:
		if strings.HasPrefix(l.text, "error: ") {
			return l, fmt.Errorf("pid %d: %s", l.p.pid, l.text)
		}
		return l, nil
	case <-ctx.Done():
		return line{}, fmt.Errorf("waiting for the children: %w", ctx.Err())
	}
}

// expect returns the next line, which must come from p and start with
// prefix.
func (g *group) expect(ctx context.Context, p *proc, prefix string) (string, error) {
	l, err := g.next(ctx)
	if err == nil && (l.p != p || !strings.HasPrefix(l.text, prefix)) {
		err = fmt.Errorf("pid %d said %q, want pid %d to say a line starting with %q", l.p.pid, l.text, p.pid, prefix)
	}
	return l.text, err
}

// serve lets the workers ws through a lock of limit permits: whenever
// limit of them are inside (by the "in" lines seen and the go-ons sent),
// or none is left outside, the one inside longest is told to leave; it
// returns when all have left and exited.
func serve(ctx context.Context, g *group, ws []*proc, limit int) error {
	var inside []*proc
	entered := 0
	for left := 0; left < len(ws); {
		if len(inside) == limit || (entered == len(ws) && len(inside) > 0) {
			inside[0].stdin.Close()
			inside = inside[1:]
			left++
			continue
		}
		l, err := g.next(ctx)
		if err != nil {
			return err
		}
		if strings.HasPrefix(l.text, "in ") {
			inside = append(inside, l.p)
			entered++
		}
	}
	for _, w := range ws {
		if err := w.cmd.Wait(); err != nil {
			return fmt.Errorf("pid %d: %w", w.pid, err)
		}
	}
	return nil
}

// kill ends p with SIGKILL and returns once it is gone.
func (p *proc) kill() {
	p.cmd.Process.Kill()
	p.cmd.Wait()
}

// close kills the children still running.
func (g *group) close() {
	close(g.done)
	for _, p := range g.procs {
		if p.cmd.ProcessState == nil {
			p.kill()
		}
	}
}

// record appends "<what> <pid> <unix ns>" to the log at path. The file is
// opened with O_APPEND and each event is one write, so the log's order is
// the order in which the processes wrote.
func record(path, what string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(f, "%s %d %d\n", what, os.Getpid(), time.Now().UnixNano())
	return errors.Join(err, f.Close())
}

// history is what a log says.
type history struct {
	order    []int           // pids in the order they entered
	peak     int             // most inside at once
	handoffs []time.Duration // from an exit to the next enter, when the lock was empty in between
}

func readLog(path string) (history, error) {
	var h history
	data, err := os.ReadFile(path)
	if err != nil {
		return h, err
	}
	inside := 0
	var lastExit int64
	for _, ln := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		f := strings.Fields(ln)
		if len(f) != 3 {
			return h, fmt.Errorf("%s: bad line %q", path, ln)
		}
		pid, err1 := strconv.Atoi(f[1])
		at, err2 := strconv.ParseInt(f[2], 10, 64)
		if err1 != nil || err2 != nil {
			return h, fmt.Errorf("%s: bad line %q", path, ln)
		}
		switch f[0] {
		case "enter":
			if inside == 0 && lastExit != 0 {
				h.handoffs = append(h.handoffs, time.Duration(at-lastExit))
			}
			inside++
			h.peak = max(h.peak, inside)
			h.order = append(h.order, pid)
		case "exit":
			inside--
			lastExit = at
		}
	}
	return h, nil
}

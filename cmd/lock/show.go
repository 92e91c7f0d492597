//go:build unix

package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/ubgo/lock"
)

func inspectCmd(args []string, stdout, stderr io.Writer) int {
	var c common
	fs := flags("inspect", &c, stderr)
	asJSON := fs.Bool("json", false, "one JSON object instead of a table")
	pos, err := parse(fs, &c, args, 1, 1)
	if err != nil {
		return fail(stderr, err)
	}
	ctx := context.Background()
	b, err := open(ctx, c.backend, c.prefix)
	if err != nil {
		return fail(stderr, err)
	}
	defer b.Close()
	ictx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	info, err := b.Inspect(ictx, pos[0])
	if err != nil {
		return fail(stderr, err)
	}
	info.Name = pos[0]
	p := newPrinter(stdout, *asJSON)
	p.print(info)
	p.flush()
	return 0
}

func lsCmd(args []string, stdout, stderr io.Writer) int {
	var c common
	fs := flags("ls", &c, stderr)
	asJSON := fs.Bool("json", false, "one JSON object per line instead of a table")
	pos, err := parse(fs, &c, args, 0, 1)
	if err != nil {
		return fail(stderr, err)
	}
	prefix := ""
	if len(pos) > 0 {
		prefix = pos[0]
	}
	ctx := context.Background()
	b, err := open(ctx, c.backend, c.prefix)
	if err != nil {
		return fail(stderr, err)
	}
	defer b.Close()
	p := newPrinter(stdout, *asJSON)
	defer p.flush()
	n := 0
	for info, err := range b.List(ctx, prefix) {
		if err != nil {
			p.flush()
			return fail(stderr, err)
		}
		p.print(info)
		// The table is aligned a page at a time, so that a long listing
		// is not held in memory.
		if n++; n%lock.ListPageSize == 0 {
			p.flush()
		}
	}
	return 0
}

// A printer writes Infos as an aligned table or as JSON lines.
type printer struct {
	json   *json.Encoder
	tw     *tabwriter.Writer
	header bool
}

func newPrinter(w io.Writer, asJSON bool) *printer {
	if asJSON {
		return &printer{json: json.NewEncoder(w)}
	}
	return &printer{tw: tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)}
}

// jsonInfo is lock.Info with JSON names; times are RFC 3339, left out
// when the backend does not know them.
type jsonInfo struct {
	Name    string       `json:"name"`
	Limit   int          `json:"limit"`
	Waiting int          `json:"waiting"`
	Holders []jsonHolder `json:"holders"`
}

type jsonHolder struct {
	Token    uint64            `json:"token"`
	ID       string            `json:"id,omitempty"`
	Owner    string            `json:"owner,omitempty"`
	Since    *time.Time        `json:"since,omitempty"`
	Expires  *time.Time        `json:"expires,omitempty"`
	Metadata map[string]string `json:"metadata,omitempty"`
}

func (p *printer) print(info lock.Info) {
	if p.json != nil {
		j := jsonInfo{Name: info.Name, Limit: info.Limit, Waiting: info.Waiting, Holders: []jsonHolder{}}
		for _, h := range info.Holders {
			j.Holders = append(j.Holders, jsonHolder{Token: h.Token, ID: h.ID, Owner: h.Owner,
				Since: timePtr(h.Since), Expires: timePtr(h.Expires), Metadata: h.Metadata})
		}
		p.json.Encode(j)
		return
	}
	if !p.header {
		fmt.Fprintln(p.tw, "NAME\tLIMIT\tTOKEN\tOWNER\tID\tSINCE\tEXPIRES\tWAITING")
		p.header = true
	}
	if len(info.Holders) == 0 {
		fmt.Fprintf(p.tw, "%s\t-\t-\t-\t-\t-\t-\t%s\n", cell(info.Name), waiting(info.Waiting))
		return
	}
	for _, h := range info.Holders {
		fmt.Fprintf(p.tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\n", cell(info.Name), info.Limit, token(h.Token),
			cell(h.Owner), cell(h.ID), stamp(h.Since), stamp(h.Expires), waiting(info.Waiting))
	}
}

func (p *printer) flush() {
	if p.tw != nil {
		p.tw.Flush()
	}
}

func timePtr(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

// cell makes s one table cell: "-" for nothing, quoted if it holds blanks
// or control characters that would break the columns.
func cell(s string) string {
	if s == "" {
		return "-"
	}
	if strings.ContainsFunc(s, func(r rune) bool { return r <= ' ' || r == 0x7f }) {
		return strconv.Quote(s)
	}
	return s
}

func token(t uint64) string {
	if t == 0 {
		return "-"
	}
	return strconv.FormatUint(t, 10)
}

func stamp(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02T15:04:05.000Z")
}

func waiting(n int) string {
	if n == 0 {
		return "-"
	}
	return strconv.Itoa(n)
}

// A breaker frees a lock whose holder is gone, so that its fenced writes
// fail afterwards: filelock, redislock and etcdlock have one.
type breaker interface {
	Break(ctx context.Context, name string) error
}

// breakRefusal says why the backends without a breaker cannot free a lock
// from here.
var breakRefusal = map[string]string{
	"flock":  "a flock lock is a kernel lock on an open file: it ends only when its holder closes it or exits; stop the holder (lock inspect shows its pid)",
	"pglock": "a pglock lock belongs to a live Postgres session: it ends only with the session; end the holder's session (lock inspect shows its backend pid, for pg_terminate_backend)",
}

func breakCmd(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	var c common
	fs := flags("break", &c, stderr)
	yes := fs.Bool("yes", false, "do not ask for confirmation")
	pos, err := parse(fs, &c, args, 1, 1)
	if err != nil {
		return fail(stderr, err)
	}
	name := pos[0]
	ctx := context.Background()
	b, err := open(ctx, c.backend, c.prefix)
	if err != nil {
		return fail(stderr, err)
	}
	defer b.Close()
	br, ok := b.factory.(breaker)
	if !ok {
		fmt.Fprintf(stderr, "lock: break %s refused: %s\n", name, breakRefusal[b.kind])
		return exitRefused
	}
	bctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	if !*yes {
		shown, err := b.Inspect(bctx, name)
		if err != nil {
			return fail(stderr, err)
		}
		if len(shown.Holders) == 0 {
			fmt.Fprintf(stderr, "lock: %s is not held; nothing done\n", name)
			return exitNotHeld
		}
		shown.Name = name
		p := newPrinter(stderr, false)
		p.print(shown)
		p.flush()
		fmt.Fprintf(stderr, "free %s on %s, whoever holds it? [y/N] ", name, redact(c.backend))
		line, _ := bufio.NewReader(stdin).ReadString('\n')
		if a := strings.TrimSpace(line); a != "y" && a != "yes" {
			fmt.Fprintln(stderr, "lock: not confirmed; nothing done")
			return exitRefused
		}
		// Break frees whoever holds the name when it runs: refuse if that
		// is no longer who was shown (the holder was not gone after all).
		ictx, cancel := context.WithTimeout(ctx, connectTimeout)
		defer cancel()
		now, err := b.Inspect(ictx, name)
		if err != nil {
			return fail(stderr, err)
		}
		if !sameHolders(shown, now) {
			fmt.Fprintf(stderr, "lock: the holders of %s changed since they were shown; nothing done\n", name)
			return exitRefused
		}
		bctx, cancel = context.WithTimeout(ctx, connectTimeout)
		defer cancel()
	}
	if err := br.Break(bctx, name); err != nil {
		if errors.Is(err, lock.ErrNotHeld) {
			fmt.Fprintf(stderr, "lock: %s is not held; nothing done\n", name)
			return exitNotHeld
		}
		return fail(stderr, err)
	}
	fmt.Fprintf(stdout, "freed %s\n", name)
	return 0
}

// sameHolders reports whether a and b list the same holders' tokens.
func sameHolders(a, b lock.Info) bool {
	return slices.EqualFunc(a.Holders, b.Holders, func(x, y lock.HolderInfo) bool { return x.Token == y.Token })
}

package docscheck

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
)

// A Problem is one thing wrong with the docs, at a place in a Markdown file.
type Problem struct {
	File string // relative to the repository root
	Line int
	Msg  string
}

func (p Problem) String() string { return fmt.Sprintf("%s:%d: %s", p.File, p.Line, p.Msg) }

// A Doc is one Markdown file, split into what the checks look at.
type Doc struct {
	Path   string // absolute
	Rel    string // relative to the repository root, with forward slashes
	Blocks []*Block
	Spans  []Span
	Links  []Span // link targets
	Probs  []Problem
}

// A Block is a fenced code block.
type Block struct {
	Doc     *Doc
	Line    int    // line of the first line of content
	Lang    string // first word of the info string
	Text    string // content, with the fence's indentation removed
	Markers []Marker
}

// A Marker is a <!-- docscheck: ... --> directive before a block.
type Marker struct {
	Line int
	Verb string // skip, vars, api, foreign
	Arg  string
}

// Marker returns the block's marker with verb, if any.
func (b *Block) Marker(verb string) (Marker, bool) {
	for _, m := range b.Markers {
		if m.Verb == verb {
			return m, true
		}
	}
	return Marker{}, false
}

// A Span is a piece of inline text at a line: a code span, or a link target.
type Span struct {
	Line int
	Text string
}

var (
	fenceRE  = regexp.MustCompile("^([ \t]*)(`{3,}|~{3,})[ \t]*([^`\\s]*)")
	markerRE = regexp.MustCompile(`^[ \t]*<!--[ \t]*docscheck:[ \t]*(\S+)[ \t]*(.*?)[ \t]*-->[ \t]*$`)
	linkRE   = regexp.MustCompile(`\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)`)
	refDefRE = regexp.MustCompile(`^[ \t]{0,3}\[[^\]]+\]:[ \t]*<?(\S+?)>?(?:[ \t].*)?$`)
)

var markerVerbs = map[string]bool{"skip": true, "vars": true, "api": true, "foreign": true}

// ReadDocs reads the Markdown files in scope under root: README.md and
// every .md file under docs/.
func ReadDocs(root string) ([]*Doc, error) {
	paths := []string{filepath.Join(root, "README.md")}
	err := filepath.WalkDir(filepath.Join(root, "docs"), func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(p, ".md") {
			paths = append(paths, p)
		}
		return nil
	})
	if err != nil && !os.IsNotExist(err) {
		return nil, err
	}
	sort.Strings(paths[1:])
	var docs []*Doc
	for _, p := range paths {
		src, err := os.ReadFile(p)
		if err != nil {
			return nil, err
		}
		rel, _ := filepath.Rel(root, p)
		docs = append(docs, ParseMarkdown(p, filepath.ToSlash(rel), string(src)))
	}
	return docs, nil
}

// ParseMarkdown splits src into fenced code blocks, code spans and link
// targets. It understands as much Markdown as the checks need: fences of
// backticks or tildes (also indented, in lists), code spans of any number
// of backticks within a paragraph, inline links and reference definitions.
func ParseMarkdown(path, rel, src string) *Doc {
	d := &Doc{Path: path, Rel: rel}
	lines := strings.Split(strings.ReplaceAll(src, "\r\n", "\n"), "\n")
	var (
		para      []string // the current paragraph's lines
		paraStart int
		pending   []Marker
	)
	flush := func() {
		if len(para) > 0 {
			d.scanText(paraStart, para)
			para = nil
		}
	}
	for i := 0; i < len(lines); i++ {
		line := lines[i]
		if m := markerRE.FindStringSubmatch(line); m != nil {
			flush()
			if !markerVerbs[m[1]] {
				d.Probs = append(d.Probs, Problem{rel, i + 1, fmt.Sprintf("unknown docscheck marker %q (want skip, vars, api or foreign)", m[1])})
				continue
			}
			pending = append(pending, Marker{Line: i + 1, Verb: m[1], Arg: m[2]})
			continue
		}
		if m := fenceRE.FindStringSubmatch(line); m != nil {
			flush()
			indent, fence := m[1], m[2]
			b := &Block{Doc: d, Line: i + 2, Lang: m[3], Markers: pending}
			pending = nil
			var body []string
			j := i + 1
			for ; j < len(lines); j++ {
				t := strings.TrimLeft(lines[j], " \t")
				if strings.HasPrefix(t, fence[:1]) && len(t)-len(strings.TrimLeft(t, fence[:1])) >= len(fence) &&
					strings.TrimSpace(strings.TrimLeft(t, fence[:1])) == "" {
					break
				}
				body = append(body, dedent(lines[j], indent))
			}
			b.Text = strings.Join(body, "\n")
			if len(body) > 0 {
				b.Text += "\n"
			}
			d.Blocks = append(d.Blocks, b)
			i = j
			continue
		}
		if strings.TrimSpace(line) == "" {
			flush()
			continue
		}
		if len(pending) > 0 {
			d.Probs = append(d.Probs, Problem{rel, pending[0].Line, "docscheck marker not followed by a code block"})
			pending = nil
		}
		if len(para) == 0 {
			paraStart = i + 1
		}
		para = append(para, line)
	}
	flush()
	if len(pending) > 0 {
		d.Probs = append(d.Probs, Problem{rel, pending[0].Line, "docscheck marker not followed by a code block"})
	}
	return d
}

// dedent removes the fence's indentation from a content line.
func dedent(line, indent string) string {
	n := 0
	for n < len(indent) && n < len(line) && (line[n] == ' ' || line[n] == '\t') {
		n++
	}
	return line[n:]
}

// scanText finds the code spans and link targets of one paragraph.
func (d *Doc) scanText(start int, lines []string) {
	text := strings.Join(lines, "\n")
	lineAt := func(off int) int { return start + strings.Count(text[:off], "\n") }
	var plain strings.Builder // text outside code spans, same length
	i := 0
	for i < len(text) {
		if text[i] != '`' {
			plain.WriteByte(text[i])
			i++
			continue
		}
		n := 0
		for i+n < len(text) && text[i+n] == '`' {
			n++
		}
		end := findRun(text, i+n, n)
		if end < 0 {
			plain.WriteString(text[i : i+n])
			i += n
			continue
		}
		s := strings.ReplaceAll(text[i+n:end], "\n", " ")
		if len(s) >= 2 && s[0] == ' ' && s[len(s)-1] == ' ' && strings.TrimSpace(s) != "" {
			s = s[1 : len(s)-1]
		}
		d.Spans = append(d.Spans, Span{Line: lineAt(i), Text: s})
		plain.WriteString(strings.Repeat(" ", end+n-i))
		i = end + n
	}
	p := plain.String()
	for _, m := range linkRE.FindAllStringSubmatchIndex(p, -1) {
		d.Links = append(d.Links, Span{Line: lineAt(m[0]), Text: p[m[2]:m[3]]})
	}
	for k, l := range lines {
		if m := refDefRE.FindStringSubmatch(l); m != nil {
			d.Links = append(d.Links, Span{Line: start + k, Text: m[1]})
		}
	}
}

// findRun returns the offset of the next run of exactly n backticks at or
// after from, or -1.
func findRun(s string, from, n int) int {
	for i := from; i < len(s); {
		if s[i] != '`' {
			i++
			continue
		}
		m := 0
		for i+m < len(s) && s[i+m] == '`' {
			m++
		}
		if m == n {
			return i
		}
		i += m
	}
	return -1
}

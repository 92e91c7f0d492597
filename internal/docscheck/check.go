package docscheck

import (
	"fmt"
	"go/ast"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"unicode"
)

// LoadFamily reads the API of every family package that exists under root.
func LoadFamily(root string) (map[string]*Package, error) {
	pkgs := map[string]*Package{}
	for name, dir := range Family {
		d := filepath.Join(root, dir)
		if _, err := os.Stat(d); os.IsNotExist(err) {
			continue
		}
		p, err := LoadPackage(d)
		if err != nil {
			return nil, err
		}
		if p.Name != name {
			return nil, fmt.Errorf("%s: package %s, want %s", d, p.Name, name)
		}
		pkgs[name] = p
	}
	return pkgs, nil
}

// guidePackage returns the family package a guide documents, or "".
func guidePackage(rel string) string {
	dir, file := filepath.Split(filepath.FromSlash(rel))
	if filepath.ToSlash(dir) != "docs/guides/" {
		return ""
	}
	name := strings.TrimSuffix(file, ".md")
	if _, ok := Family[name]; !ok {
		return ""
	}
	return name
}

// texts returns the code a doc shows: its code spans, and each line of its
// code blocks, with their lines.
func texts(d *Doc) []Span {
	out := append([]Span(nil), d.Spans...)
	for _, b := range d.Blocks {
		if _, ok := b.Marker("foreign"); ok {
			continue // another library's code: its names are not ours
		}
		for i, l := range strings.Split(b.Text, "\n") {
			out = append(out, Span{Line: b.Line + i, Text: l})
		}
	}
	return out
}

var (
	qualRE   *regexp.Regexp // family.Name(.Member)?
	memberRE = regexp.MustCompile(`(?:^|[^\w.])([A-Z]\w*)\.([A-Z]\w*)`)
	optionRE = regexp.MustCompile(`With[A-Z]\w*`)
)

func init() {
	var names []string
	for n := range Family {
		names = append(names, n)
	}
	sort.Strings(names)
	qualRE = regexp.MustCompile(`(?:^|[^\w./])(` + strings.Join(names, "|") + `)\.([A-Z]\w*)(?:\.([A-Z]\w*))?`)
}

// CheckNames reports references to family packages that name nothing:
// pkg.Name, pkg.Type.Member, and unqualified Type.Member.
func CheckNames(docs []*Doc, pkgs map[string]*Package) []Problem {
	var probs []Problem
	for _, d := range docs {
		guide := pkgs[guidePackage(d.Rel)]
		for _, s := range texts(d) {
			for _, m := range qualRE.FindAllStringSubmatch(s.Text, -1) {
				p := pkgs[m[1]]
				if p == nil {
					continue // the package does not exist (yet): nothing to check against
				}
				if !p.Has(m[2]) {
					probs = append(probs, Problem{d.Rel, s.Line, fmt.Sprintf("%s.%s does not exist", m[1], m[2])})
					continue
				}
				if m[3] != "" && p.Types[m[2]] && !p.HasMember(m[2], m[3]) {
					probs = append(probs, Problem{d.Rel, s.Line, fmt.Sprintf("%s.%s has no method or field %s", m[1], m[2], m[3])})
				}
			}
			for _, m := range memberRE.FindAllStringSubmatch(s.Text, -1) {
				if msg := checkMember(m[1], m[2], guide, pkgs); msg != "" {
					probs = append(probs, Problem{d.Rel, s.Line, msg})
				}
			}
		}
	}
	return probs
}

// checkMember checks an unqualified Type.Member: against the guide's
// package when it declares Type, else against every family package that
// does. Names that are no family type are not checked.
func checkMember(typ, member string, guide *Package, pkgs map[string]*Package) string {
	if guide != nil && guide.Types[typ] {
		if !guide.HasMember(typ, member) {
			return fmt.Sprintf("%s.%s has no method or field %s", guide.Name, typ, member)
		}
		return ""
	}
	var in []string
	for _, p := range pkgs {
		if p.Types[typ] {
			if p.HasMember(typ, member) {
				return ""
			}
			in = append(in, p.Name)
		}
	}
	if len(in) == 0 {
		return ""
	}
	sort.Strings(in)
	return fmt.Sprintf("%s.%s: no family type %s has it (types named %s: %s)", typ, member, typ, typ, strings.Join(in, ", "))
}

// CheckOptions reports options WithXxx that a guide mentions without a
// package qualifier but its package does not have.
func CheckOptions(docs []*Doc, pkgs map[string]*Package) []Problem {
	var probs []Problem
	for _, d := range docs {
		name := guidePackage(d.Rel)
		p := pkgs[name]
		if p == nil {
			continue
		}
		for _, s := range texts(d) {
			for _, loc := range optionRE.FindAllStringIndex(s.Text, -1) {
				if loc[0] > 0 {
					c := s.Text[loc[0]-1]
					if c == '.' || c == '_' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' {
						continue // qualified (checked by CheckNames, or not ours) or part of a longer word
					}
				}
				opt := s.Text[loc[0]:loc[1]]
				if p.Funcs[opt] != nil || hasMethod(p, opt) {
					continue
				}
				msg := fmt.Sprintf("%s has no %s", name, opt)
				if root := pkgs["lock"]; root != nil && root.Funcs[opt] != nil {
					msg += fmt.Sprintf(" (the root package has it: write lock.%s)", opt)
				}
				probs = append(probs, Problem{d.Rel, s.Line, msg})
			}
		}
	}
	return probs
}

func hasMethod(p *Package, name string) bool {
	for _, m := range p.Members {
		if _, ok := m[name]; ok {
			return true
		}
	}
	return false
}

// CheckLinks reports relative links whose target does not exist, and
// links to a heading (file.md#anchor, #anchor) that the file lacks.
func CheckLinks(root string, docs []*Doc) []Problem {
	var probs []Problem
	anchors := map[string]map[string]bool{} // Markdown file → its headings' anchors
	for _, d := range docs {
		for _, l := range d.Links {
			t := l.Text
			if strings.Contains(t, "://") || strings.HasPrefix(t, "mailto:") {
				continue
			}
			frag := ""
			if i := strings.IndexByte(t, '#'); i >= 0 {
				t, frag = t[:i], t[i+1:]
			}
			if i := strings.IndexByte(t, '?'); i >= 0 {
				t = t[:i]
			}
			p := d.Path
			switch {
			case t == "":
			case strings.HasPrefix(t, "/"):
				p = filepath.Join(root, filepath.FromSlash(t))
			default:
				p = filepath.Join(filepath.Dir(d.Path), filepath.FromSlash(t))
			}
			if _, err := os.Stat(p); err != nil {
				probs = append(probs, Problem{d.Rel, l.Line, fmt.Sprintf("link target %s does not exist", l.Text)})
				continue
			}
			if frag == "" || !strings.HasSuffix(p, ".md") {
				continue
			}
			if anchors[p] == nil {
				anchors[p] = headingAnchors(p)
			}
			if !anchors[p][frag] {
				probs = append(probs, Problem{d.Rel, l.Line, fmt.Sprintf("link %s: no heading with that anchor", l.Text)})
			}
		}
	}
	return probs
}

// headingAnchors returns the anchors GitHub gives the headings of a
// Markdown file: lower case, punctuation but '-' and '_' dropped, spaces
// made '-', and -1, -2, ... after a repeated one.
func headingAnchors(path string) map[string]bool {
	src, _ := os.ReadFile(path)
	out := map[string]bool{}
	seen := map[string]int{}
	fence := ""
	for _, line := range strings.Split(string(src), "\n") {
		if m := fenceRE.FindStringSubmatch(line); m != nil {
			switch {
			case fence == "":
				fence = m[2][:1]
			case strings.HasPrefix(m[2], fence):
				fence = ""
			}
			continue
		}
		if fence != "" || !strings.HasPrefix(line, "#") {
			continue
		}
		text := strings.TrimSpace(strings.TrimRight(strings.TrimLeft(line, "#"), "# "))
		text = mdLinkRE.ReplaceAllString(text, "$1")
		var b strings.Builder
		for _, r := range strings.ToLower(text) {
			switch {
			case r == ' ':
				b.WriteByte('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				b.WriteRune(r)
			}
		}
		a := b.String()
		if n := seen[a]; n > 0 {
			seen[a]++
			a = fmt.Sprintf("%s-%d", a, n)
		} else {
			seen[a] = 1
		}
		out[a] = true
	}
	return out
}

var mdLinkRE = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`)

// checkListing compares an API summary with the package's declarations.
func checkListing(u *unit, pkgs map[string]*Package) []Problem {
	b := u.b
	name := "lock"
	if u.guide != nil {
		name = u.guide.Name
	}
	if m, ok := b.Marker("api"); ok && m.Arg != "" {
		name = m.Arg
	}
	p := pkgs[name]
	if p == nil {
		if _, ok := Family[name]; ok {
			return nil // not written yet
		}
		return []Problem{{b.Doc.Rel, b.Line, fmt.Sprintf("docscheck api: %q is no family package", name)}}
	}
	var probs []Problem
	at := func(n ast.Node) int { return u.fset.PositionFor(n.Pos(), true).Line }
	for _, decl := range u.file.Decls {
		switch d := decl.(type) {
		case *ast.FuncDecl:
			var src *ast.FuncType
			what := name + "." + d.Name.Name
			if d.Recv != nil && len(d.Recv.List) == 1 {
				typ := recvName(d.Recv.List[0].Type)
				what = name + "." + typ + "." + d.Name.Name
				src = p.Members[typ][d.Name.Name]
			} else if fd := p.Funcs[d.Name.Name]; fd != nil {
				src = fd.Type
			}
			switch {
			case src == nil:
				probs = append(probs, Problem{b.Doc.Rel, at(d), what + " does not exist"})
			case Signature(src) != Signature(d.Type):
				probs = append(probs, Problem{b.Doc.Rel, at(d), fmt.Sprintf("%s: documented as func%s, declared as func%s", what, Signature(d.Type), Signature(src))})
			}
		case *ast.GenDecl:
			for _, s := range d.Specs {
				switch s := s.(type) {
				case *ast.TypeSpec:
					if !p.Types[s.Name.Name] {
						probs = append(probs, Problem{b.Doc.Rel, at(s), fmt.Sprintf("type %s.%s does not exist", name, s.Name.Name)})
						continue
					}
					if it, ok := s.Type.(*ast.InterfaceType); ok {
						for _, f := range it.Methods.List {
							for _, n := range f.Names {
								ft, ok := p.Members[s.Name.Name][n.Name]
								switch {
								case !ok:
									probs = append(probs, Problem{b.Doc.Rel, at(f), fmt.Sprintf("%s.%s has no method %s", name, s.Name.Name, n.Name)})
								case ft != nil && Signature(ft) != Signature(f.Type.(*ast.FuncType)):
									probs = append(probs, Problem{b.Doc.Rel, at(f), fmt.Sprintf("%s.%s.%s: documented as func%s, declared as func%s", name, s.Name.Name, n.Name, Signature(f.Type.(*ast.FuncType)), Signature(ft))})
								}
							}
						}
					}
				case *ast.ValueSpec:
					for _, n := range s.Names {
						if !p.Values[n.Name] {
							probs = append(probs, Problem{b.Doc.Rel, at(n), fmt.Sprintf("%s.%s does not exist", name, n.Name)})
						}
					}
				}
			}
		}
	}
	return probs
}

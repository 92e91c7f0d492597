package docscheck

import (
	"fmt"
	"go/ast"
	"go/constant"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// OptionsDoc is the options × backends table, relative to the root.
const OptionsDoc = "docs/options.md"

// A table in OptionsDoc has a column per family package (its header is the
// package's name) and a row per option (its first cell names WithXxx). A
// cell in a package's column is one of:
//
//	·          a shared option the package accepts and ignores: the package
//	           does not have it, the root package does
//	refused    another package's own option, which the package refuses
//	as `WithX` another package's name for the shared lock.WithX, which the
//	           package takes as that
//	anything   the package has the option; a default it states is written
//	           `DefaultXxx` = value, and checked against that constant
//
// A cell that states a number without citing the constant it comes from is
// a default the code may not have, and an error.
var (
	defaultRE = regexp.MustCompile("`((?:Default|Min|Max)[A-Z]\\w*)(?:\\(\\))?`(?:\\s*=\\s*(\"[^\"]*\"|[^\\s|;,)]+))?")
	digitRE   = regexp.MustCompile(`\d`)
)

// CheckOptionsTable checks OptionsDoc against the family's options and the
// values of their Default constants.
func CheckOptionsTable(root string, pkgs map[string]*Package) []Problem {
	src, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(OptionsDoc)))
	if err != nil {
		return []Problem{{OptionsDoc, 0, err.Error()}}
	}
	var probs []Problem
	bad := func(line int, format string, args ...any) {
		probs = append(probs, Problem{OptionsDoc, line, fmt.Sprintf(format, args...)})
	}
	rows := map[string]map[string]bool{} // package → options with a row in one of its columns
	lines := strings.Split(string(src), "\n")
	for i := 0; i < len(lines); i++ {
		if !strings.HasPrefix(lines[i], "|") {
			continue
		}
		cols := map[int]string{} // cell index → package
		for k, h := range cells(lines[i]) {
			if pkgs[strings.Trim(h, "` ")] != nil {
				cols[k] = strings.Trim(h, "` ")
			}
		}
		for i++; i < len(lines) && strings.HasPrefix(lines[i], "|"); i++ {
			row := cells(lines[i])
			if len(cols) == 0 || len(row) == 0 || strings.Trim(row[0], "-: ") == "" {
				continue // not an options table, or the separator row
			}
			opt := optionRE.FindString(row[0])
			if opt == "" {
				bad(i+1, "row %q names no option WithXxx in its first cell", row[0])
				continue
			}
			if rows["lock"] == nil {
				rows["lock"] = map[string]bool{}
			}
			rows["lock"][opt] = true // a root option may sit in any table
			for k, name := range cols {
				if k >= len(row) {
					bad(i+1, "%s: no cell for %s", opt, name)
					continue
				}
				if rows[name] == nil {
					rows[name] = map[string]bool{}
				}
				rows[name][opt] = true
				for _, msg := range checkCell(pkgs, name, opt, row[k]) {
					bad(i+1, "%s, %s: %s", opt, name, msg)
				}
			}
		}
	}
	for name, p := range pkgs {
		if rows[name] == nil {
			continue // not a column of any table
		}
		for fn, d := range p.Funcs {
			if isOption(fn, d) && !rows[name][fn] && !(name == "lock" && fn == "WithValue") { // WithValue is for backend authors
				bad(0, "%s.%s has no row", name, fn)
			}
		}
	}
	return probs
}

// cells splits a table row into its trimmed cells.
func cells(line string) []string {
	line = strings.TrimSpace(line)
	line = strings.TrimSuffix(strings.TrimPrefix(line, "|"), "|")
	var out []string
	for _, c := range strings.Split(line, "|") {
		out = append(out, strings.TrimSpace(c))
	}
	return out
}

// isOption reports whether fn is an option: WithXxx returning an option
// type (Option, LeadOption).
func isOption(fn string, d *ast.FuncDecl) bool {
	if !strings.HasPrefix(fn, "With") || len(fn) == 4 || d.Type.Results == nil || len(d.Type.Results.List) != 1 {
		return false
	}
	id, ok := d.Type.Results.List[0].Type.(*ast.Ident)
	return ok && strings.HasSuffix(id.Name, "Option")
}

// returnsRoot returns X when d's body is "return lock.X(...)": the option
// is the shared lock.X under another name.
func returnsRoot(d *ast.FuncDecl) string {
	if d.Body == nil || len(d.Body.List) != 1 {
		return ""
	}
	r, ok := d.Body.List[0].(*ast.ReturnStmt)
	if !ok || len(r.Results) != 1 {
		return ""
	}
	c, ok := r.Results[0].(*ast.CallExpr)
	if !ok {
		return ""
	}
	sel, ok := c.Fun.(*ast.SelectorExpr)
	if !ok {
		return ""
	}
	if x, ok := sel.X.(*ast.Ident); !ok || x.Name != "lock" {
		return ""
	}
	return sel.Sel.Name
}

func checkCell(pkgs map[string]*Package, name, opt, cell string) []string {
	p, root := pkgs[name], pkgs["lock"]
	has := p.Funcs[opt] != nil
	shared := root != nil && root.Funcs[opt] != nil
	switch {
	case cell == "·":
		if has {
			return []string{fmt.Sprintf("%s has %s: say what it does, not ·", name, opt)}
		}
		if !shared {
			return []string{fmt.Sprintf("· is a shared option ignored, but lock has no %s", opt)}
		}
		return nil
	case strings.HasPrefix(cell, "as `"):
		alias := optionRE.FindString(cell)
		if has || alias == "" || root == nil || root.Funcs[alias] == nil {
			return []string{fmt.Sprintf("%q: an alias cell names a shared option lock.WithXxx, for a package that lacks %s", cell, opt)}
		}
		for _, q := range pkgs {
			if d := q.Funcs[opt]; d != nil && returnsRoot(d) == alias {
				return nil
			}
		}
		return []string{fmt.Sprintf("no package defines %s as lock.%s", opt, alias)}
	case strings.HasPrefix(cell, "refused"):
		if has {
			return []string{fmt.Sprintf("%s has %s: it does not refuse it", name, opt)}
		}
		if shared {
			return []string{fmt.Sprintf("lock.%s is shared: %s accepts and ignores it (·)", opt, name)}
		}
		for _, q := range pkgs {
			if d := q.Funcs[opt]; d != nil {
				if alias := returnsRoot(d); alias != "" {
					return []string{fmt.Sprintf("%s is lock.%s under another name: %s takes it (as `%[2]s`)", opt, alias, name)}
				}
			}
		}
		return nil
	}
	if !has {
		return []string{fmt.Sprintf("%s has no %s", name, opt)}
	}
	var msgs []string
	cited := map[string]bool{}
	for _, m := range defaultRE.FindAllStringSubmatch(cell, -1) {
		cited[m[1]] = true
		if !p.Values[m[1]] && p.Funcs[m[1]] == nil {
			msgs = append(msgs, fmt.Sprintf("%s.%s does not exist", name, m[1]))
			continue
		}
		if m[2] == "" {
			continue
		}
		e, ok := p.Consts[m[1]]
		if !ok {
			msgs = append(msgs, fmt.Sprintf("%s.%s is no constant: state no value for it", name, m[1]))
			continue
		}
		if msg := sameValue(p, e, m[2]); msg != "" {
			msgs = append(msgs, fmt.Sprintf("%s.%s: %s", name, m[1], msg))
		}
	}
	if want := "Default" + strings.TrimPrefix(opt, "With"); p.Consts[want] != nil && !cited[want] {
		msgs = append(msgs, fmt.Sprintf("the default is %s.%s: cite it", name, want))
	}
	if digitRE.MatchString(defaultRE.ReplaceAllString(cell, "")) {
		msgs = append(msgs, fmt.Sprintf("%q states a number that is no Default constant of %s", cell, name))
	}
	return msgs
}

// sameValue compares the value a cell states with the constant's: a
// duration as time.ParseDuration reads it, a string quoted, else a number.
func sameValue(p *Package, e ast.Expr, stated string) string {
	v, dur, err := evalConst(p, e, 0)
	if err != nil {
		return err.Error()
	}
	var s constant.Value
	switch {
	case dur:
		d, err := time.ParseDuration(stated)
		if err != nil {
			return fmt.Sprintf("the constant is a duration, the table says %s", stated)
		}
		s = constant.MakeInt64(int64(d))
	case v.Kind() == constant.String:
		u, err := strconv.Unquote(stated)
		if err != nil {
			return fmt.Sprintf("the constant is a string, the table says %s (quote it)", stated)
		}
		s = constant.MakeString(u)
	default:
		s = constant.MakeFromLiteral(stated, token.INT, 0)
	}
	if s.Kind() == constant.Unknown || !constant.Compare(s, token.EQL, v) {
		if dur {
			n, _ := constant.Int64Val(v)
			return fmt.Sprintf("the table says %s, the code %s", stated, time.Duration(n))
		}
		return fmt.Sprintf("the table says %s, the code %s", stated, v)
	}
	return ""
}

// evalConst evaluates a constant expression of literals, the time units
// and the package's other constants, and reports whether it is a duration.
func evalConst(p *Package, e ast.Expr, depth int) (constant.Value, bool, error) {
	if depth > 10 {
		return nil, false, fmt.Errorf("constant defined in a loop")
	}
	switch e := e.(type) {
	case *ast.BasicLit:
		return constant.MakeFromLiteral(e.Value, e.Kind, 0), false, nil
	case *ast.ParenExpr:
		return evalConst(p, e.X, depth+1)
	case *ast.Ident:
		if c, ok := p.Consts[e.Name]; ok {
			return evalConst(p, c, depth+1)
		}
	case *ast.SelectorExpr:
		if x, ok := e.X.(*ast.Ident); ok && x.Name == "time" {
			if d, ok := timeUnits[e.Sel.Name]; ok {
				return constant.MakeInt64(int64(d)), true, nil
			}
		}
	case *ast.BinaryExpr:
		x, dx, err := evalConst(p, e.X, depth+1)
		if err != nil {
			return nil, false, err
		}
		y, dy, err := evalConst(p, e.Y, depth+1)
		if err != nil {
			return nil, false, err
		}
		return constant.BinaryOp(x, e.Op, y), dx || dy, nil
	}
	return nil, false, fmt.Errorf("cannot evaluate %s", exprString(e))
}

var timeUnits = map[string]time.Duration{
	"Nanosecond": time.Nanosecond, "Microsecond": time.Microsecond, "Millisecond": time.Millisecond,
	"Second": time.Second, "Minute": time.Minute, "Hour": time.Hour,
}

// Package docscheck keeps the documentation honest: its test fails when
// README.md or a file under docs/ shows Go code that does not compile, or
// names a function, type, option or file that does not exist.
//
// Run it with the root module's tests (go test ./internal/docscheck). It
// checks, for every Markdown file in scope:
//
//  1. Go code blocks compile. A block that starts with a package clause is
//     a whole file and is checked as it is. Any other block is a fragment:
//     if it parses as top-level declarations it becomes a file of its own,
//     otherwise its statements become the body of a function (returning
//     error, or (any, error), ..., when its top-level return statements
//     carry values). Imports are inferred from the package names the
//     fragment uses (lock., redislock., time., redis., clientv3., ... see
//     imports in wrap.go), and the free variables a fragment borrows from
//     its surroundings are declared from a small set of placeholders (ctx,
//     rdb, pool, cli, locks, ledger, runImport, ... see placeholders in
//     wrap.go); in docs/guides/<pkg>.md, locks, fence and ledger have that
//     package's *Factory, *Fence and *Ledger types. Only names a fragment
//     uses without declaring them are declared. Unused variables, unused
//     imports and a missing final return are not errors in a fragment.
//
//     Every block becomes a package of one temporary module, wired to the
//     repository's modules through a generated go.work (the repository's
//     go.work use list and go.work.sum). One go list -export -deps call
//     provides the export data of everything the blocks import (from the
//     build cache when it is warm), and go/types checks every package in
//     the test's process, as the compiler's type checker would: about a
//     second in all, where a go build would start a compiler per block,
//     each loading etcd's and pgx's export data again. Errors point at the
//     Markdown file and line (the generated code carries //line
//     directives). Set DOCSCHECK_DIR to keep the generated module there.
//
//  2. Every reference pkg.Name to a package of the family (lock, backend,
//     locktest, memlock, flock, filelock, pglock, redislock, etcdlock,
//     gocronlock) in a code span or a code block names an exported
//     declaration of that package, and pkg.Type.Member a method or field of
//     that type. An unqualified Type.Member (Factory.Inspect) must exist on
//     the type of that name in the guide's package (in a guide) or in some
//     family package (elsewhere).
//
//  3. Every option WithXxx mentioned unqualified in a code span or block of
//     docs/guides/<pkg>.md exists in that package (as a function or a
//     method): an option of the root package is written lock.WithXxx.
//
//  4. Every relative link resolves to an existing file or directory.
//
//  5. The options tables of docs/options.md match the code (options.go
//     has the cell grammar): a row per option of every package that is a
//     column, a cell for an option the package lacks only as "·" (a shared
//     option it ignores), "as `WithX`" (another backend's name for the
//     shared lock.WithX) or "refused" (another backend's own), and every
//     default stated as `DefaultXxx` = value with the constant's value. A
//     number that is no Default, Min or Max constant of the package fails,
//     and so does a Default<Option> constant the cell does not cite.
//
// # Markers
//
// An HTML comment on the line (or lines) before a code fence tunes how the
// block is checked; blank lines may separate it from the fence:
//
//	<!-- docscheck: skip -->
//	    The block is pseudo-code or a sketch and is not compiled. The names
//	    it mentions are still checked (2, 3).
//	<!-- docscheck: foreign -->
//	    The block is another library's code (the "before" of a migration
//	    guide): it is neither compiled nor checked for names, since its
//	    redislock.Obtain is not ours. Qualify such names in prose with the
//	    block's import alias (bsm.Obtain), which no family package has.
//	<!-- docscheck: vars NAME TYPE; NAME TYPE ... -->
//	    Declares (or retypes) free variables of the fragment, for example
//	    <!-- docscheck: vars runExport func(context.Context, uint64) error; migrate struct{ Run func(context.Context, *pgxpool.Pool) error } -->
//	<!-- docscheck: api PKG -->
//	    The block lists declarations of package PKG (default: the guide's
//	    package in docs/guides/<pkg>.md, lock elsewhere) with
//	    their bodies left out, as an API summary. It is not compiled; each
//	    listed function and method must exist in PKG with the same
//	    parameter and result types, and each type, variable and constant
//	    must exist. A block with a body-less function is such a listing
//	    even without the marker.
//
// A marker that is not followed by a code block is an error.
package docscheck

package docs

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
)

// notAWait marks a sleep in a loop that is not a wait for something: the
// thing measured or under test (a client's polling cadence, the measured
// window). It goes in a comment on the sleep's line, with the reason.
const notAWait = "not a wait:"

// testing.md: a test that waits calls testkit.WaitFor or testkit.Poll,
// never a sleep long "enough". A hand-rolled wait is a time.Sleep in a
// loop (a deadline and a sleep, or a count of tries): every such sleep in
// a _test.go file fails here, except in fake time (a synctest.Test
// bubble, where a sleep is how time advances) and where its line says
// "not a wait:" and why.
func TestNoWaitingTestSleeps(t *testing.T) {
	root := ".."
	fset := token.NewFileSet()
	files := 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			// Other Go modules (examples/helm, packaging, test/k8s) have
			// tests of their own; build outputs hold none of ours.
			switch rel {
			case ".git", "build", "examples", "packaging", "test":
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(rel, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ParseComments)
		if err != nil {
			return err
		}
		files++
		for _, pos := range loopSleeps(f) {
			p := fset.Position(pos)
			if lineSays(fset, f, p.Line, notAWait) {
				continue
			}
			t.Errorf("%s:%d: time.Sleep in a loop: wait with testkit.WaitFor or testkit.Poll (docs/testing.md), or say on its line // %s why it is not a wait", rel, p.Line, notAWait)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 50 {
		t.Fatalf("read %d test files; want the guard's", files)
	}
}

// loopSleeps are the time.Sleep calls of f inside a for or range loop,
// outside a synctest.Test bubble.
func loopSleeps(f *ast.File) []token.Pos {
	var out []token.Pos
	var walk func(n ast.Node, inLoop bool)
	walk = func(n ast.Node, inLoop bool) {
		ast.Inspect(n, func(c ast.Node) bool {
			if c == n {
				return true
			}
			switch c := c.(type) {
			case *ast.ForStmt:
				walk(c, true)
				return false
			case *ast.RangeStmt:
				walk(c, true)
				return false
			case *ast.FuncLit:
				walk(c.Body, false) // a function's body is its own, wherever it is written
				return false
			case *ast.CallExpr:
				if isCall(c, "synctest", "Test") {
					return false // fake time: sleeping is how it advances
				}
				if inLoop && isCall(c, "time", "Sleep") {
					out = append(out, c.Pos())
				}
			}
			return true
		})
	}
	walk(f, false)
	return out
}

func isCall(c *ast.CallExpr, pkg, fn string) bool {
	sel, ok := c.Fun.(*ast.SelectorExpr)
	if !ok || sel.Sel.Name != fn {
		return false
	}
	id, ok := sel.X.(*ast.Ident)
	return ok && id.Name == pkg
}

// lineSays reports whether a comment on line of f contains s.
func lineSays(fset *token.FileSet, f *ast.File, line int, s string) bool {
	for _, g := range f.Comments {
		for _, c := range g.List {
			if fset.Position(c.Pos()).Line == line && strings.Contains(c.Text, s) {
				return true
			}
		}
	}
	return false
}

package proxy

import (
	"go/ast"
	"go/parser"
	"go/token"
	"testing"
)

// lifecycleFiles are where a request's life is decided and carried out
// (docs/design.md): each function there reads in one screen.
var lifecycleFiles = []string{"handler.go", "lifecycle.go", "transport.go", "resume.go", "hold.go", "rewrite.go", "ledger.go", "stoptext.go", "plan.go", "operatorroutes.go"}

const maxFuncLines = 80

func TestLifecycleFunctionsAreShort(t *testing.T) {
	fset := token.NewFileSet()
	for _, name := range lifecycleFiles {
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Body == nil {
				continue
			}
			n := fset.Position(fd.End()).Line - fset.Position(fd.Pos()).Line + 1
			if n > maxFuncLines {
				t.Errorf("%s: %s is %d lines, more than %d: split it", name, fd.Name.Name, n, maxFuncLines)
			}
		}
	}
}

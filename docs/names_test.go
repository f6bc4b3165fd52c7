package docs

import (
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// namedPages are the pages that name the code by its Go names.
var namedPages = []string{"design.md", "testing.md", "how-it-decides.md", "operations.md", "configuration.md", "measured.md", "resume-facts.md"}

// Every Go name the pages write as `pkg.Name` or
// `pkg.Type.Member` names something that exists: a top-level declaration
// of a package of the guard by that name (or, for short, a method of one
// of its types: `proxy.Awaiting`), and a method or field of that type. A package moved or a function renamed or deleted without its page
// fails here.
func TestGoNamesInDocsExist(t *testing.T) {
	decls := goDecls(t)
	name := regexp.MustCompile("`([a-z][a-z0-9]*)\\.([A-Z][A-Za-z0-9_]*)(?:\\.([A-Z][A-Za-z0-9_]*))?(\\*?)")
	checked := 0
	for _, page := range namedPages {
		for _, m := range name.FindAllStringSubmatch(read(t, page), -1) {
			pkg, top, member, wild := m[1], m[2], m[3], m[4] != ""
			found, ours := decls[pkg]
			if !ours {
				continue // not one of our packages (http.Handler, zap.String, ...)
			}
			checked++
			want := top
			if member != "" {
				want = top + "." + member
			}
			if wild { // `pkg.Bound*`: the names that start so
				if !hasPrefix(found, want) {
					t.Errorf("%s names %s.%s*: no package %s of the guard declares a name that starts so", page, pkg, want, pkg)
				}
				continue
			}
			if !found[want] && (member != "" || !found["method "+top]) {
				t.Errorf("%s names %s.%s: no package %s of the guard declares %s", page, pkg, want, pkg, want)
			}
		}
	}
	if checked < 10 {
		t.Fatalf("checked %d names; want the pages' own", checked)
	}
}

// goDecls maps each package name of the guard to its declarations:
// top-level names, Type.Method and Type.Field for its types, and
// "method Name" for every method.
func goDecls(t *testing.T) map[string]map[string]bool {
	t.Helper()
	cmd := exec.Command("go", "list", "-json=Name,Dir,GoFiles", "./cmd/...", "./internal/...")
	cmd.Dir = ".."
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	decls := map[string]map[string]bool{}
	dec := json.NewDecoder(strings.NewReader(string(out)))
	fset := token.NewFileSet()
	for dec.More() {
		var p struct {
			Name, Dir string
			GoFiles   []string
		}
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		if decls[p.Name] == nil {
			decls[p.Name] = map[string]bool{}
		}
		d := decls[p.Name]
		for _, name := range p.GoFiles {
			f, err := parser.ParseFile(fset, filepath.Join(p.Dir, name), nil, parser.SkipObjectResolution)
			if err != nil {
				t.Fatal(err)
			}
			for _, decl := range f.Decls {
				switch decl := decl.(type) {
				case *ast.FuncDecl:
					if decl.Recv == nil {
						d[decl.Name.Name] = true
						continue
					}
					d[recvType(decl.Recv.List[0].Type)+"."+decl.Name.Name] = true
					d["method "+decl.Name.Name] = true
				case *ast.GenDecl:
					for _, spec := range decl.Specs {
						switch spec := spec.(type) {
						case *ast.TypeSpec:
							d[spec.Name.Name] = true
							if st, ok := spec.Type.(*ast.StructType); ok {
								for _, fld := range st.Fields.List {
									for _, n := range fld.Names {
										d[spec.Name.Name+"."+n.Name] = true
									}
								}
							}
						case *ast.ValueSpec:
							for _, n := range spec.Names {
								d[n.Name] = true
							}
						}
					}
				}
			}
		}
	}
	return decls
}

// recvType is the name of a method's receiver type.
func recvType(e ast.Expr) string {
	switch e := e.(type) {
	case *ast.StarExpr:
		return recvType(e.X)
	case *ast.IndexExpr:
		return recvType(e.X)
	case *ast.Ident:
		return e.Name
	}
	return ""
}

func hasPrefix(names map[string]bool, prefix string) bool {
	for n := range names {
		if strings.HasPrefix(n, prefix) {
			return true
		}
	}
	return false
}

// Every path of the repository the pages write in backticks
// (`internal/proxy/hold.go`, `internal/cause/testdata/real/`) exists: a file
// moved without its page fails here.
func TestPathsInDocsExist(t *testing.T) {
	// cmd/ of the module's root only: the Helm chart's module has a cmd/
	// of its own, which design.md names relative to it.
	path := regexp.MustCompile("`((?:internal|cmd/vllm-guard|scripts|examples|packaging|test)(?:/[A-Za-z0-9_./-]*[A-Za-z0-9_/])?)`")
	goName := regexp.MustCompile(`\.[A-Z][A-Za-z0-9_]*$`) // internal/testkit/guardrun.Guard
	checked := 0
	for _, page := range append(namedPages, filepath.Join("..", "README.md")) {
		for _, m := range path.FindAllStringSubmatch(read(t, page), -1) {
			checked++
			p := goName.ReplaceAllString(m[1], "")
			if _, err := os.Stat(filepath.Join("..", p)); err != nil {
				t.Errorf("%s names %s: %v", page, p, err)
			}
		}
	}
	if checked < 10 {
		t.Fatalf("checked %d paths; want the pages' own", checked)
	}
}

package heart

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"
)

// The decisions are a package of their own, and what it may reach is its
// imports: data and pure functions only (the configuration, the event
// record, the policy's types and its pure rules, vLLM's command line, the
// public status, log fields). No process, socket, GPU, file or clock: the
// executor (package supervisor) is the only caller of those, and of the
// restart policy, the bus and the logger, which the heart names only as
// effects. Within the allowed packages, what would reach the world is
// banned by name: the clock, a timer, a goroutine, a channel, the policy
// object, the bus, a logger.
func TestTheHeartReachesNothing(t *testing.T) {
	const m = "github.com/vllm-guard/vllm-guard/internal/"
	allowed := map[string]bool{"fmt": true, "reflect": true, "strconv": true, "strings": true, "time": true, "slices": true,
		m + "config": true, m + "events": true, m + "exitcode": true, m + "launch": true, m + "policy": true, m + "cause": true, m + "status": true,
		m + "vllmargs": true, "go.uber.org/zap": true, "go.uber.org/zap/zapcore": true}
	banned := map[string]map[string]bool{
		"time":   {"Now": true, "Since": true, "Until": true, "AfterFunc": true, "NewTimer": true, "NewTicker": true, "Sleep": true, "Tick": true, "After": true},
		"zap":    {"L": true, "S": true, "New": true, "NewNop": true, "NewProduction": true, "NewDevelopment": true, "ReplaceGlobals": true},
		"policy": {"Policy": true, "New": true},
		"events": {"Bus": true, "NewBus": true},
		"config": {"Load": true, "Parse": true},
	}
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, im := range f.Imports {
			if p := strings.Trim(im.Path.Value, `"`); !allowed[p] {
				t.Errorf("%s imports %s: the heart imports data and pure rules only", name, p)
			}
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.GoStmt, *ast.SendStmt, *ast.SelectStmt:
				t.Errorf("%s: a goroutine or a channel: effects that wait belong to the executor", fset.Position(n.Pos()))
			case *ast.UnaryExpr:
				if n.Op == token.ARROW {
					t.Errorf("%s: a channel receive", fset.Position(n.Pos()))
				}
			case *ast.SelectorExpr:
				if x, ok := n.X.(*ast.Ident); ok && banned[x.Name][n.Sel.Name] {
					t.Errorf("%s: %s.%s reaches the world (the clock, the policy object, the bus, a logger)", fset.Position(n.Pos()), x.Name, n.Sel.Name)
				}
			}
			return true
		})
	}
}

// Step is a function of (core, event): the same core and event give the
// same core and the same effects, and the core given is not changed.
func TestStepIsAFunction(t *testing.T) {
	c := Core{Cfg: testConfig(), Ports: Ports{GPU: true}}
	e := Event{Kind: EvBegin, At: testTime}
	c1, fx1 := Step(c, e)
	c2, fx2 := Step(c, e)
	if c.Sub != SubIdle || c.RunN != 0 || len(c.Fx) != 0 {
		t.Fatalf("the core given was changed: %+v", c)
	}
	if c1.Sub != c2.Sub || len(fx1) != len(fx2) {
		t.Fatalf("two steps of the same (core, event): %v %v / %v %v", c1.Sub, fx1, c2.Sub, fx2)
	}
	if _, ok := fx1[len(fx1)-1].(FxAskRung); !ok {
		t.Fatalf("Run begins: effects %#v, want the policy's rung asked last", fx1)
	}
	c3, fx3 := Step(c1, Event{Kind: EvRung, At: testTime, Facts: Facts{}})
	if c3.Sub != SubCheckGPU {
		t.Fatalf("the rung answered: %s, want check_gpu", c3.Sub)
	}
	if _, ok := fx3[len(fx3)-1].(FxReadFree); !ok {
		t.Fatalf("the rung answered: effects %#v, want an NVML read", fx3)
	}
}

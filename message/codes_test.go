package message

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestOneTableOfCodes: every JSON-RPC error code the module answers with is
// a constant of codes.go, so that no code means two things in two places
// (-32001 was "unauthorized" at the edge and "unknown session" in the
// broker; -32002 was the gateway's "upstream refused" and MCP's "resource
// not found"). It parses the module's non-test Go files and fails on any
// integer literal in the JSON-RPC error range (-32768 to -32000) outside
// codes.go, and on two constants of the table with one value.
func TestOneTableOfCodes(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case ".git", "node_modules", "testdata":
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		if path == filepath.Join(root, "message", "codes.go") {
			return nil
		}
		// The hostile cases are the tests' own statement of what the
		// rules require, codes included, made apart from the code under
		// test (and this package's tests import them).
		if strings.HasPrefix(path, filepath.Join(root, "internal", "hostile")+string(filepath.Separator)) {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.UnaryExpr:
				if lit, ok := n.X.(*ast.BasicLit); ok && n.Op == token.SUB && lit.Kind == token.INT {
					if v, err := strconv.Atoi(lit.Value); err == nil && v >= 32000 && v <= 32768 {
						t.Errorf("%s: JSON-RPC code -%d written as a literal; use the message.Code… constant for it (add one to codes.go if it is new)", fset.Position(n.Pos()), v)
					}
				}
			case *ast.BasicLit:
				// A code inside a JSON literal: "code":-32603.
				if n.Kind == token.STRING && strings.Contains(n.Value, `"code":-32`) {
					t.Errorf("%s: a JSON-RPC code inside a string literal; build the body with the message.Code… constant", fset.Position(n.Pos()))
				}
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	f, err := parser.ParseFile(fset, "codes.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]string{}
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		for _, s := range g.Specs {
			vs := s.(*ast.ValueSpec)
			for i, name := range vs.Names {
				if i >= len(vs.Values) {
					continue
				}
				v := render(vs.Values[i])
				if other, ok := seen[v]; ok {
					t.Errorf("%s and %s are both %s: one code, one meaning", other, name.Name, v)
				}
				seen[v] = name.Name
			}
		}
	}
	if len(seen) < 10 {
		t.Fatalf("read %d codes from codes.go; the table is missing", len(seen))
	}
}

func render(e ast.Expr) string {
	if u, ok := e.(*ast.UnaryExpr); ok {
		if lit, ok := u.X.(*ast.BasicLit); ok {
			return u.Op.String() + lit.Value
		}
	}
	if lit, ok := e.(*ast.BasicLit); ok {
		return lit.Value
	}
	return "?"
}

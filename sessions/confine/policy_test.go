package confine

import (
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/Tahul/caddy-zidane-mcp/internal/pathtree"
)

func TestArgsParseRoundTrip(t *testing.T) {
	p := Policy{
		Read: []string{"/r1", "/r 2"}, Write: []string{"/w"}, Deny: []string{"/d"},
		Connect: []uint16{443, 8080}, ConnectAny: true, BestEffort: true,
	}
	got, argv, err := Parse(append(p.Args(), "--", "prog", "--read", "x"))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, p) || !reflect.DeepEqual(argv, []string{"prog", "--read", "x"}) {
		t.Fatalf("Parse(Args) = %+v %q", got, argv)
	}
	for _, bad := range [][]string{
		{"prog"},
		{"--read", "relative", "--", "prog"},
		{"--connect", "0", "--", "prog"},
		{"--connect", "70000", "--", "prog"},
		{"--read"},
		{"--"},
		{"--nope", "--", "prog"},
	} {
		if _, _, err := Parse(bad); err == nil {
			t.Errorf("Parse(%q) accepted", bad)
		}
	}
}

// TestPlanKeepsDeniedPathsOut: a readable directory that holds a denied
// one is split around it, and a path at or inside a denied one is
// refused, through symlinks too.
func TestPlanKeepsDeniedPathsOut(t *testing.T) {
	home := t.TempDir()
	data := filepath.Join(home, ".local", "share", "caddy")
	project := filepath.Join(home, "project")
	for _, d := range []string{data, project, filepath.Join(home, ".cache")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{filepath.Join(home, ".profile"), filepath.Join(data, "tokens.json")} {
		if err := os.WriteFile(f, nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(data, filepath.Join(home, "link")); err != nil {
		t.Fatal(err)
	}

	rules, err := plan(Policy{Write: []string{project}, Read: []string{home}, Deny: []string{data}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	has := func(path string) *rule {
		for i := range rules {
			if rules[i].path == path && (rules[i].write || !strings.HasSuffix(path, "project")) {
				return &rules[i]
			}
		}
		return nil
	}
	if r := has(project); r == nil || !r.write || !r.dir {
		t.Errorf("the project is not writable: %+v", r)
	}
	if has(home) != nil {
		t.Error("the home, which holds the data dir, got a rule of its own")
	}
	if r := has(filepath.Join(home, ".profile")); r == nil || r.dir || r.write {
		t.Errorf("a file next to the data dir is not readable as a file: %+v", r)
	}
	for _, keep := range []string{filepath.Join(home, ".cache")} {
		if has(keep) == nil {
			t.Errorf("%s, next to the denied path, is not readable", keep)
		}
	}
	for _, r := range rules {
		if pathtree.Within(r.path, data) || pathtree.Within(data, r.path) && r.dir {
			t.Errorf("rule %+v reaches the denied %s", r, data)
		}
	}
	for _, bad := range []Policy{
		{Write: []string{data}, Deny: []string{data}},
		{Read: []string{filepath.Join(data, "..", "caddy", "tokens.json")}, Deny: []string{data}},
		{Read: []string{filepath.Join(home, "link")}, Deny: []string{data}},
		{Read: []string{filepath.Join(home, "missing")}},
	} {
		if _, err := plan(bad, nil); err == nil {
			t.Errorf("plan(%+v) accepted", bad)
		}
	}
	if _, err := plan(Policy{Read: []string{filepath.Join(home, "link")}, Deny: []string{data}}, nil); err == nil || !strings.Contains(err.Error(), "keeps from agents") {
		t.Errorf("a symlink into the denied dir: %v", err)
	}
}

func TestCommandPaths(t *testing.T) {
	root := t.TempDir()
	pkg := filepath.Join(root, "app", "node_modules", "@scope", "agent", "dist")
	bin := filepath.Join(root, "bin")
	for _, d := range []string{pkg, bin} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	script := filepath.Join(pkg, "index.js")
	interp := filepath.Join(bin, "node")
	if err := os.WriteFile(interp, []byte("\x7fELF"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(script, []byte("#!"+interp+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(root, "agent")
	if err := os.Symlink(script, link); err != nil {
		t.Fatal(err)
	}
	got := CommandPaths([]string{link, "--flag", script})
	want := []string{filepath.Join(root, "app"), bin}
	slices.Sort(got)
	slices.Sort(want)
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("CommandPaths = %q, want %q (the node_modules' parent and the interpreter's directory)", got, want)
	}
	t.Setenv("PATH", bin)
	envScript := filepath.Join(root, "env-agent")
	if err := os.WriteFile(envScript, []byte("#!/usr/bin/env -S node --flag\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if got := CommandPaths([]string{envScript}); !slices.Contains(got, bin) {
		t.Fatalf("CommandPaths of a #!/usr/bin/env node script = %q, want %s among them", got, bin)
	}
}

package upstream

import (
	"fmt"
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"
)

var toolNamePattern = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

func TestNamespaceTool(t *testing.T) {
	long := strings.Repeat("very_long_tool_name_", 5)
	tests := []struct {
		server, tool string
		want         string // "" means: shortened
	}{
		{"github", "create_issue", "mcp_github_create_issue"},
		{"my-server", "get-thing", "mcp_my-server_get-thing"},
		{"a", "b", "mcp_a_b"},
		{"s", strings.Repeat("t", 64-len("mcp_s_")), "mcp_s_" + strings.Repeat("t", 58)},
		{"s", strings.Repeat("t", 64-len("mcp_s_")+1), ""},
		{"github", long, ""},
		{strings.Repeat("g", 64), "x", ""},
		{"fs", "read.file", ""},
		{"fs", "lire_fichier_é", ""},
		{"fs", "", ""},
		{"fs", "get_0123456789ab", ""},
		{"fs", "get_0123456789", "mcp_fs_get_0123456789"},
	}
	for _, tt := range tests {
		t.Run(tt.server+"/"+tt.tool, func(t *testing.T) {
			got := NamespaceTool(tt.server, tt.tool)
			if !toolNamePattern.MatchString(got) {
				t.Fatalf("NamespaceTool = %q: not 1-64 of [A-Za-z0-9_-]", got)
			}
			if got != NamespaceTool(tt.server, tt.tool) {
				t.Fatal("NamespaceTool is not stable")
			}
			if tt.want != "" {
				if got != tt.want {
					t.Errorf("NamespaceTool = %q, want %q", got, tt.want)
				}
				return
			}
			if !looksShortened(got) || !strings.HasPrefix(got, "mcp_") {
				t.Errorf("NamespaceTool = %q, want a shortened name", got)
			}
			if NamespacePrompt(tt.server, tt.tool) != got {
				t.Error("NamespacePrompt differs from NamespaceTool")
			}
		})
	}
	a, b := NamespaceTool("github", long+"a"), NamespaceTool("github", long+"b")
	if a == b {
		t.Errorf("two long names share %q", a)
	}
	if !strings.HasPrefix(a, "mcp_github_very_long_tool_name_") {
		t.Errorf("shortened name %q does not keep a readable prefix", a)
	}
}

func TestNamespaceLongestPrefix(t *testing.T) {
	ns, err := NewNamespace([]string{"a", "a_b", "github", "github_enterprise"})
	if err != nil {
		t.Fatal(err)
	}
	pairs := []struct{ server, tool string }{
		{"a_b", "c"},
		{"a", "b_c"},
		{"a", "c"},
		{"a", "b"},
		{"github", "enterprise_list"},
		{"github_enterprise", "list"},
		{"github", "create_issue"},
	}
	names := map[string]string{}
	for _, p := range pairs {
		name := ns.Name(p.server, p.tool)
		if prev, dup := names[name]; dup {
			t.Fatalf("%s/%s and %s share the name %q", p.server, p.tool, prev, name)
		}
		names[name] = p.server + "/" + p.tool
		s, tool, ok := ns.Resolve(name)
		if !ok || s != p.server || tool != p.tool {
			t.Errorf("Resolve(%q) = %q, %q, %v; want %q, %q", name, s, tool, ok, p.server, p.tool)
		}
	}
	if got := ns.Name("a_b", "c"); got != "mcp_a_b_c" {
		t.Errorf("Name(a_b, c) = %q, want the natural name", got)
	}
	if got := ns.Name("a", "b_c"); got == "mcp_a_b_c" || !looksShortened(got) {
		t.Errorf("Name(a, b_c) = %q, want a shortened name, since mcp_a_b_c belongs to a_b", got)
	}
	if got := ns.Name("a", "c"); got != "mcp_a_c" {
		t.Errorf("Name(a, c) = %q", got)
	}
	if s, tool, ok := ns.Resolve("mcp_a_b_c"); !ok || s != "a_b" || tool != "c" {
		t.Errorf("Resolve(mcp_a_b_c) = %q, %q, %v", s, tool, ok)
	}
}

func TestNamespaceResolveRefuses(t *testing.T) {
	ns, err := NewNamespace([]string{"a", "gh"})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{
		"", "mcp_", "mcp_a", "mcp_a_", "mcp_zz_tool", "gh_tool", "MCP_gh_tool", "sessions",
		NamespaceTool("gh", strings.Repeat("x", 80)), // shortened, but never named by ns
		"mcp_gh_get_0123456789ab",                    // shaped like a shortened name
	} {
		if s, tool, ok := ns.Resolve(name); ok {
			t.Errorf("Resolve(%q) = %q, %q; want not found", name, s, tool)
		}
	}
}

func TestNewNamespaceRefuses(t *testing.T) {
	for _, servers := range [][]string{{"a", "a"}, {"a b"}, {""}, {strings.Repeat("x", 65)}} {
		if _, err := NewNamespace(servers); err == nil {
			t.Errorf("NewNamespace(%q) succeeded", servers)
		}
	}
}

func TestNamespaceRoundTripRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	const nameChars = "abc_-"
	randomString := func(alphabet string, min, max int) string {
		n := min + rng.IntN(max-min+1)
		var b strings.Builder
		for range n {
			b.WriteByte(alphabet[rng.IntN(len(alphabet))])
		}
		return b.String()
	}
	servers := map[string]bool{}
	for len(servers) < 40 {
		s := randomString(nameChars, 1, 8)
		if rng.IntN(10) == 0 {
			s = randomString(nameChars, 40, 64)
		}
		servers[s] = true
	}
	var list []string
	for s := range servers {
		list = append(list, s)
	}
	ns, err := NewNamespace(list)
	if err != nil {
		t.Fatal(err)
	}
	fresh, _ := NewNamespace(list)

	toolChars := "abc_-.x/é0123456789"
	seen := map[string]string{}
	for i := 0; i < 5000; i++ {
		server := list[rng.IntN(len(list))]
		tool := randomString(toolChars, 1, 12)
		if rng.IntN(5) == 0 {
			tool = randomString(toolChars, 50, 90)
		}
		key := server + "\x00" + tool
		name := ns.Name(server, tool)
		if !toolNamePattern.MatchString(name) {
			t.Fatalf("Name(%q, %q) = %q: not 1-64 of [A-Za-z0-9_-]", server, tool, name)
		}
		if prev, dup := seen[name]; dup && prev != key {
			t.Fatalf("%q is the name of both %q and %q", name, prev, key)
		}
		seen[name] = key
		s, tl, ok := ns.Resolve(name)
		if !ok || s != server || tl != tool {
			t.Fatalf("Resolve(Name(%q, %q) = %q) = %q, %q, %v", server, tool, name, s, tl, ok)
		}
		if again := fresh.Name(server, tool); again != name {
			t.Fatalf("Name(%q, %q) is %q in one namespace and %q in another", server, tool, name, again)
		}
	}
}

func BenchmarkNamespaceTool(b *testing.B) {
	cases := []struct{ server, tool string }{
		{"github", "create_issue"},
		{"github", strings.Repeat("long_tool_name_", 5)},
	}
	for _, c := range cases {
		b.Run(fmt.Sprintf("len=%d", len(c.server)+len(c.tool)), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				NamespaceTool(c.server, c.tool)
			}
		})
	}
}

func BenchmarkResolve(b *testing.B) {
	var servers []string
	for i := range 20 {
		servers = append(servers, fmt.Sprintf("server_%d", i))
	}
	ns, err := NewNamespace(servers)
	if err != nil {
		b.Fatal(err)
	}
	var names []string
	for _, s := range servers {
		for j := range 50 {
			tool := fmt.Sprintf("tool_%d_get_things", j)
			if j%10 == 0 {
				tool += strings.Repeat("_and_more", 6)
			}
			names = append(names, ns.Name(s, tool))
		}
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if _, _, ok := ns.Resolve(names[i%len(names)]); !ok {
			b.Fatal("not resolved")
		}
		i++
	}
}

package pinnedfetch

import (
	"errors"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"net"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
)

func TestCheckRemoteURL(t *testing.T) {
	tests := []struct {
		url     string
		allowed bool
		reason  string // a fragment of the refusal reason
	}{
		{"https://api.example.com/mcp", true, ""},
		{"https://API.Example.COM:8443/mcp?x=1", true, ""},
		{"https://api.example.com./mcp", true, ""},
		{"https://93.184.216.34/", true, ""},
		{"https://[2001:db8::1]:443/", true, ""},
		{"https://my_host.example.com/", true, ""},
		{"HTTPS://api.example.com/", true, ""},
		{"http://localhost:8080/mcp", true, ""},
		{"http://LOCALHOST/", true, ""},
		{"http://127.0.0.1:3000/", true, ""},
		{"http://127.255.0.9/", true, ""},
		{"http://[::1]:8080/", true, ""},

		{"http://api.example.com/", false, "plain http is allowed only to"},
		{"http://localhost.evil.com/", false, "plain http"},
		{"http://a.localhost/", false, "plain http"},
		{"http://localhost./", false, "plain http"},
		{"http://127.0.0.1.nip.io/", false, "plain http"},
		{"http://10.0.0.1/", false, "plain http"},
		{"http://169.254.169.254/latest/meta-data/", false, "plain http"},
		{"http://2130706433/", false, "reads as a number"},
		{"https://2130706433/", false, "reads as a number"},
		{"http://0177.0.0.1/", false, "reads as a number"},
		{"http://0x7f.0.0.1/", false, "reads as a number"},
		{"http://0x7f000001/", false, "reads as a number"},
		{"http://127.1/", false, "reads as a number"},
		{"http://127.0.0.1./", false, "reads as a number"},
		{"https://example.0x/", false, "reads as a number"},
		{"http://[::ffff:10.0.0.1]/", false, "IPv4-mapped"},
		{"http://[::ffff:127.0.0.1]/", false, "IPv4-mapped"},
		{"https://[::ffff:93.184.216.34]/", false, "IPv4-mapped"},
		{"http://[fe80::1%25eth0]/", false, "zones"},
		{"https://user:pass@api.example.com/", false, "userinfo"},
		{"https://user@api.example.com/", false, "userinfo"},
		{"ftp://api.example.com/", false, "scheme"},
		{"file:///etc/passwd", false, "scheme"},
		{"javascript:alert(1)", false, "not a hierarchical URL"},
		{"https:opaque", false, "not a hierarchical URL"},
		{"/relative/path", false, "scheme"},
		{"https:///path", false, "no host"},
		{"https://:443/", false, "no host"},
		{"https://api.example.com:0/", false, "port"},
		{"https://api.example.com:65536/", false, "port"},
		{"https://exa mple.com/", false, ""},  // does not parse
		{"https://ex%41mple.com/", false, ""}, // does not parse
		{"https://bücher.example/", false, "xn--"},
		{"https://-bad.example.com/", false, "valid ASCII DNS name"},
		{"https://a..b/", false, "valid ASCII DNS name"},
		{"https://" + strings.Repeat("a", 64) + ".com/", false, "valid ASCII DNS name"},
	}
	for _, tt := range tests {
		t.Run(tt.url, func(t *testing.T) {
			u, err := url.Parse(tt.url)
			if err != nil {
				if tt.allowed {
					t.Fatalf("parse: %v", err)
				}
				return
			}
			err = CheckRemoteURL(u)
			if got := IsAllowedRemoteURL(u); got != (err == nil) {
				t.Fatalf("IsAllowedRemoteURL = %v but CheckRemoteURL = %v", got, err)
			}
			if tt.allowed {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			var ue *URLError
			if !errors.As(err, &ue) {
				t.Fatalf("got %v, want a *URLError", err)
			}
			if !strings.Contains(ue.Reason, tt.reason) {
				t.Errorf("reason %q does not mention %q", ue.Reason, tt.reason)
			}
			if strings.Contains(err.Error(), "pass@") {
				t.Errorf("error leaks userinfo: %v", err)
			}
		})
	}
}

func TestCheckRemoteURLNil(t *testing.T) {
	if IsAllowedRemoteURL(nil) {
		t.Fatal("nil URL allowed")
	}
}

func TestCheckRemoteURLHandBuilt(t *testing.T) {
	// URLs built in code skip url.Parse's checks; the rule must still hold.
	tests := []*url.URL{
		{Scheme: "https", Host: "a b"},
		{Scheme: "https", Host: "[::1"},
		{Scheme: "http", Host: "127.0.0.1:+80"},
		{Scheme: "https", Host: "example.com:99999"},
		{Scheme: "http", Host: "localhost%00.evil.com"},
		{Scheme: "https", Host: "evil.com\\@good.com"},
	}
	for _, u := range tests {
		if err := CheckRemoteURL(u); err == nil {
			t.Errorf("%#v allowed", u)
		}
	}
}

func TestCheckRemoteURLRedacts(t *testing.T) {
	u, _ := url.Parse("ftp://alice:hunter2@example.com/p?token=abc123#frag")
	err := CheckRemoteURL(u)
	if err == nil {
		t.Fatal("allowed")
	}
	for _, secret := range []string{"hunter2", "alice", "abc123", "frag"} {
		if strings.Contains(err.Error(), secret) {
			t.Errorf("error %q contains %q", err, secret)
		}
	}
}

func TestIsLoopbackHost(t *testing.T) {
	tests := map[string]bool{
		"localhost":        true,
		"LocalHost":        true,
		"127.0.0.1":        true,
		"127.1.2.3":        true,
		"::1":              true,
		"0:0:0:0:0:0:0:1":  true,
		"::ffff:127.0.0.1": false, // a mapped spelling; see CheckRemoteURL
		"localhost.":       false,
		"x.localhost":      false,
		"128.0.0.1":        false,
		"0.0.0.0":          false,
		"::":               false,
		"2130706433":       false,
		"":                 false,
	}
	for host, want := range tests {
		if got := IsLoopbackHost(host); got != want {
			t.Errorf("IsLoopbackHost(%q) = %v, want %v", host, got, want)
		}
	}
}

// A socket address is what the kernel reports: an IPv4 connection on a
// dual-stack socket comes as ::ffff:a.b.c.d and is that IPv4 address. A
// written host is judged as written (TestIsLoopbackHost).
func TestIsLoopbackSocket(t *testing.T) {
	tcp := func(s string) net.Addr { return &net.TCPAddr{IP: net.ParseIP(s), Port: 443} }
	for _, c := range []struct {
		addr net.Addr
		want bool
	}{
		{tcp("127.0.0.1"), true},
		{tcp("127.9.9.9"), true},
		{tcp("::1"), true},
		{&net.TCPAddr{IP: net.IPv4(127, 0, 0, 1).To16(), Port: 1}, true},
		{tcp("::ffff:127.0.0.1"), true},
		{tcp("10.0.0.1"), false},
		{tcp("::ffff:10.0.0.1"), false},
		{tcp("::"), false},
		{&net.TCPAddr{}, false},
		{&net.UDPAddr{IP: net.ParseIP("127.0.0.1"), Port: 53}, true},
		{&net.UDPAddr{IP: net.ParseIP("192.0.2.1"), Port: 53}, false},
		{&net.UnixAddr{Name: "/run/caddy.sock", Net: "unix"}, false},
		{nil, false},
		{(*net.TCPAddr)(nil), false},
	} {
		if got := IsLoopbackSocket(c.addr); got != c.want {
			t.Errorf("IsLoopbackSocket(%v) = %v, want %v", c.addr, got, c.want)
		}
	}
}

// TestOneLoopbackPredicate: no other package of the module asks net.IP or
// netip.Addr whether an address is loopback; they ask this package's
// IsLoopbackHost, IsLoopbackAddr or IsLoopbackSocket, so that no spelling
// (::ffff:127.0.0.1 among them) is loopback to one rule and not another.
func TestOneLoopbackPredicate(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	self, _ := filepath.Abs(".")
	fset := token.NewFileSet()
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if d.Name() == ".git" || d.Name() == "node_modules" || d.Name() == "testdata" || path == self {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			if sel, ok := n.(*ast.SelectorExpr); ok && sel.Sel.Name == "IsLoopback" {
				t.Errorf("%s: IsLoopback; use pinnedfetch's loopback predicate", fset.Position(sel.Pos()))
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

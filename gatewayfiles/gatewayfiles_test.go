package gatewayfiles

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func TestPlaceholders(t *testing.T) {
	for _, c := range []struct {
		in   string
		want []string
	}{
		{"{file.upstream.token}", []string{"upstream.token"}},
		{"Bearer {file./run/secrets/token}", []string{"/run/secrets/token"}},
		{"{env.A}{file.a}{file.b}{file.a}", []string{"a", "b"}},
		{`\{file.escaped}`, nil},
		{"{x{file.inner}", []string{"inner"}},   // the replacer skips {x{file.inner} and finds {file.inner}
		{`{file.a\}b}`, []string{`a\`, `a\}b`}}, // the replacer reads "a\}b"; the first } is taken too
		{"{file.}", nil},
		{"{file.unclosed", nil},
		{"{env.FILE}", nil},
		{"file.x", nil},
	} {
		if got := Placeholders(c.in); !slices.Equal(got, c.want) {
			t.Errorf("Placeholders(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

func TestPlaceholderFiles(t *testing.T) {
	wd, _ := os.Getwd()
	type guard struct {
		Headers map[string]string `json:"headers"`
	}
	got := Paths(PlaceholderFiles(struct {
		Guard guard    `json:"guard"`
		Key   string   `json:"key"`
		List  []string `json:"list"`
		Plain string   `json:"plain"`
	}{
		Guard: guard{Headers: map[string]string{"Authorization": "{file.upstream.token}"}},
		Key:   "{file./etc/zidane/cluster.key}",
		List:  []string{"x", "{file./a/../b/c}"},
		Plain: "{env.SECRET}",
	}))
	want := []string{"/b/c", "/etc/zidane/cluster.key", filepath.Join(wd, "upstream.token")}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("PlaceholderFiles = %q, want %q", got, want)
	}
}

func TestInConfig(t *testing.T) {
	wd, _ := os.Getwd()
	cfg := `{
	"admin": {"listen": "localhost:2019"},
	"logging": {"logs": {
		"default": {"writer": {"output": "stderr"}},
		"access": {"writer": {"output": "file", "filename": "/var/log/caddy/access.log"}},
		"rel": {"writer": {"output": "file", "filename": "{env.LOGDIR}/x.log"}},
		"root": {"writer": {"output": "file", "filename": "/top.log"}},
		"audit": {"writer": {"output": "zidane_audit", "file": "/var/log/zidane/audit.log"}}
	}},
	"apps": {
		"tls": {"certificates": {
			"load_files": [{"certificate": "/etc/caddy/tls/cert.pem", "key": "/etc/caddy/tls/key.pem"}],
			"load_folders": ["/etc/caddy/certs"]
		}},
		"pki": {"certificate_authorities": {"local": {
			"root": {"certificate": "/etc/pki/root.crt", "private_key": "/etc/pki/root.key"},
			"intermediate": {"certificate": "-----BEGIN", "private_key": "-----BEGIN", "format": "pem_inline"}
		}}},
		"http": {"servers": {"s": {"routes": [{"handle": [
			{"handler": "reverse_proxy", "headers": {"request": {"set": {"Authorization": ["{file.proxy.token}"]}}},
			 "transport": {"protocol": "http", "tls": {"client_certificate_file": "/etc/mtls/c.pem", "client_certificate_key_file": "/etc/mtls/k.pem"}}},
			{"handler": "file_server", "root": "/srv/www"}
		]}]}}},
		"zidane": {"cluster": {"key": "{file./etc/zidane/cluster.key}"}}
	}
}`
	expand := func(s string) string {
		if s == "{env.LOGDIR}/x.log" {
			return "/srv/logs/x.log"
		}
		return s
	}
	files, err := InConfig([]byte(cfg), expand)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"/var/log/caddy":                 WhyCaddyLog,
		"/srv/logs":                      WhyCaddyLog,
		"/top.log":                       WhyCaddyLog, // its directory is the root: the file alone
		"/etc/caddy/tls/cert.pem":        WhyTLS,
		"/etc/caddy/tls/key.pem":         WhyTLS,
		"/etc/caddy/certs":               WhyTLSFolder,
		"/etc/pki/root.crt":              WhyPKI,
		"/etc/pki/root.key":              WhyPKI,
		"/etc/mtls/c.pem":                WhyClientCert,
		"/etc/mtls/k.pem":                WhyClientCert,
		filepath.Join(wd, "proxy.token"): WhyPlaceholder,
		"/etc/zidane/cluster.key":        WhyPlaceholder,
	}
	got := map[string]string{}
	for _, f := range files {
		got[f.Path] = f.Why
	}
	for p, why := range want {
		if got[p] != why {
			t.Errorf("%s: got %q, want %q", p, got[p], why)
		}
	}
	for p := range got {
		if _, ok := want[p]; !ok {
			t.Errorf("%s (%s) is not a file of the gateway's", p, got[p])
		}
	}
	if _, err := InConfig([]byte("not json"), nil); err == nil {
		t.Error("a config that is not JSON was read")
	}
}

func TestRegistryHoldsUntilTheLastRelease(t *testing.T) {
	var r Registry
	oldCfg := r.Hold([]File{{Path: "/etc/a.key", Why: "old"}, {Path: "/etc/shared", Why: "old"}})
	newCfg := r.Hold([]File{{Path: "/etc/shared", Why: "new"}, {Path: "/etc/b.key", Why: "new"}, {Path: "", Why: "dropped"}})
	files := r.Files()
	if got := Paths(files); !slices.Equal(got, []string{"/etc/a.key", "/etc/b.key", "/etc/shared"}) {
		t.Fatalf("while both configs run: %q", got)
	}
	if files[2].Why != "old" {
		t.Errorf("/etc/shared: why %q, want the oldest holder's", files[2].Why)
	}
	oldCfg()
	oldCfg()
	if got := Paths(r.Files()); !slices.Equal(got, []string{"/etc/b.key", "/etc/shared"}) {
		t.Fatalf("after the old config's cleanup: %q", got)
	}
	newCfg()
	if got := r.Files(); len(got) != 0 {
		t.Fatalf("after every release: %v", got)
	}
}

// TestReach covers is, inside and holds, through symlinks both ways, and
// a denied path that is itself a link.
func TestReach(t *testing.T) {
	root := t.TempDir()
	mk := func(p string) string {
		p = filepath.Join(root, p)
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	link := func(target, name string) string {
		name = filepath.Join(root, name)
		if err := os.Symlink(target, name); err != nil {
			t.Fatal(err)
		}
		return name
	}
	audit := mk("var/log/zidane")
	mk("srv/project")
	secrets := mk("secrets")
	keyTarget := filepath.Join(secrets, "real.key")
	if err := os.WriteFile(keyTarget, []byte("k"), 0o600); err != nil {
		t.Fatal(err)
	}
	mk("etc/caddy")
	named := link(keyTarget, "etc/caddy/key.pem") // the config names the link
	toAudit := link(audit, "srv/logs")
	files := []File{{Path: audit, Why: "audit"}, {Path: named, Why: "key"}, {Path: filepath.Join(root, "later/dir"), Why: "not made yet"}}

	for _, c := range []struct {
		path, why, how string
	}{
		{audit, "audit", Is},
		{filepath.Join(audit, "sub"), "audit", Inside},
		{filepath.Join(root, "var"), "audit", Holds},
		{root, "audit", Holds},
		{toAudit, "audit", Is},                           // a link to the denied directory
		{filepath.Join(toAudit, "x"), "audit", Inside},   // through the link, not made yet
		{filepath.Join(root, "etc/caddy"), "key", Holds}, // holds the link the config names
		{secrets, "key", Holds},                          // holds where the link leads
		{filepath.Join(root, "later"), "not made yet", Holds},
		{filepath.Join(root, "srv/project"), "", ""},
		{filepath.Join(root, "var/log/zidane2"), "", ""},
	} {
		f, how, ok := Reach(c.path, files)
		if ok != (c.how != "") || f.Why != c.why || how != c.how {
			t.Errorf("Reach(%s) = %q %q %v, want %q %q", c.path, f.Why, how, ok, c.why, c.how)
		}
	}
	got := Resolved(files)
	for _, want := range []string{audit, named, keyTarget} {
		if !slices.Contains(got, want) {
			t.Errorf("Resolved lacks %s: %q", want, got)
		}
	}
}

func TestDescribe(t *testing.T) {
	f := File{Path: "/var/log/zidane", Why: "the zidane_audit log's directory"}
	for how, want := range map[string]string{
		Is:     "is the zidane_audit log's directory",
		Inside: "is inside /var/log/zidane, the zidane_audit log's directory",
		Holds:  "holds /var/log/zidane, the zidane_audit log's directory",
	} {
		if got := Describe(f, how); got != want {
			t.Errorf("Describe(%s) = %q, want %q", how, got, want)
		}
	}
}

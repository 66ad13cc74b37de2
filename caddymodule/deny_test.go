package caddymodule

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"go.uber.org/zap"

	"github.com/Tahul/caddy-zidane-mcp/gatewayfiles"
	"github.com/Tahul/caddy-zidane-mcp/internal/pathtree"
)

// freeLoopbackPort is a TCP port free on 127.0.0.1 now.
func freeLoopbackPort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

func TestParseRunFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		ok   bool
		want runFlags
	}{
		{[]string{"caddy", "run", "--config", "/etc/caddy/Caddyfile", "--adapter", "caddyfile"}, true, runFlags{config: "/etc/caddy/Caddyfile", adapter: "caddyfile"}},
		{[]string{"caddy", "run", "--config=/c.json", "--envfile", "/a.env,/b.env", "--envfile=/c.env"}, true, runFlags{config: "/c.json", envFiles: []string{"/a.env", "/b.env", "/c.env"}}},
		{[]string{"caddy", "run", "-c", "Caddyfile", "-acaddyfile", "--watch", "--pingback", "127.0.0.1:9"}, true, runFlags{config: "Caddyfile", adapter: "caddyfile"}},
		{[]string{"caddy", "run", "-c=/x", "--resume"}, true, runFlags{config: "/x", resume: true}},
		{[]string{"caddy", "run", "--config"}, true, runFlags{}},
		{[]string{"caddy", "zidane", "confine", "--config", "/x"}, false, runFlags{}},
		{[]string{"caddy.test", "-test.run", "X"}, false, runFlags{}},
	} {
		got, ok := parseRunFlags(c.args)
		if ok != c.ok || got.config != c.want.config || got.adapter != c.want.adapter || got.resume != c.want.resume || !slices.Equal(got.envFiles, c.want.envFiles) {
			t.Errorf("parseRunFlags(%q) = %+v %v, want %+v %v", c.args, got, ok, c.want, c.ok)
		}
	}
}

// The config caddy was started with names files that Caddy's own modules
// read, which no module of this project holds: the config file, what it
// imports, TLS files, a file log's directory, a {file.…} in a
// reverse_proxy header, and the envfile.
func TestProcessConfigFiles(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	imported := write("sites/extra.caddy", "http://127.0.0.1:9 {\n\treverse_proxy 127.0.0.1:10 {\n\t\theader_up Authorization {file.proxy.token}\n\t}\n}\n")
	caddyfile := write("Caddyfile", `{
	admin off
	log access {
		output file `+dir+`/logs/access.log
	}
}

https://127.0.0.1:8 {
	tls `+dir+`/tls/cert.pem `+dir+`/tls/key.pem
	respond "ok"
}

import sites/*.caddy
`)
	files := processConfigFiles([]string{"caddy", "run", "--config", caddyfile, "--adapter", "caddyfile", "--envfile", "secrets.env"}, zap.NewNop())
	got := map[string]string{}
	for _, f := range files {
		got[f.Path] = f.Why
	}
	for p, why := range map[string]string{
		caddyfile:                          whyConfigFile,
		imported:                           whyImported,
		filepath.Join(dir, "secrets.env"):  whyEnvFile,
		filepath.Join(dir, "logs"):         gatewayfiles.WhyCaddyLog,
		filepath.Join(dir, "tls/cert.pem"): gatewayfiles.WhyTLS,
		filepath.Join(dir, "tls/key.pem"):  gatewayfiles.WhyTLS,
		filepath.Join(dir, "proxy.token"):  gatewayfiles.WhyPlaceholder,
	} {
		if got[p] != why {
			t.Errorf("%s: %q, want %q (all: %v)", p, got[p], why, got)
		}
	}
	// Without --config, `caddy run` takes the Caddyfile of its working
	// directory.
	files = processConfigFiles([]string{"caddy", "run"}, zap.NewNop())
	if !slices.Contains(gatewayfiles.Paths(files), caddyfile) {
		t.Errorf("caddy run without --config: %v", files)
	}
	if files := processConfigFiles([]string{"caddy", "version"}, zap.NewNop()); len(files) != 0 {
		t.Errorf("another command: %v", files)
	}
}

// Each module of this project holds the files it reads secrets from, or
// writes evidence to, while it is provisioned: an agent's sandbox path
// that reaches one is refused with the path and why when the config
// starts, and cleanup releases them. Each config is run as `caddy run`
// runs it (no admin API, nothing autosaved).
func TestSandboxPathsThatReachTheGatewaysFilesAreRefused(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir) // {file.…} placeholders read from Caddy's working directory
	for name, body := range map[string]string{
		"upstream.token": "Bearer s",
		"token.key":      base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{1}, 32)),
		"audit.key":      base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{2}, 32)),
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	pub, _ := pemFiles(t)
	auditDir := filepath.Join(t.TempDir(), "audit")
	copyDir := filepath.Join(t.TempDir(), "anchor")
	project := t.TempDir()
	config := func(sandbox string) (global, sites string) {
		global = `	log audit {
		output zidane_audit {
			file ` + auditDir + `/audit.log
			signing_key {file.audit.key}
			checkpoint_copy ` + copyDir + `/audit.checkpoint
		}
	}
	zidane {
		upstream_token_key {file.token.key}
		agent a {
			command /bin/true
			sandbox {
				` + sandbox + `
			}
		}
	}`
		sites = "http://127.0.0.1:9 {\n\tzidane_mcp {\n\t\tguard {\n\t\t\tupstream_header Authorization {file.upstream.token}\n\t\t}\n\t\tresource http://127.0.0.1:9/mcp\n\t\tjwt {\n\t\t\tissuer https://idp.test\n\t\t\tpublic_key_file " + pub + "\n\t\t}\n\t}\n\trespond 404\n}\n"
		return global, sites
	}
	port := freeLoopbackPort(t)
	check := func(t *testing.T, sandbox string) error {
		global, sites := config(sandbox)
		caddyfile := fmt.Sprintf("{\n\tadmin off\n\tpersist_config off\n\tstorage file_system %s\n%s\n}\n\n%s", t.TempDir(), global, strings.ReplaceAll(sites, "127.0.0.1:9", fmt.Sprintf("127.0.0.1:%d", port)))
		raw, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(caddyfile), nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := caddy.Load(raw, true); err != nil {
			return err
		}
		return caddy.Stop()
	}
	if err := check(t, "write "+project); err != nil {
		t.Fatalf("the config the cases change is refused: %v", err)
	}
	for _, c := range []struct {
		name, sandbox string
		want          []string
	}{
		{"write a guard's {file.…} secret", "write " + filepath.Join(dir, "upstream.token"), []string{"sandbox write " + filepath.Join(dir, "upstream.token") + " is " + gatewayfiles.WhyPlaceholder}},
		{"read the app's {file.…} key", "read " + filepath.Join(dir, "token.key"), []string{"sandbox read " + filepath.Join(dir, "token.key") + " is " + gatewayfiles.WhyPlaceholder}},
		{"read the audit key's directory", "read " + dir, []string{"sandbox read " + dir + " holds "}},
		{"write inside the audit log's directory", "write " + filepath.Join(auditDir, "sub"), []string{"is inside " + auditDir, whyAuditLog}},
		{"read what holds the JWT key", "read " + filepath.Dir(pub), []string{"holds " + pub, whyJWTKey}},
		{"write the checkpoint copy's directory", "write " + copyDir, []string{"sandbox write " + copyDir + " is " + whyCheckpointCopy}},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := check(t, c.sandbox)
			if err == nil {
				t.Fatalf("an agent with sandbox %s was accepted", c.sandbox)
			}
			for _, w := range append(c.want, "keeps from agents", "agent a") {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("the refusal does not say %q: %v", w, err)
				}
			}
		})
	}
	// Every config above was cleaned up: nothing it named is held.
	for _, f := range deniedFiles() {
		for _, p := range []string{dir, auditDir, copyDir, pub} {
			if pathtree.Within(f.Path, p) {
				t.Errorf("%s (%s) is still denied after its config was cleaned up", f.Path, f.Why)
			}
		}
	}
}

package e2e

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// deniedKind is one kind of path that holds a secret of the gateway's or
// its evidence, which no agent may reach.
type deniedKind struct {
	name    string
	paths   []string // the files of the kind, as the test made them or caddy did
	dir     string   // a directory that holds this kind only, or ""
	denyDir bool     // dir itself is denied: a cwd inside it is refused too
	why     string   // what the refusal must say the path is
}

// TestAgentDeniedFiles runs a real confined agent (confineprobe in front of
// the demo agent) whose command lives in caddy's own directory, beside
// every kind of file that holds the gateway's secrets or its evidence: a
// {file.X} credential of a guard's upstream_header, of the zidane app
// (upstream_token_key) and of the audit writer (signing_key), the
// zidane_audit log with its lock and a rotated file, Caddy's own file log,
// the JWT public key file, a TLS key and certificate, the --config
// Caddyfile and a file it imports. Without the deny list, the command's
// directory would give the agent every one of them (a control file beside
// them must stay readable, or the test proves nothing).
//
// For each kind, on its own: the agent reads and writes nothing of it; an
// agent whose `sandbox write` (or `read`) names it is refused when the
// config loads; and, where the kind has a directory of its own, a session
// whose cwd is that directory, or inside it, is refused with a message
// that says why, which the audit log records.
func TestAgentDeniedFiles(t *testing.T) {
	if _, err := os.Stat("/proc/self/status"); err != nil {
		t.Skip("the confinement test needs Linux")
	}
	port, guardPort, tlsPort, importPort := freePort(t), freePort(t), freePort(t), freePort(t)
	c := startCaddy(t, sessionsCaddyfile(port, "", ""))
	dir := c.Dir

	// The agent's command in caddy's directory: the sandbox lets a command
	// read its own directory, and so all that is beside it but denied.
	probe := filepath.Join(dir, "confineprobe")
	if err := goBuild(probe, "./e2e/confineprobe"); err != nil {
		t.Fatal(err)
	}
	write := func(path string, data []byte) string {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	control := write(filepath.Join(dir, "control.txt"), []byte("readable"))
	guardSecret := write(filepath.Join(dir, "upstream.token"), []byte("Bearer guard-secret-"+randomHex(8)))
	tokenKey := write(filepath.Join(dir, "token.key"), []byte(base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{7}, 32))))
	auditKey := write(filepath.Join(dir, "audit.key"), []byte(base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{9}, 32))))
	auditDir := filepath.Join(dir, "k-audit")
	auditLog := filepath.Join(auditDir, "audit.log")
	rotated := write(filepath.Join(auditDir, "audit-2026-01-02T03-04-05.000.log.gz"), []byte("an earlier run's records"))
	logDir := filepath.Join(dir, "k-log")
	accessLog := filepath.Join(logDir, "access.log")
	jwtDir := filepath.Join(dir, "k-jwt")
	jwtKey := write(filepath.Join(jwtDir, "jwt.pub"), publicKeyPEM(t))
	tlsDir := filepath.Join(dir, "k-tls")
	certPEM, keyPEM := selfSignedLoopback(t)
	tlsCert := write(filepath.Join(tlsDir, "cert.pem"), certPEM)
	tlsKey := write(filepath.Join(tlsDir, "key.pem"), keyPEM)
	importDir := filepath.Join(dir, "k-import")
	imported := write(filepath.Join(importDir, "extra.caddy"), fmt.Appendf(nil, "http://127.0.0.1:%d {\n\trespond \"imported\"\n}\n", importPort))
	// Caddy's file writer creates its file at the first entry; one from
	// an earlier run is there already.
	write(accessLog, []byte("an earlier run's access log\n"))

	config := func(sandbox string) string {
		return fmt.Sprintf(`{
	admin %[1]s
	auto_https disable_redirects
	log audit {
		output zidane_audit {
			file %[2]s
			signing_key {file.audit.key}
		}
		format json
	}
	log access {
		include http.log.access
		output file %[3]s
	}
	zidane {
		upstream_token_key {file.token.key}
		agent probe {
			command %[4]s %[5]s zidane demo-agent
			env PROBE_LABEL root
%[6]s
		}
		default_agent demo
	}
}

http://127.0.0.1:%[7]d {
	zidane_mcp {
		sessions
		jwt {
			issuer https://idp.test
			audience http://127.0.0.1:%[7]d/mcp
			public_key_file %[8]s
		}
	}
}

http://127.0.0.1:%[9]d {
	zidane_mcp {
		guard {
			upstream_header Authorization {file.upstream.token}
		}
	}
	reverse_proxy 127.0.0.1:9
}

https://127.0.0.1:%[10]d {
	tls %[11]s %[12]s
	respond "tls"
}

import k-import/extra.caddy
`, AdminPlaceholder, auditLog, accessLog, probe, caddyBin, sandbox, port, jwtKey, guardPort, tlsPort, tlsCert, tlsKey)
	}
	// The agents a session engine runs are the ones it started with.
	c.Reload(t, config(""))
	c.Restart(t)

	// A refusal makes the audit writer open its file and take its lock.
	resp, err := shortClient.Post(fmt.Sprintf("http://127.0.0.1:%d/mcp", port), "application/json", strings.NewReader(initializeBody))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	waitForAuditRecord(t, auditLog, `"seq"`)
	lock := filepath.Join(auditDir, ".audit.log.lock")

	kinds := []deniedKind{
		{name: "a {file.X} secret of a guard's upstream_header", paths: []string{guardSecret}, why: "{file."},
		{name: "a {file.X} secret of the zidane app (upstream_token_key)", paths: []string{tokenKey}, why: "{file."},
		{name: "a {file.X} secret of the audit writer (signing_key)", paths: []string{auditKey}, why: "{file."},
		{name: "the zidane_audit log, its lock and a rotated file", paths: []string{auditLog, lock, rotated}, dir: auditDir, denyDir: true, why: "audit log"},
		{name: "Caddy's own file log", paths: []string{accessLog}, dir: logDir, denyDir: true, why: "log"},
		{name: "the JWT public key file", paths: []string{jwtKey}, dir: jwtDir, why: "public_key_file"},
		{name: "a TLS key and certificate", paths: []string{tlsKey, tlsCert}, dir: tlsDir, why: "TLS"},
		{name: "the --config Caddyfile", paths: []string{c.Caddyfile}, why: "--config"},
		{name: "a file the Caddyfile imports", paths: []string{imported}, dir: importDir, why: "imports"},
	}
	var targets confineTargets
	targets.CaddyPID = c.proc.cmd.Process.Pid
	targets.Admin = c.AdminAddr
	targets.Read = []string{control}
	for _, k := range kinds {
		for _, p := range k.paths {
			if _, err := os.Stat(p); err != nil {
				t.Fatalf("%s: %s should exist for the agent to try: %v", k.name, p, err)
			}
			targets.Read = append(targets.Read, p)
			targets.Write = append(targets.Write, p)
		}
		if k.dir != "" {
			targets.List = append(targets.List, k.dir)
			targets.Write = append(targets.Write, filepath.Join(k.dir, "planted"))
		}
	}
	before := map[string][]byte{}
	for _, p := range targets.Write {
		before[p], _ = os.ReadFile(p)
	}

	token := createToken(t, c, "denied", "--scope", "chat")
	g := connectGoSessions(t, fmt.Sprintf("http://127.0.0.1:%d/mcp", port), token, "go-sdk")
	cwd := t.TempDir()
	tg, _ := json.Marshal(targets)
	if err := os.WriteFile(filepath.Join(cwd, "probe-targets.json"), tg, 0o644); err != nil {
		t.Fatal(err)
	}
	id := createSession(t, g, cwd, "hello", "agent", "probe").SessionID
	if v := settleIn(t, g, id, "idle"); v.LastMessage != "You said: hello" || v.Error != "" {
		t.Fatalf("the confined session did not answer its prompt: %+v", v)
	}
	raw, err := os.ReadFile(filepath.Join(cwd, "probe-report.json"))
	if err != nil {
		t.Fatalf("the probe wrote no report: %v", err)
	}
	var rep confineReport
	if err := json.Unmarshal(raw, &rep); err != nil {
		t.Fatal(err)
	}
	after := map[string][]byte{}
	for _, p := range targets.Write {
		after[p], _ = os.ReadFile(p)
	}
	probes := map[string]confineProbe{}
	for _, p := range rep.Probes {
		probes[p.Name] = p
	}
	if p, ok := probes["read "+control]; !ok || !p.Done {
		t.Fatalf("the agent cannot read %s beside its own command (%+v): the test would prove nothing", control, p)
	}

	for _, k := range kinds {
		t.Run(k.name, func(t *testing.T) {
			for _, p := range k.paths {
				for _, name := range []string{"read " + p, "write " + p} {
					got, ok := probes[name]
					switch {
					case !ok:
						t.Errorf("the probe did not try %q", name)
					case got.Done:
						t.Errorf("%s SUCCEEDED (%s): the agent reached %s", name, got.Detail, k.name)
					}
				}
				if !bytes.Equal(after[p], before[p]) && p != auditLog {
					t.Errorf("%s changed under the agent", p)
				}
			}
			if k.denyDir {
				if got := probes["list "+k.dir]; got.Done {
					t.Errorf("the agent listed %s (%s)", k.dir, got.Detail)
				}
				if _, err := os.Stat(filepath.Join(k.dir, "planted")); err == nil {
					t.Errorf("the agent planted a file in %s", k.dir)
				}
			}

			// A writable grant that reaches the kind is refused when the
			// config loads, with the path and why.
			out, err := c.TryReload(t, config("\t\t\tsandbox {\n\t\t\t\twrite "+k.paths[0]+"\n\t\t\t}"))
			if err == nil {
				t.Fatalf("a config whose agent may write %s was accepted", k.paths[0])
			}
			t.Logf("sandbox write %s: %s", k.paths[0], lastLine(strings.TrimSpace(out)))
			if !strings.Contains(out, k.paths[0]) || !strings.Contains(out, "keeps from agents") {
				t.Errorf("the refusal of sandbox write %s does not say why:\n%s", k.paths[0], out)
			}

			if k.dir == "" {
				return
			}
			out, err = c.TryReload(t, config("\t\t\tsandbox {\n\t\t\t\tread "+k.dir+"\n\t\t\t}"))
			if err == nil || !strings.Contains(out, k.dir) {
				t.Errorf("a config whose agent may read %s: %v\n%s", k.dir, err, out)
			}
			cwds := []string{k.dir}
			inside := filepath.Join(k.dir, "work")
			if k.denyDir {
				if err := os.MkdirAll(inside, 0o700); err != nil {
					t.Fatal(err)
				}
				cwds = append(cwds, inside)
			}
			for _, cwd := range cwds {
				msg := callRefused(t, g, "sessions", map[string]any{"verb": "create", "cwd": cwd, "prompt": "hello", "agent": "probe"}, "denied_path")
				t.Logf("create in %s: %s", cwd, msg)
				if !strings.Contains(msg, cwd) || !strings.Contains(msg, k.why) {
					t.Errorf("create in %s: the refusal does not say why (want %q): %s", cwd, k.why, msg)
				}
			}
			waitForLog(t, c, auditLog, `"reason":"denied_path"`, cwds[len(cwds)-1])
		})
	}
}

// waitForLog waits until caddy's output or the audit log holds a line with
// every one of subs. The test's audit log takes every logger and the
// default log keeps writing to caddy's output, so an audit event is found
// whichever logger it is written through.
func waitForLog(t *testing.T, c *Caddy, auditLog string, subs ...string) {
	t.Helper()
	deadline := time.Now().Add(auditEventTimeout)
	for {
		audit, _ := os.ReadFile(auditLog)
		for _, line := range strings.Split(c.Logs()+"\n"+string(audit), "\n") {
			all := true
			for _, s := range subs {
				all = all && strings.Contains(line, s)
			}
			if all {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no log line holds %q within %s", subs, auditEventTimeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// publicKeyPEM is the PEM of a fresh ECDSA public key.
func publicKeyPEM(t *testing.T) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})
}

// selfSignedLoopback is a certificate for 127.0.0.1 and its key, in PEM.
func selfSignedLoopback(t *testing.T) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "127.0.0.1"},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})
}

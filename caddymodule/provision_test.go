package caddymodule

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
)

// validate adapts a Caddyfile of the global options global and the sites,
// and provisions it as `caddy validate` does, with its storage under a
// temporary directory. When a provision fails,
// Caddy cleans up what it provisioned before returning the error. A
// validation that has not returned after a minute fails the test rather
// than hang it.
func validate(t *testing.T, global, sites string) error {
	t.Helper()
	caddyfile := fmt.Sprintf("{\n\tadmin off\n\tstorage file_system %s\n%s\n}\n\n%s", t.TempDir(), global, sites)
	raw, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(caddyfile), nil)
	if err != nil {
		return err
	}
	var cfg caddy.Config
	if err := json.Unmarshal(raw, &cfg); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- caddy.Validate(&cfg) }()
	select {
	case err := <-done:
		return err
	case <-time.After(time.Minute):
		t.Fatal("caddy.Validate did not return within a minute: provisioning hangs")
		return nil
	}
}

func pemFiles(t *testing.T) (pub, priv string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	pubDER, _ := x509.MarshalPKIXPublicKey(&key.PublicKey)
	privDER, _ := x509.MarshalPKCS8PrivateKey(key)
	dir := t.TempDir()
	pub, priv = filepath.Join(dir, "pub.pem"), filepath.Join(dir, "priv.pem")
	if err := os.WriteFile(pub, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(priv, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: privDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	return pub, priv
}

// A jwt block that policy refuses (a leeway out of range, a private key for
// a public one) left a nil *policy.JWTVerifier in an interface, which
// Cleanup then closed: caddy validate, run and reload died of a nil
// dereference. A key file that never ends (/dev/zero, a named pipe) hung
// the provision. Each is now an error that names the option.
func TestJWTConfigsThatFailProvisionAreErrors(t *testing.T) {
	pub, priv := pemFiles(t)
	fifo := filepath.Join(t.TempDir(), "pipe.pem")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	site := func(jwt string) string {
		return "http://127.0.0.1:9 {\n\tzidane_mcp {\n\t\tguard\n\t\tresource http://127.0.0.1:9/mcp\n\t\tjwt {\n\t\t\tissuer https://idp.test\n" + jwt + "\n\t\t}\n\t}\n}\n"
	}
	if err := validate(t, "", site("public_key_file "+pub)); err != nil {
		t.Fatalf("the valid config the cases change is refused: %v", err)
	}
	for _, c := range []struct {
		name, jwt, want string
	}{
		{"leeway over 5m", "public_key_file " + pub + "\nleeway 10h", "leeway 10h0m0s is out of range"},
		{"a private key", "public_key_file " + priv, "jwt public_key_file " + priv + ": the PEM holds a private key (PRIVATE KEY): give the public key instead"},
		{"both key sources", "public_key_file " + pub + "\njwks_url http://127.0.0.1:9/jwks", "keep only one"},
		{"/dev/zero", "public_key_file /dev/zero", "jwt public_key_file: /dev/zero is a character device, not a regular file"},
		{"a named pipe", "public_key_file " + fifo, "is a named pipe, not a regular file"},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := validate(t, "", site(c.jwt))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("validate = %v; want an error saying %q", err, c.want)
			}
		})
	}
}

// Caddy calls Cleanup after a Provision that failed at any step, so it
// must hold for modules with nothing set up.
func TestCleanupOfWhatWasNeverProvisioned(t *testing.T) {
	if err := (&Handler{}).Cleanup(); err != nil {
		t.Errorf("Handler.Cleanup: %v", err)
	}
	if err := (&Handler{JWT: &JWTConfig{Issuer: "https://idp.test"}}).Cleanup(); err != nil {
		t.Errorf("Handler.Cleanup with an unbuilt jwt: %v", err)
	}
	for _, m := range []routeModule{&Sessions{}, &Guard{}, &Broker{}, &Aggregate{}} {
		if err := m.Cleanup(); err != nil {
			t.Errorf("%s Cleanup: %v", m.CaddyModule().ID, err)
		}
	}
	if err := (&App{}).Cleanup(); err != nil {
		t.Errorf("App.Cleanup: %v", err)
	}
}

// The app refuses, at provision and so in `caddy validate`, names and paths
// that only a sessions site would otherwise have looked at.
func TestAppProvisionChecksNamesAndPaths(t *testing.T) {
	pub, _ := pemFiles(t)
	guard := "http://127.0.0.1:9 {\n\tzidane_mcp {\n\t\tguard\n\t}\n}\n"
	if err := validate(t, "\tzidane {\n\t\tworktree_root "+t.TempDir()+"\n\t}", guard); err != nil {
		t.Fatalf("the valid config the cases change is refused: %v", err)
	}
	for _, c := range []struct {
		name, global, want string
	}{
		{"unknown default agent", "default_agent nosuch", `default_agent "nosuch" is not configured: name one of demo`},
		{"unknown session upstream", "session_upstreams nosuch", `session_upstreams: no upstream "nosuch" is configured`},
		{"worktree root that is a file", "worktree_root " + pub, "worktree_root " + pub + " is not a directory"},
		{"upstreams file that is a device", "upstreams_file /dev/zero", "upstreams_file: /dev/zero is a character device, not a regular file"},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := validate(t, "\tzidane {\n\t\t"+c.global+"\n\t}", guard)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("validate = %v; want an error saying %q", err, c.want)
			}
		})
	}
}

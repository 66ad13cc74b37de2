package caddymodule

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"

	"github.com/Tahul/caddy-zidane-mcp/cluster"
	"github.com/Tahul/caddy-zidane-mcp/gatewayfiles"
	"github.com/Tahul/caddy-zidane-mcp/internal/natstest"
	"github.com/Tahul/caddy-zidane-mcp/internal/testtls"
)

// An agent has a shell with the gateway's uid. In cluster mode, the files
// that log into NATS would let it delete values or put back old ones, and
// the cluster key file given as {file.cluster.key} would let it sign hops
// as any replica, so they are among the paths no agent may reach, as
// every session engine of the process sees them; the CA is not a secret.
// The config is provisioned as caddy provisions it, with the settings in
// either place: in storage zidane_nats, which dials a real nats-server
// that requires a client certificate before the app is provisioned, or in
// the zidane app's cluster block, which a bare storage zidane_nats
// provisions first.
func TestClusterModeDeniesAgentsTheNATSFiles(t *testing.T) {
	for _, inStorage := range []bool{true, false} {
		t.Run(map[bool]string{true: "settings in storage zidane_nats", false: "settings in the zidane app's cluster block"}[inStorage], func(t *testing.T) {
			clusterModeDeniesAgentsTheNATSFiles(t, inStorage)
		})
	}
}

func clusterModeDeniesAgentsTheNATSFiles(t *testing.T, inStorage bool) {
	certs := testtls.Files(t, "zidane")
	ns := natstest.FromConfig(t, fmt.Sprintf("listen: \"127.0.0.1:-1\"\njetstream { store_dir: %q }\ntls {\n\tcert_file: %q\n\tkey_file: %q\n\tca_file: %q\n\tverify: true\n}\n",
		t.TempDir(), filepath.Join(certs, "server.pem"), filepath.Join(certs, "server-key.pem"), filepath.Join(certs, "ca.pem")))
	url := strings.Replace(ns.ClientURL(), "nats://", "tls://", 1)

	// What the app keeps on this host (the admin key, the marker of a
	// server on NATS) goes to a directory of the test's, not the user's.
	defer func(p string) { caddy.DefaultStorage.Path = p }(caddy.DefaultStorage.Path)
	caddy.DefaultStorage.Path = t.TempDir()
	// A {file.…} placeholder reads a path from Caddy's working directory.
	wd := t.TempDir()
	t.Chdir(wd)
	keyFile := filepath.Join(wd, "cluster.key")
	if err := os.WriteFile(keyFile, []byte(base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{7}, cluster.KeySize))), 0o600); err != nil {
		t.Fatal(err)
	}

	cert, key, ca := filepath.Join(certs, "zidane.pem"), filepath.Join(certs, "zidane-key.pem"), filepath.Join(certs, "ca.pem")
	settings := map[string]any{
		"urls": []string{url}, "tls_ca": ca, "tls_cert": cert, "tls_key": key, "node": "gw-1", "key": "{file.cluster.key}",
	}
	storage := map[string]any{"module": "zidane_nats"}
	zidane := map[string]any{}
	if inStorage {
		for k, v := range settings {
			storage[k] = v
		}
	} else {
		zidane["cluster"] = settings
	}
	raw, _ := json.Marshal(map[string]any{"storage": storage, "apps": map[string]any{"zidane": zidane}})
	var cfg caddy.Config
	if err := json.Unmarshal(raw, &cfg); err != nil {
		t.Fatal(err)
	}
	ctx, err := caddy.ProvisionContext(&cfg)
	if err != nil {
		t.Fatalf("provisioning cluster mode: %v", err)
	}
	v, err := ctx.App("zidane")
	if err != nil {
		t.Fatal(err)
	}
	app := v.(*App)
	// The storage module's own hold on the connection, which the config's
	// context releases when caddy stops it.
	storageKey, _ := natsStateOf(app.cluster)
	t.Cleanup(func() {
		if inStorage {
			_, _ = natsPool.Delete(storageKey)
		}
	})
	cleaned := false
	t.Cleanup(func() {
		if !cleaned {
			_ = app.Cleanup()
		}
	})
	if _, ok := ctx.Storage().(*cluster.Storage); !ok || ctx.Storage() != app.storage {
		t.Fatalf("Caddy's storage is %T, the app's %T: want both the cluster's", ctx.Storage(), app.storage)
	}
	denied := gatewayfiles.Paths(deniedFiles())
	for _, f := range []string{cert, key, keyFile} {
		if !slices.Contains(denied, f) {
			t.Errorf("agents may reach %s, which logs into NATS or signs for the cluster; denied: %v", f, denied)
		}
	}
	if slices.Contains(denied, ca) {
		t.Errorf("the CA %s is denied too; it is no secret: %v", ca, denied)
	}
	// The config's cleanup releases them.
	cleaned = true
	_ = app.Cleanup()
	for _, f := range gatewayfiles.Paths(deniedFiles()) {
		if f == keyFile || f == cert {
			t.Errorf("%s is still denied after the config that named it was cleaned up", f)
		}
	}
}

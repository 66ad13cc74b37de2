package e2e

import (
	"archive/tar"
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// clusterStorageCaddyfile is a guard site and a sessions site (which
// needs the node registry) on the cluster whose settings are given once,
// in storage zidane_nats.
func clusterStorageCaddyfile(natsURL, node, site, sessionsSite, upstream string) string {
	return fmt.Sprintf(`{
	admin %s
	storage zidane_nats {
		url %s
		lock_ttl 5s
		node %s
		advertise http://%s
	}
}

http://%s {
	zidane_mcp {
		guard
	}
	reverse_proxy %s
}

http://%s {
	zidane_mcp {
		sessions
	}
}
`, AdminPlaceholder, natsURL, node, sessionsSite, site, upstream, sessionsSite)
}

// readTar reads an archive that `caddy storage export` wrote, as key ->
// value.
func readTar(t *testing.T, path string) map[string][]byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string][]byte{}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		out[h.Name] = b
	}
}

// The storage opens on its own settings, as Caddy's storage commands load
// it (no app): `caddy storage export` of one cluster and `caddy storage
// import` into another carry its state, so a token made on the first
// works on a gateway of the second. Settings given both to the storage and
// in the zidane app's cluster block are refused.
func TestClusterStorageExportImport(t *testing.T) {
	natsA, natsB := startNATSServer(t), startNATSServer(t)
	up := startRecordingUpstream(t)
	clusterKey := "ZIDANE_CLUSTER_KEY=" + base64.StdEncoding.EncodeToString([]byte(randomHex(16)))

	siteA, sessionsA := fmt.Sprintf("127.0.0.1:%d", freePort(t)), fmt.Sprintf("127.0.0.1:%d", freePort(t))
	a := startCaddy(t, clusterStorageCaddyfile(natsA, "gw-a", siteA, sessionsA, up.addr), clusterKey)
	token := createToken(t, a, "moved", "--scope", "mcp")
	if got := post(t, "http://"+siteA+"/mcp", token, initializeBody).status; got != http.StatusOK {
		t.Fatalf("cluster A refused its own token: %d", got)
	}

	archive := filepath.Join(t.TempDir(), "cluster-a.tar")
	if _, stderr, err := a.Run(t, "storage", "export", "--config", a.Caddyfile, "--output", archive); err != nil {
		t.Fatalf("caddy storage export: %v\n%s", err, stderr)
	}
	exported := readTar(t, archive)
	if len(exported["zidane/tokens.json"]) == 0 {
		t.Fatalf("the export holds no token store; keys: %v", keysOf(exported))
	}
	for k, v := range exported {
		if bytes.Contains(v, []byte(token)) || bytes.Contains(v, []byte(strings.TrimPrefix(token, "zds_"))) {
			t.Fatalf("the export's %s holds the token secret", k)
		}
	}

	siteB, sessionsB := fmt.Sprintf("127.0.0.1:%d", freePort(t)), fmt.Sprintf("127.0.0.1:%d", freePort(t))
	b := newCaddy(t, clusterStorageCaddyfile(natsB, "gw-b", siteB, sessionsB, up.addr), clusterKey)
	stdout, stderr, err := b.Run(t, "storage", "import", "--config", b.Caddyfile, "--input", archive)
	if err != nil || !strings.Contains(stdout, "Successfully imported storage") {
		t.Fatalf("caddy storage import: %v\n%s%s", err, stdout, stderr)
	}
	b.start(t)
	if got := post(t, "http://"+siteB+"/mcp", token, initializeBody).status; got != http.StatusOK {
		t.Fatalf("cluster B, imported from A, refused A's token: %d", got)
	}
	back := filepath.Join(t.TempDir(), "cluster-b.tar")
	if _, stderr, err := b.Run(t, "storage", "export", "--config", b.Caddyfile, "--output", back); err != nil {
		t.Fatalf("caddy storage export of B: %v\n%s", err, stderr)
	}
	again := readTar(t, back)
	for k := range exported {
		if _, ok := again[k]; !ok {
			t.Errorf("%s, exported from A and imported into B, is not in B's export", k)
		}
	}

	// The settings are given once: in the storage, not also in the app.
	twice := filepath.Join(t.TempDir(), "Caddyfile")
	cf := strings.Replace(clusterStorageCaddyfile(natsA, "gw-a", siteA, sessionsA, up.addr), "admin "+AdminPlaceholder,
		"admin off\n\tzidane {\n\t\tcluster {\n\t\t\turl "+natsA+"\n\t\t}\n\t}", 1)
	if err := os.WriteFile(twice, []byte(cf), 0o600); err != nil {
		t.Fatal(err)
	}
	_, stderr, err = a.Run(t, "validate", "--config", twice, "--adapter", "caddyfile")
	if err == nil || !strings.Contains(stderr, "given twice") {
		t.Fatalf("validate with the settings in both places: %v\n%s", err, stderr)
	}
}

func keysOf(m map[string][]byte) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	return ks
}

// An operator who moves the settings from the zidane app's cluster block
// into storage zidane_nats, as the upgrade page says, reloads a running
// replica onto the new form: the same settings are the same connection,
// so the sessions endpoint keeps its engine (a changed connection under it
// is refused until a restart), and a session made before the reload is
// still there after it.
func TestClusterReloadOntoTheStorageBlock(t *testing.T) {
	natsURL := startNATSServer(t)
	clusterKey := "ZIDANE_CLUSTER_KEY=" + base64.StdEncoding.EncodeToString([]byte(randomHex(16)))
	port := freePort(t)
	settings := fmt.Sprintf("url %s\n\t\tnode gw-a\n\t\tadvertise http://127.0.0.1:%d", natsURL, port)
	site := fmt.Sprintf(`
http://127.0.0.1:%d {
	zidane_mcp {
		sessions
	}
}
`, port)
	before := fmt.Sprintf("{\n\tadmin %s\n\tstorage zidane_nats\n\tzidane {\n\t\tcluster {\n\t\t%s\n\t\t}\n\t}\n}\n", AdminPlaceholder, settings) + site
	after := fmt.Sprintf("{\n\tadmin %s\n\tstorage zidane_nats {\n\t\t%s\n\t}\n}\n", AdminPlaceholder, settings) + site

	c := startCaddy(t, before, clusterKey)
	token := createToken(t, c, "mover", "--scope", "chat")
	url := fmt.Sprintf("http://127.0.0.1:%d/mcp", port)
	g := connectGoSessions(t, url, token, "before")
	created := createSession(t, g, t.TempDir(), "hello")

	c.Reload(t, after)
	g = connectGoSessions(t, url, token, "after")
	if v := readSession(t, g, created.SessionID, false); v.SessionID != created.SessionID {
		t.Fatalf("after the reload onto storage zidane_nats { … }, the session reads as %+v", v)
	}
}

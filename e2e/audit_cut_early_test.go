package e2e

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestAuditLogRemovedWhileStopped is the bluntest cut of a zidane_audit
// log: with caddy stopped, its file is removed (rotation had left no other
// file of it). The next run finds no file and starts the log again from
// a genesis checkpoint, under a new chain id, so the log verifies on its
// own; but the latest checkpoint of the earlier chain is still kept in
// Caddy's storage, for this very log file, and `audit verify` must not
// pass a log that lost every record up to it.
func TestAuditLogRemovedWhileStopped(t *testing.T) {
	upstream := startEverythingServer(t)
	site := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	auditPath := filepath.Join(t.TempDir(), "audit.log")
	key := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{0x3c}, 32))
	c := startCaddy(t, auditChainCaddyfile(site, upstream, auditPath, "E2E_AUDIT_KEY"), "E2E_AUDIT_KEY="+key)
	url := "http://" + site + "/mcp"

	sendRefusals(t, url, 5)
	c.Stop(t)
	recs, _ := auditRecords(t, auditPath)
	lost := recs[len(recs)-1].Seq

	if err := os.Remove(auditPath); err != nil {
		t.Fatal(err)
	}
	c.start(t)
	sendRefusals(t, url, 2)
	c.Stop(t)

	pub, stderr, err := c.Run(t, "zidane", "audit", "public-key", "--env", "E2E_AUDIT_KEY")
	if err != nil {
		t.Fatalf("audit public-key: %v\n%s", err, stderr)
	}
	stdout, stderr, err := c.Run(t, "zidane", "audit", "verify", "--public-key", strings.TrimSpace(pub), auditPath)
	out := stdout + stderr
	t.Logf("verify of the log removed after seq %d, then written anew:\n%s", lost, out)
	if err == nil {
		t.Fatalf("verify passed a log whose seqs 1 to %d were removed while caddy was stopped", lost)
	}
	if !strings.Contains(out, "FAILED") {
		t.Errorf("verify does not say FAILED:\n%s", out)
	}
}

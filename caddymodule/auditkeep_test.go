package caddymodule

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/Tahul/caddy-zidane-mcp/auditchain"
	"github.com/Tahul/caddy-zidane-mcp/internal/natstest"
)

// auditWriterConfig is a config whose audit logger goes to a zidane_audit
// writer on auditPath, signed with the key in $AUDIT_KEEP_KEY, with its
// state in storageJSON (Caddy's storage, "" for the default) and the
// zidane app apps.
func auditWriterConfig(t *testing.T, auditPath, copyPath string, storageJSON, zidane map[string]any) []byte {
	t.Helper()
	writer := map[string]any{"output": "zidane_audit", "filename": auditPath, "signing_key": "{env.AUDIT_KEEP_KEY}", "checkpoint_every": int64(time.Hour)}
	if copyPath != "" {
		writer["checkpoint_copy"] = copyPath
	}
	cfg, err := json.Marshal(map[string]any{
		"admin":   map[string]any{"disabled": true, "config": map[string]any{"persist": false}},
		"storage": storageJSON,
		"logging": map[string]any{"logs": map[string]any{
			"audit":   map[string]any{"writer": writer, "encoder": map[string]any{"format": "json"}, "include": []string{auditLoggerName}},
			"default": map[string]any{"writer": map[string]any{"output": "discard"}, "exclude": []string{auditLoggerName}},
		}},
		"apps": map[string]any{"zidane": zidane},
	})
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// lastLine is the last line of the file at path.
func lastLine(t *testing.T, path string) string {
	t.Helper()
	lines := strings.Split(strings.TrimSuffix(readTestFile(t, path), "\n"), "\n")
	return lines[len(lines)-1]
}

func readTestFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func auditSeed(t *testing.T) {
	t.Helper()
	seed := make([]byte, 32)
	rand.Read(seed)
	t.Setenv("AUDIT_KEEP_KEY", base64.StdEncoding.EncodeToString(seed))
}

// The writer keeps each checkpoint in the running config's storage, under
// its chain id, and in its checkpoint_copy: at a stop, the stop
// checkpoint, the log's last line.
func TestAuditWriterKeepsItsCheckpoints(t *testing.T) {
	auditSeed(t)
	dir := t.TempDir()
	auditPath, copyPath := filepath.Join(dir, "log", "audit.log"), filepath.Join(dir, "copy", "audit.checkpoint")
	storageJSON := map[string]any{"module": "file_system", "root": filepath.Join(dir, "storage")}
	if err := caddy.Load(auditWriterConfig(t, auditPath, copyPath, storageJSON, map[string]any{}), true); err != nil {
		t.Fatal(err)
	}
	auditLogger().Info("an audit line", zap.String("event", "test"))
	st := caddy.ActiveContext().Storage()
	if err := caddy.Stop(); err != nil {
		t.Fatal(err)
	}
	stop := lastLine(t, auditPath)
	if !strings.Contains(stop, `"reason":"stop"`) {
		t.Fatalf("the log does not end with its stop checkpoint: %s", stop)
	}
	a, err := auditchain.ParseAnchor([]byte(stop), auditPath)
	if err != nil {
		t.Fatal(err)
	}
	kept, err := loadKeptCheckpoint(context.Background(), st, a.Chain)
	if err != nil || kept == nil || string(kept.Line) != stop {
		t.Fatalf("kept in storage: %v %v, want the stop checkpoint", kept, err)
	}
	if got := strings.TrimSuffix(readTestFile(t, copyPath), "\n"); got != stop {
		t.Fatalf("checkpoint_copy holds %q, want the stop checkpoint", got)
	}
}

// A checkpoint_copy in the log's own directory is refused: whoever can cut
// the log could change it too.
func TestCheckpointCopyBesideTheLogIsRefused(t *testing.T) {
	auditSeed(t)
	dir := t.TempDir()
	w := AuditWriter{Filename: filepath.Join(dir, "audit.log"), CheckpointCopy: filepath.Join(dir, "audit.checkpoint")}
	if err := w.Provision(caddy.Context{}); err == nil || !strings.Contains(err.Error(), "in the audit log's directory") {
		t.Fatalf("got %v", err)
	}
}

// In a cluster, the stop checkpoint reaches NATS though Caddy cleans a
// config's modules up in no set order, the zidane app (which releases the
// NATS connection) before the log writer or after: the keeper holds the
// connection until it has written. Several stops make both orders likely.
func TestAuditWriterKeepsTheStopCheckpointInNATS(t *testing.T) {
	auditSeed(t)
	ns := natstest.JetStream(t)
	key := make([]byte, 32)
	rand.Read(key)
	t.Setenv("ZIDANE_TEST_CLUSTER_KEY", base64.StdEncoding.EncodeToString(key))
	zidane := map[string]any{"cluster": map[string]any{"urls": []string{ns.ClientURL()}, "key": "{env.ZIDANE_TEST_CLUSTER_KEY}"}}
	storageJSON := map[string]any{"module": "zidane_nats"}
	auditPath := filepath.Join(t.TempDir(), "audit.log")
	cfg := auditWriterConfig(t, auditPath, "", storageJSON, zidane)
	for i := range 6 {
		if err := caddy.Load(cfg, true); err != nil {
			t.Fatal(err)
		}
		auditLogger().Info("an audit line", zap.String("event", "test"), zap.Int("run", i))
		if err := caddy.Stop(); err != nil {
			t.Fatal(err)
		}
		stop := lastLine(t, auditPath)
		a, err := auditchain.ParseAnchor([]byte(stop), auditPath)
		if err != nil || !strings.Contains(stop, `"reason":"stop"`) {
			t.Fatalf("run %d: the log does not end with its stop checkpoint (%v): %s", i, err, stop)
		}
		if err := caddy.Load(cfg, true); err != nil {
			t.Fatal(err)
		}
		kept, err := loadKeptCheckpoint(context.Background(), caddy.ActiveContext().Storage(), a.Chain)
		if err := caddy.Stop(); err != nil {
			t.Fatal(err)
		}
		if err != nil || kept == nil || kept.Seq != a.Seq {
			got := "none"
			if kept != nil {
				got = fmt.Sprintf("seq %d", kept.Seq)
			}
			t.Fatalf("run %d: NATS keeps %s (%v), want the stop checkpoint, seq %d", i, got, err, a.Seq)
		}
	}
}

package caddymodule

import (
	"bufio"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/Tahul/caddy-zidane-mcp/broker"
	"github.com/Tahul/caddy-zidane-mcp/broker/upstreamauth"
	"github.com/Tahul/caddy-zidane-mcp/mcpendpoint"
	"github.com/Tahul/caddy-zidane-mcp/pins"
	"github.com/Tahul/caddy-zidane-mcp/policy"
)

// loadWithAuditLog runs, in this process, a config holding the zidane app
// and the README's two log blocks: the audit logger to auditPath, and
// everything else (the audit logger excluded) to defaultPath.
func loadWithAuditLog(t *testing.T, storageDir, auditPath, defaultPath string) {
	t.Helper()
	cfg, err := json.Marshal(map[string]any{
		"admin":   map[string]any{"disabled": true, "config": map[string]any{"persist": false}},
		"storage": map[string]any{"module": "file_system", "root": storageDir},
		"logging": map[string]any{"logs": map[string]any{
			"audit": map[string]any{
				"writer":  map[string]any{"output": "file", "filename": auditPath},
				"encoder": map[string]any{"format": "json"},
				"include": []string{auditLoggerName},
			},
			"default": map[string]any{
				"writer":  map[string]any{"output": "file", "filename": defaultPath},
				"encoder": map[string]any{"format": "json"},
				"exclude": []string{auditLoggerName},
			},
		}},
		"apps": map[string]any{"zidane": map[string]any{}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := caddy.Load(cfg, true); err != nil {
		t.Fatalf("loading the config: %v", err)
	}
}

// eventsIn reads the "event" of each JSON line of the file at path, with
// the logger that wrote it.
func eventsIn(t *testing.T, path string) map[string]string {
	t.Helper()
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var m struct {
			Event  string `json:"event"`
			Logger string `json:"logger"`
		}
		if json.Unmarshal(sc.Bytes(), &m) == nil && m.Event != "" {
			out[m.Event] = m.Logger
		}
	}
	return out
}

// Each audit emitter that runs outside a handler's request (the token
// store's events, the sessions endpoint's refusals, the pin store's
// events and its own warnings, an OAuth client's state, the admin API's
// refusals, a session's egress calls) writes to the audit logger of the
// config that runs, which the README's log blocks route to the audit file
// and keep out of the default log; and after a reload to another audit
// file, to that one, through loggers taken before the reload too.
func TestAuditEventsFollowTheRunningConfig(t *testing.T) {
	dir := t.TempDir()
	storageDir := filepath.Join(dir, "storage")
	auditA, auditB, def := filepath.Join(dir, "audit-a.log"), filepath.Join(dir, "audit-b.log"), filepath.Join(dir, "default.log")
	loadWithAuditLog(t, storageDir, auditA, def)
	t.Cleanup(func() { _ = caddy.Stop() })

	held := auditLogger().With(zap.String("held", "before the reload"))
	heldSlog := auditSlog()
	emitters := map[string]func(){
		"token_created": func() {
			auditTokenEvent(policy.TokenEvent{Action: "created", Token: policy.Token{ID: "tok_1", Name: "alice", Kind: policy.KindUser}})
		},
		"tool_refused": func() {
			auditToolRefusal(mcpendpoint.Refusal{Tool: "sessions", Verb: "read", Reason: "not_owner", Message: "belongs to another owner"})
		},
		"tool_changed": func() {
			auditPinEvent(pins.Event{Kind: "changed", Namespace: "up", Item: pins.Tool, Name: "weather", Old: "sha256:a", New: "sha256:b"})
		},
		"upstream_auth": func() { oauthStateChanged("remote", upstreamauth.Status{State: upstreamauth.StateReady}) },
		"admin_refused": func() {
			a := &adminAPI{storage: caddy.ActiveContext().Storage()}
			rec := httptest.NewRecorder()
			err := a.keyed(func(http.ResponseWriter, *http.Request) error { return nil })(rec, httptest.NewRequest(http.MethodPost, "/zidane/tokens", strings.NewReader("{}")))
			if err == nil {
				t.Error("an admin change without the key was not refused")
			}
		},
		"upstream_call": func() {
			auditUpstreamCall(auditLogger(), broker.CallRecord{Upstream: "up", Route: "egress:up", Tool: "time", Outcome: "ok", Status: 200})
		},
		"held_zap": func() { held.Info("a line of a logger held across reloads", zap.String("event", "held_zap")) },
		"held_slog": func() {
			heldSlog.Warn("a line of a slog logger held across reloads", "event", "held_slog")
		},
	}
	emitAll := func() {
		for _, emit := range emitters {
			emit()
		}
	}
	check := func(t *testing.T, audit string) {
		t.Helper()
		got, defaults := eventsIn(t, audit), eventsIn(t, def)
		for kind := range emitters {
			if logger, ok := got[kind]; !ok || logger != auditLoggerName {
				t.Errorf("%s: not in the audit file %s as %s (found: logger %q)", kind, filepath.Base(audit), auditLoggerName, logger)
			}
			if _, ok := defaults[kind]; ok {
				t.Errorf("%s: in the default log", kind)
			}
		}
	}

	emitAll()
	check(t, auditA)

	sizeA := fileSize(t, auditA)
	loadWithAuditLog(t, storageDir, auditB, def)
	emitAll()
	check(t, auditB)
	if fileSize(t, auditA) != sizeA {
		t.Error("lines written after the reload went to the audit file of the config before it")
	}
}

func fileSize(t *testing.T, path string) int64 {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return st.Size()
}

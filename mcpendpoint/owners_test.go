package mcpendpoint

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/policy"
	"github.com/Tahul/caddy-zidane-mcp/sessions"
)

func init() {
	later := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	principals["creator-token"] = policy.Principal{TokenID: "tok-creator", Name: "orchestrator-ses_1", Kind: policy.KindUser, Scopes: []string{"sessions:create"}, Source: "token", Owner: "alice", Parent: "tok-alice"}
	principals["ops-token"] = policy.Principal{TokenID: "tok-ops", Name: "ops", Kind: policy.KindUser, Scopes: []string{"chat", "sessions:any"}, Source: "token", Owner: "ops", Expires: &later}
}

// refusals records what the endpoint reported to OnRefusal.
type refusals struct {
	mu   sync.Mutex
	list []Refusal
}

func (r *refusals) add(x Refusal) { r.mu.Lock(); r.list = append(r.list, x); r.mu.Unlock() }
func (r *refusals) all() []Refusal {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Refusal(nil), r.list...)
}

// Bob holds chat like alice; each verb he tries on her session is refused
// with a message that says whose it is not and which scope would reach it,
// and is reported for the audit log.
func TestAnotherOwnersSessionIsRefused(t *testing.T) {
	var seen refusals
	h := newHarnessWith(t, &Access{}, Options{OnRefusal: seen.add})
	alice, bob := h.connect("alice-token", nil, nil), h.connect("bob-token", nil, nil)
	var c sessions.Created
	ok(t, call(t, alice, "sessions", map[string]any{"verb": "create", "cwd": "/repo", "prompt": "approve: rm -rf /srv/prod"}), &c)
	rid, _ := h.engine.ask(c.SessionID, sessions.KindApproval, "rm -rf /srv/prod", map[string]any{})
	for _, tc := range []struct {
		tool  string
		args  map[string]any
		scope string
	}{
		{"sessions", map[string]any{"verb": "send", "sessionId": c.SessionID, "prompt": "more"}, "sessions:any"},
		{"sessions", map[string]any{"verb": "steer", "sessionId": c.SessionID, "text": "faster"}, "sessions:any"},
		{"sessions", map[string]any{"verb": "cancel", "sessionId": c.SessionID}, "sessions:any"},
		{"sessions", map[string]any{"verb": "read", "sessionId": c.SessionID}, "sessions:any"},
		{"sessions", map[string]any{"verb": "transcript", "sessionId": c.SessionID}, "sessions:any"},
		{"sessions", map[string]any{"verb": "wait", "sessionId": c.SessionID, "timeout": 1}, "sessions:any"},
		{"sessions", map[string]any{"verb": "events", "sessionId": c.SessionID}, "sessions:any"},
		{"interactions", map[string]any{"verb": "pending", "sessionId": c.SessionID}, "interactions:any"},
		{"interactions", map[string]any{"verb": "answer", "requestId": rid, "decision": "allow"}, "interactions:any"},
	} {
		res := call(t, bob, tc.tool, tc.args)
		failed(t, res, "belongs to another owner", tc.scope, "share_sessions")
		if code := errorCodeOf(res); code != "not_owner" {
			t.Errorf("%s %s: code %q", tc.tool, tc.args["verb"], code)
		}
		if strings.Contains(text(res), "alice") {
			t.Errorf("%s %s: the refusal names alice's token: %s", tc.tool, tc.args["verb"], text(res))
		}
	}
	got := seen.all()
	if len(got) != 9 {
		t.Fatalf("%d refusals reported, want 9: %+v", len(got), got)
	}
	for _, r := range got {
		if r.Reason != "not_owner" || r.Principal.TokenID != "tok-bob" || (r.Target != c.SessionID && r.Target != rid) {
			t.Errorf("refusal %+v", r)
		}
	}
	var l listResult
	ok(t, call(t, bob, "sessions", map[string]any{"verb": "list"}), &l)
	var p pendingResult
	ok(t, call(t, bob, "interactions", map[string]any{"verb": "pending"}), &p)
	var ev eventsResult
	ok(t, call(t, bob, "sessions", map[string]any{"verb": "events"}), &ev)
	if len(l.Sessions)+len(p.Interactions)+len(ev.Events) != 0 {
		t.Fatalf("bob sees %d sessions, %d interactions, %d events of alice's", len(l.Sessions), len(p.Interactions), len(ev.Events))
	}
	if h.engine.state(c.SessionID) != sessions.StateBlocked {
		t.Fatalf("alice's session is %s after bob's attempts", h.engine.state(c.SessionID))
	}
}

// The engine gets the caller's owner, expiry and reach from the principal
// and the route.
func TestCallerCarriesOwnerAndReach(t *testing.T) {
	for _, tc := range []struct {
		name               string
		token              string
		share              bool
		id                 string
		sessions, interact sessions.Access
	}{
		{"a token of its own", "alice-token", false, "tok-alice", sessions.AccessOwn, sessions.AccessOwn},
		{"share_sessions reads", "bob-token", true, "tok-bob", sessions.AccessRead, sessions.AccessRead},
		{"sessions:any acts on sessions only", "ops-token", false, "ops", sessions.AccessAll, sessions.AccessOwn},
		{"an orchestrator's child acts for its parent's owner", "creator-token", false, "alice", sessions.AccessOwn, sessions.AccessOwn},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarnessWith(t, &Access{ShareSessions: tc.share}, Options{})
			cs := h.connect(tc.token, nil, nil)
			call(t, cs, "sessions", map[string]any{"verb": "list"})
			h.engine.mu.Lock()
			o := h.engine.lastOwner
			h.engine.mu.Unlock()
			if o.OwnerID() != tc.id || o.OtherSessions != tc.sessions || o.OtherInteractions != tc.interact {
				t.Fatalf("owner = %+v", o)
			}
			if p := principals[tc.token]; (p.Expires == nil) != (o.Expires == nil) {
				t.Fatalf("expiry %v, want the principal's %v", o.Expires, p.Expires)
			}
		})
	}
}

// The attack of the issue: an orchestrator given only create made a worker
// with every verb. The worker's tools must be verbs its creator may call
// on this route.
func TestOrchestratorToolsOnlyNarrowTheCreators(t *testing.T) {
	narrowChat, err := policy.NewScopeMap([]policy.Rule{{Scope: "chat", Tools: []string{"sessions"}, Verbs: []string{"create", "list"}}}, false)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		token  string
		scopes *policy.ScopeMap
		tools  []string
		beyond string // "" when allowed
		within string
	}{
		{"chat gives any verb", "alice-token", nil, []string{"create", "cancel", "answer"}, "", ""},
		{"create-only gives create", "creator-token", nil, []string{"create"}, "", ""},
		{"create-only cannot give cancel", "creator-token", nil, []string{"create", "cancel"}, "sessions cancel", "tools among create"},
		{"nor answer", "creator-token", nil, []string{"answer"}, "interactions answer", "tools among create"},
		{"the route's rules decide what chat grants", "alice-token", narrowChat, []string{"list", "cancel"}, "sessions cancel", "tools among create, list"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var seen refusals
			h := newHarnessWith(t, &Access{Scopes: tc.scopes}, Options{OnRefusal: seen.add})
			cs := h.connect(tc.token, nil, nil)
			res := call(t, cs, "sessions", map[string]any{"verb": "create", "cwd": "/repo", "prompt": "orchestrate", "tools": tc.tools})
			h.engine.mu.Lock()
			created := h.engine.lastCreate.Prompt != ""
			h.engine.mu.Unlock()
			if tc.beyond == "" {
				ok(t, res, nil)
				if !created {
					t.Fatal("the engine was not asked to create")
				}
				return
			}
			failed(t, res, "can only narrow", tc.beyond, tc.within)
			if code := errorCodeOf(res); code != "tools_beyond_scope" || created {
				t.Fatalf("code %q, created %v", code, created)
			}
			if r := seen.all(); len(r) != 1 || r[0].Reason != "tools_beyond_scope" {
				t.Fatalf("refusals %+v", r)
			}
		})
	}
}

// A create the engine refuses for a directory of the gateway's own is a
// tool error with code denied_path, reported for the audit log with the
// engine's message.
func TestDeniedCwdIsReported(t *testing.T) {
	var seen refusals
	h := newHarnessWith(t, &Access{}, Options{OnRefusal: seen.add})
	h.engine.createErr = &deniedErr{}
	alice := h.connect("alice-token", nil, nil)
	res := call(t, alice, "sessions", map[string]any{"verb": "create", "cwd": "/var/log/zidane", "prompt": "tidy the logs"})
	failed(t, res, "cwd /var/log/zidane is the zidane_audit log's directory", "keeps from agents")
	if code := errorCodeOf(res); code != "denied_path" {
		t.Errorf("code %q, want denied_path", code)
	}
	got := seen.all()
	if len(got) != 1 || got[0].Reason != "denied_path" || got[0].Principal.TokenID != "tok-alice" || got[0].Verb != "create" ||
		!strings.Contains(got[0].Message, "/var/log/zidane") {
		t.Errorf("refusals reported: %+v", got)
	}
}

// deniedErr is the engine's refusal of a directory of the gateway's.
type deniedErr struct{}

func (deniedErr) Error() string {
	return "bad request: cwd /var/log/zidane is the zidane_audit log's directory, which the gateway keeps from agents (read and write)"
}
func (deniedErr) Unwrap() []error { return []error{sessions.ErrBadRequest, sessions.ErrDenied} }

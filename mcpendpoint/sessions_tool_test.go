package mcpendpoint

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/sessions"
)

func TestCreateReturnsAtOnceWithDefaults(t *testing.T) {
	h := newHarness(t)
	cs := h.connect("alice-token", nil, nil)

	var c sessions.Created
	res := call(t, cs, "sessions", map[string]any{"verb": "create", "cwd": "/repo", "prompt": "fix the login bug"})
	ok(t, res, &c)
	if c.SessionID == "" || c.Link == "" {
		t.Fatalf("created = %+v", c)
	}
	for _, want := range []string{c.SessionID, c.Link, "Do NOT wait", "<session-event"} {
		if !strings.Contains(text(res), want) {
			t.Errorf("create text lacks %q: %s", want, text(res))
		}
	}
	got := h.engine.lastCreate
	if got.Environment != (sessions.Environment{Kind: "local"}) || got.Cwd != "/repo" || got.Prompt != "fix the login bug" {
		t.Errorf("create request = %+v", got)
	}
	if h.engine.state(c.SessionID) != sessions.StateRunning {
		t.Error("the session does not run")
	}
}

func TestCreateWithEveryOption(t *testing.T) {
	h := newHarness(t)
	cs := h.connect("alice-token", nil, nil)
	ok(t, call(t, cs, "sessions", map[string]any{
		"verb": "create", "cwd": "/repo", "prompt": "orchestrate", "agent": "codex",
		"environment": map[string]any{"kind": "worktree", "branch": "fix/login"},
		"title":       "Login fix", "tools": []string{"create", "read", "answer"}, "subscribe": true,
	}), nil)
	got := h.engine.lastCreate
	want := sessions.CreateRequest{
		Cwd: "/repo", Prompt: "orchestrate", Agent: "codex",
		Environment: sessions.Environment{Kind: "worktree", Branch: "fix/login"},
		Title:       "Login fix", Tools: []string{"create", "read", "answer"}, Subscribe: true,
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("create request = %+v, want %+v", got, want)
	}
}

func TestSendSteerCancel(t *testing.T) {
	h := newHarness(t)
	cs := h.connect("alice-token", nil, nil)
	var c sessions.Created
	ok(t, call(t, cs, "sessions", map[string]any{"verb": "create", "cwd": "/repo", "prompt": "one"}), &c)
	id := c.SessionID

	var s sendResult
	res := call(t, cs, "sessions", map[string]any{"verb": "send", "sessionId": id, "prompt": "two"})
	ok(t, res, &s)
	if !s.Queued || !strings.Contains(text(res), "queued") {
		t.Errorf("send while running: %+v, %s", s, text(res))
	}

	var st steerResult
	res = call(t, cs, "sessions", map[string]any{"verb": "steer", "sessionId": id, "text": "use the new API"})
	ok(t, res, &st)
	if st.Mode != "queued-first" || !strings.Contains(text(res), "head of the prompt queue") {
		t.Errorf("steer without the extension: %+v, %s", st, text(res))
	}
	h.engine.mu.Lock()
	h.engine.steering = true
	h.engine.mu.Unlock()
	res = call(t, cs, "sessions", map[string]any{"verb": "steer", "sessionId": id, "text": "and test it"})
	ok(t, res, &st)
	if st.Mode != "steering" || !strings.Contains(text(res), "next turn boundary") {
		t.Errorf("steer with the extension: %+v, %s", st, text(res))
	}

	var cr cancelResult
	res = call(t, cs, "sessions", map[string]any{"verb": "cancel", "sessionId": id})
	ok(t, res, &cr)
	if !cr.Cancelled || h.engine.state(id) != sessions.StateIdle {
		t.Errorf("cancel: %+v, state %s", cr, h.engine.state(id))
	}
	failed(t, call(t, cs, "sessions", map[string]any{"verb": "cancel", "sessionId": id}), "not running", "send")
	failed(t, call(t, cs, "sessions", map[string]any{"verb": "steer", "sessionId": id, "text": "x"}), "not running")

	res = call(t, cs, "sessions", map[string]any{"verb": "send", "sessionId": id, "prompt": "three"})
	ok(t, res, &s)
	if s.Queued || !strings.Contains(text(res), "started on your prompt") {
		t.Errorf("send while idle: %+v, %s", s, text(res))
	}
}

func TestReadCutsLastMessageAt600(t *testing.T) {
	h := newHarness(t)
	cs := h.connect("alice-token", nil, nil)
	id := h.engine.seed(1, "tok-alice")[0]
	long := strings.Repeat("é", 1000) // characters, not bytes
	h.engine.Send(t.Context(), harnessOwner, id, "more")
	h.engine.finish(id, long)

	var v sessions.SessionView
	res := call(t, cs, "sessions", map[string]any{"verb": "read", "sessionId": id})
	ok(t, res, &v)
	if v.LastMessage != strings.Repeat("é", 600) || !v.Truncated {
		t.Errorf("read: %d characters, truncated %v", len([]rune(v.LastMessage)), v.Truncated)
	}
	for _, want := range []string{"cut at 600 characters", "full: true", string(sessions.StateIdle), "/repo", "turns: 2"} {
		if !strings.Contains(text(res), want) {
			t.Errorf("read text lacks %q: %.200s", want, text(res))
		}
	}

	var whole sessions.SessionView
	ok(t, call(t, cs, "sessions", map[string]any{"verb": "read", "sessionId": id, "full": true}), &whole)
	if v = whole; v.LastMessage != long || v.Truncated || !h.engine.lastFull {
		t.Errorf("read full: %d characters, truncated %v", len([]rune(v.LastMessage)), v.Truncated)
	}
}

func TestListLimits(t *testing.T) {
	h := newHarness(t)
	cs := h.connect("alice-token", nil, nil)
	h.engine.seed(60, "tok-bob")
	h.engine.seed(120, "tok-alice")

	var l listResult
	res := call(t, cs, "sessions", map[string]any{"verb": "list"})
	ok(t, res, &l)
	if h.engine.lastListLimit != 30 || len(l.Sessions) != 30 || !l.Partial || l.Limit != 30 {
		t.Errorf("default list: engine limit %d, %d sessions, partial %v", h.engine.lastListLimit, len(l.Sessions), l.Partial)
	}
	if l.Sessions[0].SessionID != "s180" || !l.Sessions[0].Worker || !strings.Contains(text(res), "partial") {
		t.Errorf("newest first with worker flag: %+v", l.Sessions[0])
	}

	res = call(t, cs, "sessions", map[string]any{"verb": "list", "limit": 500})
	ok(t, res, &l)
	if h.engine.lastListLimit != 100 || len(l.Sessions) != 100 || !l.Partial || len(l.Notes) != 1 {
		t.Errorf("list limit 500: engine limit %d, %d sessions, partial %v, notes %v", h.engine.lastListLimit, len(l.Sessions), l.Partial, l.Notes)
	}
	if !strings.Contains(text(res), "above the maximum: used 100") {
		t.Errorf("clamp not said: %.200s", text(res))
	}
	for _, v := range l.Sessions {
		if !v.Worker || v.Foreign {
			t.Fatalf("alice lists %+v, not one of hers: bob's sessions are not hers to see", v)
		}
	}

	ok(t, call(t, cs, "sessions", map[string]any{"verb": "list", "limit": 5}), &l)
	if len(l.Sessions) != 5 || !l.Partial {
		t.Errorf("list limit 5: %d sessions, partial %v", len(l.Sessions), l.Partial)
	}
}

func TestTranscriptLimitsAndCut(t *testing.T) {
	h := newHarness(t)
	cs := h.connect("alice-token", nil, nil)
	id := h.engine.seed(1, "tok-alice")[0]
	for i := range 59 {
		h.engine.Send(t.Context(), harnessOwner, id, fmt.Sprintf("prompt %d", i))
		h.engine.finish(id, fmt.Sprintf("answer %d", i))
	}
	long := strings.Repeat("x", 2000)
	h.engine.Send(t.Context(), harnessOwner, id, "last")
	h.engine.finish(id, long)

	var tr transcriptResult
	res := call(t, cs, "sessions", map[string]any{"verb": "transcript", "sessionId": id})
	ok(t, res, &tr)
	if h.engine.lastTurns != 10 || len(tr.Turns) != 10 || tr.Turns[9].Index != 61 {
		t.Fatalf("default transcript: engine turns %d, got %d turns", h.engine.lastTurns, len(tr.Turns))
	}
	if last := tr.Turns[9]; len(last.Answer) != 1200 || !last.Truncated || !tr.Truncated {
		t.Errorf("last turn: %d characters, truncated %v", len(last.Answer), last.Truncated)
	}
	if !strings.Contains(text(res), "cut at 1200 characters") || !strings.Contains(text(res), "prompt: prompt 58") {
		t.Errorf("transcript text: %.300s", text(res))
	}

	ok(t, call(t, cs, "sessions", map[string]any{"verb": "transcript", "sessionId": id, "turns": 80}), &tr)
	if h.engine.lastTurns != 50 || len(tr.Turns) != 50 || len(tr.Notes) != 1 {
		t.Errorf("transcript turns 80: engine %d, got %d, notes %v", h.engine.lastTurns, len(tr.Turns), tr.Notes)
	}

	ok(t, call(t, cs, "sessions", map[string]any{"verb": "transcript", "sessionId": id, "turns": 1, "full": true}), &tr)
	if len(tr.Turns) != 1 || tr.Turns[0].Answer != long || tr.Turns[0].Truncated {
		t.Errorf("transcript full: %d turns, %d characters", len(tr.Turns), len(tr.Turns[0].Answer))
	}
}

func TestWaitTimeouts(t *testing.T) {
	h := newHarness(t)
	cs := h.connect("alice-token", nil, nil)
	id := h.engine.seed(1, "tok-alice")[0] // idle: Wait returns at once

	for _, tc := range []struct {
		args map[string]any
		want time.Duration
	}{
		{map[string]any{}, 30 * time.Second},
		{map[string]any{"timeout": 5}, 5 * time.Second},
		{map[string]any{"timeout": 50}, 50 * time.Second},
		{map[string]any{"timeout": 80}, 50 * time.Second},
	} {
		args := map[string]any{"verb": "wait", "sessionId": id}
		for k, v := range tc.args {
			args[k] = v
		}
		var w waitResult
		ok(t, call(t, cs, "sessions", args), &w)
		h.engine.mu.Lock()
		got := h.engine.lastWait
		h.engine.mu.Unlock()
		if got != tc.want || !w.Settled || w.State != sessions.StateIdle {
			t.Errorf("wait %v: engine timeout %v, want %v; result %+v", tc.args, got, tc.want, w)
		}
	}
}

func TestWaitReturnsWhenTheTurnEnds(t *testing.T) {
	h := newHarness(t)
	cs := h.connect("alice-token", nil, nil)
	var c sessions.Created
	ok(t, call(t, cs, "sessions", map[string]any{"verb": "create", "cwd": "/repo", "prompt": "go"}), &c)

	go func() {
		for t.Context().Err() == nil { // finish once the endpoint is inside Wait
			h.engine.mu.Lock()
			waiting := h.engine.lastWait != 0
			h.engine.mu.Unlock()
			if waiting {
				h.engine.finish(c.SessionID, "all done")
				return
			}
			time.Sleep(time.Millisecond)
		}
	}()
	var w waitResult
	ok(t, call(t, cs, "sessions", map[string]any{"verb": "wait", "sessionId": c.SessionID}), &w)
	if !w.Settled || w.LastMessage != "all done" {
		t.Errorf("wait: %+v", w)
	}
}

func TestEventsFiltersAndLimits(t *testing.T) {
	h := newHarness(t)
	cs := h.connect("alice-token", nil, nil)
	ids := h.engine.seed(130, "tok-alice")

	var er eventsResult
	res := call(t, cs, "sessions", map[string]any{"verb": "events"})
	ok(t, res, &er)
	if h.engine.lastFilter.Limit != 20 || len(er.Events) != 20 || er.Events[0].Seq != 130 {
		t.Errorf("default events: engine limit %d, %d events, first seq %d", h.engine.lastFilter.Limit, len(er.Events), er.Events[0].Seq)
	}
	if !strings.Contains(text(res), `<session-event session="s130" status="done" seq="130">`) {
		t.Errorf("events text: %.300s", text(res))
	}

	ok(t, call(t, cs, "sessions", map[string]any{"verb": "events", "limit": 1000}), &er)
	if h.engine.lastFilter.Limit != 100 || len(er.Events) != 100 || len(er.Notes) != 1 {
		t.Errorf("events limit 1000: engine limit %d, %d events", h.engine.lastFilter.Limit, len(er.Events))
	}

	ok(t, call(t, cs, "sessions", map[string]any{
		"verb": "events", "sessionId": ids[3], "status": "done", "text": "DONE 3", "since": 2, "limit": 5,
	}), &er)
	want := sessions.EventFilter{SessionID: ids[3], Status: sessions.EventDone, Text: "DONE 3", Since: 2, Limit: 5}
	if h.engine.lastFilter != want || len(er.Events) != 1 || er.Events[0].SessionID != ids[3] {
		t.Errorf("filtered events: filter %+v, events %+v", h.engine.lastFilter, er.Events)
	}
}

func TestSessionsBadInput(t *testing.T) {
	h := newHarness(t)
	cs := h.connect("alice-token", nil, nil)
	id := h.engine.seed(1, "tok-alice")[0]

	for _, tc := range []struct {
		name string
		args map[string]any
		want []string
	}{
		{"no arguments", nil, []string{"`verb` is required", "create, send, steer"}},
		{"verb not a string", map[string]any{"verb": 3}, []string{"`verb` must be a string"}},
		{"unknown verb", map[string]any{"verb": "delete"}, []string{`unknown verb "delete"`, "create, send"}},
		{"missing sessionId", map[string]any{"verb": "read"}, []string{"`sessionId` is required for sessions read", "create or list"}},
		{"blank sessionId", map[string]any{"verb": "send", "sessionId": " ", "prompt": "x"}, []string{"`sessionId` is required"}},
		{"missing prompt", map[string]any{"verb": "create", "cwd": "/repo"}, []string{"`prompt` is required"}},
		{"missing cwd", map[string]any{"verb": "create", "prompt": "x"}, []string{"`cwd` is required"}},
		{"missing steer text", map[string]any{"verb": "steer", "sessionId": id}, []string{"`text` is required"}},
		{"misplaced argument", map[string]any{"verb": "transcript", "sessionId": id, "limit": 3}, []string{"does not take `limit`", "sessionId, turns, full"}},
		{"misspelt argument", map[string]any{"verb": "read", "session_id": id}, []string{"does not take `session_id`"}},
		{"wrong type string", map[string]any{"verb": "list", "limit": "ten"}, []string{"`limit` must be a whole number from 1 to 100", `"ten"`}},
		{"fractional", map[string]any{"verb": "list", "limit": 2.5}, []string{"whole number"}},
		{"zero limit", map[string]any{"verb": "list", "limit": 0}, []string{"`limit` must be at least 1"}},
		{"negative turns", map[string]any{"verb": "transcript", "sessionId": id, "turns": -1}, []string{"`turns` must be at least 1"}},
		{"zero timeout", map[string]any{"verb": "wait", "sessionId": id, "timeout": 0}, []string{"`timeout` must be at least 1 seconds"}},
		{"full not bool", map[string]any{"verb": "read", "sessionId": id, "full": "yes"}, []string{"`full` must be true or false"}},
		{"bad status", map[string]any{"verb": "events", "status": "finished"}, []string{"`status` must be done, error, cancelled or needs-attention"}},
		{"negative since", map[string]any{"verb": "events", "since": -4}, []string{"`since` must be at least 0"}},
		{"unknown agent", map[string]any{"verb": "create", "cwd": "/r", "prompt": "x", "agent": "gpt"}, []string{`unknown agent "gpt"`, "claude, codex"}},
		{"bad environment kind", map[string]any{"verb": "create", "cwd": "/r", "prompt": "x", "environment": map[string]any{"kind": "docker"}}, []string{`environment.kind must be "local" or "worktree"`}},
		{"environment not object", map[string]any{"verb": "create", "cwd": "/r", "prompt": "x", "environment": "worktree"}, []string{"`environment` must be a JSON object"}},
		{"branch on local", map[string]any{"verb": "create", "cwd": "/r", "prompt": "x", "environment": map[string]any{"kind": "local", "branch": "b"}}, []string{"applies only to"}},
		{"unknown tool verb", map[string]any{"verb": "create", "cwd": "/r", "prompt": "x", "tools": []string{"rm"}}, []string{`unknown verb "rm" in tools`}},
		{"tools not a list", map[string]any{"verb": "create", "cwd": "/r", "prompt": "x", "tools": "read"}, []string{"`tools` must be an array of strings"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := call(t, cs, "sessions", tc.args)
			failed(t, res, tc.want...)
			if code := errorCodeOf(res); code != "bad_input" {
				t.Errorf("structured error code %q, want bad_input", code)
			}
		})
	}
}

func TestSessionsEngineErrors(t *testing.T) {
	h := newHarness(t)
	cs := h.connect("alice-token", nil, nil)
	for _, args := range []map[string]any{
		{"verb": "read", "sessionId": "nope"},
		{"verb": "send", "sessionId": "nope", "prompt": "x"},
		{"verb": "steer", "sessionId": "nope", "text": "x"},
		{"verb": "cancel", "sessionId": "nope"},
		{"verb": "transcript", "sessionId": "nope"},
		{"verb": "wait", "sessionId": "nope"},
	} {
		res := call(t, cs, "sessions", args)
		failed(t, res, `no session "nope"`, "sessions list")
		if code := errorCodeOf(res); code != "no_session" {
			t.Errorf("%v: error code %q, want no_session", args, code)
		}
	}
}

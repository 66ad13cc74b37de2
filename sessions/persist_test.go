package sessions_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/caddyserver/certmagic"

	"github.com/Tahul/caddy-zidane-mcp/sessions"
)

func storedRecord(t *testing.T, st *certmagic.FileStorage, id string) map[string]any {
	t.Helper()
	b, err := st.Load(context.Background(), "zidane/sessions/"+id+"/session.json")
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

func TestRestartResumesOrEndsSessions(t *testing.T) {
	st := &certmagic.FileStorage{Path: t.TempDir()}
	useStore := func(c *sessions.Config) { c.Storage = st }
	o := owner("sam")

	e1, _ := newEngine(t, useStore)
	resumable := create(t, e1, o, "hello")
	waitState(t, e1, resumable, sessions.StateIdle)
	busy := create(t, e1, o, "sleep: 10m")
	sleeping(t, e1, busy)
	noLoad := create(t, e1, o, "remember me", func(r *sessions.CreateRequest) { r.Agent = "minimal" })
	waitState(t, e1, noLoad, sessions.StateIdle)
	crashed := create(t, e1, o, "crash")
	waitState(t, e1, crashed, sessions.StateError)
	before := eventsIn(e1, sessions.EventFilter{Limit: 100})
	acpID := storedRecord(t, st, resumable)["acpSessionId"]
	if err := e1.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := e1.Create(ctxT(t), o, sessions.CreateRequest{Cwd: t.TempDir(), Prompt: "x"}); !errors.Is(err, sessions.ErrClosed) {
		t.Fatalf("create after close: %v", err)
	}

	e2, _ := newEngine(t, useStore)
	// Resumed: idle, same ACP session, transcript and events intact.
	v := waitState(t, e2, resumable, sessions.StateIdle)
	if v.LastMessage != "You said: hello" || v.Turns != 1 || v.Error != "" {
		t.Errorf("resumed session = %+v", v)
	}
	if _, err := e2.Send(ctxT(t), o, resumable, "again"); err != nil {
		t.Fatal(err)
	}
	waitState(t, e2, resumable, sessions.StateIdle)
	if got := storedRecord(t, st, resumable)["acpSessionId"]; got != acpID {
		t.Errorf("ACP session id %v after resume, want %v (session/load, not session/new)", got, acpID)
	}
	tr, _ := e2.Transcript(looker, resumable, 0, true)
	if len(tr) != 2 || tr[0].Answer != "You said: hello" || tr[1].Answer != "You said: again" || tr[1].Index != 2 {
		t.Errorf("transcript after resume = %+v", tr)
	}
	// The turn running at shutdown is kept as interrupted.
	v = waitState(t, e2, busy, sessions.StateIdle)
	if tr, _ := e2.Transcript(looker, busy, 0, true); len(tr) != 1 || tr[0].StopReason != "interrupted" {
		t.Errorf("interrupted transcript = %+v", tr)
	}
	// An agent without session/load: ended, transcript intact, prompts
	// refused.
	v, _ = e2.Read(looker, noLoad, true)
	if v.State != sessions.StateEnded || !strings.Contains(v.Error, "session/load") || v.LastMessage != "ok: remember me" {
		t.Errorf("session without load = %+v", v)
	}
	_, err := e2.Send(ctxT(t), o, noLoad, "hello?")
	wantErr(t, err, sessions.ErrEnded)
	if tr, _ := e2.Transcript(looker, noLoad, 0, true); len(tr) != 1 || tr[0].Prompt != "remember me" {
		t.Errorf("transcript = %+v", tr)
	}
	// Errored stays errored.
	if v, _ := e2.Read(looker, crashed, false); v.State != sessions.StateError || !strings.Contains(v.Error, "exit status 3") {
		t.Errorf("crashed session = %+v", v)
	}
	// Events survive with their numbers, and new ones follow them.
	after := eventsIn(e2, sessions.EventFilter{Limit: 100})
	if len(after) != len(before)+1 || after[0].Seq <= before[0].Seq || after[1].Seq != before[0].Seq || after[1].Target != before[0].Target {
		t.Errorf("events before %+v\nafter %+v", before, after)
	}
	if list, _ := e2.List(o, 10); len(list) != 4 || !list[0].Worker {
		t.Errorf("list after restart = %+v", list)
	}
}

func TestRestartWithAgentRemovedEndsSession(t *testing.T) {
	st := &certmagic.FileStorage{Path: t.TempDir()}
	e1, _ := newEngine(t, func(c *sessions.Config) { c.Storage = st })
	id := create(t, e1, owner("tess"), "hi", func(r *sessions.CreateRequest) { r.Agent = "nosteer" })
	waitState(t, e1, id, sessions.StateIdle)
	e1.Close()
	e2, _ := newEngine(t, func(c *sessions.Config) {
		c.Storage = st
		delete(c.Agents, "nosteer")
	})
	v, _ := e2.Read(looker, id, false)
	if v.State != sessions.StateEnded || !strings.Contains(v.Error, "no longer configured") {
		t.Errorf("view = %+v", v)
	}
}

// syncBuffer is a log sink tests can read while the engine writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestIdleAgentIsStoppedAndResumed(t *testing.T) {
	var logs syncBuffer
	e, _ := newEngine(t, func(c *sessions.Config) {
		c.Limits.IdleTimeout = 20 * 1000 * 1000 // 20ms
		c.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	})
	o := owner("uma")
	id := create(t, e, o, "first")
	waitState(t, e, id, sessions.StateIdle)
	eventually(t, "the idle agent to be stopped", func() bool {
		return strings.Contains(logs.String(), "agent stopped after being idle")
	})
	if v, _ := e.Read(looker, id, false); v.State != sessions.StateIdle {
		t.Fatalf("a dormant session shows %s, want idle", v.State)
	}
	if queued, err := e.Send(ctxT(t), o, id, "second"); err != nil || queued {
		t.Fatalf("send = %v, %v", queued, err)
	}
	waitState(t, e, id, sessions.StateIdle)
	if msg := lastMessage(t, e, id); msg != "You said: second" {
		t.Errorf("last message = %q", msg)
	}
	if !strings.Contains(logs.String(), "resumed=true") {
		t.Errorf("the agent was not relaunched with session/load; logs:\n%s", logs.String())
	}
}

// Two nodes of a cluster share one storage: each names its sessions after
// itself, keeps them under a key of its own, and at restart resumes its own
// and no one else's (or every replica would run every agent).
func TestNodesOnOneStorageResumeOnlyTheirOwn(t *testing.T) {
	st := &certmagic.FileStorage{Path: t.TempDir()}
	on := func(node string) func(*sessions.Config) {
		return func(c *sessions.Config) { c.Storage, c.Node = st, node }
	}
	o := owner("sam")
	a, _ := newEngine(t, on("gw-a"))
	b, _ := newEngine(t, on("gw-b"))
	idA := create(t, a, o, "hello")
	idB := create(t, b, o, "hello")
	if sessions.NodeOf(idA) != "gw-a" || sessions.NodeOf(idB) != "gw-b" {
		t.Fatalf("ids %q and %q do not name their nodes", idA, idB)
	}
	waitState(t, a, idA, sessions.StateIdle)
	waitState(t, b, idB, sessions.StateIdle)
	if _, err := st.Load(context.Background(), "zidane/nodes/gw-a/sessions/"+idA+"/session.json"); err != nil {
		t.Fatalf("node gw-a's session is not under its node: %v", err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	a2, _ := newEngine(t, on("gw-a"))
	if v := waitState(t, a2, idA, sessions.StateIdle); v.Turns != 1 {
		t.Errorf("resumed %s = %+v", idA, v)
	}
	if _, err := a2.Read(looker, idB, false); !errors.Is(err, sessions.ErrNoSession) {
		t.Errorf("node gw-a resumed gw-b's session %s: %v", idB, err)
	}
	if list, _ := a2.List(looker, 10); len(list) != 1 || list[0].SessionID != idA {
		t.Errorf("node gw-a lists %+v, want only %s", list, idA)
	}
	if _, err := b.Read(looker, idB, false); err != nil {
		t.Errorf("gw-b lost its session: %v", err)
	}
	if _, err := sessions.NewEngine(context.Background(), sessions.Config{Agents: map[string]sessions.AgentConfig{"demo": demoAgent(t)}, Node: "gw/../x"}); err == nil || !strings.Contains(err.Error(), "node id") {
		t.Errorf("a node id with a path in it was taken: %v", err)
	}
}

func TestNodeOf(t *testing.T) {
	for id, want := range map[string]string{
		"ses_abcdefghijklmnop.gw-1":                       "gw-1",
		"req_abcdefghijklmnop.a.b":                        "a.b",
		"ses_abcdefghijklmnop":                            "",
		"ses_abcdefghijklmnop.":                           "",
		"ses_abcdefghijklmnop.-x":                         "",
		"ses_abcdefghijklmnop.a/b":                        "",
		"ses_abcdefghijklmno.pgw":                         "",
		"sesXabcdefghijklmnop.gw":                         "",
		"ses_abcdefghijklmnop." + strings.Repeat("a", 65): "",
	} {
		if got := sessions.NodeOf(id); got != want {
			t.Errorf("NodeOf(%q) = %q, want %q", id, got, want)
		}
	}
}

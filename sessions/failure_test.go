package sessions_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/Tahul/caddy-zidane-mcp/sessions"
)

func TestCrashEndsOnlyThatSession(t *testing.T) {
	e, _ := newEngine(t)
	o := owner("max")
	ok := create(t, e, o, "sleep: 10m")
	sleeping(t, e, ok)
	bad := create(t, e, o, "crash")
	v := waitState(t, e, bad, sessions.StateError)
	if !strings.Contains(v.Error, "exit status 3") || !strings.Contains(v.Error, "create a new session") {
		t.Errorf("error = %q, want the exit status and what to do", v.Error)
	}
	evs := eventsOf(e, bad, sessions.EventError)
	if len(evs) != 1 || !strings.Contains(evs[0].Summary, "exit status 3") {
		t.Fatalf("error events = %+v", evs)
	}
	_, err := e.Send(ctxT(t), o, bad, "hello?")
	wantErr(t, err, sessions.ErrEnded, "create a new session")
	tr, _ := e.Transcript(looker, bad, 0, true)
	if len(tr) != 1 || tr[0].StopReason != "error" {
		t.Errorf("transcript = %+v", tr)
	}
	// The other session never noticed.
	if v, _ := e.Read(looker, ok, false); v.State != sessions.StateRunning {
		t.Fatalf("other session = %+v", v)
	}
	if mode, err := e.Steer(ctxT(t), o, ok, "wake up"); err != nil || mode != "steering" {
		t.Fatalf("steer = %q, %v", mode, err)
	}
	waitState(t, e, ok, sessions.StateIdle)
}

func TestBadJSONRPCIsAnError(t *testing.T) {
	e, _ := newEngine(t)
	id := create(t, e, owner("ned"), "garbage")
	v := waitState(t, e, id, sessions.StateError)
	if !strings.Contains(v.Error, "not JSON") {
		t.Errorf("error = %q, want it to say the agent wrote non-JSON", v.Error)
	}
	if len(eventsOf(e, id, sessions.EventError)) != 1 {
		t.Errorf("events = %+v", eventsOf(e, id, ""))
	}
}

func TestCancelStopsAnAgentThatIgnoresIt(t *testing.T) {
	e, _ := newEngine(t, func(c *sessions.Config) {
		c.Limits.CancelTimeout = 50 * 1000 * 1000 // 50ms
	})
	o := owner("yan")
	id := create(t, e, o, "hang", func(r *sessions.CreateRequest) { r.Agent = "minimal" })
	eventually(t, "the turn to start", func() bool {
		tr, _ := e.Transcript(looker, id, 1, true)
		return len(tr) == 1
	})
	if err := e.Cancel(ctxT(t), o, id); err != nil {
		t.Fatal(err)
	}
	v, _ := e.Read(looker, id, false)
	if v.State != sessions.StateError || !strings.Contains(v.Error, "after session/cancel") {
		t.Fatalf("view = %+v", v)
	}
	if tr, _ := e.Transcript(looker, id, 0, true); len(tr) != 1 || tr[0].StopReason != "error" || tr[0].Ended.IsZero() {
		t.Errorf("transcript = %+v", tr)
	}
	if len(eventsOf(e, id, sessions.EventError)) != 1 {
		t.Errorf("events = %+v", eventsOf(e, id, ""))
	}
}

func TestBadInput(t *testing.T) {
	e, _ := newEngine(t)
	o := owner("pat")
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		req  sessions.CreateRequest
		says string
	}{
		{"cwd missing", sessions.CreateRequest{Cwd: "/nonexistent/dir", Prompt: "hi"}, "does not exist"},
		{"cwd relative", sessions.CreateRequest{Cwd: "project", Prompt: "hi"}, "not an absolute path"},
		{"cwd empty", sessions.CreateRequest{Prompt: "hi"}, "cwd is empty"},
		{"cwd is a file", sessions.CreateRequest{Cwd: file, Prompt: "hi"}, "not a directory"},
		{"unknown agent", sessions.CreateRequest{Cwd: t.TempDir(), Prompt: "hi", Agent: "gpt-9"}, `unknown agent "gpt-9"; configured agents: demo, minimal, nosteer`},
		{"empty prompt", sessions.CreateRequest{Cwd: t.TempDir(), Prompt: "  \n "}, "prompt is empty"},
		{"bad environment", sessions.CreateRequest{Cwd: t.TempDir(), Prompt: "hi", Environment: sessions.Environment{Kind: "docker"}}, "use local"},
		{"worktree outside git", sessions.CreateRequest{Cwd: t.TempDir(), Prompt: "hi", Environment: sessions.Environment{Kind: "worktree"}}, "not inside a git repository"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.Create(ctxT(t), o, tc.req)
			wantErr(t, err, sessions.ErrBadRequest, tc.says)
		})
	}
	if list, _ := e.List(o, 10); len(list) != 0 {
		t.Errorf("bad requests created sessions: %+v", list)
	}
	id := create(t, e, o, "hi")
	_, err := e.Send(ctxT(t), o, id, "")
	wantErr(t, err, sessions.ErrBadRequest, "prompt is empty")
	_, err = e.Steer(ctxT(t), o, id, " ")
	wantErr(t, err, sessions.ErrBadRequest, "steering text is empty")
	_, err = e.Send(ctxT(t), o, "ses_nope", "hi")
	wantErr(t, err, sessions.ErrNoSession)
	_, err = e.Read(looker, "ses_nope", false)
	wantErr(t, err, sessions.ErrNoSession)
	_, err = e.Transcript(looker, "ses_nope", 1, false)
	wantErr(t, err, sessions.ErrNoSession)
	waitState(t, e, id, sessions.StateIdle)
}

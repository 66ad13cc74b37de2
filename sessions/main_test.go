package sessions_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"
	acp "github.com/coder/acp-go-sdk"

	"github.com/Tahul/caddy-zidane-mcp/sessions"
	"github.com/Tahul/caddy-zidane-mcp/sessions/confine"
	"github.com/Tahul/caddy-zidane-mcp/sessions/demoagent"
)

// The tests drive real ACP agent processes: the demo agent, served by this
// test binary re-executed with SESSIONS_DEMOAGENT=1. Run with --confine as
// its first argument, the binary is the confiner instead (confine.Main, as
// `caddy zidane confine` is), in front of an agent or a git.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "--confine" {
		os.Exit(confine.Main(os.Args[2:]))
	}
	switch os.Getenv("SESSIONS_DEMOAGENT") {
	case "1":
		os.Exit(demoagent.Main(context.Background()))
	case "minimal":
		os.Exit(minimalAgent())
	}
	os.Exit(m.Run())
}

// minimalAgent is a bare ACP agent, for what the demo agent does not do:
// it advertises neither session/load nor steering, echoes a prompt as
// "ok: <prompt>", and a "hang" turn never ends, session/cancel or not.
// It speaks the real protocol through the SDK.
func minimalAgent() int {
	m := &minimal{}
	m.conn = acp.NewAgentSideConnection(m, os.Stdout, os.Stdin)
	<-m.conn.Done()
	return 0
}

type minimal struct{ conn *acp.AgentSideConnection }

func (*minimal) Initialize(context.Context, acp.InitializeRequest) (acp.InitializeResponse, error) {
	return acp.InitializeResponse{ProtocolVersion: acp.ProtocolVersionNumber}, nil
}
func (*minimal) NewSession(context.Context, acp.NewSessionRequest) (acp.NewSessionResponse, error) {
	return acp.NewSessionResponse{SessionId: "minimal"}, nil
}
func (m *minimal) Prompt(ctx context.Context, p acp.PromptRequest) (acp.PromptResponse, error) {
	text := p.Prompt[0].Text.Text
	if text == "hang" {
		select {} // ignores the cancel of its ctx
	}
	err := m.conn.SessionUpdate(ctx, acp.SessionNotification{SessionId: p.SessionId, Update: acp.UpdateAgentMessageText("ok: " + text)})
	return acp.PromptResponse{StopReason: acp.StopReasonEndTurn}, err
}
func (*minimal) Cancel(context.Context, acp.CancelNotification) error { return nil }
func (*minimal) Authenticate(context.Context, acp.AuthenticateRequest) (acp.AuthenticateResponse, error) {
	return acp.AuthenticateResponse{}, nil
}
func (*minimal) CloseSession(context.Context, acp.CloseSessionRequest) (acp.CloseSessionResponse, error) {
	return acp.CloseSessionResponse{}, acp.NewMethodNotFound(acp.AgentMethodSessionClose)
}
func (*minimal) ListSessions(context.Context, acp.ListSessionsRequest) (acp.ListSessionsResponse, error) {
	return acp.ListSessionsResponse{}, acp.NewMethodNotFound(acp.AgentMethodSessionList)
}
func (*minimal) ResumeSession(context.Context, acp.ResumeSessionRequest) (acp.ResumeSessionResponse, error) {
	return acp.ResumeSessionResponse{}, acp.NewMethodNotFound(acp.AgentMethodSessionResume)
}
func (*minimal) SetSessionConfigOption(context.Context, acp.SetSessionConfigOptionRequest) (acp.SetSessionConfigOptionResponse, error) {
	return acp.SetSessionConfigOptionResponse{}, acp.NewMethodNotFound(acp.AgentMethodSessionSetConfigOption)
}
func (*minimal) SetSessionMode(context.Context, acp.SetSessionModeRequest) (acp.SetSessionModeResponse, error) {
	return acp.SetSessionModeResponse{}, acp.NewMethodNotFound(acp.AgentMethodSessionSetMode)
}

// demoAgent is the demo agent as an AgentConfig; extra are KEY=VALUE
// settings for it (e.g. demoagent.SteeringEnv+"=0").
func demoAgent(t *testing.T, extra ...string) sessions.AgentConfig {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// A race-enabled binary sleeps a second at exit unless told not to,
	// which every Close would wait for.
	env := map[string]string{
		"SESSIONS_DEMOAGENT": "1", // or "minimal", through extra
		"GORACE":             strings.TrimSpace(os.Getenv("GORACE") + " atexit_sleep_ms=0"),
	}
	if dir := os.Getenv("GOCOVERDIR"); dir != "" {
		env["GOCOVERDIR"] = dir
	}
	for _, kv := range extra {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	return sessions.AgentConfig{Command: []string{exe}, Env: env}
}

// newEngine starts an engine with the demo agent as "demo" (the default),
// the demo agent without steering as "nosteer", and minimalAgent as
// "minimal", over a file storage.
func newEngine(t *testing.T, edit ...func(*sessions.Config)) (*sessions.Engine, sessions.Config) {
	t.Helper()
	cfg := sessions.Config{
		Agents: map[string]sessions.AgentConfig{
			"demo":    demoAgent(t),
			"nosteer": demoAgent(t, demoagent.SteeringEnv+"=0"),
			"minimal": demoAgent(t, "SESSIONS_DEMOAGENT=minimal"),
		},
		DefaultAgent: "demo",
		Storage:      &certmagic.FileStorage{Path: t.TempDir()},
		LinkFor:      func(id, base string) string { return base + "/sessions/" + id },
	}
	for _, f := range edit {
		f(&cfg)
	}
	e, err := sessions.NewEngine(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e, cfg
}

func owner(name string) sessions.Owner {
	return sessions.Owner{TokenID: "tok-" + name, TokenName: name, MCPSession: "mcp-" + name}
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func create(t *testing.T, e *sessions.Engine, o sessions.Owner, prompt string, edit ...func(*sessions.CreateRequest)) string {
	t.Helper()
	req := sessions.CreateRequest{Cwd: t.TempDir(), Prompt: prompt}
	for _, f := range edit {
		f(&req)
	}
	c, err := e.Create(ctxT(t), o, req)
	if err != nil {
		t.Fatalf("create %q: %v", prompt, err)
	}
	return c.SessionID
}

// waitState waits (through Wait) until the session is in one of want.
func waitState(t *testing.T, e *sessions.Engine, id string, want ...sessions.State) sessions.SessionView {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		v, err := e.Wait(ctxT(t), looker, id, 5*time.Second)
		if err != nil {
			t.Fatalf("wait %s: %v", id, err)
		}
		for _, s := range want {
			if v.State == s {
				return v
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("session %s is %s (error %q), want %v", id, v.State, v.Error, want)
		}
		if v.State != sessions.StateRunning {
			// Wait returns at once on a settled state; a queued prompt may
			// be about to start.
			time.Sleep(5 * time.Millisecond)
		}
	}
}

// eventually polls cond, for conditions no engine call waits on (a turn's
// first chunk). It never asserts a duration: the bound only stops a hang.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// sleeping waits until the session's turn is inside a demo "sleep:".
func sleeping(t *testing.T, e *sessions.Engine, id string) {
	t.Helper()
	eventually(t, "the sleep turn to start", func() bool {
		tr, _ := e.Transcript(looker, id, 1, true)
		return len(tr) == 1 && tr[0].Ended.IsZero() && strings.Contains(tr[0].Answer, "Sleeping")
	})
}

func pendingOne(t *testing.T, e *sessions.Engine, id string) sessions.Interaction {
	t.Helper()
	waitState(t, e, id, sessions.StateBlocked)
	p := pendingIn(e, id)
	if len(p) != 1 {
		t.Fatalf("pending = %+v, want one", p)
	}
	return p[0]
}

func lastMessage(t *testing.T, e *sessions.Engine, id string) string {
	t.Helper()
	v, err := e.Read(looker, id, true)
	if err != nil {
		t.Fatal(err)
	}
	return v.LastMessage
}

func wantErr(t *testing.T, err, target error, contains ...string) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("error = %v, want %v", err, target)
	}
	for _, c := range contains {
		if !strings.Contains(err.Error(), c) {
			t.Errorf("error %q does not say %q", err, c)
		}
	}
}

func eventsOf(e *sessions.Engine, id string, status sessions.EventStatus) []sessions.Event {
	return eventsIn(e, sessions.EventFilter{SessionID: id, Status: status, Limit: 1000})
}

// looker sees every owner's sessions, as a caller on a host with
// share_sessions does, and acts on none but its own.
var looker = sessions.Owner{TokenID: "tok-looker", TokenName: "looker", OtherSessions: sessions.AccessRead, OtherInteractions: sessions.AccessRead}

func pendingIn(e *sessions.Engine, id string) []sessions.Interaction {
	list, err := e.Pending(looker, id)
	if err != nil {
		panic(err)
	}
	return list
}

func eventsIn(e *sessions.Engine, f sessions.EventFilter) []sessions.Event {
	list, err := e.Events(looker, f)
	if err != nil {
		panic(err)
	}
	return list
}

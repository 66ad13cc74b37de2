package demoagent

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	acp "github.com/coder/acp-go-sdk"
)

func steeringSupported(resp acp.InitializeResponse) bool {
	s, _ := resp.Meta["steering"].(map[string]any)
	supported, _ := s["supported"].(bool)
	return supported
}

func TestInitializeAdvertisesLoadSessionAndSteering(t *testing.T) {
	p := startInProcess(t, Options{}, newClient())
	resp := p.initialize(t, true)
	if resp.ProtocolVersion != acp.ProtocolVersionNumber {
		t.Errorf("protocolVersion = %d, want %d", resp.ProtocolVersion, acp.ProtocolVersionNumber)
	}
	if !resp.AgentCapabilities.LoadSession {
		t.Error("loadSession not advertised")
	}
	if !steeringSupported(resp) {
		t.Errorf("_meta.steering.supported not true: %#v", resp.Meta)
	}
	if resp.AgentInfo == nil || resp.AgentInfo.Name != Name {
		t.Errorf("agentInfo = %#v", resp.AgentInfo)
	}
}

func TestSteeringDisabled(t *testing.T) {
	p := startInProcess(t, Options{DisableSteering: true}, newClient())
	resp := p.initialize(t, true)
	id := p.newSession(t, t.TempDir())
	if steeringSupported(resp) {
		t.Errorf("steering advertised although disabled: %#v", resp.Meta)
	}
	_, err := p.conn.CallExtension(testCtx(t), SteeringMethod, SteeringParams{SessionId: id, Text: "go"})
	var re *acp.RequestError
	if !errors.As(err, &re) || re.Code != -32601 {
		t.Fatalf("steering while disabled: err = %v, want method not found (-32601)", err)
	}
}

func TestNewSessionChecksCwd(t *testing.T) {
	p := startInProcess(t, Options{}, newClient())
	p.initialize(t, true)
	for _, cwd := range []string{"relative/dir", filepath.Join(t.TempDir(), "missing")} {
		_, err := p.conn.NewSession(testCtx(t), acp.NewSessionRequest{Cwd: cwd, McpServers: []acp.McpServer{}})
		var re *acp.RequestError
		if !errors.As(err, &re) || re.Code != -32602 {
			t.Errorf("session/new cwd %q: err = %v, want invalid params", cwd, err)
		}
	}
}

func TestSessionsAreSeparate(t *testing.T) {
	p := startInProcess(t, Options{}, newClient())
	p.initialize(t, true)
	dirA, dirB := t.TempDir(), t.TempDir()
	a, b := p.newSession(t, dirA), p.newSession(t, dirB)
	if a == b {
		t.Fatalf("two session/new returned the same id %q", a)
	}
	for id, want := range map[acp.SessionId]string{a: dirA, b: dirB} {
		if _, err := p.prompt(testCtx(t), id, "pwd"); err != nil {
			t.Fatalf("pwd: %v", err)
		}
		if got := message(p.client.snapshot(id)); got != want {
			t.Errorf("pwd in %s = %q, want %q", id, got, want)
		}
	}
}

func TestEchoStreamsChunksAndEndsTurn(t *testing.T) {
	p, id := ready(t, Options{}, newClient())
	resp, err := p.prompt(testCtx(t), id, "hello there, demo agent")
	if err != nil {
		t.Fatalf("prompt: %v", err)
	}
	if resp.StopReason != acp.StopReasonEndTurn {
		t.Errorf("stopReason = %q, want end_turn", resp.StopReason)
	}
	updates := p.client.snapshot(id)
	if got, want := message(updates), "You said: hello there, demo agent"; got != want {
		t.Errorf("message = %q, want %q", got, want)
	}
	if n := chunkCount(updates); n < 2 {
		t.Errorf("%d agent_message_chunks, want several", n)
	}
	if u := updates[0].SessionInfoUpdate; u == nil || u.Title == nil || *u.Title != "hello there, demo agent" {
		t.Errorf("first update is not the session title: %s", describe(updates))
	}

	if _, err := p.prompt(testCtx(t), id, "again"); err != nil {
		t.Fatalf("prompt: %v", err)
	}
	titles := 0
	for _, u := range p.client.snapshot(id) {
		if u.SessionInfoUpdate != nil {
			titles++
		}
	}
	if titles != 1 {
		t.Errorf("%d title updates after two prompts, want 1", titles)
	}
}

func TestFailEndsPromptWithInternalError(t *testing.T) {
	p, id := ready(t, Options{}, newClient())
	_, err := p.prompt(testCtx(t), id, "fail")
	var re *acp.RequestError
	if !errors.As(err, &re) || re.Code != -32603 || !strings.Contains(re.Message, "fails on purpose") {
		t.Fatalf("err = %v, want internal error (-32603) saying it fails on purpose", err)
	}
	// The session survives a failed turn.
	if _, err := p.prompt(testCtx(t), id, "still there?"); err != nil {
		t.Fatalf("prompt after fail: %v", err)
	}
}

func TestPromptUnknownSession(t *testing.T) {
	p := startInProcess(t, Options{}, newClient())
	p.initialize(t, true)
	_, err := p.prompt(testCtx(t), "no-such-session", "hi")
	var re *acp.RequestError
	if !errors.As(err, &re) || re.Code != -32602 {
		t.Fatalf("err = %v, want invalid params", err)
	}
}

func TestCrashEndsRunMidTurn(t *testing.T) {
	p, id := ready(t, Options{}, newClient())
	if _, err := p.prompt(testCtx(t), id, "crash"); err == nil {
		t.Fatal("prompt crash answered; want the connection to drop")
	}
	err := wait(t, p.exited, "end of Run")
	var e *ExitError
	if !errors.As(err, &e) || e.Code != ExitCrash {
		t.Fatalf("Run = %v, want exit status %d", err, ExitCrash)
	}
	// The client may see the connection drop before it has handled the
	// chunk streamed just before the crash.
	p.client.await(t, id, "chunk before the crash", func(u []acp.SessionUpdate) bool {
		return strings.HasPrefix(message(u), "Crashing on purpose")
	})
	wait(t, p.conn.Done(), "disconnect")
}

func TestLoadSession(t *testing.T) {
	p, id := ready(t, Options{}, newClient())
	if _, err := p.prompt(testCtx(t), id, "remember me"); err != nil {
		t.Fatal(err)
	}
	before := len(p.client.snapshot(id))
	if _, err := p.conn.LoadSession(testCtx(t), acp.LoadSessionRequest{SessionId: id, Cwd: t.TempDir(), McpServers: []acp.McpServer{}}); err != nil {
		t.Fatalf("session/load of a known session: %v", err)
	}
	replay := p.client.snapshot(id)[before:]
	if len(replay) != 2 || replay[0].UserMessageChunk == nil || replay[0].UserMessageChunk.Content.Text.Text != "remember me" ||
		message(replay) != "You said: remember me" {
		t.Errorf("replay = %s", describe(replay))
	}

	// A session from before a restart: the process knows nothing of it.
	old := acp.SessionId("demo-from-an-earlier-process")
	if _, err := p.conn.LoadSession(testCtx(t), acp.LoadSessionRequest{SessionId: old, Cwd: t.TempDir(), McpServers: []acp.McpServer{}}); err != nil {
		t.Fatalf("session/load of an unknown session: %v", err)
	}
	if len(p.client.snapshot(old)) != 0 {
		t.Errorf("replayed something for an unknown session: %s", describe(p.client.snapshot(old)))
	}
	resp, err := p.prompt(testCtx(t), old, "resumed")
	if err != nil || resp.StopReason != acp.StopReasonEndTurn {
		t.Fatalf("prompt in loaded session: %v, %v", resp, err)
	}
}

func TestMCPServersAreRecorded(t *testing.T) {
	p := startInProcess(t, Options{}, newClient())
	p.initialize(t, true)
	id := p.newSession(t, t.TempDir(), acp.McpServer{Http: &acp.McpServerHttpInline{Name: "zidane", Type: "http", Url: "http://127.0.0.1:1/mcp", Headers: []acp.HttpHeader{}}})
	if _, err := p.prompt(testCtx(t), id, "mcp"); err != nil {
		t.Fatal(err)
	}
	if got := message(p.client.snapshot(id)); !strings.Contains(got, "zidane (http http://127.0.0.1:1/mcp)") {
		t.Errorf("mcp = %q", got)
	}
}

package demoagent

import (
	"errors"
	"strings"
	"testing"

	acp "github.com/coder/acp-go-sdk"
)

// These tests drive the demo agent as a separate process (the test binary
// re-executed, see TestMain) through Main, as `caddy zidane demo-agent`
// runs it.

func TestSubprocessTurnThenCrash(t *testing.T) {
	p := startSubprocess(t, newClient())
	if !steeringSupported(p.initialize(t, true)) {
		t.Error("steering not advertised")
	}
	id := p.newSession(t, t.TempDir())
	resp, err := p.prompt(testCtx(t), id, "hello process")
	if err != nil || resp.StopReason != acp.StopReasonEndTurn {
		t.Fatalf("prompt: %v, %v", resp, err)
	}
	if got := message(p.client.snapshot(id)); got != "You said: hello process" {
		t.Errorf("message = %q", got)
	}
	if _, err := p.prompt(testCtx(t), id, "crash"); err == nil {
		t.Fatal("prompt crash answered")
	}
	if code := p.exitStatus(t); code != ExitCrash {
		t.Errorf("exit status %d, want %d; stderr:\n%s", code, ExitCrash, p.stderr)
	}
}

func TestSubprocessGarbage(t *testing.T) {
	p := startSubprocess(t, newClient())
	p.initialize(t, true)
	id := p.newSession(t, t.TempDir())
	if _, err := p.prompt(testCtx(t), id, "garbage"); err == nil {
		t.Fatal("prompt garbage answered")
	}
	if code := p.exitStatus(t); code != ExitGarbage {
		t.Errorf("exit status %d, want %d; stderr:\n%s", code, ExitGarbage, p.stderr)
	}
	if !strings.Contains(p.clientLog.String(), "failed to parse incoming message") {
		t.Errorf("the client did not see a bad line; its log:\n%s", p.clientLog)
	}
}

func TestSubprocessSteeringSwitchedOffByEnv(t *testing.T) {
	p := startSubprocess(t, newClient(), SteeringEnv+"=0")
	if steeringSupported(p.initialize(t, true)) {
		t.Error("steering advertised with " + SteeringEnv + "=0")
	}
	id := p.newSession(t, t.TempDir())
	_, err := p.conn.CallExtension(testCtx(t), SteeringMethod, SteeringParams{SessionId: id, Text: "x"})
	var re *acp.RequestError
	if !errors.As(err, &re) || re.Code != -32601 {
		t.Fatalf("err = %v, want method not found", err)
	}
}

func TestSubprocessExitsCleanlyWhenStdinCloses(t *testing.T) {
	p := startSubprocess(t, newClient())
	p.initialize(t, true)
	if err := p.stdin.Close(); err != nil {
		t.Fatal(err)
	}
	if code := p.exitStatus(t); code != 0 {
		t.Errorf("exit status %d, want 0; stderr:\n%s", code, p.stderr)
	}
}

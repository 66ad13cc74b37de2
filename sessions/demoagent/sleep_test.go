package demoagent

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	acp "github.com/coder/acp-go-sdk"
)

// sleeping reports whether a sleep: turn has streamed its first chunk.
func sleeping(updates []acp.SessionUpdate) bool {
	return strings.Contains(message(updates), "Sleeping for")
}

func TestSleepEnds(t *testing.T) {
	p, id := ready(t, Options{}, newClient())
	resp, err := p.prompt(testCtx(t), id, "sleep: 1ms")
	if err != nil || resp.StopReason != acp.StopReasonEndTurn {
		t.Fatalf("prompt: %v, %v", resp, err)
	}
	if got := message(p.client.snapshot(id)); got != "Sleeping for 1ms… Done sleeping." {
		t.Errorf("message = %q", got)
	}
}

func TestSleepIsCapped(t *testing.T) {
	p, id := ready(t, Options{MaxSleep: time.Millisecond}, newClient())
	resp, err := p.prompt(testCtx(t), id, "sleep: 10h")
	if err != nil || resp.StopReason != acp.StopReasonEndTurn {
		t.Fatalf("prompt: %v, %v", resp, err)
	}
	if got := message(p.client.snapshot(id)); !strings.Contains(got, "Sleeping for 1ms (capped)") {
		t.Errorf("message = %q", got)
	}
}

func TestSleepRejectsBadDuration(t *testing.T) {
	p, id := ready(t, Options{}, newClient())
	_, err := p.prompt(testCtx(t), id, "sleep: a while")
	var re *acp.RequestError
	if !errors.As(err, &re) || re.Code != -32602 {
		t.Fatalf("err = %v, want invalid params", err)
	}
}

func TestSleepCancelled(t *testing.T) {
	p, id := ready(t, Options{}, newClient())
	done := p.promptAsync(t, id, "sleep: 10m")
	p.client.await(t, id, "sleeping chunk", sleeping)
	if err := p.conn.Cancel(testCtx(t), acp.CancelNotification{SessionId: id}); err != nil {
		t.Fatal(err)
	}
	r := wait(t, done, "end of turn")
	if r.err != nil || r.resp.StopReason != acp.StopReasonCancelled {
		t.Fatalf("prompt = %v, %v; want stopReason cancelled", r.resp, r.err)
	}
}

func TestSteeringRequestEndsSleep(t *testing.T) {
	p, id := ready(t, Options{}, newClient())
	done := p.promptAsync(t, id, "sleep: 10m")
	p.client.await(t, id, "sleeping chunk", sleeping)
	raw, err := p.conn.CallExtension(testCtx(t), SteeringMethod, SteeringParams{SessionId: id, Text: "use tabs"})
	if err != nil {
		t.Fatalf("steering: %v", err)
	}
	var res SteeringResult
	if err := json.Unmarshal(raw, &res); err != nil || !res.Accepted {
		t.Errorf("steering result = %s (%v)", raw, err)
	}
	r := wait(t, done, "end of turn")
	if r.err != nil || r.resp.StopReason != acp.StopReasonEndTurn {
		t.Fatalf("prompt = %v, %v", r.resp, r.err)
	}
	if got := message(p.client.snapshot(id)); !strings.HasSuffix(got, "\nSteered: use tabs") {
		t.Errorf("message = %q, want it to end with the guidance", got)
	}
}

func TestSteeringNotificationWithPromptContent(t *testing.T) {
	p, id := ready(t, Options{}, newClient())
	done := p.promptAsync(t, id, "sleep: 10m")
	p.client.await(t, id, "sleeping chunk", sleeping)
	err := p.conn.NotifyExtension(testCtx(t), SteeringMethod, SteeringParams{SessionId: id, Prompt: []acp.ContentBlock{acp.TextBlock("stop and write tests")}})
	if err != nil {
		t.Fatal(err)
	}
	r := wait(t, done, "end of turn")
	if r.err != nil || r.resp.StopReason != acp.StopReasonEndTurn {
		t.Fatalf("prompt = %v, %v", r.resp, r.err)
	}
	if got := message(p.client.snapshot(id)); !strings.Contains(got, "Steered: stop and write tests") {
		t.Errorf("message = %q", got)
	}
}

func TestSteeringWhileIdleReachesNextTurn(t *testing.T) {
	p, id := ready(t, Options{}, newClient())
	if _, err := p.conn.CallExtension(testCtx(t), SteeringMethod, SteeringParams{SessionId: id, Text: "be brief"}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.prompt(testCtx(t), id, "hi"); err != nil {
		t.Fatal(err)
	}
	if got := message(p.client.snapshot(id)); got != "You said: hi\nSteered: be brief" {
		t.Errorf("message = %q", got)
	}
	// The guidance was acted on once.
	before := len(p.client.snapshot(id))
	if _, err := p.prompt(testCtx(t), id, "again"); err != nil {
		t.Fatal(err)
	}
	if got := message(p.client.snapshot(id)[before:]); got != "You said: again" {
		t.Errorf("second message = %q", got)
	}
}

func TestSteeringRejectsBadParams(t *testing.T) {
	p, id := ready(t, Options{}, newClient())
	for _, params := range []SteeringParams{{SessionId: "nope", Text: "x"}, {SessionId: id}} {
		_, err := p.conn.CallExtension(testCtx(t), SteeringMethod, params)
		var re *acp.RequestError
		if !errors.As(err, &re) || re.Code != -32602 {
			t.Errorf("steering %+v: err = %v, want invalid params", params, err)
		}
	}
}

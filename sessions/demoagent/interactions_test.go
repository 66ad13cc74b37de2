package demoagent

import (
	"context"
	"strings"
	"testing"

	acp "github.com/coder/acp-go-sdk"
)

func TestAsk(t *testing.T) {
	cases := []struct {
		name   string
		answer acp.UnstableCreateElicitationResponse
		want   string
	}{
		{"accept", acp.UnstableCreateElicitationResponse{Accept: &acp.UnstableCreateElicitationAccept{Content: map[string]any{"answer": "blue"}}}, "You answered: blue"},
		{"decline", acp.NewUnstableCreateElicitationResponseDecline(), "You declined to answer."},
		{"cancel", acp.NewUnstableCreateElicitationResponseCancel(), "The question was cancelled."},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := newClient()
			var got acp.UnstableCreateElicitationRequest
			c.elicit = func(_ context.Context, req acp.UnstableCreateElicitationRequest) (acp.UnstableCreateElicitationResponse, error) {
				got = req
				return tc.answer, nil
			}
			p, id := ready(t, Options{}, c)
			resp, err := p.prompt(testCtx(t), id, "ask: What colour?")
			if err != nil || resp.StopReason != acp.StopReasonEndTurn {
				t.Fatalf("prompt: %v, %v", resp, err)
			}
			form := got.Form
			if form == nil || form.Message != "What colour?" || form.Meta["sessionId"] != string(id) {
				t.Fatalf("elicitation = %#v", form)
			}
			field, _ := form.RequestedSchema.Properties["answer"].(map[string]any)
			if field["type"] != "string" || len(form.RequestedSchema.Required) != 1 || form.RequestedSchema.Required[0] != "answer" {
				t.Errorf("requested schema = %#v", form.RequestedSchema)
			}
			if msg := message(p.client.snapshot(id)); msg != tc.want {
				t.Errorf("message = %q, want %q", msg, tc.want)
			}
		})
	}
}

func TestAskWithoutElicitationCapability(t *testing.T) {
	p := startInProcess(t, Options{}, newClient())
	p.initialize(t, false)
	id := p.newSession(t, t.TempDir())
	resp, err := p.prompt(testCtx(t), id, "ask: anything?")
	if err != nil || resp.StopReason != acp.StopReasonEndTurn {
		t.Fatalf("prompt: %v, %v", resp, err)
	}
	if msg := message(p.client.snapshot(id)); !strings.Contains(msg, "clientCapabilities.elicitation.form") {
		t.Errorf("message = %q", msg)
	}
}

// selecting answers a permission request with optionID and records it.
func selecting(optionID string, got *acp.RequestPermissionRequest) func(context.Context, acp.RequestPermissionRequest) (acp.RequestPermissionResponse, error) {
	return func(_ context.Context, req acp.RequestPermissionRequest) (acp.RequestPermissionResponse, error) {
		*got = req
		return acp.RequestPermissionResponse{Outcome: acp.NewRequestPermissionOutcomeSelected(acp.PermissionOptionId(optionID))}, nil
	}
}

func optionKinds(opts []acp.PermissionOption) map[string]acp.PermissionOptionKind {
	m := map[string]acp.PermissionOptionKind{}
	for _, o := range opts {
		m[string(o.OptionId)] = o.Kind
	}
	return m
}

// toolCallStatuses returns the status of the tool_call, then of each
// tool_call_update.
func toolCallStatuses(updates []acp.SessionUpdate) []acp.ToolCallStatus {
	var out []acp.ToolCallStatus
	for _, u := range updates {
		switch {
		case u.ToolCall != nil:
			out = append(out, u.ToolCall.Status)
		case u.ToolCallUpdate != nil && u.ToolCallUpdate.Status != nil:
			out = append(out, *u.ToolCallUpdate.Status)
		}
	}
	return out
}

func TestApprove(t *testing.T) {
	cases := []struct {
		option, want string
		status       acp.ToolCallStatus
	}{
		{OptionAllow, "Allowed: rm -rf build", acp.ToolCallStatusCompleted},
		{OptionAllowAlways, "Allowed: rm -rf build", acp.ToolCallStatusCompleted},
		{OptionReject, "Rejected: rm -rf build", acp.ToolCallStatusFailed},
	}
	for _, tc := range cases {
		t.Run(tc.option, func(t *testing.T) {
			c := newClient()
			var req acp.RequestPermissionRequest
			c.permission = selecting(tc.option, &req)
			p, id := ready(t, Options{}, c)
			resp, err := p.prompt(testCtx(t), id, "approve: rm -rf build")
			if err != nil || resp.StopReason != acp.StopReasonEndTurn {
				t.Fatalf("prompt: %v, %v", resp, err)
			}
			call := req.ToolCall
			if req.SessionId != id || call.Kind == nil || *call.Kind != acp.ToolKindExecute || call.Title == nil || *call.Title != "rm -rf build" {
				t.Errorf("permission request = %#v", req)
			}
			if input, _ := call.RawInput.(map[string]any); input["command"] != "rm -rf build" {
				t.Errorf("rawInput = %#v", call.RawInput)
			}
			kinds := optionKinds(req.Options)
			if kinds[OptionAllow] != acp.PermissionOptionKindAllowOnce || kinds[OptionAllowAlways] != acp.PermissionOptionKindAllowAlways || kinds[OptionReject] != acp.PermissionOptionKindRejectOnce {
				t.Errorf("options = %#v", req.Options)
			}
			updates := p.client.snapshot(id)
			if got := toolCallStatuses(updates); len(got) != 2 || got[0] != acp.ToolCallStatusPending || got[1] != tc.status {
				t.Errorf("tool call statuses = %v, want [pending %s]", got, tc.status)
			}
			if msg := message(updates); msg != tc.want {
				t.Errorf("message = %q, want %q", msg, tc.want)
			}
		})
	}
}

// TestApproveCancelledWhilePending plays the client's duty on
// session/cancel: answer the pending permission request "cancelled".
func TestApproveCancelledWhilePending(t *testing.T) {
	c := newClient()
	pending := make(chan struct{})
	release := make(chan struct{})
	c.permission = func(context.Context, acp.RequestPermissionRequest) (acp.RequestPermissionResponse, error) {
		close(pending)
		<-release
		return acp.RequestPermissionResponse{Outcome: acp.NewRequestPermissionOutcomeCancelled()}, nil
	}
	p, id := ready(t, Options{}, c)
	done := p.promptAsync(t, id, "approve: make deploy")
	wait(t, pending, "permission request")
	if err := p.conn.Cancel(testCtx(t), acp.CancelNotification{SessionId: id}); err != nil {
		t.Fatal(err)
	}
	close(release)
	r := wait(t, done, "end of turn")
	if r.err != nil || r.resp.StopReason != acp.StopReasonCancelled {
		t.Fatalf("prompt = %v, %v; want stopReason cancelled", r.resp, r.err)
	}
	if got := toolCallStatuses(p.client.snapshot(id)); len(got) != 2 || got[1] != acp.ToolCallStatusFailed {
		t.Errorf("tool call statuses = %v, want the call to end failed", got)
	}
}

func TestPlan(t *testing.T) {
	cases := []struct{ option, want string }{
		{OptionPlanAcceptEdits, "Plan approved."},
		{OptionPlanDefault, "Plan approved."},
		{OptionPlanKeep, "Plan rejected: I keep planning."},
	}
	for _, tc := range cases {
		t.Run(tc.option, func(t *testing.T) {
			c := newClient()
			var req acp.RequestPermissionRequest
			c.permission = selecting(tc.option, &req)
			p, id := ready(t, Options{}, c)
			resp, err := p.prompt(testCtx(t), id, "plan: 1. read the code\n2. fix the bug")
			if err != nil || resp.StopReason != acp.StopReasonEndTurn {
				t.Fatalf("prompt: %v, %v", resp, err)
			}
			call := req.ToolCall
			if call.Kind == nil || *call.Kind != acp.ToolKindSwitchMode {
				t.Errorf("toolCall.kind = %v, want switch_mode", call.Kind)
			}
			if len(call.Content) != 1 || call.Content[0].Content == nil || call.Content[0].Content.Content.Text == nil ||
				call.Content[0].Content.Content.Text.Text != "1. read the code\n2. fix the bug" {
				t.Errorf("toolCall.content = %#v, want the plan", call.Content)
			}
			if msg := message(p.client.snapshot(id)); msg != tc.want {
				t.Errorf("message = %q, want %q", msg, tc.want)
			}
		})
	}
}

// TestAskCancelledWhilePending: on session/cancel the client answers the
// pending elicitation "cancel", and the turn ends cancelled.
func TestAskCancelledWhilePending(t *testing.T) {
	c := newClient()
	pending := make(chan struct{})
	release := make(chan struct{})
	c.elicit = func(context.Context, acp.UnstableCreateElicitationRequest) (acp.UnstableCreateElicitationResponse, error) {
		close(pending)
		<-release
		return acp.NewUnstableCreateElicitationResponseCancel(), nil
	}
	p, id := ready(t, Options{}, c)
	done := p.promptAsync(t, id, "ask: still there?")
	wait(t, pending, "elicitation")
	if err := p.conn.Cancel(testCtx(t), acp.CancelNotification{SessionId: id}); err != nil {
		t.Fatal(err)
	}
	close(release)
	r := wait(t, done, "end of turn")
	if r.err != nil || r.resp.StopReason != acp.StopReasonCancelled {
		t.Fatalf("prompt = %v, %v; want stopReason cancelled", r.resp, r.err)
	}
}

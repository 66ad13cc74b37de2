package demoagent

import (
	"fmt"
	"sync/atomic"
	"time"

	acp "github.com/coder/acp-go-sdk"
)

// Option ids of the permission requests, as claude-agent-acp names them.
const (
	OptionAllowAlways = "allow_always"
	OptionAllow       = "allow"
	OptionReject      = "reject"

	OptionPlanAcceptEdits = "acceptEdits"
	OptionPlanDefault     = "default"
	OptionPlanKeep        = "plan"
)

var toolCallSeq atomic.Int64

func nextToolCallID() acp.ToolCallId {
	return acp.ToolCallId(fmt.Sprintf("demo-call-%d", toolCallSeq.Add(1)))
}

// ask raises an elicitation/create in form mode with one string field,
// "answer". ACP v0.13 gives the request no sessionId, so it rides in _meta.
func (t *turn) ask(question string) (acp.StopReason, error) {
	if !t.a.canElicit() {
		return acp.StopReasonEndTurn, t.say("I would ask: " + question + "\nbut this client did not advertise clientCapabilities.elicitation.form, so I cannot.")
	}
	resp, err := t.a.conn.UnstableCreateElicitation(t.out, acp.UnstableCreateElicitationRequest{Form: &acp.UnstableCreateElicitationForm{
		Meta:    map[string]any{"sessionId": string(t.s.id)},
		Message: question,
		Mode:    "form",
		RequestedSchema: acp.UnstableElicitationSchema{
			Type: acp.UnstableElicitationSchemaTypeObject,
			Properties: map[string]any{
				"answer": map[string]any{"type": "string", "title": "Answer", "description": question},
			},
			Required: []string{"answer"},
		},
	}})
	if err != nil {
		return "", err
	}
	if t.ctx.Err() != nil {
		return acp.StopReasonCancelled, nil
	}
	switch {
	case resp.Accept != nil:
		answer, _ := resp.Accept.Content["answer"].(string)
		return acp.StopReasonEndTurn, t.say("You answered: " + answer)
	case resp.Decline != nil:
		return acp.StopReasonEndTurn, t.say("You declined to answer.")
	default:
		return acp.StopReasonEndTurn, t.say("The question was cancelled.")
	}
}

// approve asks permission to run command, as a coding agent asks before a
// shell command, and reports the answer. It never runs the command.
func (t *turn) approve(command string) (acp.StopReason, error) {
	call := acp.ToolCallUpdate{
		ToolCallId: nextToolCallID(),
		Title:      acp.Ptr(command),
		Kind:       acp.Ptr(acp.ToolKindExecute),
		Status:     acp.Ptr(acp.ToolCallStatusPending),
		RawInput:   map[string]any{"command": command},
	}
	options := []acp.PermissionOption{
		{Kind: acp.PermissionOptionKindAllowAlways, Name: "Always allow", OptionId: OptionAllowAlways},
		{Kind: acp.PermissionOptionKindAllowOnce, Name: "Allow", OptionId: OptionAllow},
		{Kind: acp.PermissionOptionKindRejectOnce, Name: "Reject", OptionId: OptionReject},
	}
	kind, stop, err := t.permission(call, options)
	if err != nil || stop != "" {
		return stop, err
	}
	if allows(kind) {
		if err := t.finishCall(call.ToolCallId, acp.ToolCallStatusCompleted, map[string]any{"allowed": true, "note": "the demo agent never runs commands"}); err != nil {
			return "", err
		}
		return acp.StopReasonEndTurn, t.say("Allowed: " + command)
	}
	if err := t.finishCall(call.ToolCallId, acp.ToolCallStatusFailed, map[string]any{"allowed": false}); err != nil {
		return "", err
	}
	return acp.StopReasonEndTurn, t.say("Rejected: " + command)
}

// plan asks approval of a plan the way Claude's ExitPlanMode does: a
// permission request for a switch_mode tool call holding the plan.
func (t *turn) plan(text string) (acp.StopReason, error) {
	call := acp.ToolCallUpdate{
		ToolCallId: nextToolCallID(),
		Title:      acp.Ptr("Ready to code?"),
		Kind:       acp.Ptr(acp.ToolKindSwitchMode),
		Status:     acp.Ptr(acp.ToolCallStatusPending),
		Content:    []acp.ToolCallContent{acp.ToolContent(acp.TextBlock(text))},
		RawInput:   map[string]any{"plan": text},
	}
	options := []acp.PermissionOption{
		{Kind: acp.PermissionOptionKindAllowAlways, Name: "Yes, and auto-accept edits", OptionId: OptionPlanAcceptEdits},
		{Kind: acp.PermissionOptionKindAllowOnce, Name: "Yes, and manually approve edits", OptionId: OptionPlanDefault},
		{Kind: acp.PermissionOptionKindRejectOnce, Name: "No, keep planning", OptionId: OptionPlanKeep},
	}
	kind, stop, err := t.permission(call, options)
	if err != nil || stop != "" {
		return stop, err
	}
	if allows(kind) {
		if err := t.finishCall(call.ToolCallId, acp.ToolCallStatusCompleted, nil); err != nil {
			return "", err
		}
		return acp.StopReasonEndTurn, t.say("Plan approved.")
	}
	if err := t.finishCall(call.ToolCallId, acp.ToolCallStatusFailed, nil); err != nil {
		return "", err
	}
	return acp.StopReasonEndTurn, t.say("Plan rejected: I keep planning.")
}

// permission announces the tool call, asks for permission and returns the
// kind of the option chosen. A non-empty stop reason ends the turn: the
// answer was "cancelled" or the turn was cancelled meanwhile. The request
// outlives session/cancel, since the client answers it "cancelled" then.
func (t *turn) permission(call acp.ToolCallUpdate, options []acp.PermissionOption) (acp.PermissionOptionKind, acp.StopReason, error) {
	start := acp.StartToolCall(call.ToolCallId, *call.Title,
		acp.WithStartKind(*call.Kind), acp.WithStartStatus(*call.Status),
		acp.WithStartContent(call.Content), acp.WithStartRawInput(call.RawInput))
	if err := t.update(start); err != nil {
		return "", "", err
	}
	resp, err := t.a.conn.RequestPermission(t.out, acp.RequestPermissionRequest{SessionId: t.s.id, ToolCall: call, Options: options})
	if err != nil {
		return "", "", err
	}
	if resp.Outcome.Selected == nil || t.ctx.Err() != nil {
		return "", acp.StopReasonCancelled, t.finishCall(call.ToolCallId, acp.ToolCallStatusFailed, map[string]any{"cancelled": true})
	}
	for _, o := range options {
		if o.OptionId == resp.Outcome.Selected.OptionId {
			return o.Kind, "", nil
		}
	}
	return "", "", acp.NewInvalidParams(map[string]any{"error": fmt.Sprintf("the client selected %q, which is not one of the options offered", resp.Outcome.Selected.OptionId)})
}

func (t *turn) finishCall(id acp.ToolCallId, status acp.ToolCallStatus, output any) error {
	opts := []acp.ToolCallUpdateOpt{acp.WithUpdateStatus(status)}
	if output != nil {
		opts = append(opts, acp.WithUpdateRawOutput(output))
	}
	return t.update(acp.UpdateToolCall(id, opts...))
}

func allows(k acp.PermissionOptionKind) bool {
	return k == acp.PermissionOptionKindAllowOnce || k == acp.PermissionOptionKindAllowAlways
}

// sleep holds the turn until the duration passes, the turn is cancelled or
// guidance arrives.
func (t *turn) sleep(arg string) (acp.StopReason, error) {
	d, err := time.ParseDuration(arg)
	if err != nil || d < 0 {
		return "", acp.NewInvalidParams(map[string]any{"error": fmt.Sprintf("sleep: %q is not a duration such as 5s or 2m", arg)})
	}
	note := ""
	if d > t.a.opts.MaxSleep {
		d, note = t.a.opts.MaxSleep, " (capped)"
	}
	if err := t.say(fmt.Sprintf("Sleeping for %s%s…", d, note)); err != nil {
		return "", err
	}
	if t.a.hasGuidance(t.s) {
		return acp.StopReasonEndTurn, t.say(" Woken early by steering.")
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return acp.StopReasonEndTurn, t.say(" Done sleeping.")
	case <-t.s.wake:
		return acp.StopReasonEndTurn, t.say(" Woken early by steering.")
	case <-t.ctx.Done():
		return acp.StopReasonCancelled, nil
	}
}

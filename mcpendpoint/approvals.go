package mcpendpoint

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/Tahul/caddy-zidane-mcp/approvals"
	"github.com/Tahul/caddy-zidane-mcp/policy"
	"github.com/Tahul/caddy-zidane-mcp/sessions"
)

// KindCall is the kind of a pending interaction that is a call an approve
// rule holds (package approvals), beside the sessions' question, plan and
// approval; its requestId is the approval's id (apv_…).
const KindCall sessions.InteractionKind = "call"

// heldCalls are the held calls c may answer, as interactions: those of
// the sites c holds the approve scope for (policy.MayApprove), the
// caller's own left out unless their rule says self.
func (e *Endpoint) heldCalls(ctx context.Context, c caller) ([]sessions.Interaction, error) {
	if e.approvals == nil {
		return nil, nil
	}
	list, err := e.approvals.List(ctx, func(a approvals.Approval) bool { return mayAnswer(c.p, a) })
	if err != nil {
		return nil, err
	}
	out := make([]sessions.Interaction, 0, len(list))
	for _, a := range list {
		payload, _ := json.Marshal(map[string]any{
			"site": a.Site, "route": a.Route, "upstream": a.Upstream, "method": a.Method, "tool": a.Tool,
			"prompt": a.Prompt, "uri": a.URI, "arguments": a.Arguments, "caller": a.Owner, "rule": a.Rule,
			"message": a.Message, "expires": a.Expires, "options": []string{"allow", "reject"},
		})
		out = append(out, sessions.Interaction{RequestID: a.ID, Kind: KindCall, Created: a.Created, Payload: payload,
			Summary: fmt.Sprintf("%s asks to run %s on %s (%s); answer decision allow or reject", a.Owner, callOf(a), a.Site, a.Message)})
	}
	return out, nil
}

// mayAnswer is whether p may answer a: the approve scope for its site,
// and not as its caller unless its rule says self.
func mayAnswer(p policy.Principal, a approvals.Approval) bool {
	return policy.MayApprove(p, a.Site) && (a.Self || (p.OwnerID() != a.Owner && p.TokenID != a.Credential))
}

func callOf(a approvals.Approval) string {
	for _, n := range []string{a.Tool, a.Prompt, a.URI} {
		if n != "" {
			return a.Method + " " + n
		}
	}
	return a.Method
}

// answerHeld answers the held call id with decision allow or reject.
func (e *Endpoint) answerHeld(ctx context.Context, c caller, id, decision string) (reply, error) {
	if e.approvals == nil {
		return reply{}, badInput("no call is held for approval here: %s is not a pending interaction", id)
	}
	if decision != "allow" && decision != "reject" {
		return reply{}, badInput("a held call (%s) is answered with decision \"allow\" or \"reject\"", id)
	}
	who := approvals.Answerer{Owner: c.p.OwnerID(), Credential: c.p.TokenID}
	a, err := e.approvals.Answer(ctx, id, who, decision == "allow", func(a approvals.Approval) bool { return policy.MayApprove(c.p, a.Site) })
	switch {
	case errors.Is(err, approvals.ErrAnswered):
		return reply{}, fmt.Errorf("someone answered %s first (%s), and their answer stands; yours was not applied", id, a.State)
	case err != nil:
		return reply{}, fmt.Errorf("%s: %w", id, err)
	}
	verb := "Approved"
	if a.State == approvals.Denied {
		verb = "Denied"
	}
	return reply{
		text: fmt.Sprintf("%s %s: %s's %s on %s. %s", verb, id, a.Owner, callOf(a), a.Site, map[bool]string{true: "The same call, made again by its caller, runs once.", false: "Its caller is told it was denied."}[a.State == approvals.Approved]),
		data: answerResult{RequestID: id, Answered: true},
	}, nil
}

// isHeldCall reports whether a requestId names a held call.
func isHeldCall(id string) bool { return strings.HasPrefix(id, "apv_") }

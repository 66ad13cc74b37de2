package mcpendpoint

import (
	"errors"
	"fmt"
	"strings"

	"github.com/Tahul/caddy-zidane-mcp/policy"
	"github.com/Tahul/caddy-zidane-mcp/sessions"
)

// toolOfVerb is the tool a verb of an orchestrator's tools belongs to
// (create refused a name that is no verb).
func toolOfVerb(name string) string {
	tool, _ := policy.VerbTool(name)
	return tool
}

// checkTools refuses an orchestrator's tools that its creator may not call
// itself: the session's agent gets a token derived from the creator's, and
// a derived token's verbs can only narrow its parent's. Refusing, rather
// than dropping the extra verbs, tells the caller at once what it may give,
// where a silently narrowed orchestrator would fail later, mid-task.
func checkTools(c caller, tools []string) error {
	var beyond, granted []string
	for _, t := range tools {
		if !c.access.Scopes.GrantsVerb(c.p, toolOfVerb(t), t) {
			beyond = append(beyond, toolOfVerb(t)+" "+t)
		}
	}
	if len(beyond) == 0 {
		return nil
	}
	for _, t := range policy.VerbNames("") {
		if c.access.Scopes.GrantsVerb(c.p, toolOfVerb(t), t) {
			granted = append(granted, t)
		}
	}
	return fmt.Errorf("%w: an orchestrator's tools can only narrow what your token may call, and it may not call %s; "+
		"create the session with tools among %s, or ask the operator for a token that holds the verbs it needs",
		errToolsBeyondScope, strings.Join(beyond, ", "), strings.Join(granted, ", "))
}

// reportRefusal tells OnRefusal of a call refused for whose session it is,
// for the tools it asked for, or for a directory of the gateway's own.
func (e *Endpoint) reportRefusal(c caller, a *args, err error) {
	if err == nil || e.onRefusal == nil {
		return
	}
	reason := ""
	switch {
	case errors.Is(err, sessions.ErrNotOwner):
		reason = "not_owner"
	case errors.Is(err, errToolsBeyondScope):
		reason = "tools_beyond_scope"
	case errors.Is(err, sessions.ErrDenied):
		reason = "denied_path"
	default:
		return
	}
	target, _ := a.str("sessionId")
	if target == "" {
		target, _ = a.str("requestId")
	}
	e.onRefusal(Refusal{Principal: c.p, Tool: a.tool, Verb: a.verb, Target: target, Reason: reason, Message: err.Error()})
}

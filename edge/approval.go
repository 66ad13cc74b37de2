package edge

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/approvals"
	"github.com/Tahul/caddy-zidane-mcp/message"
)

// Reasons of a call an approve rule holds: held for a person's approval,
// or refused because of what became of its approval (denied, too many
// waiting).
const (
	ReasonApproval        = "approval_required"
	ReasonApprovalRefused = "approval_refused"
)

// heldVerdict is the verdict on c, which an approve rule holds (v): a
// batch is refused, since one approval binds one call and a batch is
// allowed or refused whole; a call whose pinned definition changed is
// refused as any other would be, before anyone is asked to approve it.
func heldVerdict(route Route, c message.Call, batch bool, v Verdict) Verdict {
	if batch {
		return Verdict{Status: http.StatusForbidden, Reason: ReasonRule, Rule: v.Rule, RuleEffect: v.RuleEffect,
			Message: v.Held.Message + ": a call that needs a person's approval must be sent on its own, not in a batch"}
	}
	if pv := pinVerdict(route, c, false); !pv.Allowed() {
		return pv
	}
	return v
}

// Approvals settles the calls that approve rules hold on one site.
type Approvals struct {
	Store *approvals.Store
	// Site is the site's resource URL: approvals name it, and approvers'
	// rights are by site.
	Site string
}

// Settle decides a call that an approve rule holds (d's verdict is
// ReasonApproval; any other verdict is returned as it is). The caller's
// live approval of this same call (same bytes of arguments, same
// credential: see approvals.Digest) is found, or a new one asked for:
//
//   - approved: it is consumed, once across replicas, and the call is
//     allowed (the verdict names the rule, for the audit line);
//   - pending: the call is answered with a tool error (a JSON-RPC error
//     for another method) that names the approval and says to make the
//     same call again once approved;
//   - denied: a refusal that says so, ReasonApprovalRefused;
//   - too many of the caller's calls waiting: 429.
//
// A nil a holds nothing: the call stays refused, and says why.
func (a *Approvals) Settle(ctx context.Context, d Decision) Verdict {
	v := d.Verdict
	if v.Reason != ReasonApproval || v.Held == nil {
		return v
	}
	tool := d.Call.IsToolCall()
	if a == nil || a.Store == nil {
		return Verdict{Status: http.StatusForbidden, Reason: ReasonRule, Rule: v.Rule, RuleEffect: v.RuleEffect,
			Message: v.Held.Message + " (this call needs a person's approval, which this route cannot hold)"}
	}
	c := *v.Held
	c.Site = a.Site
	ap, err := a.Store.Hold(ctx, c)
	if err == nil && ap.State == approvals.Approved {
		if _, err := a.Store.Consume(ctx, ap.ID, c); err == nil {
			return Verdict{Rule: v.Rule, RuleEffect: string(approvals.Approved)}
		} else if !errors.Is(err, approvals.ErrUsed) {
			return refusedHeld(tool, v, ReasonApprovalRefused, fmt.Sprintf("%s: approval %s: %v", c.Message, ap.ID, err))
		}
		// The same call, made at once elsewhere, used the approval
		// first: this one is a replay, held anew.
		ap, err = a.Store.Hold(ctx, c)
	}
	switch {
	case errors.Is(err, approvals.ErrTooMany):
		return Verdict{Status: http.StatusTooManyRequests, Reason: ReasonApprovalRefused, Rule: v.Rule, RuleEffect: v.RuleEffect,
			Message: c.Message + ": " + err.Error(), RetryAfter: time.Minute}
	case err != nil:
		return Verdict{Status: http.StatusServiceUnavailable, Reason: ReasonApprovalRefused, Rule: v.Rule, RuleEffect: v.RuleEffect,
			Message: "the call could not be held for approval (" + err.Error() + "); try again", RetryAfter: 5 * time.Second}
	}
	switch ap.State {
	case approvals.Approved:
		// Approved between the two Holds: the next call of it runs.
		return refusedHeld(tool, v, ReasonApproval, fmt.Sprintf("%s: approval %s was approved as this call was made; make it again to run it", c.Message, ap.ID))
	case approvals.Denied:
		return refusedHeld(tool, v, ReasonApprovalRefused, fmt.Sprintf("%s: approval %s: %v (by %s); do not retry it", c.Message, ap.ID, approvals.ErrDenied, ap.AnsweredBy))
	}
	return refusedHeld(tool, v, ReasonApproval, fmt.Sprintf("%s: this call awaits a person's approval as %s, until %s. Ask someone who may approve calls here to approve %s; then make exactly this call again, with the same arguments, and it runs once.",
		c.Message, ap.ID, ap.Expires.UTC().Format("15:04 UTC"), ap.ID))
}

// refusedHeld is the answer to a held call that does not run: a tool
// error for tools/call (what the model reads), else a 403 JSON-RPC error.
func refusedHeld(tool bool, v Verdict, reason, msg string) Verdict {
	r := Verdict{Status: http.StatusForbidden, Reason: reason, Rule: v.Rule, RuleEffect: v.RuleEffect, Message: msg}
	if tool {
		r.Status, r.ToolError = http.StatusOK, true
	}
	return r
}

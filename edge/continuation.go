package edge

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/approvals"
	"github.com/Tahul/caddy-zidane-mcp/message"
)

// An approved call is multi-round at MCP 2026-07-28 (SEP-2322): its
// backend (or the aggregated route, bridging an older upstream's
// elicitation) may answer it input_required, with a requestState S of
// its own, and the client makes the same call again with S and its
// inputResponses. That retry is the approved call going on. Decided as a
// new call it would be held again, and the state of the new approval
// would take S's place: the backend would never get its answer.
//
// So the continuation is bound to the approval, through the approvals
// store (see approvals.Round, which says why storage rather than a sealed
// state): on the way back, the answer to the
// approved call that is input_required has S replaced by the state of a
// round, zidane-approval.<round id>, which names the approval, the call's
// digest, the caller and S, and lives no longer than the approval. The
// retry that carries it consumes the round (once, on any replica), must be
// the approved call by the same credential, and goes on with S put back
// and its inputResponses, the backend's, as the client sent them. The
// backend's next question is another round, up to approvals.MaxRounds.
// A backend's S sent without the gateway's state is a new call, held for
// a new approval.

// Continuation binds the input_required answer to an approved call to
// the call's next round: the listing filter hands it that answer (see
// Listing.Rounds).
type Continuation struct {
	ctx   context.Context // the request's: the round is stored while it is answered
	store *approvals.Store
	grant approvals.Grant
	id    message.ID
	// issued: the call's answer bound a round already. One request has
	// one answer; a server that sends more (two events of one id) binds
	// no more rounds than the client makes retries.
	issued bool
}

// Continuation returns the binding of the answer to call c, which the
// approval or round g let run; nil where there is nothing to bind: no
// approval let it run, or c speaks an MCP version without multi-round
// calls.
func (a *Approvals) Continuation(ctx context.Context, g *approvals.Grant, c message.Call) *Continuation {
	if a == nil || a.Store == nil || g == nil || !speaksModern(c) || c.ID.IsZero() {
		return nil
	}
	return &Continuation{ctx: ctx, store: a.Store, grant: *g, id: c.ID}
}

// roundAnswer is what the client gets, for its call, in place of a
// backend's question that the gateway could not bind to a round (err says
// why).
func roundAnswer(id message.ID, err error) []byte {
	raw := id.Raw()
	if len(raw) == 0 {
		raw = []byte("null")
	}
	msg, _ := json.Marshal("the MCP server asked for input in an approved call, and the gateway could not keep that round: " + err.Error())
	return fmt.Appendf(nil, `{"jsonrpc":"2.0","id":%s,"error":{"code":%d,"message":%s}}`, raw, message.CodeUpstream, msg)
}

// answer binds c, an answer the filter read, when it is the approved
// call's input_required result: its requestState becomes the round's.
// Any other message is returned as it is (changed false). A result whose
// resultType or requestState a client could read another way (a
// case-variant member, a state that is not a string) is refused, as is a
// round the store does not keep (a state over approvals.MaxStateBytes,
// too many rounds, the approval expired): the client gets an error for
// its call, and drop is told (approval_round_refused).
func (k *Continuation) answer(c message.Call, drop func(Drop)) (out []byte, changed bool) {
	if !c.IsResponse() || c.Result == nil || c.ID != k.id {
		return c.Raw, false
	}
	var res map[string]json.RawMessage
	if json.Unmarshal(c.Result, &res) != nil {
		return c.Raw, false
	}
	refuse := func(err error) ([]byte, bool) {
		drop(Drop{Reason: "approval_round_refused", ID: clip(c.ID.String()), Approval: k.grant.Approval})
		return roundAnswer(c.ID, err), true
	}
	for key := range res {
		if (key != "resultType" && strings.EqualFold(key, "resultType")) || (key != "requestState" && strings.EqualFold(key, "requestState")) {
			return refuse(errors.New("its answer spells resultType or requestState in another case"))
		}
	}
	var rt string
	if json.Unmarshal(res["resultType"], &rt) != nil || rt != "input_required" {
		return c.Raw, false
	}
	var state string
	raw, has := res["requestState"]
	if has && json.Unmarshal(raw, &state) != nil {
		return refuse(errors.New("its requestState is not a string"))
	}
	if k.issued {
		return refuse(errors.New("it answered the call more than once"))
	}
	k.issued = true
	round, err := k.store.IssueRound(k.ctx, k.grant, state, has)
	if err != nil {
		return refuse(err)
	}
	res["requestState"], _ = json.Marshal(approvalStatePrefix + round.ID)
	var msg map[string]json.RawMessage
	if json.Unmarshal(c.Raw, &msg) != nil {
		return refuse(errors.New("its answer could not be read again"))
	}
	msg["result"] = rawObject(res)
	return rawObject(msg), true
}

// settleRound decides the retry of an approved call's round: its
// requestState names round id. The round must be this caller's and this
// call's, unused and unexpired (approvals.Store.ConsumeRound, which
// audits it); the call then runs with the backend's requestState back in
// place (Verdict.Round) and binds its own next round (Verdict.Grant).
func (a *Approvals) settleRound(ctx context.Context, d Decision, c approvals.Call, id string) Verdict {
	v := d.Verdict
	r, err := a.Store.ConsumeRound(ctx, id, c)
	switch {
	case err == nil:
		g := r.Grant()
		return Verdict{Rule: v.Rule, RuleEffect: string(approvals.Approved), StripState: true, Round: &r, Grant: &g}
	case errors.Is(err, approvals.ErrCaller):
		return Verdict{Status: http.StatusForbidden, Reason: ReasonRequestState, Code: message.CodeInvalidParams, Rule: v.Rule, RuleEffect: v.RuleEffect,
			Message: "this retry's requestState names a round of an approved call not issued to you (another caller's, or made up), so the call was not made; call again without requestState and inputResponses"}
	case errors.Is(err, approvals.ErrUsed), errors.Is(err, approvals.ErrExpired), errors.Is(err, approvals.ErrMismatch):
		return Verdict{Status: http.StatusForbidden, Reason: ReasonApprovalRefused, Rule: v.Rule, RuleEffect: v.RuleEffect,
			Message: fmt.Sprintf("%s: approval %s, round %d: %v", c.Message, r.Approval, r.N, roundErr(err))}
	}
	return Verdict{Status: http.StatusServiceUnavailable, Reason: ReasonApprovalRefused, Rule: v.Rule, RuleEffect: v.RuleEffect,
		Message: "the approved call's round could not be read (" + err.Error() + "); try again", RetryAfter: 5 * time.Second}
}

// roundErr says what a refused round's error means for a round.
func roundErr(err error) error {
	if errors.Is(err, approvals.ErrUsed) {
		return errors.New("this round of the approved call was used already: each of its rounds runs once; make the call again to ask for a new approval")
	}
	return err
}

// HopSettledHeader names, on a hop, the approval or round whose
// consumption let the sender allow the call it forwards (see
// approvals.MarkHop), under the hop's MAC. The receiver checks it in
// storage ([Approvals.SettleForwarded]): it is no authority of itself.
const HopSettledHeader = "Zidane-Hop-Settled"

// Settlement is the approval or round that let a call run on this
// replica, for the hop that sends the call to another (see
// [WithSettlement]).
type Settlement struct {
	ID string
	// Mark records, in storage, that the call goes to node.
	Mark func(ctx context.Context, node string) error
}

type settlementKey struct{}

// WithSettlement puts s in ctx, the context of the call it let run.
func WithSettlement(ctx context.Context, s Settlement) context.Context {
	return context.WithValue(ctx, settlementKey{}, s)
}

func settlementFrom(ctx context.Context) (Settlement, bool) {
	s, ok := ctx.Value(settlementKey{}).(Settlement)
	return s, ok && s.ID != "" && s.Mark != nil
}

// Settlement is the settlement of a call that v, an allowed verdict of
// Settle, let run on an approval or a round of one; false for any other.
func (a *Approvals) Settlement(v Verdict) (Settlement, bool) {
	if a == nil || a.Store == nil || v.Grant == nil || !v.Allowed() {
		return Settlement{}, false
	}
	id := v.Grant.Approval
	if v.Round != nil {
		id = v.Round.ID
	}
	store := a.Store
	return Settlement{ID: id, Mark: func(ctx context.Context, node string) error { return store.MarkHop(ctx, id, node) }}, true
}

// SettleForwarded decides, on the replica node that a 2026-07-28 call
// was forwarded to, the call an approve rule holds (d's verdict
// ReasonApproval) that the sender settled on approval or round id (the
// hop's HopSettledHeader): it runs if id let this same call run, by this
// caller, and was marked for node and not taken before
// (approvals.Store.TakeHop); else it is refused. Any other verdict is
// returned as it is.
func (a *Approvals) SettleForwarded(ctx context.Context, d Decision, id, node string) Verdict {
	v := d.Verdict
	if v.Reason != ReasonApproval || v.Held == nil {
		return v
	}
	if a == nil || a.Store == nil {
		return refusedHeld(d.Call.IsToolCall(), v, ReasonApprovalRefused, v.Held.Message+" (this call needs a person's approval, which this route cannot hold)")
	}
	c := *v.Held
	c.Site = a.Site
	err := a.Store.TakeHop(ctx, id, node, c)
	switch {
	case err == nil:
		return Verdict{Rule: v.Rule, RuleEffect: string(approvals.Approved)}
	case errors.Is(err, approvals.ErrHop):
		return Verdict{Status: http.StatusForbidden, Reason: ReasonApprovalRefused, Rule: v.Rule, RuleEffect: v.RuleEffect,
			Message: fmt.Sprintf("%s: %v", c.Message, err)}
	}
	return Verdict{Status: http.StatusServiceUnavailable, Reason: ReasonApprovalRefused, Rule: v.Rule, RuleEffect: v.RuleEffect,
		Message: "the forwarded call's approval could not be read (" + err.Error() + "); try again", RetryAfter: 5 * time.Second}
}

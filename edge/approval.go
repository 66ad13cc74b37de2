package edge

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
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
	// StatusPage, when the gateway signs people in, is the address of an
	// approval's status page (package approvalpage), where a person who
	// may approve answers it: held calls send their callers there.
	StatusPage func(id string) string
}

// Settle decides a call that an approve rule holds (d's verdict is
// ReasonApproval; any other verdict is returned as it is). The caller's
// live approval of this same call (same bytes of arguments, same
// credential: see approvals.Digest) is found, or a new one asked for:
//
//   - approved: it is consumed, once across replicas, and the call is
//     allowed (the verdict names the rule, for the audit line);
//   - pending: the caller is told how to wait: at 2026-07-28, a client
//     that declares elicitation gets an input_required result (Verdict.
//     Result) whose requestState names the approval; at 2025-11-25, a
//     session that declared URL elicitation (d.URLElicitation) gets the
//     -32042 error whose URL elicitation is the approval's StatusPage;
//     any other caller a tool error (a JSON-RPC error for another method)
//     that names the approval (and its page) and says to make the same
//     call again once approved;
//   - denied: a refusal that says so, ReasonApprovalRefused;
//   - too many of the caller's calls waiting: 429.
//
// A call whose requestState names an approval is the retry of an
// input_required answer: see settleRetry. A nil a holds nothing: the call
// stays refused, and says why.
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
	if IsApprovalState(d.Call.RequestState) {
		return a.settleRetry(ctx, d, c)
	}
	ap, err := a.Store.Hold(ctx, c)
	if err == nil && ap.State == approvals.Approved {
		if used, err := a.Store.Consume(ctx, ap.ID, c); err == nil {
			g := approvals.GrantOf(used)
			return Verdict{Rule: v.Rule, RuleEffect: string(approvals.Approved), Grant: &g}
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
	if r := a.inputRequired(d.Call, ap); r != nil {
		return Verdict{Status: http.StatusOK, Reason: ReasonApproval, Rule: v.Rule, RuleEffect: v.RuleEffect,
			Message: fmt.Sprintf("%s: held for approval %s", c.Message, ap.ID), Result: r}
	}
	page := a.page(ap.ID)
	if page != "" && d.URLElicitation && !speaksModern(d.Call) {
		// MCP 2025-11-25's URL elicitation: the client opens the page
		// for its person, and makes the call again once approved.
		return Verdict{Status: http.StatusOK, Reason: ReasonApproval, Code: message.CodeURLElicitationRequired, Rule: v.Rule, RuleEffect: v.RuleEffect,
			Message: fmt.Sprintf("URL elicitation required: %s: this call awaits a person's approval as %s; make it again once approved", c.Message, ap.ID),
			Data:    map[string]any{"elicitations": []map[string]any{urlElicitation(ap, page)}}}
	}
	msg := fmt.Sprintf("%s: this call awaits a person's approval as %s, until %s. Ask someone who may approve calls here to approve %s", c.Message, ap.ID, ap.Expires.UTC().Format("15:04 UTC"), ap.ID)
	if page != "" {
		msg += " (at " + page + ")"
	}
	return refusedHeld(tool, v, ReasonApproval, msg+"; then make exactly this call again, with the same arguments, and it runs once.")
}

// page is the address of approval id's status page, or "" with none.
func (a *Approvals) page(id string) string {
	if a.StatusPage == nil {
		return ""
	}
	return a.StatusPage(id)
}

// speaksModern reports whether c speaks MCP 2026-07-28 or later.
func speaksModern(c message.Call) bool {
	return c.HasMetaVersion && c.MetaVersion >= message.ModernVersion
}

// waitMessage is what the person is asked while approval ap is pending.
func waitMessage(ap approvals.Approval, then string) string {
	return fmt.Sprintf("%s: this call awaits a person's approval as %s, until %s. Ask someone who may approve calls here to approve %s, then %s.",
		ap.Message, ap.ID, ap.Expires.UTC().Format("15:04 UTC"), ap.ID, then)
}

// urlElicitation is MCP's URL elicitation (ElicitRequestURLParams) of
// approval ap's status page, keyed by the approval's id.
func urlElicitation(ap approvals.Approval, page string) map[string]any {
	return map[string]any{"mode": "url", "message": waitMessage(ap, "accept to run it once"), "url": page, "elicitationId": ap.ID}
}

// settleRetry decides the 2026-07-28 retry of a held call, whose
// requestState names the approval its input_required answer made. The
// approval must be this caller's (owner and credential): a requestState
// that names another's, or none, is refused before anything else, the
// same for both so that it tells nothing of other callers' approvals. Then
// the retry's own call, as read (its arguments' bytes), must be the one
// approved: approvals.Store.Consume checks its digest and uses the
// approval once.
//
// A retry while the approval is pending is answered input_required again
// at once rather than held open: the approval waits on a person, for
// minutes, and a request held that long would pin a connection and a
// goroutine per waiting call on the replica; the client's own round trip
// (its user shown the message, go-sdk bounding its rounds) paces the
// retries, and the rate limit bounds them.
func (a *Approvals) settleRetry(ctx context.Context, d Decision, c approvals.Call) Verdict {
	v := d.Verdict
	tool := d.Call.IsToolCall()
	id := strings.TrimPrefix(d.Call.RequestState, approvalStatePrefix)
	if approvals.IsRoundID(id) {
		return a.settleRound(ctx, d, c, id)
	}
	ap, err := a.Store.Get(ctx, id)
	if err != nil && !errors.Is(err, approvals.ErrUnknown) {
		return Verdict{Status: http.StatusServiceUnavailable, Reason: ReasonApprovalRefused, Rule: v.Rule, RuleEffect: v.RuleEffect,
			Message: "the approval could not be read (" + err.Error() + "); try again", RetryAfter: 5 * time.Second}
	}
	if err != nil || ap.Owner != c.Owner || ap.Credential != c.Credential {
		return Verdict{Status: http.StatusForbidden, Reason: ReasonRequestState, Code: message.CodeInvalidParams, Rule: v.Rule, RuleEffect: v.RuleEffect,
			Message: "this retry's requestState names an approval not issued to you (another caller's, expired or made up), so the call was not made; call again without requestState and inputResponses"}
	}
	if declinedInput(d.Call.Params, id) {
		return refusedHeld(tool, v, ReasonApprovalRefused, fmt.Sprintf("%s: you stopped waiting for approval %s, so the call was not made; make it again to wait again", c.Message, id))
	}
	used, err := a.Store.Consume(ctx, id, c)
	switch {
	case err == nil:
		g := approvals.GrantOf(used)
		return Verdict{Rule: v.Rule, RuleEffect: string(approvals.Approved), StripState: true, Grant: &g}
	case errors.Is(err, approvals.ErrPending):
		if r := a.inputRequired(d.Call, ap); r != nil {
			return Verdict{Status: http.StatusOK, Reason: ReasonApproval, Rule: v.Rule, RuleEffect: v.RuleEffect,
				Message: fmt.Sprintf("%s: still awaiting approval %s", c.Message, id), Result: r}
		}
		return refusedHeld(tool, v, ReasonApproval, fmt.Sprintf("%s: %s awaits a person's approval still", c.Message, id))
	case errors.Is(err, approvals.ErrDenied):
		return refusedHeld(tool, v, ReasonApprovalRefused, fmt.Sprintf("%s: approval %s: %v (by %s); do not retry it", c.Message, id, err, ap.AnsweredBy))
	}
	// A changed argument (ErrMismatch), a replay (ErrUsed), an expired
	// approval: a refusal whose error says what to do.
	return Verdict{Status: http.StatusForbidden, Reason: ReasonApprovalRefused, Rule: v.Rule, RuleEffect: v.RuleEffect,
		Message: fmt.Sprintf("%s: approval %s: %v", c.Message, id, err)}
}

// ReasonRequestState refuses a retry whose requestState the gateway did
// not issue to its caller.
const ReasonRequestState = "request_state"

// approvalStatePrefix starts the requestState of an approval's
// input_required answer; the approval's id follows. The id is no secret
// (approvers and logs see it): the state is bound, not sealed, to its
// caller, through the approval, which records the owner and credential
// whose call it holds, and to the call, through the approval's digest.
const approvalStatePrefix = "zidane-approval."

// IsApprovalState reports whether a retry's requestState has the shape of
// an approval's: the gateway's own, never a backend's to read.
func IsApprovalState(requestState string) bool {
	return strings.HasPrefix(requestState, approvalStatePrefix)
}

// inputRequired is the input_required result (MCP 2026-07-28, SEP-2322)
// that tells the caller of held call c to wait for approval ap: one input
// request, keyed by the approval's id, and the requestState that names the
// approval, which the retry carries. The input request is the URL
// elicitation of the approval's status page when there is one and the
// client declares URL elicitation, else a form elicitation with nothing to
// fill in whose message says what the call awaits. Nil when c speaks an
// earlier version or its client declares no elicitation: such a caller is
// told with a tool error.
func (a *Approvals) inputRequired(c message.Call, ap approvals.Approval) map[string]any {
	if !speaksModern(c) || !elicits(c.Meta, false) {
		return nil
	}
	params := map[string]any{"mode": "form", "message": waitMessage(ap, "accept to run it once"),
		"requestedSchema": map[string]any{"type": "object", "properties": map[string]any{}}}
	if page := a.page(ap.ID); page != "" && elicits(c.Meta, true) {
		params = urlElicitation(ap, page)
	}
	return map[string]any{
		"resultType":    "input_required",
		"inputRequests": map[string]any{ap.ID: map[string]any{"method": "elicitation/create", "params": params}},
		"requestState":  approvalStatePrefix + ap.ID,
	}
}

// elicits reports whether a 2026-07-28 request's _meta declares the
// elicitation capability (an object, which with no mode named means
// form), or, with url, its URL mode (elicitation.url an object).
func elicits(meta []byte, url bool) bool {
	if len(meta) == 0 {
		return false
	}
	path := []string{message.ClientCapabilitiesKey, "elicitation"}
	if url {
		path = append(path, "url")
	}
	v, ok := message.Lookup(meta, path)
	return ok && len(v) > 0 && v[0] == '{'
}

// declinedInput reports whether a retry's params answer the input request
// id with anything but accept (decline, cancel, or no answer).
func declinedInput(params []byte, id string) bool {
	v, ok := message.Lookup(params, []string{"inputResponses", id, "action"})
	if !ok {
		return true
	}
	s, isString, ok := message.Scalar(v)
	return !ok || !isString || s != "accept"
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

// WithoutRequestState takes the requestState and inputResponses out of
// the one call of b, the retry that [Approvals.Settle] allowed
// (Verdict.StripState): they answer the gateway's input_required, which
// the backend never made, and a backend that reads requestState would take
// the gateway's for its own. It returns the body read again and puts it
// back as r's body, so that the route forwards, and decides on, exactly
// it.
//
// Every other member keeps its bytes as the client sent them (the
// arguments the approval's digest is over among them): the message and
// its params are split into members as raw JSON and written back, in key
// order, without re-encoding a value. The body was read by package
// message, so its keys are unique and no member can hide behind another.
func WithoutRequestState(r *http.Request, b *message.Body) (*message.Body, error) {
	return rewriteParams(r, b, func(params map[string]json.RawMessage) {
		delete(params, "requestState")
		delete(params, "inputResponses")
	})
}

// RestoreRequestState puts the backend's requestState of round back in
// the one call of b, the retry of an approved call's round that
// [Approvals.Settle] allowed (Verdict.Round), in place of the gateway's,
// or takes the gateway's out when the backend gave none. The
// inputResponses stay: they answer the backend's question. Like
// [WithoutRequestState], it keeps every other member's bytes and puts
// the body back as r's.
func RestoreRequestState(r *http.Request, b *message.Body, round approvals.Round) (*message.Body, error) {
	// The state as a JSON string, without json.Marshal's HTML escapes:
	// the backend reads the same string either way, and this way a state
	// spelled plainly comes back as it went.
	var state bytes.Buffer
	enc := json.NewEncoder(&state)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(round.State); err != nil {
		return nil, err
	}
	return rewriteParams(r, b, func(params map[string]json.RawMessage) {
		delete(params, "requestState")
		if round.HasState {
			params["requestState"] = bytes.TrimSuffix(state.Bytes(), []byte("\n"))
		}
	})
}

// rewriteParams changes the params of the one call of b with edit, and
// puts the body, read again, back as r's.
func rewriteParams(r *http.Request, b *message.Body, edit func(map[string]json.RawMessage)) (*message.Body, error) {
	if b == nil || b.Batch || len(b.Calls) != 1 {
		return nil, errors.New("the retry of a held call must be one message")
	}
	var msg map[string]json.RawMessage
	if err := json.Unmarshal(b.Calls[0].Raw, &msg); err != nil {
		return nil, err
	}
	var params map[string]json.RawMessage
	if err := json.Unmarshal(msg["params"], &params); err != nil {
		return nil, err
	}
	edit(params)
	msg["params"] = rawObject(params)
	raw := rawObject(msg)
	nb, err := message.Read(raw)
	if err != nil {
		return nil, err
	}
	rb := &replayBody{body: raw}
	rb.Reset(raw)
	r.Body, r.ContentLength, r.GetBody = rb, int64(len(raw)), rb.again
	return nb, nil
}

// rawObject writes the members of m as a JSON object, in key order, each
// value's bytes as they are.
func rawObject(m map[string]json.RawMessage) []byte {
	var buf bytes.Buffer
	buf.WriteByte('{')
	for i, k := range slices.Sorted(maps.Keys(m)) {
		if i > 0 {
			buf.WriteByte(',')
		}
		key, _ := json.Marshal(k)
		buf.Write(key)
		buf.WriteByte(':')
		buf.Write(m[k])
	}
	buf.WriteByte('}')
	return buf.Bytes()
}

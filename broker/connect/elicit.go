package connect

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/message"
)

// Required is a call that cannot go on until its owner connects their
// account at an upstream: what [Answer] answers it with.
type Required struct {
	// ID is the call's JSON-RPC id as canonical JSON (message.ID.Raw).
	ID json.RawMessage
	// Method is the call's method: a tools/call of a client without URL
	// elicitation is answered with a tool error, which its model reads.
	Method string
	// Version is the protocol version the call speaks: from 2026-07-28
	// (message.ModernVersion) on, an input_required result; before, the
	// -32042 error.
	Version string
	// URLElicitation reports whether the client declared the URL
	// elicitation capability (see [URLCapable]).
	URLElicitation bool
	// Upstream is the upstream's name, as the person knows it.
	Upstream string
	// Link is the connect link made for this call's owner.
	Link Link
}

// requestStatePrefix starts the requestState of a connect answer, so that
// a retry carrying it is told from one carrying an upstream's own state.
const requestStatePrefix = "zidane-connect."

// RequestState is the requestState of the input_required answer for the
// elicitation id: the retry names the elicitation it followed.
func RequestState(elicitation string) string { return requestStatePrefix + elicitation }

// ElicitationOf is the elicitation id a retry's requestState names, if it
// is a connect answer's.
func ElicitationOf(requestState string) (string, bool) {
	id, ok := strings.CutPrefix(requestState, requestStatePrefix)
	return id, ok && id != ""
}

// elicitParams is MCP's ElicitRequestURLParams.
type elicitParams struct {
	Mode          string `json:"mode"`
	Message       string `json:"message"`
	URL           string `json:"url"`
	ElicitationID string `json:"elicitationId"`
}

type inputRequest struct {
	Method string       `json:"method"`
	Params elicitParams `json:"params"`
}

type rpcError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
	Data    any    `json:"data,omitempty"`
}

type textContent struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

type response struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id"`
	Result  any             `json:"result,omitempty"`
	Error   *rpcError       `json:"error,omitempty"`
}

// Message is what the person is asked: connect their account at the
// upstream, as themselves, before the link expires.
func (r Required) Message() string {
	return fmt.Sprintf("This request needs your own account at %s: connect your account by opening the link, signing in to the gateway as yourself if asked, and approving at %s. The link works once, for you alone, until %s.",
		r.Upstream, r.Upstream, r.Link.Expires.UTC().Format("15:04 UTC"))
}

func (r Required) params() elicitParams {
	return elicitParams{Mode: "url", Message: r.Message(), URL: r.Link.URL, ElicitationID: r.Link.Elicitation}
}

// Answer is the JSON-RPC response to a call that needs its owner to
// connect their account first:
//   - a client with the URL elicitation capability, at 2026-07-28 or
//     later: an input_required result whose one input request is the URL
//     elicitation, keyed by its id, and a requestState naming it, so that
//     the client's retry with inputResponses goes on once connected;
//   - such a client before 2026-07-28: the error -32042
//     (URLElicitationRequired) whose data.elicitations holds it; the
//     client retries after notifications/elicitation/complete;
//   - a client without the capability: for tools/call, a tool error whose
//     text names the URL (the model, and so the person, reads it); for
//     another method, the -32042 error, whose message names the URL.
func Answer(r Required) []byte {
	resp := response{JSONRPC: "2.0", ID: r.ID}
	modern := r.Version >= message.ModernVersion
	switch {
	case r.URLElicitation && modern:
		resp.Result = map[string]any{
			"resultType":    "input_required",
			"inputRequests": map[string]inputRequest{r.Link.Elicitation: {Method: "elicitation/create", Params: r.params()}},
			"requestState":  RequestState(r.Link.Elicitation),
		}
	case r.URLElicitation || r.Method != "tools/call":
		msg := "URL elicitation required: connect your account at " + r.Upstream
		if !r.URLElicitation {
			msg += " by opening " + r.Link.URL
		}
		resp.Error = &rpcError{Code: message.CodeURLElicitationRequired, Message: msg,
			Data: map[string]any{"elicitations": []elicitParams{r.params()}}}
	default:
		res := map[string]any{
			"content": []textContent{{Type: "text", Text: r.Message() + " Link: " + r.Link.URL + " Then call this tool again."}},
			"isError": true,
		}
		if modern {
			res["resultType"] = "complete"
		}
		resp.Result = res
	}
	b, err := json.Marshal(resp)
	if err != nil {
		// Every field is a string, a map of them or raw JSON the edge
		// read: it always encodes.
		panic(err)
	}
	return b
}

// CompleteNotification is notifications/elicitation/complete for the
// elicitation id: sent on the client's stream when the account is
// connected, so that a 2025-11-25 client retries its call.
func CompleteNotification(elicitation string) []byte {
	b, _ := json.Marshal(map[string]any{
		"jsonrpc": "2.0",
		"method":  "notifications/elicitation/complete",
		"params":  map[string]string{"elicitationId": elicitation},
	})
	return b
}

// URLCapable reports whether client capabilities (initialize's
// params.capabilities, or a 2026-07-28 request's _meta entry) declare URL
// elicitation: elicitation.url is an object. Capabilities that two JSON
// readers could read differently (a duplicate key) declare nothing.
func URLCapable(capabilities []byte) bool {
	if len(capabilities) == 0 || message.Validate(capabilities) != nil {
		return false
	}
	v, ok := message.Lookup(capabilities, []string{"elicitation", "url"})
	return ok && len(v) > 0 && v[0] == '{'
}

// MetaCapabilities is the client capabilities a 2026-07-28 request
// carries in its params._meta (message.Call.Meta); nil when none.
func MetaCapabilities(meta []byte) []byte {
	if len(meta) == 0 {
		return nil
	}
	v, _ := message.Lookup(meta, []string{message.ClientCapabilitiesKey})
	return v
}

// Declined reports whether a retry's params answer the elicitation id
// with anything but accept (decline, cancel): the person said no, and the
// call ends with a tool error rather than another link.
func Declined(params []byte, elicitation string) bool {
	v, ok := message.Lookup(params, []string{"inputResponses", elicitation, "action"})
	if !ok {
		return false
	}
	s, isString, ok := message.Scalar(v)
	return !ok || !isString || s != "accept"
}

// RetryWait bounds how long the retry of a call answered with a connect
// elicitation waits for its person to finish connecting: a client opens
// the link and retries at once, while the person is still at the
// upstream.
const RetryWait = 2 * time.Minute

// Errors of [Service.Settle].
var (
	// ErrDeclined: the retry answers the connect elicitation with decline
	// or cancel; the call ends with [DeclinedAnswer].
	ErrDeclined = errors.New("the person declined to connect their account")
	// ErrRetryNotYours: the retry carries a connect requestState that was
	// not made for this caller and this upstream (made up, another
	// person's, another upstream's, or expired); it is refused, never sent.
	ErrRetryNotYours = errors.New("this retry's requestState was not issued to this caller for this upstream")
)

// IsConnectState reports whether a retry's requestState has the shape of
// a connect answer's: the gateway's own, never an upstream's to read.
func IsConnectState(requestState string) bool {
	return strings.HasPrefix(requestState, requestStatePrefix)
}

// Settle is for owner's call about to go to the per_user upstream: when
// it is the 2026-07-28 retry of a call answered with a connect
// elicitation, it waits, at most RetryWait or until ctx ends, for owner
// to finish connecting, and then lets the call go on (nil). A call that
// carries no connect requestState goes on at once. A retry that answers
// decline or cancel gets [ErrDeclined]; one whose requestState names no
// live link made for owner at upstream gets [ErrRetryNotYours], before
// any wait: a requestState made up, copied from another person, or made
// for another upstream holds nothing open and reaches no upstream.
func (s *Service) Settle(ctx context.Context, owner, upstream string, c message.Call) error {
	if !IsConnectState(c.RequestState) {
		return nil
	}
	id, ok := ElicitationOf(c.RequestState)
	var made time.Time
	if ok {
		made, ok = s.links.issued(ctx, owner, upstream, id)
	}
	if !ok {
		return ErrRetryNotYours
	}
	if Declined(c.Params, id) {
		return ErrDeclined
	}
	// The person may have connected through another of their links (a
	// client that asked twice): any connection since this link was made
	// lets the call go on.
	ctx, cancel := context.WithTimeout(ctx, RetryWait)
	defer cancel()
	s.WaitConnected(ctx, owner, upstream, made)
	return nil
}

// SettleAny is [Service.Settle] for a route that does not say which
// upstream the call is for (the aggregated route's): the upstream is the
// one owner's link of that elicitation was made for. It reports whether
// the person declined; a requestState that names no live link of owner's
// lets the call go on at once, to be answered as any call of a person
// not connected.
func (s *Service) SettleAny(ctx context.Context, owner string, c message.Call) (declined bool) {
	id, ok := ElicitationOf(c.RequestState)
	if !ok {
		return false
	}
	up, ok := s.links.upstreamOf(ctx, owner, id)
	if !ok {
		return false
	}
	return errors.Is(s.Settle(ctx, owner, up, c), ErrDeclined)
}

// RetryAnswer is the answer to a retry that [Service.Settle] refused:
// for [ErrDeclined] the tool error saying the person declined (or, for
// another method, the -32042 error), for [ErrRetryNotYours] a JSON-RPC
// error -32602 saying to call again without that state. The status is
// the HTTP status to send it with.
func RetryAnswer(c message.Call, upstream string, err error) (status int, body []byte) {
	version := "2025-11-25"
	if c.HasMetaVersion {
		version = c.MetaVersion
	}
	if errors.Is(err, ErrDeclined) {
		return http.StatusOK, declinedAnswer(c, upstream, version)
	}
	b, _ := json.Marshal(response{JSONRPC: "2.0", ID: c.ID.Raw(), Error: &rpcError{Code: message.CodeInvalidParams,
		Message: fmt.Sprintf("this retry's requestState was not issued to you for %s (it is another person's, another upstream's, expired or made up), so the request was not made; call again without requestState and inputResponses", upstream)}})
	return http.StatusForbidden, b
}

// Refuse answers owner's call c that cannot go to upstream for want of
// owner's connected account: it makes a connect link and returns
// [Answer]'s response for the call's protocol version and the client's
// capabilities (from c's _meta at 2026-07-28; before, from c itself when
// it is the initialize, else initCaps, the session's initialize's). A retry whose person declined
// gets a tool error (or, for another method than tools/call, the -32042
// error) saying so, and no new link.
func (s *Service) Refuse(ctx context.Context, owner, upstream string, c message.Call, initCaps []byte) ([]byte, error) {
	version, caps := "2025-11-25", initCaps
	switch {
	case c.HasMetaVersion:
		version, caps = c.MetaVersion, MetaCapabilities(c.Meta)
	case c.Method == "initialize":
		// Refused at the handshake itself: the capabilities are in it.
		caps, _ = message.Lookup(c.Params, []string{"capabilities"})
	}
	if id, ok := ElicitationOf(c.RequestState); ok && Declined(c.Params, id) {
		if _, mine := s.links.issued(ctx, owner, upstream, id); mine {
			return declinedAnswer(c, upstream, version), nil
		}
	}
	link, err := s.Create(ctx, owner, upstream)
	if err != nil {
		return nil, err
	}
	return Answer(Required{ID: c.ID.Raw(), Method: c.Method, Version: version, URLElicitation: URLCapable(caps), Upstream: upstream, Link: link}), nil
}

func declinedAnswer(c message.Call, upstream, version string) []byte {
	text := fmt.Sprintf("You declined to connect your account at %s, so this request was not made. Call again to be asked again.", upstream)
	resp := response{JSONRPC: "2.0", ID: c.ID.Raw()}
	if c.Method == "tools/call" {
		res := map[string]any{"content": []textContent{{Type: "text", Text: text}}, "isError": true}
		if version >= message.ModernVersion {
			res["resultType"] = "complete"
		}
		resp.Result = res
	} else {
		resp.Error = &rpcError{Code: message.CodeURLElicitationRequired, Message: text}
	}
	b, _ := json.Marshal(resp)
	return b
}

// Respond writes, in w, Refuse's answer to the request r: the call whose
// id is rpcID in the body the edge read and decided on (message.
// FromContext), refused because owner has not connected their account at
// upstream. It is what a route's refusal of a per_user call hands the
// caller. A request whose body is not in its context is answered by its
// method and id alone, as a client without the capability.
func (s *Service) Respond(w http.ResponseWriter, r *http.Request, owner, upstream string, rpcID json.RawMessage, method string, initCaps []byte) {
	c := message.Call{Method: method}
	if id, err := message.ParseID(rpcID); err == nil {
		c.ID = id
	}
	if body, ok := message.FromContext(r.Context()); ok {
		for _, bc := range body.Calls {
			if !bc.ID.IsZero() && bc.ID == c.ID {
				c = bc
				break
			}
		}
	}
	b, err := s.Refuse(r.Context(), owner, upstream, c, initCaps)
	if err != nil {
		status, code := http.StatusServiceUnavailable, message.CodeUnavailable
		msg := fmt.Sprintf("your account at %s is not connected, and a link to connect it could not be made (%v); try again", upstream, err)
		if errors.Is(err, ErrNotPerson) {
			status, code = http.StatusForbidden, message.CodeForbidden
			msg = fmt.Sprintf("%s takes each person's own account, and this credential does not belong to a person who can sign in to the gateway to connect one (%v); use a credential of your own, signed in", upstream, err)
		}
		b, _ = json.Marshal(response{JSONRPC: "2.0", ID: c.ID.Raw(), Error: &rpcError{Code: code, Message: msg}})
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = w.Write(b)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_, _ = w.Write(b)
}

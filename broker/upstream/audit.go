package upstream

import (
	"errors"
	"net/http"
	"net/url"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/broker/answerlimit"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Outcomes of a [CallRecord] other than an HTTP status text.
const (
	// OutcomeOK: the upstream answered 2xx and its answer was relayed
	// until one side ended it. A client may stop reading an SSE answer
	// once it has its response, and a standalone GET stream ends when the
	// client leaves, so leaving after the answer began is still "ok".
	OutcomeOK = "ok"
	// OutcomeError: the upstream could not be reached, did not answer in
	// time, broke off its answer, or answered something the gateway does
	// not relay (a redirect it would not follow, an invalid session id).
	OutcomeError = "error"
	// OutcomeCanceled: the client went away before the upstream answered,
	// and the upstream request was cancelled.
	OutcomeCanceled = "canceled"
	// OutcomeAuthRequired: not sent, since the upstream waits for an
	// operator's OAuth login.
	OutcomeAuthRequired = "auth_required"
	// OutcomeConnectRequired: not sent, since the upstream takes each
	// person's own token (credentials per_user) and the caller has none.
	OutcomeConnectRequired = "connect_required"
)

// ClientIPHeader carries the client's address, as the zidane_mcp edge
// saw it, to the broker's routes, for their audit records. The edge
// removes every copy a client sent before it sets its own, and it never
// leaves the gateway: the pass-through route forwards an allow-list of
// headers, which does not hold it, and the aggregated route's upstream
// requests are its own.
const ClientIPHeader = "Zidane-Client-Ip"

// ClientIP is the client's address that the edge put in h.
func ClientIP(h http.Header) string {
	if h == nil {
		return ""
	}
	return h.Get(ClientIPHeader)
}

// ExtraClientIP is ClientIP of a go-sdk request's HTTP header.
func ExtraClientIP(extra *mcp.RequestExtra) string {
	if extra == nil {
		return ""
	}
	return ClientIP(extra.Header)
}

// CallRecord describes one exchange with an upstream, for audit: one
// client request forwarded (a POST of JSON-RPC messages, a GET stream, a
// DELETE) and how it ended. It never holds a header value, a session id or
// a body.
type CallRecord struct {
	// Upstream is the upstream's name.
	Upstream string
	// Route is the route identity, such as "broker:github".
	Route string
	// HTTPMethod is POST, GET or DELETE.
	HTTPMethod string
	// Method is the JSON-RPC method of the first message of a POST; empty
	// for GET and DELETE, and for a POST that only carries the client's
	// answers to the server's requests (sampling, elicitation, roots).
	Method string
	// Tool is params.name of the first tools/call in a POST.
	Tool string
	// TokenID and TokenName identify the principal the request acted for.
	TokenID   string
	TokenName string
	// ClientIP is the address of the client the request came from, as the
	// edge saw it ([ClientIPHeader]); empty when the edge gave none.
	ClientIP string
	// Outcome is [OutcomeOK], [OutcomeError], [OutcomeCanceled], or the
	// status text of an upstream answer that was not 2xx ("Not Found",
	// "Unauthorized", …).
	Outcome string
	// Status is the upstream's HTTP status; 0 when it never answered.
	Status int
	// Detail says what went wrong for OutcomeError, in words for an
	// operator, without URLs' queries or header values; empty otherwise.
	Detail string
	// Duration runs from the request's arrival to the end of the relayed
	// answer, streams included.
	Duration time.Duration
}

// Refusal describes a request the route refused before any upstream call,
// for audit. It never holds a header value, a session id or a body.
type Refusal struct {
	// Upstream is the upstream's name.
	Upstream string
	// Route is the route identity, such as "broker:github".
	Route string
	// HTTPMethod is the client request's method.
	HTTPMethod string
	// Method is the JSON-RPC method of the first message of a POST, when
	// the body was read before the refusal.
	Method string
	// TokenID and TokenName identify the principal, when the request had one.
	TokenID   string
	TokenName string
	// Reason is a stable code: "no_principal", "method_not_allowed",
	// "body_too_large", "body_unreadable", "session_repeated" or
	// "session_unknown".
	Reason string
	// Status is the HTTP status the client got.
	Status int
	// Detail says why, in words for an operator.
	Detail string
}

// SafeError returns err's text for a log or a record. net/http wraps a
// client error in a *url.Error that quotes the request URL with its query,
// where some upstreams take a key, so that layer is dropped; pinnedfetch's
// own errors are already redacted.
func SafeError(err error) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	return err.Error()
}

// LimitMessage is what a client is told of an answer over a limit.
func LimitMessage(err error) string {
	var tl *answerlimit.TooLargeError
	if errors.As(err, &tl) {
		return tl.Error()
	}
	var be *answerlimit.BudgetError
	if errors.As(err, &be) {
		return be.Error()
	}
	return SafeError(err)
}

package broker

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/pinnedfetch"
)

// DefaultHeaderTimeout bounds the wait for an upstream's response headers
// when the upstream sets no Timeout. Only the wait for headers is bounded:
// an SSE answer may then stream for as long as both sides keep it open.
const DefaultHeaderTimeout = 2 * time.Minute

// DefaultPassThroughMaxBody bounds a request body when
// [PassThroughOptions.MaxBodyBytes] is zero.
const DefaultPassThroughMaxBody = 4 << 20

// Header names of the streamable HTTP transport that both routes handle.
const (
	headerSessionID       = "Mcp-Session-Id"
	headerProtocolVersion = "Mcp-Protocol-Version"
)

type header struct{ name, value string }

// upstreamHeaders checks the expanded headers of e and returns them in
// canonical form, sorted by name.
func upstreamHeaders(e Upstream) ([]header, error) {
	var out []header
	for _, name := range sortedKeys(e.Headers) {
		value := e.Headers[name]
		canonical := http.CanonicalHeaderKey(name)
		if reservedUpstreamHeader(canonical) {
			return nil, fmt.Errorf("%s: header %s is set by the pass-through route for each request; remove it from headers", describe(e), canonical)
		}
		if v, ok := firstPlaceholder(value); ok {
			return nil, fmt.Errorf("%s: header %s still holds the placeholder for %s: set %s in the environment of the Caddy process, or give a default with ${%s:-…}", describe(e), canonical, v, v, v)
		}
		if strings.ContainsAny(value, "\r\n\x00") {
			return nil, fmt.Errorf("%s: header %s: after expansion the value holds a line break or NUL; fix the variable it comes from", describe(e), canonical)
		}
		out = append(out, header{canonical, value})
	}
	return out, nil
}

// credentials is the layer pinnedfetch calls only for hops to the pinned
// origin: it adds the upstream's configured headers.
type credentials struct {
	headers []header
	next    http.RoundTripper
}

func (c *credentials) RoundTrip(req *http.Request) (*http.Response, error) {
	// A RoundTripper must not modify the request it is given: copy the
	// header map, the only part it changes.
	r := req.WithContext(req.Context())
	r.Header = req.Header.Clone()
	for _, h := range c.headers {
		r.Header[h.name] = []string{h.value}
	}
	return c.next.RoundTrip(r)
}

// pinnedClient is the broker's egress client for one upstream: pinned to
// url's origin, the upstream's headers attached on that origin only, every
// redirect decision reported to onDecision.
func pinnedClient(url string, headers []header, onDecision func(pinnedfetch.Decision), denyPrivate *bool, creds func(http.RoundTripper) http.RoundTripper, noRedirects bool) (*http.Client, error) {
	names := make([]string, 0, len(headers))
	for _, h := range headers {
		names = append(names, h.name)
	}
	fetchOpts := []pinnedfetch.Option{pinnedfetch.WithDecisions(onDecision)}
	if len(headers) > 0 || creds != nil {
		fetchOpts = append(fetchOpts, pinnedfetch.WithCredentials(func(next http.RoundTripper) http.RoundTripper {
			if creds != nil {
				next = creds(next)
			}
			if len(headers) == 0 {
				return next
			}
			return &credentials{headers: headers, next: next}
		}))
	}
	if denyPrivate != nil {
		fetchOpts = append(fetchOpts, pinnedfetch.DenyPrivateAddresses(*denyPrivate))
	}
	if noRedirects {
		fetchOpts = append(fetchOpts, pinnedfetch.WithMaxRedirects(0))
	}
	return pinnedfetch.New(url, names, fetchOpts...)
}

// rpcError is a JSON-RPC error response.
type rpcError struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id"`
	Error   rpcErrorObject  `json:"error"`
}

type rpcErrorObject struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

// writeRPCError answers with a JSON-RPC error object. id is the request's
// id when the body held a single request, else null, as JSON-RPC asks when
// the id cannot be known.
func writeRPCError(w http.ResponseWriter, status int, id json.RawMessage, code int, message string) {
	body := rpcErrorAnswer(id, code, message)
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	w.Write(body)
}

// rpcErrorAnswer is the JSON-RPC error answer to id.
func rpcErrorAnswer(id json.RawMessage, code int, message string) []byte {
	if len(id) == 0 {
		id = json.RawMessage("null")
	}
	body, err := json.Marshal(rpcError{JSONRPC: "2.0", ID: id, Error: rpcErrorObject{code, message}})
	if err != nil {
		body, _ = json.Marshal(rpcError{JSONRPC: "2.0", ID: json.RawMessage("null"), Error: rpcErrorObject{code, message}})
	}
	return body
}

// Header names the pass-through route handles itself.
const headerParamPrefix = "Mcp-Param-"

// forwardedRequestHeaders is the allow-list of client request headers sent
// upstream, in canonical form. An allow-list rather than a deny-list: a
// header nobody thought about stays behind, so the client's Authorization,
// Cookie and Proxy-Authorization, anything identifying the client (Origin,
// Referer, User-Agent, X-Forwarded-*, Forwarded) and every hop-by-hop header
// never leave the edge. What passes is what the MCP transport needs and
// carries no credential:
//
//   - Content-Type and Accept: the transport's content negotiation (an MCP
//     server refuses a POST without both JSON and SSE in Accept);
//   - Mcp-Protocol-Version: the negotiated protocol version;
//   - Last-Event-Id: resuming an SSE stream;
//   - Mcp-Method, Mcp-Name and Mcp-Param-* (protocol 2026-07-28): copies of
//     the method, the tool, prompt or resource name and annotated tool
//     arguments, which the server checks against the body;
//   - Traceparent and Tracestate: W3C trace context, so a trace spans the
//     gateway.
//
// Mcp-Session-Id is not in the list: it is translated (see
// [PassThrough.ServeHTTP]). Accept-Encoding is left to the Go transport,
// which asks for gzip and decompresses itself.
var forwardedRequestHeaders = map[string]bool{
	"Content-Type":        true,
	"Accept":              true,
	headerProtocolVersion: true,
	"Last-Event-Id":       true,
	"Mcp-Method":          true,
	"Mcp-Name":            true,
	"Traceparent":         true,
	"Tracestate":          true,
}

// forwardRequestHeader reports whether the canonical header name passes
// the allow-list.
func forwardRequestHeader(name string) bool {
	return forwardedRequestHeaders[name] || strings.HasPrefix(name, headerParamPrefix)
}

// ReservedUpstreamHeader reports whether the pass-through route sets the
// header of that canonical name itself on every request, so that a
// configured header of that name is refused.
func ReservedUpstreamHeader(canonical string) bool { return reservedUpstreamHeader(canonical) }

// reservedUpstreamHeader reports whether a configured upstream header would
// clash with what the route sets on each request. Such a config is refused
// rather than allowed to override the translated session id or the
// transport's framing.
func reservedUpstreamHeader(canonical string) bool {
	switch canonical {
	case "Host", "Content-Length", "Transfer-Encoding", "Connection", "Te", "Trailer", "Upgrade",
		"Keep-Alive", "Proxy-Connection", "Accept-Encoding", "Content-Type", "Accept":
		return true
	}
	return forwardedRequestHeaders[canonical] || canonical == headerSessionID ||
		strings.HasPrefix(canonical, headerParamPrefix)
}

package edge

import (
	"bytes"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strings"

	"github.com/Tahul/caddy-zidane-mcp/message"
)

// allowedMethods are the HTTP methods of MCP's streamable HTTP transport,
// and OPTIONS for a browser's preflight.
const allowedMethods = "GET, POST, DELETE, OPTIONS"

// CheckSingleHeaders refuses (400 duplicate_header) a request that carries
// more than one Origin, Authorization or Mcp-Protocol-Version header, or a
// list of them in one: the edge judges one browser origin, authenticates
// one credential and reads the body by one protocol version, and
// a server behind it that read another (the last one, or the list an
// intermediary joins them into) would act on what the edge never judged.
// net/http gathers every spelling of a header name (origin, ORIGIN) under
// its canonical one, so they count as one header sent twice. A serialized
// origin holds no comma or space, and a bearer token no comma, so either in
// one value is a list. The adapter runs this first, before the Origin
// check and authentication; the message never repeats a value.
func CheckSingleHeaders(r *http.Request) Verdict {
	for _, h := range [...]struct {
		name, list, send string
	}{
		{"Origin", ", \t", "one Origin header with one origin, such as Origin: https://app.example"},
		{"Authorization", ",", "one Authorization header with one credential: Authorization: Bearer <token>"},
		// The version decides how the request is read (2026-07-28 or
		// 2025-11-25); servers read the first value or the last.
		{"Mcp-Protocol-Version", ", \t", "one Mcp-Protocol-Version header with one version, such as Mcp-Protocol-Version: 2025-11-25"},
	} {
		var what string
		switch values := r.Header[h.name]; {
		case len(values) > 1:
			what = "more than one " + h.name + " header"
		case len(values) == 1 && strings.ContainsAny(values[0], h.list):
			what = "an " + h.name + " header that lists several values"
		default:
			continue
		}
		return Verdict{Status: http.StatusBadRequest, Reason: ReasonDuplicateHeader, Code: message.CodeInvalidRequest,
			Message: fmt.Sprintf("this request carries %s, which servers could read differently: send %s", what, h.send)}
	}
	return Verdict{}
}

// CheckRequest refuses, before any body is read, what the edge never
// passes on: a request to switch protocols (400, an Upgrade header), an
// HTTP method that MCP does not use (405), and for a POST a body that is
// not plain JSON (415): a Content-Encoding other than identity would hide
// the body the edge decides on from it, and a Content-Type other than
// application/json is not a JSON-RPC message.
//
// OPTIONS is refused too: the edge answers a browser's preflight itself,
// before this step, so an OPTIONS that reaches it is none, and MCP has no
// other use for one.
func CheckRequest(r *http.Request) Verdict {
	if len(r.Header.Values("Upgrade")) > 0 {
		// MCP never switches protocols. Once a server behind guard answered
		// 101, reverse_proxy would join the two connections, and nothing
		// the client sent after it would be read, authorized or filtered.
		return Verdict{Status: http.StatusBadRequest, Reason: ReasonUpgrade, Code: message.CodeInvalidRequest,
			Message: "this MCP endpoint does not switch protocols: send the request without an Upgrade header (MCP's streamable HTTP transport uses plain POST, GET and DELETE)"}
	}
	switch r.Method {
	case http.MethodGet, http.MethodDelete:
		return Verdict{}
	case http.MethodPost:
	case http.MethodOptions:
		return Verdict{Status: http.StatusMethodNotAllowed, Reason: "method_not_allowed", Code: message.CodeInvalidRequest, Allow: allowedMethods,
			Message: "OPTIONS is answered here only as a browser's CORS preflight, with Origin and Access-Control-Request-Method: send JSON-RPC messages with POST, open a stream with GET, end a session with DELETE"}
	default:
		return Verdict{Status: http.StatusMethodNotAllowed, Reason: "method_not_allowed", Code: message.CodeInvalidRequest, Allow: allowedMethods,
			Message: fmt.Sprintf("HTTP method %s is not part of MCP's streamable HTTP transport: send JSON-RPC messages with POST, open a stream with GET, end a session with DELETE", r.Method)}
	}
	for _, enc := range r.Header.Values("Content-Encoding") {
		for _, e := range strings.Split(enc, ",") {
			if e = strings.TrimSpace(e); e != "" && !strings.EqualFold(e, "identity") {
				return Verdict{Status: http.StatusUnsupportedMediaType, Reason: ReasonUnsupportedMedia, Code: message.CodeInvalidRequest,
					Message: "a request body with a Content-Encoding is not accepted: send the JSON-RPC message uncompressed, without Content-Encoding"}
			}
		}
	}
	ct := r.Header.Values("Content-Type")
	if len(ct) != 1 || !jsonMediaType(ct[0]) {
		return Verdict{Status: http.StatusUnsupportedMediaType, Reason: ReasonUnsupportedMedia, Code: message.CodeInvalidRequest,
			Message: "a POST to this MCP endpoint carries a JSON-RPC message: send it with Content-Type: application/json"}
	}
	return Verdict{}
}

// jsonMediaType reports whether ct is application/json, in UTF-8 when it
// names a charset (JSON has no other, RFC 8259).
func jsonMediaType(ct string) bool {
	if ct == "application/json" {
		return true // what clients send, without mime's allocations
	}
	mt, params, err := mime.ParseMediaType(ct)
	if err != nil || mt != "application/json" {
		return false
	}
	for k, v := range params {
		if k != "charset" || !strings.EqualFold(v, "utf-8") {
			return false
		}
	}
	return true
}

// NoBody refuses a GET, DELETE or OPTIONS request that carries a body. MCP
// gives those no body, so the edge decides nothing on one; a server behind
// guard that read JSON-RPC from it anyway would run a call nobody
// authorized. A body announced (chunked, say) but empty passes, without
// its trailers (see ReadBody).
func NoBody(r *http.Request) Verdict {
	if r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
		r.Trailer = nil
		return Verdict{}
	}
	var one [1]byte
	if n, _ := io.ReadFull(r.Body, one[:]); n == 0 {
		r.Body, r.ContentLength, r.Trailer = http.NoBody, 0, nil
		return Verdict{}
	}
	return Verdict{Status: http.StatusBadRequest, Reason: ReasonUnexpectedBody, Code: message.CodeInvalidRequest,
		Message: fmt.Sprintf("a %s request to this MCP endpoint carries no body: send JSON-RPC messages with POST", r.Method)}
}

// ReadBody reads a POST's body, bounded by limit bytes (413 past it), and
// puts the same bytes back as r's body, so that the route forwards exactly
// what the edge decided on.
//
// It drops the request's trailers: header fields sent after a chunked
// body, which the edge never checked (an Authorization, an Mcp-Name that
// says something else than the body) and which reverse_proxy would pass
// on. MCP uses none.
func ReadBody(r *http.Request, limit int64) ([]byte, Verdict) {
	tooLarge := func(msg string) Verdict {
		return Verdict{Status: http.StatusRequestEntityTooLarge, Reason: "too_large", Message: msg}
	}
	if r.ContentLength > limit {
		return nil, tooLarge(fmt.Sprintf("request body of %d bytes is over the %d-byte limit; send a smaller request", r.ContentLength, limit))
	}
	var body []byte
	var err error
	if r.ContentLength > 0 {
		// The length is known (and bounded above): one read into a buffer
		// of that size. net/http reads no more than it says.
		body = make([]byte, r.ContentLength)
		_, err = io.ReadFull(r.Body, body)
	} else {
		body, err = io.ReadAll(io.LimitReader(r.Body, limit+1))
	}
	if err != nil {
		return nil, Verdict{Status: http.StatusBadRequest, Reason: ReasonMalformed, Code: message.CodeInvalidRequest,
			Message: "the request body could not be read; send it again"}
	}
	if int64(len(body)) > limit {
		return nil, tooLarge(fmt.Sprintf("request body is over the %d-byte limit; send a smaller request", limit))
	}
	rb := &replayBody{body: body}
	rb.Reset(body)
	r.Body = rb
	r.ContentLength = int64(len(body))
	r.Trailer = nil
	r.GetBody = rb.again
	return body, Verdict{}
}

// replayBody is the body the edge read, put back for the route to send on,
// and what GetBody gives for a retry: one allocation for both.
type replayBody struct {
	bytes.Reader
	body []byte
}

func (*replayBody) Close() error { return nil }

// again is the body from its start, for a transport that sends it again.
func (b *replayBody) again() (io.ReadCloser, error) {
	return io.NopCloser(bytes.NewReader(b.body)), nil
}

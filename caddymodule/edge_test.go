package caddymodule

import (
	"net/http"
	"strings"
	"testing"
)

// send sends in through e's handler as FuzzEdge does, and returns what
// reached the server behind and the client's status and body.
func (e *guardEdge) send(t *testing.T, in edgeInput) (*reached, int, string) {
	t.Helper()
	r, err := parseRequest(e.raw(in))
	if err != nil {
		t.Fatalf("net/http refuses the request: %v", err)
	}
	got, w := e.serve(t, r, in.flags)
	return got, w.Code, w.Body.String()
}

// The harness of FuzzEdge lets a call the token may make reach the server
// behind, as the operator configured it, and refuses the others: the
// fuzzer's invariants are about requests that do reach it.
func TestFuzzEdgeHarnessPassesAndRefuses(t *testing.T) {
	e := newGuardEdge(t)
	const call = `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"%s","arguments":{}}}`
	for _, c := range []struct {
		name   string
		in     edgeInput
		status int
		passed bool
	}{
		{"tool a, token a", edgeInput{http.MethodPost, "/mcp", "", []byte(strings.Replace(call, "%s", "a", 1)), credToolA | flagContentType}, 200, true},
		{"tool b, token a", edgeInput{http.MethodPost, "/mcp", "", []byte(strings.Replace(call, "%s", "b", 1)), credToolA | flagContentType}, 403, false},
		{"tool b, mcp token", edgeInput{http.MethodPost, "/mcp", "", []byte(strings.Replace(call, "%s", "b", 1)), credAll | flagContentType | flagChunked}, 200, true},
		{"tool a, no token", edgeInput{http.MethodPost, "/mcp", "", []byte(strings.Replace(call, "%s", "a", 1)), flagContentType}, 401, false},
		{"GET stream, token a", edgeInput{http.MethodGet, "/mcp", "", nil, credToolA}, 200, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, status, body := e.send(t, c.in)
			if status != c.status || (got != nil) != c.passed {
				t.Fatalf("answered %d (passed on: %v), want %d (%v): %s", status, got != nil, c.status, c.passed, body)
			}
			if got != nil && got.header.Get("Authorization") != "Bearer "+upstreamSecret {
				t.Fatalf("the server behind got Authorization %q, not the guard's upstream header", got.header.Get("Authorization"))
			}
			if c.in.flags&credMask == credToolA && strings.Contains(body, `"name":"b"`) {
				t.Fatalf("token a was shown tool b: %s", body)
			}
			e.check(t, c.in)
		})
	}
}

// FuzzEdge found that an OPTIONS that is no preflight reached the server
// behind the guard: the edge answers a browser's preflight itself, so it
// refuses any other OPTIONS (405) instead of passing on a method that MCP
// does not use.
func TestOptionsIsAnsweredAsAPreflightOrRefused(t *testing.T) {
	e := newGuardEdge(t)
	for _, c := range []struct {
		name   string
		in     edgeInput
		status int
	}{
		{"a token, no Origin", edgeInput{http.MethodOptions, "/mcp", "", nil, credToolA}, http.StatusMethodNotAllowed},
		{"a token and an allowed Origin, no Access-Control-Request-Method", edgeInput{http.MethodOptions, "/mcp", "", nil, credAll | flagOrigin}, http.StatusMethodNotAllowed},
		{"a browser's preflight", edgeInput{http.MethodOptions, "/mcp", "Access-Control-Request-Method: POST\nAccess-Control-Request-Headers: authorization\n", nil, flagOrigin}, http.StatusNoContent},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, status, body := e.send(t, c.in)
			if got != nil {
				t.Fatalf("OPTIONS reached the server behind the guard (answered %d)", status)
			}
			if status != c.status {
				t.Fatalf("answered %d, want %d: %s", status, c.status, body)
			}
			if status == http.StatusMethodNotAllowed && (!strings.Contains(body, `"method_not_allowed"`) || !strings.Contains(body, "preflight")) {
				t.Fatalf("the refusal does not say why: %s", body)
			}
		})
	}
}

// A seed of FuzzEdge showed that trailers reached the server behind the
// guard: header fields after a chunked body, which the edge never checked
// and reverse_proxy passes on, so that a client's token declared as a
// trailer reached the upstream (TestGuardDropsTrailers). The edge drops
// them with the body it read.
func TestTrailersDoNotReachTheServerBehind(t *testing.T) {
	e := newGuardEdge(t)
	const list = `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`
	for _, c := range []struct {
		name string
		in   edgeInput
	}{
		{"a POST", edgeInput{http.MethodPost, "/mcp", "Transfer-Encoding: chunked\nTrailer: Authorization, Mcp-Name\n",
			[]byte("2e\r\n" + list + "\r\n0\r\nAuthorization: Bearer zds_the-clients-own\r\nMcp-Name: b\r\n\r\n"), credToolA | flagContentType}},
		{"a GET with an empty body", edgeInput{http.MethodGet, "/mcp", "Transfer-Encoding: chunked\nTrailer: Mcp-Method\n",
			[]byte("0\r\nMcp-Method: tools/call\r\n\r\n"), credAll}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, status, body := e.send(t, c.in)
			if got == nil {
				t.Fatalf("refused %d: %s", status, body)
			}
			if len(got.trailer) != 0 {
				t.Fatalf("trailers %q reached the server behind", got.trailer)
			}
		})
	}
}

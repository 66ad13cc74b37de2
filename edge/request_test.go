package edge

import (
	"bufio"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/Tahul/caddy-zidane-mcp/message"
)

func TestCheckRequest(t *testing.T) {
	cases := []struct {
		method string
		header http.Header
		status int
		reason string
	}{
		{http.MethodPost, http.Header{"Content-Type": {"application/json"}}, 0, ""},
		{http.MethodPost, http.Header{"Content-Type": {"application/json; charset=utf-8"}}, 0, ""},
		{http.MethodPost, http.Header{"Content-Type": {"Application/JSON; charset=UTF-8"}}, 0, ""},
		{http.MethodPost, http.Header{"Content-Type": {"application/json"}, "Content-Encoding": {"identity"}}, 0, ""},
		{http.MethodGet, nil, 0, ""},
		{http.MethodDelete, nil, 0, ""},
		{http.MethodOptions, nil, 405, "method_not_allowed"},
		{http.MethodOptions, http.Header{"Origin": {"http://localhost:6274"}}, 405, "method_not_allowed"},
		{http.MethodPost, http.Header{"Content-Type": {"application/json"}, "Content-Encoding": {"gzip"}}, 415, "unsupported_media_type"},
		{http.MethodPost, http.Header{"Content-Type": {"application/json"}, "Content-Encoding": {"identity, br"}}, 415, "unsupported_media_type"},
		{http.MethodPost, http.Header{"Content-Type": {"text/plain"}}, 415, "unsupported_media_type"},
		{http.MethodPost, http.Header{"Content-Type": {"application/json; charset=latin1"}}, 415, "unsupported_media_type"},
		{http.MethodPost, http.Header{"Content-Type": {"application/json", "text/plain"}}, 415, "unsupported_media_type"},
		{http.MethodPost, nil, 415, "unsupported_media_type"},
		{http.MethodPut, nil, 405, "method_not_allowed"},
		{http.MethodPatch, nil, 405, "method_not_allowed"},
		{"PROPFIND", nil, 405, "method_not_allowed"},
	}
	for _, tc := range cases {
		r := httptest.NewRequest(tc.method, "/mcp", nil)
		r.Header = tc.header
		if r.Header == nil {
			r.Header = http.Header{}
		}
		v := CheckRequest(r)
		if v.Status != tc.status || v.Reason != tc.reason {
			t.Errorf("%s %v: %d %q, want %d %q", tc.method, tc.header, v.Status, v.Reason, tc.status, tc.reason)
		}
		if v.Status == 405 && v.Allow != "GET, POST, DELETE, OPTIONS" {
			t.Errorf("405 without Allow: %q", v.Allow)
		}
		if v.Status != 0 && !strings.Contains(v.Message, "send") {
			t.Errorf("%s %v: the refusal does not say what to send: %q", tc.method, tc.header, v.Message)
		}
	}
}

// The edge judges one Origin and authenticates one credential. A request
// that carries either twice, or a list of them in one header, is refused
// before either is looked at: a server behind that read the other one (the
// last, or the whole list) would act on something the edge never judged.
func TestCheckSingleHeaders(t *testing.T) {
	cases := []struct {
		name   string
		raw    string // the request's header lines
		reason string
	}{
		{"neither", "", ""},
		{"one of each", "Origin: https://app.example\r\nAuthorization: Bearer zds_one\r\n", ""},
		{"the null Origin", "Origin: null\r\n", ""},
		{"a Bearer token with padding", "Authorization: Bearer abc+/de==\r\n", ""},
		{"two Origins, the allowed one first", "Origin: http://localhost:6274\r\nOrigin: https://evil.example\r\n", "duplicate_header"},
		{"two equal Origins", "Origin: https://app.example\r\nOrigin: https://app.example\r\n", "duplicate_header"},
		{"Origin in two spellings", "origin: http://localhost:6274\r\nORIGIN: https://evil.example\r\n", "duplicate_header"},
		{"an empty Origin, then one", "Origin:\r\nOrigin: https://evil.example\r\n", "duplicate_header"},
		{"two Authorizations", "Authorization: Bearer zds_one\r\nAuthorization: Bearer zds_two\r\n", "duplicate_header"},
		{"Authorization in two spellings", "authorization: Bearer zds_one\r\nAuthorization: Bearer zds_two\r\n", "duplicate_header"},
		{"an Origin list joined with a comma", "Origin: http://localhost:6274, https://evil.example\r\n", "duplicate_header"},
		{"an Origin list joined with a space (RFC 6454)", "Origin: http://localhost:6274 https://evil.example\r\n", "duplicate_header"},
		{"an Authorization list joined with a comma", "Authorization: Bearer zds_one, Bearer zds_two\r\n", "duplicate_header"},
		{"one protocol version", "Mcp-Protocol-Version: 2025-11-25\r\n", ""},
		{"two protocol versions", "Mcp-Protocol-Version: 2025-11-25\r\nmcp-protocol-version: 2026-07-28\r\n", "duplicate_header"},
		{"a protocol version list", "Mcp-Protocol-Version: 2025-11-25, 2026-07-28\r\n", "duplicate_header"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			// Parsed as a server parses it, so that header names are
			// canonicalised as they are for the handler.
			raw := "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\n" + tc.raw + "\r\n"
			r, err := http.ReadRequest(bufio.NewReader(strings.NewReader(raw)))
			if err != nil {
				t.Fatal(err)
			}
			v := CheckSingleHeaders(r)
			if v.Reason != tc.reason {
				t.Fatalf("%q: reason %q, want %q (%+v)", tc.raw, v.Reason, tc.reason, v)
			}
			if tc.reason == "" {
				return
			}
			if v.Status != http.StatusBadRequest || v.Code != message.CodeInvalidRequest {
				t.Errorf("status %d code %d, want 400 %d", v.Status, v.Code, message.CodeInvalidRequest)
			}
			if !strings.Contains(v.Message, "send one") {
				t.Errorf("the refusal does not say what to send: %q", v.Message)
			}
			for _, secret := range []string{"zds_one", "zds_two"} {
				if strings.Contains(v.Message, secret) {
					t.Errorf("the refusal repeats a credential: %q", v.Message)
				}
			}
		})
	}
}

func TestReadBody(t *testing.T) {
	body := `{"jsonrpc":"2.0","id":1,"method":"ping"}`
	r := httptest.NewRequest(http.MethodPost, "/mcp", strings.NewReader(body))
	got, v := ReadBody(r, 1024)
	if !v.Allowed() || string(got) != body {
		t.Fatalf("ReadBody: %q %+v", got, v)
	}
	again, _ := io.ReadAll(r.Body)
	if string(again) != body {
		t.Errorf("the route reads %q, not the bytes decided on", again)
	}
	r = httptest.NewRequest(http.MethodPost, "/mcp", strings.NewReader(body))
	if _, v := ReadBody(r, 10); v.Status != http.StatusRequestEntityTooLarge {
		t.Errorf("over the limit: %+v", v)
	}
	r = httptest.NewRequest(http.MethodPost, "/mcp", io.NopCloser(strings.NewReader(body)))
	r.ContentLength = -1
	if _, v := ReadBody(r, 10); v.Status != http.StatusRequestEntityTooLarge {
		t.Errorf("over the limit, length unknown: %+v", v)
	}
}

// BenchmarkEdgeSmallCall is the edge's work on a typical tools/call beyond
// authentication: the HTTP checks, the one reading and the decision.
func BenchmarkEdgeSmallCall(b *testing.B) {
	rt := testRoutes(b)["guard"]
	body := []byte(`{"jsonrpc":"2.0","id":17,"method":"tools/call","params":{"name":"test_simple_text","arguments":{"text":"hello from the benchmark client"}}}`)
	r := httptest.NewRequest(http.MethodPost, "/mcp", nil)
	r.Header.Set("Content-Type", "application/json")
	b.ReportAllocs()
	for b.Loop() {
		if v := CheckRequest(r); !v.Allowed() {
			b.Fatal(v)
		}
		if d := Decide(rt.route, rt.p, http.MethodPost, r.Header, body); !d.Allowed() {
			b.Fatal(d.Verdict)
		}
	}
}

// A GET or DELETE with a body is refused: MCP gives them none, and the
// edge decides nothing on one. An announced but empty body passes.
func TestNoBody(t *testing.T) {
	for _, m := range []string{http.MethodGet, http.MethodDelete, http.MethodOptions} {
		r := httptest.NewRequest(m, "/mcp", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"secret"}}`))
		if v := NoBody(r); v.Status != http.StatusBadRequest || v.Reason != ReasonUnexpectedBody || !strings.Contains(v.Message, "POST") {
			t.Errorf("%s with a body: %+v", m, v)
		}
		chunked := httptest.NewRequest(m, "/mcp", io.NopCloser(strings.NewReader("x")))
		chunked.ContentLength = -1
		if v := NoBody(chunked); v.Allowed() {
			t.Errorf("%s with a body of unknown length passed", m)
		}
		empty := httptest.NewRequest(m, "/mcp", io.NopCloser(strings.NewReader("")))
		empty.ContentLength = -1
		if v := NoBody(empty); !v.Allowed() {
			t.Errorf("%s with an empty body of unknown length: %+v", m, v)
		}
		if v := NoBody(httptest.NewRequest(m, "/mcp", nil)); !v.Allowed() {
			t.Errorf("%s without a body: %+v", m, v)
		}
	}
}

// A request to switch protocols is refused on every method: after a 101,
// the connection would carry bytes the edge never reads.
func TestCheckRequestRefusesUpgrade(t *testing.T) {
	for _, method := range []string{http.MethodGet, http.MethodPost, http.MethodDelete, http.MethodOptions} {
		for _, up := range []string{"websocket", "h2c", "anything"} {
			r := httptest.NewRequest(method, "/mcp", nil)
			r.Header.Set("Content-Type", "application/json")
			r.Header.Set("Connection", "Upgrade")
			r.Header.Set("Upgrade", up)
			if v := CheckRequest(r); v.Status != http.StatusBadRequest || v.Reason != ReasonUpgrade {
				t.Errorf("%s with Upgrade: %s: got %d %q; want 400 %q", method, up, v.Status, v.Reason, ReasonUpgrade)
			}
		}
	}
}

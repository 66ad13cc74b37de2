package caddymodule

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/Tahul/caddy-zidane-mcp/internal/hostile"
	"github.com/Tahul/caddy-zidane-mcp/message"
	"github.com/Tahul/caddy-zidane-mcp/policy"
)

// FuzzEdge sends random HTTP/1.1 requests (method, target, header lines,
// body, framing) through the zidane_mcp handler in guard mode, provisioned
// as Caddy provisions it, with a next handler that records what reached it
// and answers as an MCP server would. The invariants are what a client and
// the server behind the guard can observe:
//
//   - the handler never panics and never returns an error;
//   - a request that reaches no server gets a refusal (400, 401, 403, 404,
//     405, 413, 415, 429 or 503) with a JSON-RPC error body that names its
//     reason, or the edge's own answer: 204 with no body to a browser's
//     preflight, and the public documents (RFC 9728 metadata, the OAuth
//     callback) under their own paths;
//   - what reaches the server is a GET, POST or DELETE with a valid token,
//     without the client's credential (the guard's upstream header in its
//     place), without Accept-Encoding and without trailers (header fields
//     the edge never checked, which reverse_proxy passes on); a GET or
//     DELETE has no body; a
//     POST carries exactly the bytes the client sent, JSON in UTF-8, which
//     package message reads in one way only, with Mcp-Method and Mcp-Name
//     headers that agree with it; and for the token scoped to tool a, that
//     reading holds no call but tools/call of a, the methods open to every
//     token, notifications and responses;
//   - the server's answer reaches the client with its status, and the token
//     scoped to tool a sees no other tool in a listing.
//
// Run it with go test -run='^$' -fuzz=FuzzEdge -parallel=1 ./caddymodule/.
func FuzzEdge(f *testing.F) {
	e := newGuardEdge(f)
	for _, s := range edgeSeeds(f) {
		f.Add(s.method, s.target, s.headers, s.body, s.flags)
	}
	f.Fuzz(func(t *testing.T, method, target, headers string, body []byte, flags byte) {
		e.check(t, edgeInput{method, target, headers, body, flags})
	})
}

// edgeInput is one fuzzed request.
type edgeInput struct {
	method, target, headers string
	body                    []byte
	flags                   byte
}

// The bits of edgeInput.flags.
const (
	credMask        = 3 // which credential the request carries: see the cred* constants
	flagContentType = 1 << 2
	flagAccept      = 1 << 3
	flagChunked     = 1 << 4
	flagNoHost      = 1 << 5
	flagSSEAnswer   = 1 << 6 // the server behind answers POSTs with an event stream
	flagOrigin      = 1 << 7 // the allowed browser Origin
)

const (
	credNone = iota
	credToolA
	credAll
	credUnknown
)

const (
	edgeHost         = "127.0.0.1:8080"
	edgeOrigin       = "http://localhost:6274"
	upstreamEnv      = "ZIDANE_FUZZ_UPSTREAM_TOKEN"
	upstreamSecret   = "upstream-secret-of-the-guard"
	unknownSecret    = "zds_notatokenofthisgatewayatall0000000000"
	toolAScope       = "tool-a"
	allowedToolForA  = "a"
	forbiddenForA    = "b"
	edgeMaxBodyBytes = 64 << 10
)

// openToEveryToken are the methods that a token needs no scope for in
// guard mode (initialize, pings, listings, which are filtered, and the
// 2026-07-28 discovery and subscription), written out here so that a
// change that opens another one fails this test.
var openToEveryToken = []string{
	"initialize", "ping", "tools/list", "prompts/list", "resources/list",
	"resources/templates/list", "logging/setLevel", "server/discover", "subscriptions/listen",
}

// guardEdge is a guard-mode handler with two tokens: one scoped to tool a
// only, one with the mcp scope (every tool and method).
type guardEdge struct {
	h             *Handler
	toolA, all    string // secrets
	toolAName     string
	allName       string
	forbiddenTool string
}

// newGuardEdge loads a Caddy config that holds only the zidane app (no
// server listens, the admin API is off) and provisions a guard-mode
// Handler in its context, as Caddy would for
//
//	zidane_mcp {
//		guard {
//			upstream_header Authorization "Bearer {env.ZIDANE_FUZZ_UPSTREAM_TOKEN}"
//		}
//		allowed_origins http://localhost:6274
//		max_body 64KiB
//		scope tool-a tools a
//		rate_limit { ... high enough never to be reached ... }
//	}
func newGuardEdge(tb testing.TB) *guardEdge {
	tb.Helper()
	return newGuardEdgeWith(tb, nil)
}

// newGuardEdgeWith is newGuardEdge with the site's policy rules.
func newGuardEdgeWith(tb testing.TB, rules []PolicyRule) *guardEdge {
	tb.Helper()
	tb.Setenv(upstreamEnv, upstreamSecret)
	dir := tb.TempDir()
	cfg, err := json.Marshal(map[string]any{
		"admin":   map[string]any{"disabled": true, "config": map[string]any{"persist": false}},
		"storage": map[string]any{"module": "file_system", "root": filepath.Join(dir, "storage")},
		// Every log line is built (audit included) and thrown away.
		"logging": map[string]any{"logs": map[string]any{"default": map[string]any{
			"writer": map[string]any{"output": "discard"}, "level": "DEBUG"}}},
		"apps": map[string]any{"zidane": map[string]any{}},
	})
	if err != nil {
		tb.Fatal(err)
	}
	if err := caddy.Load(cfg, true); err != nil {
		tb.Fatalf("loading the zidane app: %v", err)
	}
	tb.Cleanup(func() { _ = caddy.Stop() })
	ctx := caddy.ActiveContext()
	lots := &policy.Limit{Rate: 1e9, Burst: 1 << 30}
	h := &Handler{
		RouteRaw:       routeJSON(&Guard{UpstreamHeaders: map[string]string{"Authorization": "Bearer {env." + upstreamEnv + "}"}}),
		AllowedOrigins: []string{edgeOrigin},
		MaxBodyBytes:   edgeMaxBodyBytes,
		Scopes:         []policy.Rule{{Scope: toolAScope, Tools: []string{allowedToolForA}}},
		RateLimit:      &RateLimit{PerToken: lots, PerIP: lots},
		Policy:         rules,
	}
	if err := h.Provision(ctx); err != nil {
		tb.Fatalf("provision: %v", err)
	}
	if err := h.Validate(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = h.Cleanup() })
	e := &guardEdge{h: h, toolAName: "only-a", allName: "everything", forbiddenTool: forbiddenForA}
	for _, tok := range []struct {
		secret *string
		spec   policy.TokenSpec
	}{
		{&e.toolA, policy.TokenSpec{Name: e.toolAName, Scopes: []string{toolAScope}}},
		{&e.all, policy.TokenSpec{Name: e.allName, Scopes: []string{"mcp"}}},
	} {
		if *tok.secret, _, err = h.tokens.Create(context.Background(), tok.spec); err != nil {
			tb.Fatal(err)
		}
	}
	return e
}

// secret is the credential that flags choose, "" for none.
func (e *guardEdge) secret(flags byte) string {
	switch flags & credMask {
	case credToolA:
		return e.toolA
	case credAll:
		return e.all
	case credUnknown:
		return unknownSecret
	}
	return ""
}

// raw writes in as an HTTP/1.1 request as a client would put it on the
// wire. The header lines are the fuzzer's; a framing header among them
// (Content-Length, Transfer-Encoding) replaces the one raw would add.
func (e *guardEdge) raw(in edgeInput) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "%s %s HTTP/1.1\r\n", in.method, in.target)
	if in.flags&flagNoHost == 0 {
		b.WriteString("Host: " + edgeHost + "\r\n")
	}
	if s := e.secret(in.flags); s != "" {
		b.WriteString("Authorization: Bearer " + s + "\r\n")
	}
	if in.flags&flagContentType != 0 {
		b.WriteString("Content-Type: application/json\r\n")
	}
	if in.flags&flagAccept != 0 {
		b.WriteString("Accept: application/json, text/event-stream\r\n")
	}
	if in.flags&flagOrigin != 0 {
		b.WriteString("Origin: " + edgeOrigin + "\r\n")
	}
	framed := false
	for line := range strings.SplitSeq(in.headers, "\n") {
		line = strings.TrimSuffix(line, "\r")
		if line == "" {
			continue
		}
		if k, _, _ := strings.Cut(line, ":"); strings.EqualFold(strings.TrimSpace(k), "Content-Length") || strings.EqualFold(strings.TrimSpace(k), "Transfer-Encoding") {
			framed = true
		}
		b.WriteString(line + "\r\n")
	}
	switch {
	case framed:
		b.WriteString("\r\n")
		b.Write(in.body)
	case in.flags&flagChunked != 0:
		b.WriteString("Transfer-Encoding: chunked\r\n\r\n")
		for rest := in.body; len(rest) > 0; {
			n := min(len(rest), 7) // several chunks for a body of some length
			fmt.Fprintf(&b, "%x\r\n%s\r\n", n, rest[:n])
			rest = rest[n:]
		}
		b.WriteString("0\r\n\r\n")
	default:
		fmt.Fprintf(&b, "Content-Length: %d\r\n\r\n", len(in.body))
		b.Write(in.body)
	}
	return b.Bytes()
}

// parseRequest reads raw as net/http's server does before it calls a
// handler, and refuses what that server answers itself (a malformed
// request line or header, a missing Host, an Expect it does not meet).
func parseRequest(raw []byte) (*http.Request, error) {
	r, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(raw)))
	if err != nil {
		return nil, err
	}
	// ReadRequest moved Host into r.Host.
	if r.ProtoMajor != 1 || (r.ProtoAtLeast(1, 1) && r.Host == "") {
		return nil, errors.New("refused by net/http")
	}
	if exp := r.Header.Get("Expect"); exp != "" && !strings.EqualFold(exp, "100-continue") {
		return nil, errors.New("refused by net/http")
	}
	for k, vv := range r.Header {
		if !validFieldName(k) {
			return nil, errors.New("invalid header name")
		}
		for _, v := range vv {
			if !validFieldValue(v) {
				return nil, errors.New("invalid header value")
			}
		}
	}
	r.RemoteAddr = "127.0.0.1:50123"
	ctx := context.WithValue(context.Background(), http.LocalAddrContextKey, &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 8080})
	ctx = context.WithValue(ctx, caddy.ReplacerCtxKey, caddy.NewReplacer())
	return r.WithContext(ctx), nil
}

// validFieldName is RFC 9110's token, as net/http's server requires.
func validFieldName(k string) bool {
	if k == "" {
		return false
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return true
}

// validFieldValue refuses control characters but tab, as net/http's
// server does.
func validFieldValue(v string) bool {
	for i := 0; i < len(v); i++ {
		if c := v[i]; (c < ' ' && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}

// reached is what the next handler saw of a request.
type reached struct {
	method string
	url    string
	header http.Header
	body   []byte
	// trailer holds the request's trailers once its body is read.
	trailer http.Header
	p       policy.Principal
	pOK     bool
	read    *message.Body // message.FromContext
	status  int           // what it answered
}

// next is the server behind the guard: it records the request and answers
// as an MCP server would, listing tools a and b to a tools/list.
func next(rec **reached, sse bool) caddyhttp.Handler {
	return caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		got := &reached{method: r.Method, url: r.URL.String(), header: r.Header.Clone()}
		*rec = got
		got.body, _ = io.ReadAll(r.Body)
		got.trailer = r.Trailer.Clone()
		got.p, got.pOK = policy.PrincipalFrom(r.Context())
		got.read, _ = message.FromContext(r.Context())
		switch r.Method {
		case http.MethodGet:
			// A listing on the GET stream, answering no request of it.
			w.Header().Set("Content-Type", "text/event-stream")
			got.status = http.StatusOK
			w.WriteHeader(got.status)
			_, err := io.WriteString(w, "event: message\ndata: "+listAnswer(`"stream"`)+"\n\n")
			return err
		case http.MethodPost:
		default:
			got.status = http.StatusNoContent
			w.WriteHeader(got.status)
			return nil
		}
		b, err := message.Read(got.body)
		if err != nil {
			// The invariants report it; answer as go-sdk would.
			got.status = http.StatusBadRequest
			w.WriteHeader(got.status)
			return nil
		}
		var answers []string
		for _, c := range b.Calls {
			switch {
			case c.IsResponse() || c.ID.IsZero():
			case c.Method == "tools/list":
				answers = append(answers, listAnswer(string(c.ID.Raw())))
			default:
				answers = append(answers, `{"jsonrpc":"2.0","id":`+string(c.ID.Raw())+`,"result":{}}`)
			}
		}
		if len(answers) == 0 {
			got.status = http.StatusAccepted
			w.WriteHeader(got.status)
			return nil
		}
		out := answers[0]
		if b.Batch {
			out = "[" + strings.Join(answers, ",") + "]"
		}
		got.status = http.StatusOK
		if sse {
			w.Header().Set("Content-Type", "text/event-stream")
			out = "event: message\ndata: " + out + "\n\n"
		} else {
			w.Header().Set("Content-Type", "application/json")
		}
		w.WriteHeader(got.status)
		_, err = io.WriteString(w, out)
		return err
	})
}

func listAnswer(id string) string {
	return `{"jsonrpc":"2.0","id":` + id + `,"result":{"tools":[{"name":"` + allowedToolForA + `","inputSchema":{"type":"object"}},{"name":"` + forbiddenForA + `","inputSchema":{"type":"object"}}]}}`
}

// refusalStatuses are the statuses of the edge's refusals (README,
// "Refusals").
var refusalStatuses = []int{400, 401, 403, 404, 405, 413, 415, 429, 503}

// check sends in through the handler and checks every invariant.
func (e *guardEdge) check(t *testing.T, in edgeInput) {
	raw := e.raw(in)
	r, err := parseRequest(raw)
	if err != nil {
		return // net/http answers it; no handler sees it
	}
	// The body net/http hands the handler, read from a second parse of
	// the same bytes.
	sent, sentErr := func() ([]byte, error) {
		r2, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(raw)))
		if err != nil {
			return nil, err
		}
		return io.ReadAll(r2.Body)
	}()
	secret := e.secret(in.flags)
	validToken := in.flags&credMask == credToolA || in.flags&credMask == credAll

	method, path := r.Method, r.URL.Path
	got, w := e.serve(t, r, in.flags)
	answer := w.Result()
	body := w.Body.Bytes()
	public := strings.HasPrefix(path, wellKnownResource) || strings.HasPrefix(path, OAuthCallbackPath)

	if got == nil {
		e.checkEdgeAnswer(t, method, public, answer, body)
		return
	}

	// Something reached the server behind the guard.
	switch {
	case public:
		t.Fatalf("%s %s, a public path, reached the server behind the guard", method, path)
	case !validToken:
		t.Fatalf("a request without a valid token reached the server behind the guard (credential %d)", in.flags&credMask)
	case !slices.Contains([]string{http.MethodGet, http.MethodPost, http.MethodDelete}, got.method):
		t.Fatalf("HTTP method %q reached the server behind the guard", got.method)
	}
	if v := got.header.Values("Authorization"); len(v) != 1 || v[0] != "Bearer "+upstreamSecret {
		t.Fatalf("the server behind got Authorization %q, want the guard's upstream header alone", v)
	}
	if v := got.header.Values("DPoP"); len(v) != 0 {
		t.Fatalf("the server behind got the client's DPoP header %q: a proof is for the edge, as the token is", v)
	}
	for k, vv := range got.header {
		for _, v := range vv {
			if strings.Contains(v, secret) {
				t.Fatalf("the client's credential reached the server behind in header %s", k)
			}
		}
	}
	if strings.Contains(got.url, secret) {
		t.Fatal("the client's credential reached the server behind in the URL")
	}
	if len(got.trailer) != 0 {
		t.Fatalf("trailers %q reached the server behind: header fields the edge never checked", got.trailer)
	}
	if _, ok := got.header["Accept-Encoding"]; ok {
		t.Fatal("Accept-Encoding reached the server behind: its answer could be compressed past the listing filter")
	}
	if !got.pOK || (in.flags&credMask == credToolA) != (got.p.Name == e.toolAName) {
		t.Fatalf("the request carried principal %+v (%v), want the token it was sent with", got.p, got.pOK)
	}
	if got.method != http.MethodPost {
		if len(got.body) != 0 {
			t.Fatalf("a %s reached the server behind with a body of %d bytes", got.method, len(got.body))
		}
	} else {
		e.checkPassedBody(t, in, got, sent, sentErr)
	}
	if answer.StatusCode != got.status {
		t.Fatalf("the server answered %d, the client got %d", got.status, answer.StatusCode)
	}
	if got.status == http.StatusAccepted || got.status == http.StatusNoContent {
		if len(body) != 0 {
			t.Fatalf("a %d reached the client with a body: %q", got.status, body)
		}
	}
	if in.flags&credMask == credToolA {
		if tool, ok := listedOtherThanA(body); ok {
			t.Fatalf("token %s was shown tool %q in a listing: %q", e.toolAName, tool, body)
		}
	}
}

// serve sends r through the handler to next, and returns what reached
// next (nil for nothing) and the client's answer.
func (e *guardEdge) serve(t *testing.T, r *http.Request, flags byte) (*reached, *httptest.ResponseRecorder) {
	t.Helper()
	var got *reached
	w := httptest.NewRecorder()
	if err := e.h.ServeHTTP(w, r, next(&got, flags&flagSSEAnswer != 0)); err != nil {
		t.Fatalf("ServeHTTP returned %v", err)
	}
	return got, w
}

// checkEdgeAnswer checks an answer the edge gave itself.
func (e *guardEdge) checkEdgeAnswer(t *testing.T, method string, public bool, answer *http.Response, body []byte) {
	status := answer.StatusCode
	switch {
	case method == http.MethodOptions && status == http.StatusNoContent:
		if len(body) != 0 || answer.Header.Get("Access-Control-Allow-Origin") != edgeOrigin {
			t.Fatalf("preflight answer: body %q, Access-Control-Allow-Origin %q", body, answer.Header.Get("Access-Control-Allow-Origin"))
		}
		return
	case public && status != http.StatusForbidden:
		// The metadata (200, or 405 to another method) and the OAuth
		// callback's page (404: no upstream logs in here).
		if !slices.Contains([]int{200, 404, 405}, status) {
			t.Fatalf("a public path answered %d", status)
		}
		return
	case !slices.Contains(refusalStatuses, status):
		t.Fatalf("the edge answered %d itself: %q", status, body)
	}
	if ct := answer.Header.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("refusal %d with Content-Type %q", status, ct)
	}
	var rpc struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Error   struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
			Data    struct {
				Reason string `json:"reason"`
			} `json:"data"`
		} `json:"error"`
	}
	if err := json.Unmarshal(body, &rpc); err != nil || rpc.JSONRPC != "2.0" || rpc.ID == nil || rpc.Error.Code == 0 || rpc.Error.Message == "" || rpc.Error.Data.Reason == "" {
		t.Fatalf("refusal %d is not a JSON-RPC error that names its reason: %q", status, body)
	}
	need := map[int]string{401: "WWW-Authenticate", 405: "Allow", 429: "Retry-After"}
	if h, ok := need[status]; ok && answer.Header.Get(h) == "" {
		t.Fatalf("refusal %d (%s) without %s", status, rpc.Error.Data.Reason, h)
	}
}

// checkPassedBody checks the body of a POST that reached the server
// behind.
func (e *guardEdge) checkPassedBody(t *testing.T, in edgeInput, got *reached, sent []byte, sentErr error) {
	if sentErr != nil || !bytes.Equal(got.body, sent) {
		t.Fatalf("the server behind got a body other than the one sent (read error %v):\n got %q\nsent %q", sentErr, got.body, sent)
	}
	if got.read == nil || !bytes.Equal(got.read.Raw, got.body) {
		t.Fatal("the body in the request context is not the body passed on")
	}
	if ct := got.header.Values("Content-Type"); len(ct) != 1 || !isJSONUTF8(ct[0]) {
		t.Fatalf("a POST reached the server behind with Content-Type %q", ct)
	}
	for _, enc := range got.header.Values("Content-Encoding") {
		for e := range strings.SplitSeq(enc, ",") {
			if e = strings.TrimSpace(e); e != "" && !strings.EqualFold(e, "identity") {
				t.Fatalf("a POST reached the server behind with Content-Encoding %q", enc)
			}
		}
	}
	b, err := message.Read(got.body)
	if err != nil {
		t.Fatalf("a body that package message refuses reached the server behind (%v): %q", err, got.body)
	}
	for k := range got.header {
		if n := strings.ReplaceAll(k, "_", "-"); n != k && (strings.EqualFold(n, "Mcp-Method") || strings.EqualFold(n, "Mcp-Name")) {
			t.Fatalf("header %q reached the server behind", k)
		}
	}
	methods, names := got.header.Values("Mcp-Method"), got.header.Values("Mcp-Name")
	if len(methods) > 1 || len(names) > 1 {
		t.Fatalf("Mcp-Method %q and Mcp-Name %q reached the server behind", methods, names)
	}
	for _, c := range b.Calls {
		if c.IsResponse() {
			continue
		}
		if len(methods) == 1 && methods[0] != c.Method {
			t.Fatalf("Mcp-Method %q reached the server behind with a body whose method is %q", methods[0], c.Method)
		}
		if len(names) == 1 && names[0] != c.Name() {
			t.Fatalf("Mcp-Name %q reached the server behind with a body whose %s names %q", names[0], c.Method, c.Name())
		}
		if in.flags&credMask != credToolA {
			continue
		}
		switch {
		case c.IsToolCall() && c.Tool == allowedToolForA:
		case c.IsToolCall():
			t.Fatalf("tools/call of %q reached the server behind for the token scoped to tool a: %q", c.Tool, got.body)
		case slices.Contains(openToEveryToken, c.Method), strings.HasPrefix(c.Method, "notifications/"):
		default:
			t.Fatalf("method %q reached the server behind for the token scoped to tool a: %q", c.Method, got.body)
		}
	}
}

// isJSONUTF8 reports whether ct is application/json with no parameter but
// a UTF-8 charset.
func isJSONUTF8(ct string) bool {
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

// listedOtherThanA finds a tool other than a in the tools listings of an
// answer body: one JSON value, or the data of SSE events.
func listedOtherThanA(body []byte) (string, bool) {
	values := [][]byte{body}
	if !json.Valid(body) {
		values = nil
		for line := range bytes.SplitSeq(body, []byte("\n")) {
			if data, ok := bytes.CutPrefix(line, []byte("data:")); ok {
				values = append(values, data)
			}
		}
	}
	for _, v := range values {
		var x any
		if json.Unmarshal(v, &x) != nil {
			continue
		}
		if tool, ok := findTool(x); ok {
			return tool, true
		}
	}
	return "", false
}

// findTool walks x for a "tools" array with an item named other than a.
func findTool(x any) (string, bool) {
	switch x := x.(type) {
	case []any:
		for _, v := range x {
			if tool, ok := findTool(v); ok {
				return tool, true
			}
		}
	case map[string]any:
		for k, v := range x {
			if items, ok := v.([]any); ok && strings.EqualFold(k, "tools") {
				for _, it := range items {
					if m, ok := it.(map[string]any); ok && m["name"] != allowedToolForA {
						return fmt.Sprint(m["name"]), true
					}
				}
			}
			if tool, ok := findTool(v); ok {
				return tool, true
			}
		}
	}
	return "", false
}

// edgeSeeds are the hostile cases against tool b (and what else token a
// may not do), the bodies of package message's corpus, and requests of
// every HTTP method and framing.
func edgeSeeds(tb testing.TB) []edgeInput {
	tb.Helper()
	const jsonA = credToolA | flagContentType | flagAccept
	tool := func(name string) hostile.Call {
		return hostile.Call{Method: "tools/call", Params: `{"name":"` + name + `","arguments":{}}`}
	}
	var seeds []edgeInput
	for _, c := range hostile.Cases(hostile.Target{
		Allowed: tool(allowedToolForA),
		Forbidden: []hostile.Call{
			tool(forbiddenForA),
			{Method: "resources/read", Params: `{"uri":"file:///etc/secret"}`},
			{Method: "prompts/get", Params: `{"name":"p"}`},
		},
	}) {
		var h strings.Builder
		flags := byte(jsonA)
		for k, vv := range c.Header {
			if k == "Content-Type" {
				flags &^= flagContentType
			}
			for _, v := range vv {
				h.WriteString(k + ": " + v + "\n")
			}
		}
		seeds = append(seeds, edgeInput{c.HTTPMethod(), "/mcp", h.String(), c.Body, flags})
	}
	dir := filepath.Join("..", "message", "testdata", "fuzz", "FuzzRead")
	entries, err := os.ReadDir(dir)
	if err != nil {
		tb.Fatal(err)
	}
	for i, ent := range entries {
		data, err := os.ReadFile(filepath.Join(dir, ent.Name()))
		if err != nil {
			tb.Fatal(err)
		}
		_, lit, _ := strings.Cut(strings.TrimSpace(string(data)), "\n")
		lit, _ = strings.CutPrefix(lit, "[]byte(")
		lit, _ = strings.CutSuffix(lit, ")")
		s, err := strconv.Unquote(lit)
		if err != nil {
			tb.Fatalf("%s: %v", ent.Name(), err)
		}
		// Alternate the token, the framing and the answer's form.
		flags := byte(jsonA)
		if i%2 == 1 {
			flags = credAll | flagContentType | flagAccept | flagSSEAnswer
		}
		if i%3 == 0 {
			flags |= flagChunked
		}
		seeds = append(seeds, edgeInput{http.MethodPost, "/mcp", "", []byte(s), flags})
	}
	list := `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`
	return append(seeds,
		edgeInput{http.MethodGet, "/mcp", "Mcp-Session-Id: s\n", nil, credToolA | flagAccept},
		edgeInput{http.MethodDelete, "/mcp", "Mcp-Session-Id: s\n", nil, credAll},
		edgeInput{http.MethodGet, "/mcp", "", []byte(list), credToolA},
		edgeInput{http.MethodOptions, "/mcp", "Access-Control-Request-Method: POST\n", nil, flagOrigin},
		edgeInput{http.MethodOptions, "/mcp", "", nil, credToolA},
		edgeInput{http.MethodPut, "/mcp", "", []byte(list), jsonA},
		edgeInput{http.MethodPost, "/mcp", "", []byte(list), jsonA | flagSSEAnswer | flagOrigin},
		edgeInput{http.MethodPost, "/mcp", "", []byte(list), credUnknown | flagContentType},
		edgeInput{http.MethodPost, "/mcp", "", []byte(list), flagContentType},
		edgeInput{http.MethodPost, "/mcp", "Origin: http://evil.example\n", []byte(list), jsonA},
		edgeInput{http.MethodPost, "/mcp", "Host: evil.example\n", []byte(list), jsonA | flagNoHost},
		edgeInput{http.MethodPost, "/mcp", "Content-Length: 5\n", []byte(list), jsonA},
		edgeInput{http.MethodPost, "/mcp", "Content-Encoding: gzip\n", []byte(list), jsonA},
		edgeInput{http.MethodPost, "/mcp", "Mcp-Method: tools/list\nMcp-Protocol-Version: 2026-07-28\n", []byte(list), jsonA},
		edgeInput{http.MethodPost, "/mcp", "DPoP: eyJhbGciOiJFUzI1NiJ9.e30.c2ln\ndpop: second\n", []byte(list), jsonA},
		edgeInput{http.MethodPost, "/mcp", "Mcp_Name: a\n", []byte(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"b"}}`), jsonA},
		edgeInput{http.MethodPost, "/mcp", "Transfer-Encoding: chunked\n", []byte(fmt.Sprintf("%x\r\n%s\r\n0\r\nMcp-Name: b\r\nAuthorization: Bearer x\r\n\r\n", len(list), list)), jsonA},
		edgeInput{http.MethodGet, "/mcp", "Transfer-Encoding: chunked\nTrailer: Mcp-Method\n", []byte("0\r\nMcp-Method: tools/call\r\n\r\n"), credToolA},
		edgeInput{http.MethodPost, "/mcp", "", bytes.Repeat([]byte(" "), edgeMaxBodyBytes+1), jsonA},
		edgeInput{http.MethodGet, wellKnownResource + "/mcp", "", nil, 0},
		edgeInput{http.MethodPost, wellKnownResource, "", nil, 0},
		edgeInput{http.MethodGet, OAuthCallbackPath + "up?code=c&state=s", "", nil, 0},
		edgeInput{http.MethodPost, "http://127.0.0.1:8080/mcp?x=1", "", []byte(list), jsonA | flagChunked},
	)
}

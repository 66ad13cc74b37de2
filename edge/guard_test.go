package edge

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/http/httputil"
	"net/textproto"
	"net/url"
	"strings"
	"testing"

	"github.com/Tahul/caddy-zidane-mcp/broker/sessionid"

	"github.com/Tahul/caddy-zidane-mcp/message"
	"github.com/Tahul/caddy-zidane-mcp/policy"
)

// guardFixture is a Guard in front of a server that answers as told, passed
// on through httputil.ReverseProxy as Caddy's reverse_proxy would.
type guardFixture struct {
	g      *Guard
	seen   []http.Header // what the server received, request by request
	answer func(w http.ResponseWriter, r *http.Request)
	proxy  *httputil.ReverseProxy
	before func(w http.ResponseWriter) // sets headers of the edge's own before the guard runs
}

func newGuardFixture(t *testing.T) *guardFixture {
	t.Helper()
	ids, err := sessionid.New(bytes.Repeat([]byte{7}, sessionid.KeySize))
	if err != nil {
		t.Fatal(err)
	}
	f := &guardFixture{g: &Guard{IDs: ids, Route: "guard:/mcp"}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.seen = append(f.seen, r.Header.Clone())
		f.answer(w, r)
	}))
	t.Cleanup(srv.Close)
	target, _ := url.Parse(srv.URL)
	f.proxy = httputil.NewSingleHostReverseProxy(target)
	return f
}

// reply is what a client of the guard got.
type reply struct {
	Code   int
	header http.Header
	Body   *bytes.Buffer
	early  []http.Header // the headers of informational answers
}

func (r *reply) Header() http.Header { return r.header }

// do sends a request as principal p with the given headers, through a
// front server that runs the guard (with the edge's CORS headers already
// set on the answer, as the handler sets them). It returns the guard's
// error, when it refused.
func (f *guardFixture) do(p policy.Principal, method string, header http.Header) (*reply, error) {
	var serveErr error
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r = r.WithContext(policy.WithPrincipal(r.Context(), p))
		w.Header().Set("Access-Control-Allow-Origin", "https://app.example")
		w.Header().Set("Access-Control-Expose-Headers", "Mcp-Session-Id")
		if f.before != nil {
			f.before(w)
		}
		serveErr = f.g.Serve(w, r, NextFunc(func(w http.ResponseWriter, r *http.Request) error {
			f.proxy.ServeHTTP(w, r)
			return nil
		}))
		if serveErr != nil {
			w.WriteHeader(599)
		}
	}))
	defer front.Close()
	out := &reply{Body: &bytes.Buffer{}}
	ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{
		Got1xxResponse: func(code int, h textproto.MIMEHeader) error {
			out.early = append(out.early, http.Header(h).Clone())
			return nil
		},
	})
	req, _ := http.NewRequestWithContext(ctx, method, front.URL+"/mcp", nil)
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := front.Client().Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	out.Code, out.header = resp.StatusCode, resp.Header
	out.Body.ReadFrom(resp.Body)
	return out, serveErr
}

var (
	alice = policy.Principal{TokenID: "tok_alice", Name: "alice"}
	mallo = policy.Principal{TokenID: "tok_mallory", Name: "mallory"}
)

func TestGuardBindsSessionsToTheirToken(t *testing.T) {
	f := newGuardFixture(t)
	f.answer = func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Mcp-Session-Id", "upstream-session-1")
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"jsonrpc":"2.0","id":1,"result":{}}`))
	}
	w, err := f.do(alice, http.MethodPost, nil)
	if err != nil {
		t.Fatal(err)
	}
	sealed := w.Header().Get("Mcp-Session-Id")
	if sealed == "" || strings.Contains(sealed, "upstream-session-1") {
		t.Fatalf("the client got session id %q; want the server's id sealed", sealed)
	}

	// Alice's next request: the server sees its own id, and Alice keeps
	// hers.
	w, err = f.do(alice, http.MethodGet, http.Header{"Mcp-Session-Id": {sealed}})
	if err != nil {
		t.Fatal(err)
	}
	if got := f.seen[len(f.seen)-1].Get("Mcp-Session-Id"); got != "upstream-session-1" {
		t.Fatalf("the server got session id %q, want its own", got)
	}
	if got := w.Header().Get("Mcp-Session-Id"); got != sealed {
		t.Fatalf("the client's id changed to %q", got)
	}

	// Mallory, with Alice's id, on a GET stream or a POST: 404, and the
	// server sees nothing.
	before := len(f.seen)
	for _, method := range []string{http.MethodGet, http.MethodPost, http.MethodDelete} {
		_, err = f.do(mallo, method, http.Header{"Mcp-Session-Id": {sealed}})
		var re *RefusalError
		if !errors.As(err, &re) || re.Verdict.Status != http.StatusNotFound || re.Verdict.Code != message.CodeUnknownSession {
			t.Fatalf("%s with another token's session id: %v; want a 404 refusal", method, err)
		}
	}
	// A raw server id, a forged one, two of them.
	for _, h := range []http.Header{
		{"Mcp-Session-Id": {"upstream-session-1"}},
		{"Mcp-Session-Id": {sealed[:len(sealed)-2] + "AA"}},
	} {
		if _, err = f.do(alice, http.MethodGet, h); err == nil {
			t.Fatalf("session id %q was passed on", h.Get("Mcp-Session-Id"))
		}
	}
	_, err = f.do(alice, http.MethodGet, http.Header{"Mcp-Session-Id": {sealed, sealed}})
	var re *RefusalError
	if !errors.As(err, &re) || re.Verdict.Status != http.StatusBadRequest {
		t.Fatalf("two session ids: %v; want 400", err)
	}
	if len(f.seen) != before {
		t.Fatalf("the server received %d refused requests", len(f.seen)-before)
	}

	// Another guarded site (another resource) does not open Alice's id.
	f.g = &Guard{Scopes: f.g.Scopes, Prepare: f.g.Prepare, IDs: f.g.IDs, Route: "guard:https://other.example/mcp"}
	if _, err = f.do(alice, http.MethodGet, http.Header{"Mcp-Session-Id": {sealed}}); err == nil {
		t.Fatal("an id sealed for one guarded site opened on another")
	}
}

func TestGuardStripsTheServersAuthSurface(t *testing.T) {
	f := newGuardFixture(t)
	f.answer = func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Link", "</style.css>; rel=preload")
		h.Set("Set-Cookie", "early=1")
		w.WriteHeader(http.StatusEarlyHints)
		h.Del("Link")
		h.Set("WWW-Authenticate", `Bearer resource_metadata="https://evil.example/.well-known/oauth-protected-resource"`)
		h.Set("Proxy-Authenticate", "Basic")
		h.Set("Set-Cookie", "session=upstream")
		h.Set("Access-Control-Allow-Origin", "*")
		h.Set("Access-Control-Allow-Credentials", "true")
		h.Set("Content-Type", "application/json")
		w.Write([]byte(`{"jsonrpc":"2.0","id":1,"result":{}}`))
	}
	w, err := f.do(alice, http.MethodPost, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"WWW-Authenticate", "Proxy-Authenticate", "Set-Cookie", "Access-Control-Allow-Credentials"} {
		if v := w.Header().Values(name); len(v) > 0 {
			t.Errorf("the client got %s: %q", name, v)
		}
	}
	if got := w.Header().Values("Access-Control-Allow-Origin"); len(got) != 1 || got[0] != "https://app.example" {
		t.Errorf("Access-Control-Allow-Origin = %q; want the edge's own only", got)
	}
	if w.Code != http.StatusOK || !strings.Contains(w.Body.String(), `"result"`) {
		t.Errorf("answer %d %q", w.Code, w.Body.String())
	}
	if len(w.early) != 1 || w.early[0].Get("Link") == "" || w.early[0].Get("Set-Cookie") != "" {
		t.Errorf("early hints %v; want the Link, without the cookie", w.early)
	}
}

func TestGuardTurnsTheServersRefusalInto502(t *testing.T) {
	for _, status := range []int{http.StatusUnauthorized, http.StatusForbidden, http.StatusProxyAuthRequired} {
		f := newGuardFixture(t)
		f.answer = func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("WWW-Authenticate", `Bearer resource_metadata="https://evil.example/meta"`)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(status)
			w.Write([]byte(`{"error":"log in at https://evil.example"}`))
		}
		w, err := f.do(alice, http.MethodPost, nil)
		if err != nil {
			t.Fatal(err)
		}
		body := w.Body.String()
		if w.Code != http.StatusBadGateway || strings.Contains(body, "evil") || !strings.Contains(body, "operator") || w.Header().Get("WWW-Authenticate") != "" {
			t.Fatalf("server's %d became %d %q (WWW-Authenticate %q); want 502 with a message for the operator", status, w.Code, body, w.Header().Get("WWW-Authenticate"))
		}
	}
}

func TestGuardRefusesAnInvalidServerSessionID(t *testing.T) {
	f := newGuardFixture(t)
	f.answer = func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Mcp-Session-Id", "has space")
		w.Write([]byte(`{}`))
	}
	w, err := f.do(alice, http.MethodPost, nil)
	if err != nil {
		t.Fatal(err)
	}
	if w.Code != http.StatusBadGateway || w.Header().Get("Mcp-Session-Id") != "" {
		t.Fatalf("answer %d, session id %q; want 502 without it", w.Code, w.Header().Get("Mcp-Session-Id"))
	}
}

// The guard puts the opened and the sealed session ids in slices of its
// own: the ones a request or an answer came with may be shared by whatever
// set them (a handler before the guard, or one after it that keeps its
// headers in a package variable), and writing into them would hand one
// client's ids to another request.
func TestGuardLeavesSharedHeaderSlicesAlone(t *testing.T) {
	f := newGuardFixture(t)
	sealed := f.g.IDs.Seal("upstream-session-1", alice.TokenID, f.g.Route)
	requestIDs := []string{sealed}
	answerIDs := []string{"upstream-session-1"}
	var got string
	r := httptest.NewRequest(http.MethodPost, "http://127.0.0.1/mcp", strings.NewReader(`{}`))
	r = r.WithContext(policy.WithPrincipal(r.Context(), alice))
	r.Header["Mcp-Session-Id"] = requestIDs
	w := httptest.NewRecorder()
	err := f.g.Serve(w, r, NextFunc(func(w http.ResponseWriter, r *http.Request) error {
		got = r.Header.Get("Mcp-Session-Id")
		w.Header()["Mcp-Session-Id"] = answerIDs
		w.WriteHeader(http.StatusOK)
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	if got != "upstream-session-1" || w.Header().Get("Mcp-Session-Id") != sealed {
		t.Fatalf("the server got %q and the client %q; want the ids translated", got, w.Header().Get("Mcp-Session-Id"))
	}
	if requestIDs[0] != sealed || answerIDs[0] != "upstream-session-1" {
		t.Errorf("the guard wrote into slices it did not make: request %q, answer %q", requestIDs, answerIDs)
	}
}

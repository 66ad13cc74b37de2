package edge

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"testing"

	"github.com/Tahul/caddy-zidane-mcp/broker"
	"github.com/Tahul/caddy-zidane-mcp/message"
	"github.com/Tahul/caddy-zidane-mcp/policy"
)

// The guarded server's trailers reach the client neither as trailers nor,
// on a JSON answer (whose status the listing filter sends with the filtered
// body, after reverse_proxy copied the trailers into the header map), as
// headers: a Set-Cookie, a CORS header or the server's own session id in a
// trailer must not pass where the same header would not.
func TestGuardStripsTrailers(t *testing.T) {
	leaks := map[string]string{
		"Set-Cookie":                  "sid=from-the-server; Path=/",
		"Mcp-Session-Id":              "raw-upstream-session",
		"Access-Control-Allow-Origin": "*",
	}
	for _, ctype := range []string{"application/json", "text/event-stream"} {
		// declared: named in a Trailer header (reverse_proxy copies them
		// into the header map after the body); prefixed: set under
		// http.TrailerPrefix without being declared.
		for _, declared := range []bool{true, false} {
			name := ctype + map[bool]string{true: ", declared", false: ", prefixed"}[declared]
			t.Run(name, func(t *testing.T) {
				upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					if declared {
						names := make([]string, 0, len(leaks))
						for k := range leaks {
							names = append(names, k)
						}
						w.Header().Set("Trailer", strings.Join(names, ", "))
					}
					w.Header().Set("Content-Type", ctype)
					w.WriteHeader(http.StatusOK)
					if ctype == "application/json" {
						io.WriteString(w, `{"jsonrpc":"2.0","id":1,"result":{}}`)
					} else {
						io.WriteString(w, "event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}\n\n")
					}
					for k, v := range leaks {
						if !declared {
							k = http.TrailerPrefix + k
						}
						w.Header().Set(k, v)
					}
				}))
				defer upstream.Close()
				target, _ := url.Parse(upstream.URL)
				proxy := httputil.NewSingleHostReverseProxy(target)
				ids, err := broker.NewSessionIDs(bytes.Repeat([]byte{7}, broker.SessionKeySize))
				if err != nil {
					t.Fatal(err)
				}
				g := &Guard{IDs: ids, Route: "guard:/mcp"}
				raw := []byte(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x"}}`)
				front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					b, err := message.Read(raw)
					if err != nil {
						t.Error(err)
						return
					}
					r = r.WithContext(policy.WithPrincipal(r.Context(), alice))
					fw, closeFilter := NewListing(g, alice, b, nil).Wrap(w)
					if err := g.Serve(fw, r, NextFunc(func(w http.ResponseWriter, r *http.Request) error {
						proxy.ServeHTTP(w, r)
						return nil
					})); err != nil {
						t.Error(err)
					}
					closeFilter()
				}))
				defer front.Close()
				resp, err := front.Client().Post(front.URL+"/mcp", "application/json", bytes.NewReader(raw))
				if err != nil {
					t.Fatal(err)
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if !bytes.Contains(body, []byte(`"result":{}`)) {
					t.Fatalf("the client got %q", body)
				}
				for k := range leaks {
					if v := resp.Header.Values(k); len(v) > 0 {
						t.Errorf("the server's trailer %s reached the client as a header: %q", k, v)
					}
					if v := resp.Trailer.Values(k); len(v) > 0 {
						t.Errorf("the server's trailer %s reached the client: %q", k, v)
					}
				}
			})
		}
	}
}

// An Mcp-Session-Id spelled with _ for - is refused, as the edge refuses
// Mcp-Method spelled so: a server behind that reads it as the session id
// (CGI and WSGI map both spellings to HTTP_MCP_SESSION_ID) would get an id
// the guard never opened.
func TestGuardRefusesUnderscoreSessionID(t *testing.T) {
	f := newGuardFixture(t)
	f.answer = func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"jsonrpc":"2.0","id":1,"result":{}}`))
	}
	for _, name := range []string{"Mcp_Session_Id", "mcp_session-id", "MCP-SESSION_ID"} {
		before := len(f.seen)
		_, err := f.do(mallo, http.MethodGet, http.Header{name: {"raw-session-of-alice"}})
		var re *RefusalError
		if !errors.As(err, &re) || re.Verdict.Status != http.StatusBadRequest {
			t.Errorf("%s: %v; want a 400 refusal", name, err)
		}
		if len(f.seen) != before {
			t.Errorf("%s reached the server: %v", name, f.seen[len(f.seen)-1])
		}
	}
}

// Headers that speak for the gateway's whole origin in a browser are the
// edge's to send, like CORS: the server's Clear-Site-Data would wipe the
// origin's cookies and storage, its Alt-Svc send later requests for the
// origin elsewhere, its Strict-Transport-Security pin the origin's
// subdomains. What the edge (Caddy) set before the route ran stays.
func TestGuardStripsOriginWideHeaders(t *testing.T) {
	f := newGuardFixture(t)
	f.answer = func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Clear-Site-Data", `"cookies", "storage"`)
		h.Set("Alt-Svc", `h2="evil.example:443"`)
		h.Set("Strict-Transport-Security", "max-age=63072000; includeSubDomains; preload")
		h.Set("Content-Type", "application/json")
		w.Write([]byte(`{"jsonrpc":"2.0","id":1,"result":{}}`))
	}
	front := func(w http.ResponseWriter) { w.Header().Set("Alt-Svc", `h3=":443"; ma=2592000`) }
	f.before = front
	w, err := f.do(alice, http.MethodPost, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"Clear-Site-Data", "Strict-Transport-Security"} {
		if v := w.Header().Values(name); len(v) > 0 {
			t.Errorf("the client got the server's %s: %q", name, v)
		}
	}
	if got := w.Header().Values("Alt-Svc"); len(got) != 1 || got[0] != `h3=":443"; ma=2592000` {
		t.Errorf("Alt-Svc = %q; want the edge's own only", got)
	}
}

package edge

import (
	"crypto/rand"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/policy"
)

func testHopKey(t *testing.T) *HopKey {
	t.Helper()
	k := make([]byte, 32)
	_, _ = rand.Read(k)
	return NewHopKey(k)
}

const (
	hopRoute = "aggregate-node|/mcp||a,b"
	hopSID   = "sid-1"
)

// signedHop is a hop from node a to node b, as the owner receives it.
func signedHop(t *testing.T, k *HopKey, method, body string, at time.Time) *http.Request {
	t.Helper()
	out := httptest.NewRequest(method, "http://127.0.0.1:9/mcp", strings.NewReader(body))
	out.Header.Set("Content-Type", "application/json")
	out.Header.Set("Accept", "application/json, text/event-stream")
	out.Header.Set("Mcp-Session-Id", hopSID)
	out.Header.Set("Mcp-Protocol-Version", "2025-11-25")
	p := policy.Principal{TokenID: "tok_1", Name: "alice", Scopes: []string{"mcp"}}
	if _, err := k.Sign(out, hopRoute, "a", "b", p, "192.0.2.7", []byte(body), at); err != nil {
		t.Fatal(err)
	}
	return out
}

// Every alteration of a signed hop, a replay, a stale one, one meant for
// another node or route, and one signed with another key are refused; the
// hop as signed is taken once, with its principal.
func TestHopRefusesForgedAlteredReplayed(t *testing.T) {
	k := testHopKey(t)
	now := time.Now()
	body := `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`
	verify := func(r *http.Request, body, self, route string) (HopClaims, string) {
		c, v := k.Verify(r, r.URL.RequestURI(), []byte(body), self, route, now)
		return c, v.Reason
	}
	for _, tc := range []struct {
		name   string
		change func(r *http.Request) (body, self, route string)
		want   string
	}{
		{"another body", func(r *http.Request) (string, string, string) {
			return strings.Replace(body, "tools/list", "tools/call", 1), "b", hopRoute
		}, "hop_forged"},
		{"another method", func(r *http.Request) (string, string, string) {
			r.Method = http.MethodDelete
			return body, "b", hopRoute
		}, "hop_forged"},
		{"another path", func(r *http.Request) (string, string, string) { r.URL.Path = "/other"; return body, "b", hopRoute }, "hop_forged"},
		{"another session", func(r *http.Request) (string, string, string) {
			r.Header.Set("Mcp-Session-Id", "sid-2")
			return body, "b", hopRoute
		}, "hop_forged"},
		{"another protocol version", func(r *http.Request) (string, string, string) {
			r.Header.Set("Mcp-Protocol-Version", "2025-06-18")
			return body, "b", hopRoute
		}, "hop_forged"},
		{"a Last-Event-ID added", func(r *http.Request) (string, string, string) {
			r.Header.Set("Last-Event-ID", "0")
			return body, "b", hopRoute
		}, "hop_forged"},
		{"an Mcp-Name added", func(r *http.Request) (string, string, string) {
			r.Header.Set("Mcp-Name", "delete_everything")
			return body, "b", hopRoute
		}, "hop_forged"},
		{"an Mcp-Param header added", func(r *http.Request) (string, string, string) {
			r.Header.Set("Mcp-Param-Region", "eu")
			return body, "b", hopRoute
		}, "hop_forged"},
		{"another principal", func(r *http.Request) (string, string, string) {
			other := signedHop(t, k, http.MethodPost, body, now)
			other.Header.Set(HopPrincipalHeader, "eyJUb2tlbklEIjoidG9rX2FkbWluIiwiU2NvcGVzIjpbImFkbWluIl19")
			r.Header.Set(HopPrincipalHeader, other.Header.Get(HopPrincipalHeader))
			return body, "b", hopRoute
		}, "hop_forged"},
		{"another sender named", func(r *http.Request) (string, string, string) {
			r.Header.Set(HopHeader, strings.Replace(r.Header.Get(HopHeader), "from=a", "from=c", 1))
			return body, "b", hopRoute
		}, "hop_forged"},
		{"another route", func(r *http.Request) (string, string, string) { return body, "b", "aggregate-node|/mcp||a" }, "hop_forged"},
		{"another client address", func(r *http.Request) (string, string, string) {
			r.Header.Set(HopHeader, strings.Replace(r.Header.Get(HopHeader), "c=192.0.2.7", "c=198.51.100.1", 1))
			return body, "b", hopRoute
		}, "hop_forged"},
		{"no client address", func(r *http.Request) (string, string, string) {
			r.Header.Set(HopHeader, strings.Replace(r.Header.Get(HopHeader), ";c=192.0.2.7", "", 1))
			return body, "b", hopRoute
		}, "hop_malformed"},
		{"a client address spelled another way", func(r *http.Request) (string, string, string) {
			r.Header.Set(HopHeader, strings.Replace(r.Header.Get(HopHeader), "c=192.0.2.7", "c=192.0.2.07", 1))
			return body, "b", hopRoute
		}, "hop_malformed"},
		{"a client that is no address", func(r *http.Request) (string, string, string) {
			r.Header.Set(HopHeader, strings.Replace(r.Header.Get(HopHeader), "c=192.0.2.7", "c=example.com", 1))
			return body, "b", hopRoute
		}, "hop_malformed"},
		{"the last version's header", func(r *http.Request) (string, string, string) {
			r.Header.Set(HopHeader, strings.Replace(strings.Replace(r.Header.Get(HopHeader), "v2;", "v1;", 1), ";c=192.0.2.7", "", 1))
			return body, "b", hopRoute
		}, "hop_malformed"},
		{"received by another node", func(r *http.Request) (string, string, string) { return body, "c", hopRoute }, "hop_misdirected"},
		{"another cluster key", func(r *http.Request) (string, string, string) {
			*r = *signedHop(t, testHopKey(t), http.MethodPost, body, now)
			return body, "b", hopRoute
		}, "hop_forged"},
		{"stale", func(r *http.Request) (string, string, string) {
			*r = *signedHop(t, k, http.MethodPost, body, now.Add(-HopFreshness-time.Second))
			return body, "b", hopRoute
		}, "hop_stale"},
		{"from the future", func(r *http.Request) (string, string, string) {
			*r = *signedHop(t, k, http.MethodPost, body, now.Add(HopFreshness+time.Second))
			return body, "b", hopRoute
		}, "hop_stale"},
		{"no principal header", func(r *http.Request) (string, string, string) {
			r.Header.Del(HopPrincipalHeader)
			return body, "b", hopRoute
		}, "hop_malformed"},
		{"two hop headers", func(r *http.Request) (string, string, string) {
			r.Header.Add(HopHeader, r.Header.Get(HopHeader))
			return body, "b", hopRoute
		}, "hop_malformed"},
		{"a made-up header", func(r *http.Request) (string, string, string) {
			r.Header.Set(HopHeader, "v2;from=a;to=b;t=1;n=00000000000000000000000000000000;c=;mac=AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA")
			return body, "b", hopRoute
		}, "hop_forged"},
		{"garbage", func(r *http.Request) (string, string, string) {
			r.Header.Set(HopHeader, "let me in")
			return body, "b", hopRoute
		}, "hop_malformed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := signedHop(t, k, http.MethodPost, body, now)
			b, self, route := tc.change(r)
			if _, reason := verify(r, b, self, route); reason != tc.want {
				t.Fatalf("refused with %q, want %q", reason, tc.want)
			}
		})
	}

	r := signedHop(t, k, http.MethodPost, body, now)
	c, reason := verify(r, body, "b", hopRoute)
	if reason != "" || c.From != "a" || c.Principal.TokenID != "tok_1" || c.Principal.Name != "alice" || c.Client != "192.0.2.7" {
		t.Fatalf("the hop as signed: %q %+v", reason, c)
	}
	if _, reason := verify(r, body, "b", hopRoute); reason != "hop_replayed" {
		t.Fatalf("the same hop again: %q, want hop_replayed", reason)
	}
	// GET and DELETE hops, without a body, are signed and checked alike.
	for _, m := range []string{http.MethodGet, http.MethodDelete} {
		r := signedHop(t, k, m, "", now)
		if _, reason := verify(r, "", "b", hopRoute); reason != "" {
			t.Fatalf("%s hop: %q", m, reason)
		}
	}
}

// A sender with no address that parses (a unix socket's) sends none, and
// the hop still holds; an IPv6 address goes in its one spelling.
func TestHopClientAddress(t *testing.T) {
	k := testHopKey(t)
	now := time.Now()
	for client, want := range map[string]string{"@": "", "": "", "2001:DB8::1": "2001:db8::1", "::ffff:192.0.2.1": "::ffff:192.0.2.1"} {
		out := httptest.NewRequest(http.MethodGet, "http://127.0.0.1:9/mcp", nil)
		out.Header.Set("Mcp-Session-Id", hopSID)
		if _, err := k.Sign(out, hopRoute, "a", "b", policy.Principal{TokenID: "tok_1"}, client, nil, now); err != nil {
			t.Fatal(err)
		}
		c, v := k.Verify(out, out.URL.RequestURI(), nil, "b", hopRoute, now)
		if !v.Allowed() || c.Client != want {
			t.Errorf("client %q: %+v, client %q; want %q", client, v, c.Client, want)
		}
	}
}

// The answer tag binds the answer to its hop: another hop's nonce, other
// nodes, another key do not check.
func TestHopAnswerTag(t *testing.T) {
	k := testHopKey(t)
	c := HopClaims{From: "a", To: "b", Nonce: "0123456789abcdef0123456789abcdef"}
	tag := k.AnswerTag(c)
	if !k.CheckAnswer(tag, "a", "b", c.Nonce) {
		t.Fatal("the tag of the hop does not check")
	}
	for name, ok := range map[string]bool{
		"another nonce":  k.CheckAnswer(tag, "a", "b", "ffffffffffffffffffffffffffffffff"),
		"other nodes":    k.CheckAnswer(tag, "b", "a", c.Nonce),
		"another key":    testHopKey(t).CheckAnswer(tag, "a", "b", c.Nonce),
		"no tag":         k.CheckAnswer("", "a", "b", c.Nonce),
		"a made-up tag":  k.CheckAnswer("AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA", "a", "b", c.Nonce),
		"not base64url!": k.CheckAnswer("***", "a", "b", c.Nonce),
	} {
		if ok {
			t.Errorf("%s: checks", name)
		}
	}
}

// The Mcp-Param-* headers a hop carries are under its MAC, by name and
// value: one changed, renamed or dropped is refused.
func TestHopCoversParamHeaders(t *testing.T) {
	k := testHopKey(t)
	now := time.Now()
	body := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","arguments":{"region":"us"}}}`
	sign := func() *http.Request {
		out := httptest.NewRequest(http.MethodPost, "http://127.0.0.1:9/mcp", strings.NewReader(body))
		out.Header.Set("Mcp-Protocol-Version", "2026-07-28")
		out.Header.Set("Mcp-Method", "tools/call")
		out.Header.Set("Mcp-Name", "t")
		out.Header.Set("Mcp-Param-Region", "us")
		if _, err := k.Sign(out, hopRoute, "a", "b", policy.Principal{TokenID: "tok_1"}, "127.0.0.1", []byte(body), now); err != nil {
			t.Fatal(err)
		}
		return out
	}
	for name, change := range map[string]func(http.Header){
		"value changed": func(h http.Header) { h.Set("Mcp-Param-Region", "eu") },
		"renamed":       func(h http.Header) { h.Del("Mcp-Param-Region"); h.Set("Mcp-Param-Zone", "us") },
		"dropped":       func(h http.Header) { h.Del("Mcp-Param-Region") },
		"doubled":       func(h http.Header) { h.Add("Mcp-Param-Region", "eu") },
		"method":        func(h http.Header) { h.Set("Mcp-Method", "tools/list") },
	} {
		r := sign()
		change(r.Header)
		if _, v := k.Verify(r, r.URL.RequestURI(), []byte(body), "b", hopRoute, now); v.Reason != "hop_forged" {
			t.Errorf("%s: %+v, want hop_forged", name, v)
		}
	}
	r := sign()
	if _, v := k.Verify(r, r.URL.RequestURI(), []byte(body), "b", hopRoute, now); !v.Allowed() {
		t.Fatalf("the hop as signed: %+v", v)
	}
}

// An owner takes forwarded requests at a rate far above what a fixed count
// of nonces for the window allows (65,536 for 20 s capped it at about
// 3,300 a second): 100,000 distinct hops over 10 s of the owner's clock,
// 10,000 a second, are all taken, and one in 1,000, replayed half a window
// later, is refused.
func TestHopReplayCheckTakesAHighRate(t *testing.T) {
	k := testHopKey(t)
	start := time.Now()
	const n, rate = 100_000, 10_000
	step := time.Second / rate
	replayed := 0
	for i := range n {
		now := start.Add(time.Duration(i) * step)
		r := signedHop(t, k, http.MethodGet, "", now)
		if _, v := k.Verify(r, r.URL.RequestURI(), nil, "b", hopRoute, now); !v.Allowed() {
			t.Fatalf("hop %d of %d at %d a second: refused %d %q (%s)", i, n, rate, v.Status, v.Reason, v.Message)
		}
		if i%1000 == 0 {
			if _, v := k.Verify(r, r.URL.RequestURI(), nil, "b", hopRoute, now.Add(HopFreshness/2)); v.Reason != "hop_replayed" {
				t.Fatalf("hop %d replayed: %d %q, want hop_replayed", i, v.Status, v.Reason)
			}
			replayed++
		}
	}
	if replayed != n/1000 {
		t.Fatalf("%d replays checked, want %d", replayed, n/1000)
	}
}

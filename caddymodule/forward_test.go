package caddymodule

import (
	"bytes"
	"crypto/rand"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/broker"
	"github.com/Tahul/caddy-zidane-mcp/policy"
)

func testHopKey(t *testing.T) *hopKey {
	t.Helper()
	k := make([]byte, 32)
	_, _ = rand.Read(k)
	return newHopKey(k)
}

const (
	hopRoute = "aggregate-node|/mcp||a,b"
	hopSID   = "sid-1"
)

// signedHop is a hop from node a to node b, as the owner receives it.
func signedHop(t *testing.T, k *hopKey, method, body string, at time.Time) *http.Request {
	t.Helper()
	out := httptest.NewRequest(method, "http://127.0.0.1:9/mcp", strings.NewReader(body))
	out.Header.Set("Content-Type", "application/json")
	out.Header.Set("Accept", "application/json, text/event-stream")
	out.Header.Set("Mcp-Session-Id", hopSID)
	out.Header.Set("Mcp-Protocol-Version", "2025-11-25")
	p := policy.Principal{TokenID: "tok_1", Name: "alice", Scopes: []string{"mcp"}}
	if err := k.sign(out, hopRoute, hopSID, "a", "b", p, []byte(body), at); err != nil {
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
	verify := func(r *http.Request, body, self, route string) (hopClaims, string) {
		c, v := k.verify(r, []byte(body), self, route, now)
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
		{"another principal", func(r *http.Request) (string, string, string) {
			other := signedHop(t, k, http.MethodPost, body, now)
			other.Header.Set(hopPrincipalHeader, "eyJUb2tlbklEIjoidG9rX2FkbWluIiwiU2NvcGVzIjpbImFkbWluIl19")
			r.Header.Set(hopPrincipalHeader, other.Header.Get(hopPrincipalHeader))
			return body, "b", hopRoute
		}, "hop_forged"},
		{"another sender named", func(r *http.Request) (string, string, string) {
			r.Header.Set(hopHeader, strings.Replace(r.Header.Get(hopHeader), "from=a", "from=c", 1))
			return body, "b", hopRoute
		}, "hop_forged"},
		{"another route", func(r *http.Request) (string, string, string) { return body, "b", "aggregate-node|/mcp||a" }, "hop_forged"},
		{"received by another node", func(r *http.Request) (string, string, string) { return body, "c", hopRoute }, "hop_misdirected"},
		{"another cluster key", func(r *http.Request) (string, string, string) {
			*r = *signedHop(t, testHopKey(t), http.MethodPost, body, now)
			return body, "b", hopRoute
		}, "hop_forged"},
		{"stale", func(r *http.Request) (string, string, string) {
			*r = *signedHop(t, k, http.MethodPost, body, now.Add(-hopFreshness-time.Second))
			return body, "b", hopRoute
		}, "hop_stale"},
		{"from the future", func(r *http.Request) (string, string, string) {
			*r = *signedHop(t, k, http.MethodPost, body, now.Add(hopFreshness+time.Second))
			return body, "b", hopRoute
		}, "hop_stale"},
		{"no principal header", func(r *http.Request) (string, string, string) {
			r.Header.Del(hopPrincipalHeader)
			return body, "b", hopRoute
		}, "hop_malformed"},
		{"two hop headers", func(r *http.Request) (string, string, string) {
			r.Header.Add(hopHeader, r.Header.Get(hopHeader))
			return body, "b", hopRoute
		}, "hop_malformed"},
		{"a made-up header", func(r *http.Request) (string, string, string) {
			r.Header.Set(hopHeader, "v1;from=a;to=b;t=1;n=00000000000000000000000000000000;mac=AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA")
			return body, "b", hopRoute
		}, "hop_forged"},
		{"garbage", func(r *http.Request) (string, string, string) {
			r.Header.Set(hopHeader, "let me in")
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
	if reason != "" || c.from != "a" || c.principal.TokenID != "tok_1" || c.principal.Name != "alice" {
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

// The replay check is bounded: when it holds as many live nonces as it
// may, it refuses (503) rather than forget one that could be replayed.
func TestHopReplayCacheIsBounded(t *testing.T) {
	k := testHopKey(t)
	now := time.Now()
	for i := range maxHopNonces {
		k.seen[strconv.Itoa(i)+"|x"] = now.Add(time.Minute)
	}
	r := signedHop(t, k, http.MethodGet, "", now)
	if _, v := k.verify(r, nil, "b", hopRoute, now); v.Status != http.StatusServiceUnavailable {
		t.Fatalf("full replay cache: %d %q, want 503", v.Status, v.Reason)
	}
	// Expired nonces make room.
	for n := range k.seen {
		k.seen[n] = now.Add(-time.Second)
	}
	if _, v := k.verify(r, nil, "b", hopRoute, now); !v.Allowed() {
		t.Fatalf("after expiry: %+v", v)
	}
}

// A session id names its node only sealed: an id naming another node,
// made without the key, or sealed for another route, names none.
func TestAggregateSessionIDNamesItsNode(t *testing.T) {
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	ids, err := broker.NewSessionIDs(key)
	if err != nil {
		t.Fatal(err)
	}
	f := &aggForward{ids: ids, route: hopRoute}
	sid := ids.Seal("node-b/"+rand.Text(), "", hopRoute)
	if node, ok := f.owner(sid); !ok || node != "node-b" {
		t.Fatalf("owner of a sealed id: %q %v", node, ok)
	}
	otherKey := make([]byte, 32)
	_, _ = rand.Read(otherKey)
	other, _ := broker.NewSessionIDs(otherKey)
	for name, forged := range map[string]string{
		"another node in plain text":   "node-c/" + rand.Text(),
		"sealed with another key":      other.Seal("node-c/x", "", hopRoute),
		"sealed for another route":     ids.Seal("node-c/x", "", "aggregate-node|/other||a"),
		"a bad node id, sealed":        ids.Seal("../../x/y", "", hopRoute),
		"no node, sealed":              ids.Seal("justrandom", "", hopRoute),
		"a sealed id with a bit moved": flipMiddle(sid),
	} {
		if node, ok := f.owner(forged); ok {
			t.Errorf("%s: names node %q", name, node)
		}
	}
}

// flipMiddle changes one character in the middle of a base64 id (the
// last one may hold only padding bits).
func flipMiddle(s string) string {
	b := []byte(s)
	i := len(b) / 2
	if b[i] == 'A' {
		b[i] = 'B'
	} else {
		b[i] = 'A'
	}
	return string(b)
}

func TestCheckAdvertise(t *testing.T) {
	for _, ok := range []string{"https://gw-1.internal:8443", "https://10.0.0.2", "http://127.0.0.1:8080", "http://localhost:1", "http://[::1]:2/"} {
		if err := checkAdvertise(ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for bad, want := range map[string]string{
		"http://10.0.0.2:8080":          "in the clear",
		"gw-1:8443":                     "give the URL",
		"ftp://gw-1":                    "scheme",
		"https://":                      "give the URL",
		"https://user:pw@gw-1":          "no user",
		"https://gw-1/mcp":              "no user, path",
		"https://gw-1?x=1":              "no user, path or query",
		"https://0.0.0.0:8443":          "no address another replica can reach",
		"":                              "give the URL",
		"https://gw-1.internal:8443#no": "no user",
	} {
		err := checkAdvertise(bad)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want an error saying %q", bad, err, want)
		}
	}
}

// The hop carries the forwarded headers only: no Authorization, cookie,
// Origin or X-Forwarded-*.
func TestHopCarriesOnlyForwardedHeaders(t *testing.T) {
	k := testHopKey(t)
	var got http.Header
	owner := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = r.Header.Clone()
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Set-Cookie", "x=1")
		_, _ = w.Write([]byte(`{}`))
	}))
	defer owner.Close()
	f := newAggForward(nil, hopRoute, nil, k, nil)
	in := httptest.NewRequest(http.MethodPost, "http://mcp.example/mcp", bytes.NewReader([]byte(`{}`)))
	for name, v := range map[string]string{
		"Authorization": "Bearer secret", "Cookie": "a=b", "Origin": "http://evil", "X-Forwarded-For": "1.2.3.4",
		"X-Forwarded-Host": "evil", "Mcp-Session-Id": hopSID, "Content-Type": "application/json", "Accept": "application/json",
	} {
		in.Header.Set(name, v)
	}
	in = in.WithContext(policy.WithPrincipal(in.Context(), policy.Principal{TokenID: "tok_1"}))
	w := httptest.NewRecorder()
	if err := f.forwardTo(w, in, hopSID, "a", "b", owner.URL); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"Authorization", "Cookie", "Origin", "X-Forwarded-For", "X-Forwarded-Host"} {
		if got.Get(name) != "" {
			t.Errorf("the hop carried %s: %q", name, got.Get(name))
		}
	}
	if got.Get("Mcp-Session-Id") != hopSID || got.Get(hopHeader) == "" {
		t.Errorf("the hop lacks what the owner needs: %v", got)
	}
	if w.Header().Get("Set-Cookie") != "" {
		t.Error("the owner's Set-Cookie reached the client")
	}
}

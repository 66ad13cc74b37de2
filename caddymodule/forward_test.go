package caddymodule

import (
	"bytes"
	"crypto/rand"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/broker/sessionid"

	"github.com/Tahul/caddy-zidane-mcp/edge"
	"github.com/Tahul/caddy-zidane-mcp/policy"
)

func testHopKey(t *testing.T) *edge.HopKey {
	t.Helper()
	k := make([]byte, 32)
	_, _ = rand.Read(k)
	return edge.NewHopKey(k)
}

const (
	hopRoute = "aggregate-node|/mcp||a,b"
	hopSID   = "sid-1"
)

// A session id names its node only sealed: an id naming another node,
// made without the key, or sealed for another route, names none.
func TestAggregateSessionIDNamesItsNode(t *testing.T) {
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	ids, err := sessionid.New(key)
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
	other, _ := sessionid.New(otherKey)
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
		// Spellings of loopback that pinnedfetch's rule refuses are not
		// loopback here either: one predicate for every plain-http rule.
		"http://[::ffff:127.0.0.1]:8080": "in the clear",
		"http://[::ffff:7f00:1]:8080":    "in the clear",
		"http://2130706433:8080":         "in the clear",
		"http://localhost.:8080":         "in the clear",
	} {
		err := checkAdvertise(bad)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want an error saying %q", bad, err, want)
		}
	}
}

// The hop carries the forwarded headers only: no Authorization, cookie,
// Origin or X-Forwarded-*; the answer's headers come back by an allowlist,
// and only an answer that carries the hop's tag (from the route the hop
// was for) is relayed at all.
func TestHopCarriesOnlyForwardedHeaders(t *testing.T) {
	k := testHopKey(t)
	var got http.Header
	tagged := true
	owner := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = r.Header.Clone()
		body, _ := io.ReadAll(r.Body)
		c, v := k.Verify(r, r.URL.RequestURI(), body, "b", hopRoute, time.Now())
		if !v.Allowed() {
			t.Errorf("the owner refuses the hop: %+v", v)
		}
		// The client's address as the sender saw it (its connection's,
		// never X-Forwarded-For), for the owner's audit lines.
		if c.Client != "192.0.2.1" {
			t.Errorf("the hop names client %q, want the sender's client 192.0.2.1", c.Client)
		}
		if tagged {
			w.Header().Set(edge.HopAnswerHeader, k.AnswerTag(c))
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Set-Cookie", "x=1")
		_, _ = w.Write([]byte(`{"internal":"page"}`))
	}))
	defer owner.Close()
	f := newAggForward(nil, hopRoute, nil, k, nil)
	request := func() *http.Request {
		in := httptest.NewRequest(http.MethodPost, "http://mcp.example/mcp", bytes.NewReader([]byte(`{}`)))
		for name, v := range map[string]string{
			"Authorization": "Bearer secret", "Cookie": "a=b", "Origin": "http://evil", "X-Forwarded-For": "1.2.3.4",
			"X-Forwarded-Host": "evil", "Mcp-Session-Id": hopSID, "Content-Type": "application/json", "Accept": "application/json",
		} {
			in.Header.Set(name, v)
		}
		return in.WithContext(policy.WithPrincipal(in.Context(), policy.Principal{TokenID: "tok_1"}))
	}
	w := httptest.NewRecorder()
	if err := f.forwardTo(w, request(), hopSID, "a", "b", owner.URL); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"Authorization", "Cookie", "Origin", "X-Forwarded-For", "X-Forwarded-Host"} {
		if got.Get(name) != "" {
			t.Errorf("the hop carried %s: %q", name, got.Get(name))
		}
	}
	if got.Get("Mcp-Session-Id") != hopSID || got.Get(edge.HopHeader) == "" {
		t.Errorf("the hop lacks what the owner needs: %v", got)
	}
	if w.Header().Get("Set-Cookie") != "" || w.Header().Get(edge.HopAnswerHeader) != "" {
		t.Errorf("the owner's Set-Cookie or tag reached the client: %v", w.Header())
	}
	if w.Body.String() != `{"internal":"page"}` {
		t.Errorf("the tagged answer was not relayed: %q", w.Body.String())
	}

	tagged = false
	w = httptest.NewRecorder()
	err := f.forwardTo(w, request(), hopSID, "a", "b", owner.URL)
	var re *edge.RefusalError
	if !errors.As(err, &re) || re.Verdict.Reason != "hop_untagged" || w.Body.Len() != 0 {
		t.Fatalf("an untagged answer: %v, %q relayed", err, w.Body.String())
	}
}

// Routes provisioned again (a config reload) share the replay check: a
// hop taken before is a replay after.
func TestHopKeySurvivesReload(t *testing.T) {
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	before, after := sharedHopKey(key), sharedHopKey(append([]byte(nil), key...))
	if before != after {
		t.Fatal("a route provisioned again gets a hop key of its own, with an empty replay check")
	}
	out := httptest.NewRequest(http.MethodGet, "http://127.0.0.1:9/mcp", nil)
	out.Header.Set("Mcp-Session-Id", hopSID)
	if _, err := before.Sign(out, hopRoute, "a", "b", policy.Principal{TokenID: "tok_1"}, "", "127.0.0.1", nil, time.Now()); err != nil {
		t.Fatal(err)
	}
	if _, v := before.Verify(out, out.URL.RequestURI(), nil, "b", hopRoute, time.Now()); !v.Allowed() {
		t.Fatalf("before the reload: %+v", v)
	}
	if _, v := after.Verify(out, out.URL.RequestURI(), nil, "b", hopRoute, time.Now()); v.Reason != "hop_replayed" {
		t.Fatalf("the same hop after the reload: %q, want hop_replayed", v.Reason)
	}
}

// An owner whose replay check is at its memory bound refuses a hop 503
// hop_busy with Retry-After: the client gets 503 with the owner's delay,
// something to retry, not a 502 that blames the cluster's config.
func TestHopBusyOwnerGivesARetry(t *testing.T) {
	k := testHopKey(t)
	owner := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(edge.HopRefusedHeader, "hop_busy")
		w.Header().Set("Retry-After", "2")
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer owner.Close()
	f := newAggForward(nil, hopRoute, nil, k, nil)
	in := httptest.NewRequest(http.MethodPost, "http://mcp.example/mcp", strings.NewReader(`{}`))
	in.Header.Set("Mcp-Session-Id", hopSID)
	in = in.WithContext(policy.WithPrincipal(in.Context(), policy.Principal{TokenID: "tok_1"}))
	err := f.forwardTo(httptest.NewRecorder(), in, hopSID, "a", "b", owner.URL)
	var re *edge.RefusalError
	if !errors.As(err, &re) || re.Verdict.Status != http.StatusServiceUnavailable || re.Verdict.Reason != "hop_busy" || re.Verdict.RetryAfter != 2*time.Second {
		t.Fatalf("a busy owner: %v, want 503 hop_busy retrying after 2s", err)
	}
}

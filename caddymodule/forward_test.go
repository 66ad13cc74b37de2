package caddymodule

import (
	"crypto/rand"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/policy"
)

const (
	hopRoute = "aggregate-node|/mcp||a,b"
	hopSID   = "sid-1"
)

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

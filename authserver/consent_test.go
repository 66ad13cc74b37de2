package authserver

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// TestConsentPage: the page names the client truthfully (its id, its
// name as its own claim, the host the grant goes to), the resource and
// the scopes, and cannot be framed, cached or leak a referrer.
func TestConsentPage(t *testing.T) {
	f := newFixture(t)
	q := f.authzQuery(newPKCE(f))
	resp := f.authorize(q.Encode(), "alice")
	for h, want := range map[string]string{
		"X-Frame-Options":         "DENY",
		"Cache-Control":           "no-store",
		"Referrer-Policy":         "same-origin",
		"Content-Security-Policy": "frame-ancestors 'none'",
	} {
		if got := resp.Header.Get(h); !strings.Contains(got, want) {
			t.Errorf("%s: %q, want %q", h, got, want)
		}
	}
	body := readBody(resp)
	for _, want := range []string{clientA, "it calls itself “Client A”", "<code>127.0.0.1</code>", testResource, `value="tools:read" checked`, `value="tools:call" checked`, "on your own computer"} {
		if !strings.Contains(body, want) {
			t.Errorf("the consent page does not say %q", want)
		}
	}
	if strings.Contains(body, q.Get("state")) {
		t.Error("the consent page shows the client's state")
	}
}

// TestConsentEscapes: a client's name is its own claim and is shown as
// text, never markup.
func TestConsentEscapes(t *testing.T) {
	f := newFixture(t, func(_ *fixture, c *Config) {
		c.Clients = testClients{clientA: {id: clientA, name: `<script>alert(1)</script>"><img src=x>`, redirects: []string{redirectA}}}
	})
	body := readBody(f.authorize(f.authzQuery(newPKCE(f)).Encode(), "alice"))
	if strings.Contains(body, "<script>alert") || strings.Contains(body, "<img src=x>") {
		t.Errorf("the client's name reached the page as markup: %s", body)
	}
}

// TestConsentAttacks is what a page on another site, another browser, or
// a client trying its luck may post to the consent endpoint.
func TestConsentAttacks(t *testing.T) {
	for _, tc := range []struct {
		name   string
		attack func(f *fixture, fm form) *http.Response
		status int
		reason string
	}{
		{"CSRF missing", func(f *fixture, fm form) *http.Response {
			v := fm.values("allow")
			v.Del("csrf")
			return f.postConsent(v, "alice", fm.cookie)
		}, 400, "lacks"},
		{"CSRF of another browser", func(f *fixture, fm form) *http.Response {
			// The attacker's own consent page, for the same request, in
			// the attacker's browser: its CSRF token is bound to that
			// browser, not the victim's.
			other := f.readForm(f.authorize(f.authzQuery(newPKCE(f)).Encode(), "alice"))
			v := fm.values("allow")
			v.Set("csrf", other.csrf)
			return f.postConsent(v, "alice", fm.cookie)
		}, 403, "CSRF token"},
		{"no browser binding cookie", func(f *fixture, fm form) *http.Response {
			return f.postConsent(fm.values("allow"), "alice", nil)
		}, 403, "CSRF token"},
		{"request of client A posted as client B's", func(f *fixture, fm form) *http.Response {
			v := fm.values("allow")
			v.Set("client_id", clientB)
			return f.postConsent(v, "alice", fm.cookie)
		}, 400, "not one this server made for this client"},
		{"request altered", func(f *fixture, fm form) *http.Response {
			v := fm.values("allow")
			b := []byte(fm.request)
			b[10] ^= 1
			v.Set("request", string(b))
			return f.postConsent(v, "alice", fm.cookie)
		}, 400, "not one this server made"},
		{"another person signed in", func(f *fixture, fm form) *http.Response {
			return f.postConsent(fm.values("allow"), "bob", fm.cookie)
		}, 403, "not the one the form was shown to"},
		{"nobody signed in", func(f *fixture, fm form) *http.Response {
			return f.postConsent(fm.values("allow"), "", fm.cookie)
		}, 403, "not the one the form was shown to"},
		{"a scope the person may no longer grant", func(f *fixture, fm form) *http.Response {
			// The form was shown when alice could grant tools:call; she
			// has since signed in again without it.
			return f.postConsent(fm.values("allow"), "alice-narrowed", fm.cookie)
		}, 403, "may no longer grant tools:call"},
		{"scope widened in the form", func(f *fixture, fm form) *http.Response {
			return f.postConsent(fm.values("allow", "tools:read", "sessions"), "alice", fm.cookie)
		}, 400, "did not offer"},
		{"posted from another origin", func(f *fixture, fm form) *http.Response {
			r := httptest.NewRequest(http.MethodPost, testIssuer+ConsentPath, strings.NewReader(fm.values("allow").Encode()))
			r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			r.Header.Set("Origin", "https://evil.example")
			r.AddCookie(&http.Cookie{Name: "test-person", Value: "alice"})
			r.AddCookie(&http.Cookie{Name: fm.cookie.Name, Value: fm.cookie.Value})
			return f.do(r)
		}, 403, "another origin"},
		{"posted with Origin: null (a sandboxed frame)", func(f *fixture, fm form) *http.Response {
			r := httptest.NewRequest(http.MethodPost, testIssuer+ConsentPath, strings.NewReader(fm.values("allow").Encode()))
			r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			r.Header.Set("Origin", "null")
			r.AddCookie(&http.Cookie{Name: "test-person", Value: "alice"})
			r.AddCookie(&http.Cookie{Name: fm.cookie.Name, Value: fm.cookie.Value})
			return f.do(r)
		}, 403, "another origin"},
		{"expired", func(f *fixture, fm form) *http.Response {
			f.now = f.now.Add(DefaultConsentLifetime + time.Second)
			return f.postConsent(fm.values("allow"), "alice", fm.cookie)
		}, 400, "expired"},
		{"csrf twice", func(f *fixture, fm form) *http.Response {
			v := fm.values("allow")
			v.Add("csrf", "x")
			return f.postConsent(v, "alice", fm.cookie)
		}, 400, "csrf is given more than once"},
		{"GET", func(f *fixture, fm form) *http.Response {
			return f.do(httptest.NewRequest(http.MethodGet, testIssuer+ConsentPath+"?"+fm.values("allow").Encode(), nil))
		}, 405, "posted"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			fm := f.readForm(f.authorize(f.authzQuery(newPKCE(f)).Encode(), "alice"))
			resp := tc.attack(f, fm)
			if resp.StatusCode != tc.status {
				t.Errorf("status %d, want %d", resp.StatusCode, tc.status)
			}
			if loc := resp.Header.Get("Location"); loc != "" {
				t.Errorf("the refused form redirected to %q", loc)
			}
			if resp.Header.Get("X-Frame-Options") != "DENY" || resp.Header.Get("Cache-Control") != "no-store" {
				t.Error("the refusal page lacks its framing and caching headers")
			}
			if a := f.lastAudit(); !strings.Contains(a.Reason, tc.reason) {
				t.Errorf("audited %q, want it to say %q", a.Reason, tc.reason)
			}
			if n := f.codes(); n != 0 {
				t.Errorf("%d codes were stored", n)
			}
		})
	}
}

func (f *fixture) codes() int {
	keys, _ := f.store.List(context.Background(), CodesPrefix, false)
	return len(keys)
}

// TestConsentAllow: the answer goes to the registered redirect URI alone,
// with the code, the state and iss; the code holds the scopes ticked.
func TestConsentAllow(t *testing.T) {
	f := newFixture(t)
	q := f.authzQuery(newPKCE(f))
	fm := f.readForm(f.authorize(q.Encode(), "alice"))
	resp := f.postConsent(fm.values("allow", "tools:read"), "alice", fm.cookie)
	got := redirectParams(t, resp, http.StatusSeeOther)
	if !strings.HasPrefix(resp.Header.Get("Location"), redirectA+"?") {
		t.Fatalf("redirected to %q, want %s", resp.Header.Get("Location"), redirectA)
	}
	if got.Get("code") == "" || got.Get("state") != q.Get("state") || got.Get("iss") != testIssuer {
		t.Fatalf("redirect params %v, want code, the state and iss", got)
	}
	raw, err := f.store.Load(context.Background(), codeKey(got.Get("code")))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(raw), got.Get("code")) {
		t.Error("storage holds the code itself")
	}
	var rec codeRecord
	_ = json.Unmarshal(raw, &rec)
	if strings.Join(rec.Scopes, " ") != "tools:read" || rec.Owner != "alice" || rec.Client != clientA || rec.Resource != testResource {
		t.Errorf("code record %+v, want alice's grant of tools:read to client A for the resource", rec)
	}
	if !rec.Expires.Equal(f.now.Add(DefaultCodeLifetime)) {
		t.Errorf("the code expires at %v, want %v", rec.Expires, f.now.Add(DefaultCodeLifetime))
	}
}

// TestConsentKeepsRedirectQuery: a registered redirect URI's own query is
// kept as written, the answer's parameters added after it.
func TestConsentKeepsRedirectQuery(t *testing.T) {
	f := newFixture(t)
	q := f.authzQuery(newPKCE(f))
	q.Set("client_id", "https://withquery.example/c.js")
	q.Set("redirect_uri", "https://withquery.example/cb?x=1")
	fm := f.readForm(f.authorize(q.Encode(), "alice"))
	resp := f.postConsent(fm.values("allow"), "alice", fm.cookie)
	if loc := resp.Header.Get("Location"); !strings.HasPrefix(loc, "https://withquery.example/cb?x=1&") {
		t.Errorf("redirected to %q, want the registered URI with its query kept", loc)
	}
}

// TestConsentDeny: declining, or unticking every scope, answers
// access_denied, with state and iss, to the registered redirect URI.
func TestConsentDeny(t *testing.T) {
	for _, tc := range []struct {
		name     string
		decision string
		scopes   []string
	}{{"declined", "deny", nil}, {"no scope ticked", "allow", []string{}}} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			q := f.authzQuery(newPKCE(f))
			fm := f.readForm(f.authorize(q.Encode(), "alice"))
			v := fm.values(tc.decision, tc.scopes...)
			if tc.scopes != nil && len(tc.scopes) == 0 {
				v.Del("scope")
			}
			resp := f.postConsent(v, "alice", fm.cookie)
			got := redirectParams(t, resp, http.StatusSeeOther)
			if got.Get("error") != "access_denied" || got.Get("iss") != testIssuer || got.Get("state") != q.Get("state") || got.Get("code") != "" {
				t.Errorf("got %v, want access_denied with iss and state and no code", got)
			}
			if f.codes() != 0 {
				t.Error("a code was stored")
			}
		})
	}
}

// TestConsentOnce: a consent form is answered once: posted again (the back
// button, or whoever holds its cookie and fields), allow or deny, it gives
// no second code.
func TestConsentOnce(t *testing.T) {
	for _, first := range []string{"allow", "deny"} {
		t.Run("after "+first, func(t *testing.T) {
			f := newFixture(t)
			fm := f.readForm(f.authorize(f.authzQuery(newPKCE(f)).Encode(), "alice"))
			if resp := f.postConsent(fm.values(first), "alice", fm.cookie); resp.StatusCode != http.StatusSeeOther {
				t.Fatalf("first answer: %d", resp.StatusCode)
			}
			resp := f.postConsent(fm.values("allow"), "alice", fm.cookie)
			if resp.StatusCode != http.StatusBadRequest || resp.Header.Get("Location") != "" {
				t.Errorf("the form posted again: %d to %q", resp.StatusCode, resp.Header.Get("Location"))
			}
			if a := f.lastAudit(); !strings.Contains(a.Reason, "already answered") {
				t.Errorf("audited %q", a.Reason)
			}
			want := 0
			if first == "allow" {
				want = 1
			}
			if n := f.codes(); n != want {
				t.Errorf("%d codes stored, want %d", n, want)
			}
		})
	}
}

// TestSweep: expired codes (after their tombstones' time) and answered
// forms (after the form's lifetime) are deleted; live ones are kept.
func TestSweep(t *testing.T) {
	f := newFixture(t)
	f.consentCode(newPKCE(f))
	if n, err := f.srv.Sweep(context.Background()); err != nil || n != 0 {
		t.Fatalf("a sweep of live records deleted %d (%v)", n, err)
	}
	f.now = f.now.Add(DefaultConsentLifetime + tombstoneKeep + time.Minute)
	n, err := f.srv.Sweep(context.Background())
	if err != nil || n != 2 {
		t.Fatalf("the sweep deleted %d (%v), want the code and the answered form", n, err)
	}
	for _, prefix := range []string{CodesPrefix, ConsentsPrefix} {
		if keys, _ := f.store.List(context.Background(), prefix, false); len(keys) != 0 {
			t.Errorf("%s still holds %v", prefix, keys)
		}
	}
}

// TestConsentOriginAsBrowsersWriteIt: a browser's Origin leaves out the
// scheme's default port (RFC 6454 §6.2); an issuer written with it
// (https://mcp.example.com:443) still takes its own consent form, and one
// from another port is still another origin.
func TestConsentOriginAsBrowsersWriteIt(t *testing.T) {
	for origin, status := range map[string]int{
		"http://127.0.0.1":      http.StatusSeeOther,
		"http://127.0.0.1:80":   http.StatusSeeOther,
		"http://127.0.0.1:8080": http.StatusForbidden,
		"http://localhost":      http.StatusForbidden,
	} {
		f := newFixture(t, func(_ *fixture, c *Config) { c.Issuer = "http://127.0.0.1:80" })
		fm := f.readForm(f.authorize(f.authzQuery(newPKCE(f)).Encode(), "alice"))
		r := httptest.NewRequest(http.MethodPost, testIssuer+ConsentPath, strings.NewReader(fm.values("allow").Encode()))
		r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		r.Header.Set("Origin", origin)
		r.AddCookie(&http.Cookie{Name: "test-person", Value: "alice"})
		r.AddCookie(&http.Cookie{Name: fm.cookie.Name, Value: fm.cookie.Value})
		if resp := f.do(r); resp.StatusCode != status {
			t.Errorf("the form posted with Origin %s: %d, want %d", origin, resp.StatusCode, status)
		}
	}
}

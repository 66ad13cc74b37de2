package authserver

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
)

// TestAuthorizeAttacks is what a client, or a page that sends a person's
// browser to the authorization endpoint, may try. Until the redirect URI
// is known good a refusal is a page and never a redirect; after, it goes
// back to the client with error, state and iss.
func TestAuthorizeAttacks(t *testing.T) {
	type want struct {
		page   bool   // refused on a page (no redirect)
		status int    // the page's status
		err    string // the OAuth error (audited, and in a redirect)
		reason string // a word of the reason
	}
	set := func(k, v string) func(url.Values) { return func(q url.Values) { q.Set(k, v) } }
	del := func(k string) func(url.Values) { return func(q url.Values) { q.Del(k) } }
	add := func(k, v string) func(url.Values) { return func(q url.Values) { q.Add(k, v) } }
	for _, tc := range []struct {
		name string
		mod  []func(url.Values)
		raw  func(string) string // edits the encoded query
		want want
	}{
		{name: "redirect not registered", mod: []func(url.Values){set("redirect_uri", "https://evil.example/cb")}, want: want{page: true, status: 400, err: "invalid_request", reason: "not one the client registered"}},
		{name: "localhost for a 127.0.0.1 registration", mod: []func(url.Values){set("redirect_uri", "http://localhost:33418/callback")}, want: want{page: true, status: 400, err: "invalid_request", reason: "not one the client registered"}},
		{name: "changed path", mod: []func(url.Values){set("redirect_uri", "http://127.0.0.1:33418/callback/x")}, want: want{page: true, status: 400, reason: "not one the client registered"}},
		{name: "added query", mod: []func(url.Values){set("redirect_uri", redirectA+"?next=evil")}, want: want{page: true, status: 400, reason: "not one the client registered"}},
		{name: "fragment", mod: []func(url.Values){set("redirect_uri", redirectA+"#x")}, want: want{page: true, status: 400, reason: "fragment"}},
		{name: "trailing slash", mod: []func(url.Values){set("redirect_uri", redirectA+"/")}, want: want{page: true, status: 400, reason: "not one the client registered"}},
		{name: "IPv4-mapped loopback", mod: []func(url.Values){set("redirect_uri", "http://[::ffff:127.0.0.1]:33418/callback")}, want: want{page: true, status: 400, reason: "plain http off loopback"}},
		{name: "http off loopback, though registered", mod: []func(url.Values){set("client_id", "https://plain.example/c.json"), set("redirect_uri", "http://plain.example/cb")}, want: want{page: true, status: 400, reason: "plain http off loopback"}},
		{name: "user information", mod: []func(url.Values){set("redirect_uri", "http://evil@127.0.0.1:33418/callback")}, want: want{page: true, status: 400, reason: "user information"}},
		{name: "no redirect_uri", mod: []func(url.Values){del("redirect_uri")}, want: want{page: true, status: 400, reason: "no redirect_uri"}},
		{name: "redirect_uri twice", mod: []func(url.Values){add("redirect_uri", "https://evil.example/cb")}, want: want{page: true, status: 400, reason: "redirect_uri is given more than once"}},
		{name: "redirect_uri in another case", raw: func(s string) string { return s + "&Redirect_Uri=https%3A%2F%2Fevil.example%2Fcb" }, want: want{page: true, status: 400, reason: "redirect_uri is given more than once"}},
		{name: "client_id twice", mod: []func(url.Values){add("client_id", clientB)}, want: want{page: true, status: 400, reason: "client_id is given more than once"}},
		{name: "unknown client", mod: []func(url.Values){set("client_id", "https://nobody.example/c.json")}, want: want{page: true, status: 400, err: "invalid_client", reason: "not known"}},
		{name: "no client_id", mod: []func(url.Values){del("client_id")}, want: want{page: true, status: 400, reason: "no client_id"}},
		{name: "semicolon separator", raw: func(s string) string { return s + ";scope=admin" }, want: want{page: true, status: 400, reason: "do not parse"}},
		{name: "query too long", raw: func(s string) string { return s + "&pad=" + strings.Repeat("a", maxQuery) }, want: want{page: true, status: 414, reason: "over"}},
		// After the redirect URI is good: redirects.
		{name: "PKCE missing", mod: []func(url.Values){del("code_challenge"), del("code_challenge_method")}, want: want{err: "invalid_request", reason: "PKCE is required"}},
		{name: "PKCE method missing", mod: []func(url.Values){del("code_challenge_method")}, want: want{err: "invalid_request", reason: "PKCE is required"}},
		{name: "PKCE plain", mod: []func(url.Values){set("code_challenge_method", "plain")}, want: want{err: "invalid_request", reason: "plain is refused"}},
		{name: "PKCE challenge not S256", mod: []func(url.Values){set("code_challenge", "short")}, want: want{err: "invalid_request", reason: "not an S256 challenge"}},
		{name: "response_type token", mod: []func(url.Values){set("response_type", "token")}, want: want{err: "unsupported_response_type", reason: "only response_type is code"}},
		{name: "resource missing", mod: []func(url.Values){del("resource")}, want: want{err: "invalid_target", reason: "no resource"}},
		{name: "resource twice", mod: []func(url.Values){add("resource", "http://127.0.0.1:8443/other")}, want: want{err: "invalid_request", reason: "resource is given more than once"}},
		{name: "resource unknown", mod: []func(url.Values){set("resource", "https://elsewhere.example/mcp")}, want: want{err: "invalid_target", reason: "not one this server issues tokens for"}},
		{name: "resource with a fragment", mod: []func(url.Values){set("resource", testResource+"#f")}, want: want{err: "invalid_target", reason: "not one this server"}},
		{name: "scope unknown to the resource", mod: []func(url.Values){set("scope", "tools:read admin")}, want: want{err: "invalid_scope", reason: `no scope "admin"`}},
		{name: "scope twice", mod: []func(url.Values){add("scope", "sessions")}, want: want{err: "invalid_request", reason: "scope is given more than once"}},
		{name: "state twice", mod: []func(url.Values){add("state", "other")}, want: want{err: "invalid_request", reason: "state is given more than once"}},
		{name: "dpop_jkt malformed", mod: []func(url.Values){set("dpop_jkt", "abc")}, want: want{err: "invalid_request", reason: "dpop_jkt"}},
		// 42 A's and a B: base64url of 32 bytes whose last character
		// sets bits the bytes do not hold, a second spelling of the
		// value whose last character is A. A thumbprint or a challenge
		// is compared as a string: that spelling would match no key's
		// thumbprint (RFC 7638) and no verifier's S256.
		{name: "dpop_jkt in a second spelling", mod: []func(url.Values){set("dpop_jkt", strings.Repeat("A", 42)+"B")}, want: want{err: "invalid_request", reason: "dpop_jkt"}},
		{name: "PKCE challenge in a second spelling", mod: []func(url.Values){set("code_challenge", strings.Repeat("A", 42)+"B")}, want: want{err: "invalid_request", reason: "not an S256 challenge"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			q := f.authzQuery(newPKCE(f))
			state := q.Get("state")
			for _, m := range tc.mod {
				m(q)
			}
			raw := q.Encode()
			if tc.raw != nil {
				raw = tc.raw(raw)
			}
			resp := f.authorize(raw, "alice")
			body := readBody(resp)
			a := f.lastAudit()
			if !strings.Contains(a.Reason, tc.want.reason) {
				t.Errorf("audited reason %q, want it to say %q", a.Reason, tc.want.reason)
			}
			if tc.want.err != "" && a.Error != tc.want.err {
				t.Errorf("audited error %q, want %q", a.Error, tc.want.err)
			}
			if tc.want.page {
				if resp.StatusCode != tc.want.status {
					t.Errorf("status %d, want %d", resp.StatusCode, tc.want.status)
				}
				if loc := resp.Header.Get("Location"); loc != "" {
					t.Errorf("a refusal before the redirect URI is good redirected to %q", loc)
				}
				if !strings.Contains(body, "cannot go on") {
					t.Errorf("the refusal page says nothing: %q", body)
				}
				return
			}
			got := redirectParams(t, resp, http.StatusFound)
			if !strings.HasPrefix(resp.Header.Get("Location"), redirectA+"?") {
				t.Errorf("the refusal redirected to %q, not the registered redirect URI", resp.Header.Get("Location"))
			}
			if got.Get("error") != tc.want.err || !strings.Contains(got.Get("error_description"), tc.want.reason) {
				t.Errorf("redirect error %q %q, want %q saying %q", got.Get("error"), got.Get("error_description"), tc.want.err, tc.want.reason)
			}
			if got.Get("iss") != testIssuer {
				t.Errorf("iss %q in the error response, want %q (RFC 9207)", got.Get("iss"), testIssuer)
			}
			if tc.name != "state twice" && got.Get("state") != state {
				t.Errorf("state %q in the error response, want the request's", got.Get("state"))
			}
		})
	}
}

// TestAuthorizeLoopbackPort: a loopback redirect URI registered without a
// port, or with another, matches on any port (RFC 8252 §7.3), through the
// client's rule.
func TestAuthorizeLoopbackPort(t *testing.T) {
	f := newFixture(t)
	q := f.authzQuery(newPKCE(f))
	q.Set("redirect_uri", "http://127.0.0.1:50123/callback")
	f.readForm(f.authorize(q.Encode(), "alice"))
}

// TestAuthorizeSignIn: a browser nobody signed in on is sent to sign in,
// and back to the same authorization request.
func TestAuthorizeSignIn(t *testing.T) {
	f := newFixture(t)
	q := f.authzQuery(newPKCE(f))
	resp := f.authorize(q.Encode(), "")
	if resp.StatusCode != http.StatusFound || !strings.HasPrefix(resp.Header.Get("Location"), "/test-signin?return=") {
		t.Fatalf("status %d to %q, want the sign-in", resp.StatusCode, resp.Header.Get("Location"))
	}
	u, _ := url.Parse(resp.Header.Get("Location"))
	back := u.Query().Get("return")
	if back != AuthorizePath+"?"+q.Encode() {
		t.Errorf("return to %q, want the authorization request", back)
	}
}

// TestAuthorizePersonScopes: the consent offers the scopes asked that the
// person may grant; a person who may grant none is refused.
func TestAuthorizePersonScopes(t *testing.T) {
	f := newFixture(t)
	q := f.authzQuery(newPKCE(f))
	fm := f.readForm(f.authorize(q.Encode(), "bob"))
	if strings.Join(fm.scopes, " ") != "tools:read" {
		t.Errorf("bob is offered %v, want only tools:read", fm.scopes)
	}
	resp := f.authorize(q.Encode(), "carol")
	got := redirectParams(t, resp, http.StatusFound)
	if got.Get("error") != "access_denied" || got.Get("iss") != testIssuer {
		t.Errorf("carol got %v, want access_denied with iss", got)
	}
}

// TestAuthorizeDefaultScopes: a request without scope is offered every
// scope of the resource the person may grant.
func TestAuthorizeDefaultScopes(t *testing.T) {
	f := newFixture(t)
	q := f.authzQuery(newPKCE(f))
	q.Del("scope")
	fm := f.readForm(f.authorize(q.Encode(), "alice"))
	if strings.Join(fm.scopes, " ") != "tools:read tools:call sessions" {
		t.Errorf("offered %v, want the resource's scopes", fm.scopes)
	}
}

// TestAuthorizeResourceCase: a resource's scheme and host are compared
// without case, as the MCP rules ask; its path is not.
func TestAuthorizeResourceCase(t *testing.T) {
	f := newFixture(t)
	q := f.authzQuery(newPKCE(f))
	q.Set("resource", "HTTP://127.0.0.1:8443/mcp")
	f.readForm(f.authorize(q.Encode(), "alice"))
	q.Set("resource", "http://127.0.0.1:8443/MCP")
	got := redirectParams(t, f.authorize(q.Encode(), "alice"), http.StatusFound)
	if got.Get("error") != "invalid_target" {
		t.Errorf("a resource with another path case got %v, want invalid_target", got)
	}
}

// unavailableClients cannot look any client up now.
type unavailableClients struct{}

func (unavailableClients) Resolve(context.Context, string) (Client, error) {
	return nil, fmt.Errorf("%w: too many documents are being fetched", ErrClientUnavailable)
}

// TestAuthorizeClientUnavailable: a client that cannot be looked up now,
// for a reason that is not its own, is a 503 page that says to try again
// (never a redirect), not "unknown client".
func TestAuthorizeClientUnavailable(t *testing.T) {
	f := newFixture(t, func(_ *fixture, c *Config) { c.Clients = unavailableClients{} })
	resp := f.authorize(f.authzQuery(newPKCE(f)).Encode(), "alice")
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" || resp.Header.Get("Location") != "" {
		t.Errorf("status %d, Retry-After %q, Location %q", resp.StatusCode, resp.Header.Get("Retry-After"), resp.Header.Get("Location"))
	}
	if a := f.lastAudit(); a.Error != "temporarily_unavailable" || !strings.Contains(a.Reason, "try again") {
		t.Errorf("audited %+v", a)
	}
}

// TestAuditBounded: what a request names in an audit line (its client_id,
// its resource) is cut at its query and bounded.
func TestAuditBounded(t *testing.T) {
	f := newFixture(t)
	q := f.authzQuery(newPKCE(f))
	q.Set("client_id", "https://nobody.example/c.json?secret=hunter2&"+strings.Repeat("a", 4000))
	f.authorize(q.Encode(), "alice")
	if a := f.lastAudit(); a.Client != "https://nobody.example/c.json" {
		t.Errorf("audited client %q", a.Client)
	}
	q = f.authzQuery(newPKCE(f))
	q.Set("resource", "https://"+strings.Repeat("r", 1000)+".example/mcp")
	f.authorize(q.Encode(), "alice")
	if a := f.lastAudit(); len(a.Resource) > maxAuditValue+len("…") || a.Error != "invalid_target" {
		t.Errorf("audited resource of %d bytes: %+v", len(a.Resource), a.Error)
	}
}

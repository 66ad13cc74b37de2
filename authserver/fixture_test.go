package authserver

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"html"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"

	"github.com/Tahul/caddy-zidane-mcp/policy"
)

const (
	testIssuer   = "http://127.0.0.1:8443"
	testResource = "http://127.0.0.1:8443/mcp"
	clientA      = "https://client-a.example/client.json"
	clientB      = "https://client-b.example/client.json"
	redirectA    = "http://127.0.0.1:33418/callback"
	redirectB    = "https://client-b.example/cb"
)

// testClient follows the redirect rule the clients package owns: exact,
// but for a loopback redirect URI's port (RFC 8252 §7.3).
type testClient struct {
	id, name  string
	redirects []string
}

func (c testClient) ClientID() string    { return c.id }
func (c testClient) DisplayName() string { return c.name }
func (c testClient) AllowsRedirect(uri string) bool {
	for _, r := range c.redirects {
		if r == uri {
			return true
		}
		ru, err1 := url.Parse(r)
		uu, err2 := url.Parse(uri)
		if err1 != nil || err2 != nil || ru.Scheme != "http" || !isLoopbackHost(ru.Hostname()) {
			continue
		}
		ru.Host, uu.Host = ru.Hostname(), uu.Hostname()
		if ru.String() == uu.String() {
			return true
		}
	}
	return false
}

type testClients map[string]testClient

func (cs testClients) Resolve(_ context.Context, id string) (Client, error) {
	c, ok := cs[id]
	if !ok {
		return nil, errors.New("no such client")
	}
	return c, nil
}

// testPeople signs a browser in with a cookie naming the person.
type testPeople map[string]Person

func (p testPeople) Current(r *http.Request) (Person, bool) {
	c, err := r.Cookie("test-person")
	if err != nil {
		return Person{}, false
	}
	per, ok := p[c.Value]
	return per, ok
}

func (p testPeople) SignIn(w http.ResponseWriter, r *http.Request, returnTo string) {
	http.Redirect(w, r, "/test-signin?return="+url.QueryEscape(returnTo), http.StatusFound)
}

type fixture struct {
	t      testing.TB
	srv    *Server
	store  *certmagic.FileStorage
	grants *policy.TokenStore
	now    time.Time
	mu     sync.Mutex
	audits []Refusal
	// secrets are values that must never reach an audit line.
	secrets []string
}

func newFixture(t testing.TB, opt ...func(*fixture, *Config)) *fixture {
	t.Helper()
	f := &fixture{t: t, store: &certmagic.FileStorage{Path: t.TempDir()}, now: time.Unix(1_800_000_000, 0)}
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	cfg := Config{
		Issuer:    testIssuer,
		Resources: StaticResources{{URL: testResource, Scopes: []string{"tools:read", "tools:call", "sessions"}}, {URL: "http://127.0.0.1:8443/other", Scopes: []string{"tools:read"}}},
		Clients: testClients{
			clientA:                          {id: clientA, name: "Client A", redirects: []string{redirectA}},
			clientB:                          {id: clientB, name: "Client B", redirects: []string{redirectB}},
			"https://plain.example/c.json":   {id: "https://plain.example/c.json", redirects: []string{"http://plain.example/cb"}},
			"https://loop.example/c.json":    {id: "https://loop.example/c.json", redirects: []string{"http://localhost/cb"}},
			"https://withquery.example/c.js": {id: "https://withquery.example/c.js", redirects: []string{"https://withquery.example/cb?x=1"}},
		},
		People: testPeople{
			"alice": {Owner: "alice", Name: "Alice", Scopes: []string{"tools:read", "tools:call", "sessions"}},
			"bob":   {Owner: "bob", Name: "Bob", Scopes: []string{"tools:read"}},
			"carol": {Owner: "carol", Name: "Carol", Scopes: []string{"admin"}},
			// alice again, signed in anew after her IdP took tools:call
			// from her.
			"alice-narrowed": {Owner: "alice", Name: "Alice", Scopes: []string{"tools:read"}},
		},
		Storage: f.store,
		Key:     key,
		Audit: func(r Refusal) {
			f.mu.Lock()
			f.audits = append(f.audits, r)
			f.mu.Unlock()
		},
		Now: func() time.Time { return f.now },
	}
	withGrants(f, &cfg)
	for _, o := range opt {
		o(f, &cfg)
	}
	srv, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	f.srv = srv
	t.Cleanup(f.checkAudits)
	return f
}

// checkAudits fails the test if any audit line holds a secret the test
// used (a code, a verifier, a state, a cookie, a CSRF token, a token).
func (f *fixture) checkAudits() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, a := range f.audits {
		line, _ := json.Marshal(a)
		for _, s := range f.secrets {
			if s != "" && strings.Contains(string(line), s) {
				f.t.Errorf("an audit line holds a secret: %s", line)
			}
		}
	}
}

func (f *fixture) secret(s string) string {
	f.secrets = append(f.secrets, s)
	return s
}

func (f *fixture) lastAudit() Refusal {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.audits) == 0 {
		f.t.Fatal("no refusal was audited")
	}
	return f.audits[len(f.audits)-1]
}

// pkce is a verifier and its S256 challenge.
type pkce struct{ verifier, challenge string }

func newPKCE(f *fixture) pkce {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	v := f.secret(base64.RawURLEncoding.EncodeToString(b))
	return pkce{v, s256(v)}
}

// authzQuery is a good authorization request for client A.
func (f *fixture) authzQuery(p pkce) url.Values {
	return url.Values{
		"response_type":         {"code"},
		"client_id":             {clientA},
		"redirect_uri":          {redirectA},
		"code_challenge":        {p.challenge},
		"code_challenge_method": {"S256"},
		"resource":              {testResource},
		"scope":                 {"tools:read tools:call"},
		"state":                 {f.secret("st-" + randText())},
	}
}

func randText() string {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}

// do sends r through the server, as from a loopback client.
func (f *fixture) do(r *http.Request) *http.Response {
	r.RemoteAddr = "127.0.0.1:40000"
	w := httptest.NewRecorder()
	f.srv.ServeHTTP(w, r)
	return w.Result()
}

func (f *fixture) authorize(rawQuery string, person string, cookies ...*http.Cookie) *http.Response {
	r := httptest.NewRequest(http.MethodGet, testIssuer+AuthorizePath+"?"+rawQuery, nil)
	if person != "" {
		r.AddCookie(&http.Cookie{Name: "test-person", Value: person})
	}
	for _, c := range cookies {
		r.AddCookie(c)
	}
	return f.do(r)
}

// form is a consent page's form, with the cookie it was shown with.
type form struct {
	clientID, request, csrf string
	scopes                  []string
	cookie                  *http.Cookie
}

var hiddenRE = regexp.MustCompile(`name="(client_id|request|csrf)" value="([^"]*)"`)
var scopeRE = regexp.MustCompile(`name="scope" value="([^"]*)"`)

func (f *fixture) readForm(resp *http.Response) form {
	f.t.Helper()
	if resp.StatusCode != http.StatusOK {
		f.t.Fatalf("consent page status %d, want 200 (Location %q)", resp.StatusCode, resp.Header.Get("Location"))
	}
	body := readBody(resp)
	var fm form
	for _, m := range hiddenRE.FindAllStringSubmatch(body, -1) {
		v := html.UnescapeString(m[2])
		switch m[1] {
		case "client_id":
			fm.clientID = v
		case "request":
			fm.request = v
		case "csrf":
			fm.csrf = f.secret(v)
		}
	}
	for _, m := range scopeRE.FindAllStringSubmatch(body, -1) {
		fm.scopes = append(fm.scopes, html.UnescapeString(m[1]))
	}
	for _, c := range resp.Cookies() {
		if strings.Contains(c.Name, "zidane-consent") {
			fm.cookie = c
			f.secret(c.Value)
		}
	}
	if fm.request == "" || fm.csrf == "" {
		f.t.Fatalf("the consent page has no form: %s", body)
	}
	return fm
}

func readBody(resp *http.Response) string {
	var b strings.Builder
	buf := make([]byte, 4096)
	for {
		n, err := resp.Body.Read(buf)
		b.Write(buf[:n])
		if err != nil {
			break
		}
	}
	return b.String()
}

// post posts the consent form with vals, from person's browser with cookie.
func (f *fixture) postConsent(vals url.Values, person string, cookie *http.Cookie) *http.Response {
	r := httptest.NewRequest(http.MethodPost, testIssuer+ConsentPath, strings.NewReader(vals.Encode()))
	r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	r.Header.Set("Origin", testIssuer)
	if person != "" {
		r.AddCookie(&http.Cookie{Name: "test-person", Value: person})
	}
	if cookie != nil {
		r.AddCookie(&http.Cookie{Name: cookie.Name, Value: cookie.Value})
	}
	return f.do(r)
}

func (fm form) values(decision string, scopes ...string) url.Values {
	v := url.Values{"client_id": {fm.clientID}, "request": {fm.request}, "csrf": {fm.csrf}, "decision": {decision}}
	if scopes == nil {
		scopes = fm.scopes
	}
	v["scope"] = scopes
	return v
}

// consentCode runs a good authorization for client A as alice and returns
// the code the client received.
func (f *fixture) consentCode(p pkce, mod ...func(url.Values)) string {
	f.t.Helper()
	q := f.authzQuery(p)
	for _, m := range mod {
		m(q)
	}
	fm := f.readForm(f.authorize(q.Encode(), "alice"))
	resp := f.postConsent(fm.values("allow"), "alice", fm.cookie)
	loc := redirectParams(f.t, resp, http.StatusSeeOther)
	code := loc.Get("code")
	if code == "" {
		f.t.Fatalf("no code in the redirect: %v", loc)
	}
	return f.secret(code)
}

// redirectParams checks that resp redirects with status and returns the
// parameters the client receives.
func redirectParams(t testing.TB, resp *http.Response, status int) url.Values {
	t.Helper()
	if resp.StatusCode != status {
		t.Fatalf("status %d, want %d (a redirect)", resp.StatusCode, status)
	}
	u, err := url.Parse(resp.Header.Get("Location"))
	if err != nil {
		t.Fatal(err)
	}
	return u.Query()
}

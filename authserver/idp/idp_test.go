package idp

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"

	"github.com/Tahul/caddy-zidane-mcp/policy"
)

var testKey = bytes.Repeat([]byte{7}, 32)

// clock is a settable time for the tests.
type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func newService(t *testing.T, cfg Config) *Service {
	t.Helper()
	if cfg.Site == "" {
		cfg.Site = "https://gw.example.com"
	}
	if cfg.Key == nil {
		cfg.Key = testKey
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// browser keeps the cookies one browser holds for the site, by name.
type browser map[string]string

func (b browser) take(resp *http.Response) {
	for _, c := range resp.Cookies() {
		if c.MaxAge < 0 {
			delete(b, c.Name)
		} else {
			b[c.Name] = c.Value
		}
	}
}

func (b browser) send(r *http.Request) *http.Request {
	for n, v := range b {
		r.AddCookie(&http.Cookie{Name: n, Value: v})
	}
	return r
}

func serve(h http.HandlerFunc, r *http.Request) *http.Response {
	rec := httptest.NewRecorder()
	h(rec, r)
	return rec.Result()
}

func body(t *testing.T, resp *http.Response) string {
	t.Helper()
	var b bytes.Buffer
	_, _ = b.ReadFrom(resp.Body)
	return b.String()
}

var alice = Person{Owner: "alice", Name: "Alice", Scopes: []string{"chat", "upstream:github"}}

// TestCheckReturnTo: the only place a sign-in sends a browser back to is
// a path on this site; every spelling of "somewhere else" is refused.
func TestCheckReturnTo(t *testing.T) {
	for _, ok := range []string{"/", "/zidane/authorize?client_id=https%3A%2F%2Fc.example%2Fm.json&state=x", "/a/b/c", "/a%2Fb"} {
		if err := CheckReturnTo(ok); err != nil {
			t.Errorf("%q refused: %v", ok, err)
		}
	}
	for _, attack := range []string{
		"", "https://evil.example/", "http://evil.example", "//evil.example", "/\\evil.example", "\\\\evil.example",
		"/%2F", "/%2F%2Fevil.example", "/%2f/evil.example", "/%5Cevil.example", "javascript:alert(1)", "evil.example",
		"/a\\b", "/a b", "/a\tb", "/\t/evil.example", "/a\r\nSet-Cookie: x=y", "/a#frag", "/é", "/a\x00",
		"/" + strings.Repeat("a", maxReturnTo),
	} {
		if err := CheckReturnTo(attack); !errors.Is(err, ErrReturnTo) {
			t.Errorf("%q accepted", attack)
		}
	}
}

// TestSessionCookie: the session is a sealed, short-lived cookie of this
// site alone; a cookie altered, from another site or key, expired, or
// doubled is no one.
func TestSessionCookie(t *testing.T) {
	c := &clock{t: time.Unix(1_800_000_000, 0)}
	s := newService(t, Config{Now: c.now})
	rec := httptest.NewRecorder()
	if err := s.jar.startSession(rec, alice); err != nil {
		t.Fatal(err)
	}
	cookies := rec.Result().Cookies()
	if len(cookies) != 1 {
		t.Fatalf("%d cookies", len(cookies))
	}
	ck := cookies[0]
	if ck.Name != "__Host-zidane-signin" || !ck.Secure || !ck.HttpOnly || ck.SameSite != http.SameSiteLaxMode || ck.Path != "/" || ck.Domain != "" || ck.MaxAge != 3600 {
		t.Fatalf("cookie attributes: %+v", ck)
	}
	if strings.Contains(ck.Value, "alice") {
		t.Fatalf("the cookie shows its owner: %s", ck.Value)
	}
	with := func(cs ...*http.Cookie) *http.Request {
		r := httptest.NewRequest("GET", "/", nil)
		for _, c := range cs {
			r.AddCookie(c)
		}
		return r
	}
	p, ok := s.Current(with(ck))
	if !ok || p.Owner != "alice" || p.Name != "Alice" || strings.Join(p.Scopes, " ") != "chat upstream:github" {
		t.Fatalf("Current = %+v, %v", p, ok)
	}

	other := newService(t, Config{Site: "https://other.example.com", Now: c.now})
	otherKey := newService(t, Config{Key: bytes.Repeat([]byte{8}, 32), Now: c.now})
	flipped := *ck
	raw := []byte(flipped.Value)
	raw[len(raw)/2] ^= 1
	flipped.Value = string(raw)
	plain := *ck
	plain.Name = "zidane-signin"
	for _, tc := range []struct {
		name string
		s    *Service
		r    *http.Request
	}{
		{"altered", s, with(&flipped)},
		{"another site", other, with(ck)},
		{"another key", otherKey, with(ck)},
		{"twice (a planted second cookie)", s, with(ck, &http.Cookie{Name: ck.Name, Value: ck.Value})},
		{"without the __Host- prefix on https", s, with(&plain)},
		{"not base64", s, with(&http.Cookie{Name: ck.Name, Value: "!!!"})},
		{"oversized", s, with(&http.Cookie{Name: ck.Name, Value: strings.Repeat("A", maxCookieBytes+1)})},
	} {
		if p, ok := tc.s.Current(tc.r); ok {
			t.Errorf("%s: signed in as %+v", tc.name, p)
		}
	}
	c.t = c.t.Add(time.Hour)
	if p, ok := s.Current(with(ck)); ok {
		t.Errorf("expired: signed in as %+v", p)
	}
}

// TestSessionCookieLoopback: an http site on loopback keeps the cookie
// without Secure or the prefix (a browser would drop both there).
func TestSessionCookieLoopback(t *testing.T) {
	s := newService(t, Config{Site: "http://127.0.0.1:8080"})
	rec := httptest.NewRecorder()
	if err := s.jar.startSession(rec, alice); err != nil {
		t.Fatal(err)
	}
	ck := rec.Result().Cookies()[0]
	if ck.Name != "zidane-signin" || ck.Secure {
		t.Fatalf("%+v", ck)
	}
	for _, bad := range []string{"http://gw.example.com", "https://gw.example.com/path", "https://gw.example.com?x=1", "ftp://gw.example.com", "gw.example.com"} {
		if _, err := New(Config{Site: bad, Key: testKey}); err == nil {
			t.Errorf("site %q accepted", bad)
		}
	}
	if _, err := New(Config{Site: "https://gw.example.com", Key: testKey[:16]}); err == nil {
		t.Error("a 16-byte key accepted")
	}
}

// TestClaimRules: the owner comes from one claim that policy accepts for
// a person; scopes come only from rules; claims two readers could read
// differently are refused.
func TestClaimRules(t *testing.T) {
	c := Claims{Rules: []Rule{
		{Claim: "groups", Value: "eng", Scopes: []string{"upstream:github", "chat"}},
		{Claim: "dept", Value: "sales", Scopes: []string{"chat"}},
	}}
	for _, tc := range []struct {
		name, claims string
		want         string // scopes, space-separated; or an error word
		err          error
	}{
		{"group member", `{"sub":"u1","groups":["ops","eng"],"name":"Ann"}`, "chat upstream:github", nil},
		{"string claim", `{"sub":"u2","dept":"sales"}`, "chat", nil},
		{"both rules, scopes once", `{"sub":"u3","groups":["eng"],"dept":"sales"}`, "chat upstream:github", nil},
		{"no rule matches", `{"sub":"u4","groups":["ops"]}`, "", ErrNoScope},
		{"group as a number", `{"sub":"u5","groups":[1,2]}`, "", ErrNoScope},
		{"group object", `{"sub":"u5","groups":{"eng":true}}`, "", ErrNoScope},
		{"value differs in case", `{"sub":"u5","groups":["ENG"]}`, "", ErrNoScope},
		{"no sub", `{"groups":["eng"]}`, "", ErrNoOwner},
		{"empty sub", `{"sub":"","groups":["eng"]}`, "", ErrNoOwner},
		{"sub a number", `{"sub":7,"groups":["eng"]}`, "", ErrNoOwner},
		{"sub names a token", `{"sub":"tok_0123456789abcdef","groups":["eng"]}`, "", ErrNoOwner},
		{"sub names a JWT subject", `{"sub":"jwt:bob","groups":["eng"]}`, "", ErrNoOwner},
		{"sub with a space", `{"sub":"bob smith","groups":["eng"]}`, "", ErrNoOwner},
		{"sub twice", `{"sub":"bob","sub":"alice","groups":["eng"]}`, "", ErrNoOwner},
		{"sub and Sub", `{"Sub":"bob","sub":"alice","groups":["eng"]}`, "", ErrNoOwner},
		{"groups twice", `{"sub":"bob","groups":["ops"],"groups":["eng"]}`, "", ErrNoOwner},
	} {
		p, err := c.person([]byte(tc.claims))
		switch {
		case tc.err != nil && !errors.Is(err, tc.err):
			t.Errorf("%s: %+v, %v; want %v", tc.name, p, err, tc.err)
		case tc.err == nil && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.err == nil && strings.Join(p.Scopes, " ") != tc.want:
			t.Errorf("%s: scopes %q, want %q", tc.name, p.Scopes, tc.want)
		}
	}

	owned := Claims{OwnerClaim: "email", Rules: c.Rules}
	p, err := owned.person([]byte(`{"sub":"u1","email":"ann@example.com","email_verified":true,"groups":["eng"],"name":"Ann\u202eevil"}`))
	if err != nil || p.Owner != "ann@example.com" || p.Name != "Annevil" {
		t.Fatalf("owner claim email: %+v, %v", p, err)
	}
	// An address the IdP has not verified is anyone's to type in.
	for _, unverified := range []string{
		`{"sub":"u1","email":"ann@example.com","groups":["eng"]}`,
		`{"sub":"u1","email":"ann@example.com","email_verified":false,"groups":["eng"]}`,
		`{"sub":"u1","email":"ann@example.com","email_verified":"true","groups":["eng"]}`,
	} {
		if p, err := owned.person([]byte(unverified)); !errors.Is(err, ErrNoOwner) || !strings.Contains(err.Error(), "email_verified") {
			t.Errorf("%s: %+v, %v", unverified, p, err)
		}
	}
	p, err = Claims{}.person([]byte(`{"sub":"u1","groups":["eng"]}`))
	if !errors.Is(err, ErrNoScope) || p.Scopes != nil {
		t.Fatalf("no rules: %+v, %v (a person is granted nothing by default)", p, err)
	}
	for _, bad := range []Claims{
		{Rules: []Rule{{Claim: "groups", Value: "eng"}}},
		{Rules: []Rule{{Claim: "groups", Scopes: []string{"chat"}}}},
		{Rules: []Rule{{Claim: "groups", Value: "eng", Scopes: []string{"a b"}}}},
	} {
		if err := bad.check(); err == nil {
			t.Errorf("rule %+v accepted", bad.Rules)
		}
	}
}

func fileStorage(t *testing.T) *certmagic.FileStorage {
	return &certmagic.FileStorage{Path: t.TempDir()}
}

// TestLinks: storage holds the hash of a link, never its secret; a link
// signs in once, before it expires; of concurrent redemptions one wins.
func TestLinks(t *testing.T) {
	ctx := context.Background()
	st := fileStorage(t)
	c := &clock{t: time.Now()}
	l := NewLinks(st, c.now)
	secret, exp, err := l.Create(ctx, LinkSpec{Owner: "alice", Name: "Alice", Scopes: []string{"chat"}})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(secret, "zsl_") || exp.Sub(c.t) != DefaultLinkLifetime {
		t.Fatalf("secret %q expires %s", secret, exp)
	}
	keys, err := st.List(ctx, "zidane/signin/links", false)
	if err != nil || len(keys) != 1 {
		t.Fatalf("stored: %q, %v", keys, err)
	}
	stored, _ := st.Load(ctx, keys[0])
	if strings.Contains(keys[0], secret[4:]) || bytes.Contains(stored, []byte(secret[4:])) {
		t.Fatalf("storage holds the secret: %s %s", keys[0], stored)
	}
	for _, bad := range []string{"", "zsl_", secret + "x", strings.TrimPrefix(secret, "zsl_"), "zsl_" + strings.Repeat("A", 43)} {
		if _, err := l.Redeem(ctx, bad); !errors.Is(err, ErrLinkUnknown) {
			t.Errorf("redeem %q: %v", bad, err)
		}
	}
	p, err := l.Redeem(ctx, secret)
	if err != nil || p.Owner != "alice" || p.Name != "Alice" || strings.Join(p.Scopes, " ") != "chat" {
		t.Fatalf("redeem: %+v, %v", p, err)
	}
	if _, err := l.Redeem(ctx, secret); !errors.Is(err, ErrLinkUnknown) {
		t.Fatalf("second redemption: %v", err)
	}

	old, _, err := l.Create(ctx, LinkSpec{Owner: "bob", Scopes: []string{"chat"}, Expires: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	c.t = c.t.Add(time.Minute)
	if _, err := l.Redeem(ctx, old); !errors.Is(err, ErrLinkExpired) {
		t.Fatalf("expired link: %v", err)
	}
	stale, _, _ := l.Create(ctx, LinkSpec{Owner: "carol", Scopes: []string{"chat"}, Expires: time.Minute})
	c.t = c.t.Add(2 * time.Minute)
	if _, _, err := l.Create(ctx, LinkSpec{Owner: "dan", Scopes: []string{"chat"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Load(ctx, linkKey(stale)); err == nil {
		t.Error("an expired link was not pruned by the next Create")
	}

	for _, bad := range []LinkSpec{
		{Owner: "", Scopes: []string{"chat"}},
		{Owner: "tok_abc", Scopes: []string{"chat"}},
		{Owner: "jwt:alice", Scopes: []string{"chat"}},
		{Owner: "alice"},
		{Owner: "alice", Scopes: []string{"chat", "chat"}},
		{Owner: "alice", Scopes: []string{"chat"}, Expires: MaxLinkLifetime + time.Second},
		{Owner: "alice", Scopes: []string{"chat"}, Expires: -time.Second},
	} {
		if _, _, err := l.Create(ctx, bad); err == nil {
			t.Errorf("link %+v created", bad)
		}
	}

	race, _, err := l.Create(ctx, LinkSpec{Owner: "erin", Scopes: []string{"chat"}})
	if err != nil {
		t.Fatal(err)
	}
	// Two processes on one storage: two Links values, each with its own
	// in-process queue, so the storage lock alone decides.
	other := NewLinks(st, c.now)
	wins := make(chan error, 8)
	for i := range 8 {
		go func() {
			ll := l
			if i%2 == 1 {
				ll = other
			}
			_, err := ll.Redeem(ctx, race)
			wins <- err
		}()
	}
	won := 0
	for range 8 {
		err := <-wins
		switch {
		case err == nil:
			won++
		case !errors.Is(err, ErrLinkUnknown):
			t.Errorf("redeem: %v", err)
		}
	}
	if won != 1 {
		t.Fatalf("%d redemptions of one link succeeded", won)
	}
}

func linkPost(form string, headers ...string) *http.Request {
	r := httptest.NewRequest("POST", "https://gw.example.com"+LinkPath, strings.NewReader(form))
	r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	r.Header.Set("Origin", "https://gw.example.com")
	r.Header.Set("Sec-Fetch-Site", "same-origin")
	for i := 0; i+1 < len(headers); i += 2 {
		if headers[i+1] == "" {
			r.Header.Del(headers[i])
		} else {
			r.Header.Set(headers[i], headers[i+1])
		}
	}
	return r
}

// TestLinkPage: opening a link (GET, what a scanner does) uses nothing; the
// button's POST from this site's page signs in, once; a post from another
// site, or one that could be read two ways, is refused and uses nothing.
func TestLinkPage(t *testing.T) {
	var audit []Refusal
	var signed []string
	s := newService(t, Config{Links: fileStorage(t), Audit: func(r Refusal) { audit = append(audit, r) },
		SignedIn: func(p Person, via string) { signed = append(signed, p.Owner+" by "+via) }})
	secret, _, err := s.links.Create(context.Background(), LinkSpec{Owner: "alice", Scopes: []string{"chat"}})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		resp := serve(s.ServeHTTP, httptest.NewRequest("GET", "https://gw.example.com"+LinkPath, nil))
		b := body(t, resp)
		if resp.StatusCode != 200 || !strings.Contains(b, `method="post"`) || !strings.Contains(b, `name="secret"`) {
			t.Fatalf("link page: %d %s", resp.StatusCode, b)
		}
		if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "frame-ancestors 'none'") || !strings.Contains(csp, "script-src 'sha256-") {
			t.Fatalf("link page CSP: %q", csp)
		}
		if resp.Header.Get("X-Frame-Options") != "DENY" || resp.Header.Get("Cache-Control") != "no-store" || resp.Header.Get("Referrer-Policy") != "same-origin" {
			t.Fatalf("link page headers: %v", resp.Header)
		}
	}
	form := "secret=" + url.QueryEscape(secret)
	for _, tc := range []struct {
		name   string
		r      *http.Request
		status int
		word   string
	}{
		{"from another site", linkPost(form, "Origin", "https://evil.example", "Sec-Fetch-Site", "cross-site"), 403, "own page"},
		{"from a sibling subdomain", linkPost(form, "Origin", "https://evil.gw.example.com", "Sec-Fetch-Site", "same-site"), 403, "own page"},
		{"foreign Origin, no Sec-Fetch-Site", linkPost(form, "Origin", "https://evil.example", "Sec-Fetch-Site", ""), 403, "own page"},
		{"Origin null", linkPost(form, "Origin", "null", "Sec-Fetch-Site", ""), 403, "own page"},
		{"no browser headers", linkPost(form, "Origin", "", "Sec-Fetch-Site", ""), 403, "own page"},
		{"secret in the query", func() *http.Request {
			r := linkPost(form)
			r.URL.RawQuery = form
			return r
		}(), 400, "never in the address"},
		{"JSON body", linkPost(form, "Content-Type", "application/json"), 415, "x-www-form-urlencoded"},
		{"secret twice", linkPost(form + "&secret=zsl_x"), 400, "once"},
		{"another field", linkPost(form + "&owner=root"), 400, "once"},
		{"oversized", linkPost(form + "&pad=" + strings.Repeat("a", 5000)), 400, "4 KiB"},
		{"unknown secret", linkPost("secret=zsl_" + strings.Repeat("A", 43)), 403, "unknown or was used"},
	} {
		resp := serve(s.ServeHTTP, tc.r)
		b := body(t, resp)
		if resp.StatusCode != tc.status || !strings.Contains(b, tc.word) {
			t.Errorf("%s: %d, want %d with %q: %s", tc.name, resp.StatusCode, tc.status, tc.word, b)
		}
		if len(resp.Cookies()) != 0 {
			t.Errorf("%s: set a cookie", tc.name)
		}
		if strings.Contains(b, secret) {
			t.Errorf("%s: the page shows the secret", tc.name)
		}
	}
	if len(audit) != 11 {
		t.Errorf("%d refusals audited, want 11", len(audit))
	}
	for _, a := range audit {
		if strings.Contains(a.Detail, secret) {
			t.Errorf("audit holds the secret: %+v", a)
		}
	}

	b := browser{}
	resp := serve(s.ServeHTTP, b.send(linkPost(form)))
	b.take(resp)
	page := body(t, resp)
	if resp.StatusCode != 200 || !strings.Contains(page, "Signed in") || !strings.Contains(page, "alice") {
		t.Fatalf("redeem: %d %s", resp.StatusCode, page)
	}
	if p, ok := s.Current(b.send(httptest.NewRequest("GET", "/", nil))); !ok || p.Owner != "alice" {
		t.Fatalf("after the link: %+v, %v", p, ok)
	}
	if strings.Join(signed, ",") != "alice by link" {
		t.Fatalf("sign-ins reported: %q", signed)
	}
	resp = serve(s.ServeHTTP, linkPost(form))
	if resp.StatusCode != 403 || !strings.Contains(body(t, resp), "used already") {
		t.Fatalf("second use: %d", resp.StatusCode)
	}
	resp = serve(s.ServeHTTP, httptest.NewRequest("PUT", "https://gw.example.com"+LinkPath, nil))
	if resp.StatusCode != 405 || resp.Header.Get("Allow") != "GET, POST" {
		t.Fatalf("PUT: %d %v", resp.StatusCode, resp.Header)
	}
}

// TestSignInWithLinks: with links alone, SignIn shows how to get one and
// remembers where to come back to; the link then brings the browser back
// there. A return address off the site is refused.
func TestSignInWithLinks(t *testing.T) {
	s := newService(t, Config{Links: fileStorage(t)})
	b := browser{}
	resp := serve(func(w http.ResponseWriter, r *http.Request) { s.SignIn(w, r, "/zidane/authorize?x=1") }, httptest.NewRequest("GET", "/zidane/authorize?x=1", nil))
	b.take(resp)
	if resp.StatusCode != 401 || !strings.Contains(body(t, resp), "signin-link") {
		t.Fatalf("SignIn: %d", resp.StatusCode)
	}
	if _, ok := b["__Host-zidane-signin-flow"]; !ok {
		t.Fatalf("no flow cookie: %v", b)
	}
	secret, _, _ := s.links.Create(context.Background(), LinkSpec{Owner: "alice", Scopes: []string{"chat"}})
	resp = serve(s.ServeHTTP, b.send(linkPost("secret="+secret)))
	b.take(resp)
	if resp.StatusCode != 303 || resp.Header.Get("Location") != "/zidane/authorize?x=1" {
		t.Fatalf("redeem: %d %q", resp.StatusCode, resp.Header.Get("Location"))
	}
	if _, ok := b["__Host-zidane-signin-flow"]; ok {
		t.Fatal("the flow cookie outlived the sign-in")
	}

	for _, bad := range []string{"https://evil.example/", "//evil.example/", "/\\evil.example"} {
		resp := serve(func(w http.ResponseWriter, r *http.Request) { s.SignIn(w, r, bad) }, httptest.NewRequest("GET", "/", nil))
		if resp.StatusCode != 400 || resp.Header.Get("Location") != "" || len(resp.Cookies()) != 0 {
			t.Errorf("SignIn(%q): %d %q", bad, resp.StatusCode, resp.Header.Get("Location"))
		}
	}
	none := newService(t, Config{})
	resp = serve(func(w http.ResponseWriter, r *http.Request) { none.SignIn(w, r, "/") }, httptest.NewRequest("GET", "/", nil))
	if resp.StatusCode != 503 || !strings.Contains(body(t, resp), "no way to sign people in") {
		t.Fatalf("no sign-in configured: %d", resp.StatusCode)
	}
	resp = serve(none.ServeHTTP, httptest.NewRequest("GET", LinkPath, nil))
	if resp.StatusCode != 404 {
		t.Fatalf("link page without links: %d", resp.StatusCode)
	}
}

// TestRateLimitPerAddress: one address that posts links (or IdP answers)
// faster than the limit is refused 429 with Retry-After, before any
// storage or IdP is touched; another address is not.
func TestRateLimitPerAddress(t *testing.T) {
	c := &clock{t: time.Now()}
	var audit []Refusal
	s := newService(t, Config{Links: fileStorage(t), Now: c.now, Limit: policy.Limit{Rate: 1, Burst: 3},
		Audit: func(r Refusal) { audit = append(audit, r) },
		OIDC:  &OIDC{Issuer: "http://127.0.0.1:1", ClientID: "gw", ClientSecret: "x"}})
	from := func(r *http.Request, addr string) *http.Request {
		r.RemoteAddr = addr + ":40000"
		return r
	}
	unknown := "secret=zsl_" + strings.Repeat("A", 43)
	for i := range 3 {
		if resp := serve(s.ServeHTTP, from(linkPost(unknown), "192.0.2.7")); resp.StatusCode != http.StatusForbidden {
			t.Fatalf("post %d: %d", i, resp.StatusCode)
		}
	}
	for _, r := range []*http.Request{from(linkPost(unknown), "192.0.2.7"), from(callback("code=c&state=s"), "192.0.2.7"),
		from(httptest.NewRequest("GET", LinkPath, nil), "192.0.2.7")} {
		resp := serve(s.ServeHTTP, r)
		if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" || !strings.Contains(body(t, resp), "Too many") {
			t.Fatalf("%s %s over the limit: %d %v", r.Method, r.URL.Path, resp.StatusCode, resp.Header)
		}
		if audit[len(audit)-1].Reason != "rate_limited" {
			t.Fatalf("audited as %+v", audit[len(audit)-1])
		}
	}
	// Another address has a bucket of its own.
	if resp := serve(s.ServeHTTP, from(linkPost(unknown), "198.51.100.1")); resp.StatusCode != http.StatusForbidden {
		t.Fatalf("another address: %d", resp.StatusCode)
	}
	c.t = c.t.Add(2 * time.Second)
	if resp := serve(s.ServeHTTP, from(linkPost(unknown), "192.0.2.7")); resp.StatusCode != http.StatusForbidden {
		t.Fatalf("after the refill: %d", resp.StatusCode)
	}
}

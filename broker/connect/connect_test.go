package connect

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"

	"github.com/Tahul/caddy-zidane-mcp/authserver/idp"
)

const site = "https://gw.example.com"

// clock is a settable time, shared by the sign-in and the links.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// authorizer stands for the upstream OAuth client's per-owner login: it
// hands out authorization URLs with a fresh state and, on Finish, checks
// the state is one it started for that owner and upstream.
type authorizer struct {
	mu       sync.Mutex
	started  map[string][2]string // state -> owner, upstream
	finished [][2]string
	fail     error
}

func (a *authorizer) Begin(_ context.Context, owner, upstream string) (string, error) {
	if a.fail != nil {
		return "", a.fail
	}
	state := rand.Text()
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.started == nil {
		a.started = map[string][2]string{}
	}
	a.started[state] = [2]string{owner, upstream}
	return "https://as.example/authorize?client_id=gw&state=" + state, nil
}

func (a *authorizer) Finish(_ context.Context, owner, upstream string, q url.Values) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.started[q.Get("state")] != [2]string{owner, upstream} {
		return errors.New("unknown state")
	}
	delete(a.started, q.Get("state"))
	a.finished = append(a.finished, [2]string{owner, upstream})
	return nil
}

func (a *authorizer) finishedFor() [][2]string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([][2]string(nil), a.finished...)
}

type fixture struct {
	t         testing.TB
	clock     *clock
	signin    *idp.Service
	links     *idp.Links
	svc       *Service
	auth      *authorizer
	mu        sync.Mutex
	refusals  []Refusal
	connected []Connection
}

func newFixture(t testing.TB) *fixture {
	t.Helper()
	store := &certmagic.FileStorage{Path: t.TempDir()}
	f := &fixture{t: t, clock: &clock{t: time.Unix(1_800_000_000, 0)}, auth: &authorizer{}}
	var err error
	f.signin, err = idp.New(idp.Config{Site: site, Key: bytes.Repeat([]byte{7}, 32), Links: store, Now: f.clock.now, SessionLifetime: 8 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	f.links = idp.NewLinks(store, f.clock.now)
	f.svc, err = New(Config{Site: site, Store: store, People: f.signin, Authorizer: f.auth, Now: f.clock.now,
		Audit:     func(r Refusal) { f.mu.Lock(); f.refusals = append(f.refusals, r); f.mu.Unlock() },
		Connected: func(c Connection) { f.mu.Lock(); f.connected = append(f.connected, c); f.mu.Unlock() }})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// browser keeps the cookies one browser holds for the site.
type browser map[string]string

func (b browser) do(t testing.TB, h http.Handler, r *http.Request) *http.Response {
	t.Helper()
	for n, v := range b {
		r.AddCookie(&http.Cookie{Name: n, Value: v})
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, r)
	resp := rec.Result()
	for _, c := range resp.Cookies() {
		if c.MaxAge < 0 {
			delete(b, c.Name)
		} else {
			b[c.Name] = c.Value
		}
	}
	return resp
}

// signIn signs a browser in as owner with a one-time sign-in link, as a
// person would, and returns where the sign-in sent it back to.
func (f *fixture) signIn(b browser, owner string) string {
	f.t.Helper()
	secret, _, err := f.links.Create(context.Background(), idp.LinkSpec{Owner: owner, Name: strings.ToUpper(owner[:1]) + owner[1:], Scopes: []string{"upstream:github"}})
	if err != nil {
		f.t.Fatal(err)
	}
	r := httptest.NewRequest(http.MethodPost, site+idp.LinkPath, strings.NewReader(url.Values{"secret": {secret}}.Encode()))
	r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	r.Header.Set("Origin", site)
	resp := b.do(f.t, f.signin, r)
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusSeeOther {
		f.t.Fatalf("sign-in as %s: %d %s", owner, resp.StatusCode, readBody(resp))
	}
	return resp.Header.Get("Location")
}

func (f *fixture) get(b browser, target string) *http.Response {
	return b.do(f.t, f.svc, httptest.NewRequest(http.MethodGet, target, nil))
}

// post presses the link page's button, from the site's own page unless
// headers say otherwise.
func (f *fixture) post(b browser, target string, headers map[string]string) *http.Response {
	r := httptest.NewRequest(http.MethodPost, target, strings.NewReader("connect=1"))
	r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	r.Header.Set("Origin", site)
	r.Header.Set("Sec-Fetch-Site", "same-origin")
	for k, v := range headers {
		if v == "" {
			r.Header.Del(k)
		} else {
			r.Header.Set(k, v)
		}
	}
	return b.do(f.t, f.svc, r)
}

func (f *fixture) lastRefusal() Refusal {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.refusals) == 0 {
		return Refusal{}
	}
	return f.refusals[len(f.refusals)-1]
}

func readBody(resp *http.Response) string {
	var b bytes.Buffer
	_, _ = b.ReadFrom(resp.Body)
	return b.String()
}

func (f *fixture) link(owner, upstream string) (Link, string) {
	f.t.Helper()
	l, err := f.svc.Create(context.Background(), owner, upstream)
	if err != nil {
		f.t.Fatal(err)
	}
	if !strings.HasPrefix(l.URL, site+PathPrefix) {
		f.t.Fatalf("link %q is not on the site", l.URL)
	}
	return l, strings.TrimPrefix(l.URL, site)
}

// wantRefused checks a refusal: its status, a word of the page, and its
// audit line's reason.
func (f *fixture) wantRefused(resp *http.Response, status int, word, reason string) {
	f.t.Helper()
	body := readBody(resp)
	if resp.StatusCode != status || !strings.Contains(body, word) {
		f.t.Fatalf("got %d %q, want %d with %q", resp.StatusCode, body, status, word)
	}
	if got := f.lastRefusal(); got.Reason != reason || got.Status != status {
		f.t.Fatalf("audited %+v, want reason %q status %d", got, reason, status)
	}
	wantPageHeaders(f.t, resp)
}

func wantPageHeaders(t testing.TB, resp *http.Response) {
	t.Helper()
	h := resp.Header
	if !strings.Contains(h.Get("Content-Security-Policy"), "frame-ancestors 'none'") || h.Get("X-Frame-Options") != "DENY" ||
		h.Get("Cache-Control") != "no-store" || h.Get("Referrer-Policy") != "same-origin" {
		t.Fatalf("page headers: %v", h)
	}
}

// connects presses A's link's button and follows the authorization back
// to the callback in browser cb; it returns the callback's answer.
func (f *fixture) authorizeFrom(resp *http.Response) string {
	f.t.Helper()
	if resp.StatusCode != http.StatusSeeOther {
		f.t.Fatalf("connect: %d %s", resp.StatusCode, readBody(resp))
	}
	loc, err := url.Parse(resp.Header.Get("Location"))
	if err != nil || loc.Host != "as.example" {
		f.t.Fatalf("connect went to %q", resp.Header.Get("Location"))
	}
	if resp.Header.Get("Cache-Control") != "no-store" || resp.Header.Get("Referrer-Policy") != "no-referrer" {
		f.t.Fatalf("redirect headers: %v", resp.Header)
	}
	return CallbackPath + "?" + url.Values{"code": {"c0de"}, "state": {loc.Query().Get("state")}, "iss": {"https://as.example"}}.Encode()
}

// TestConnectLinkAttacks: what a person who is not the link's owner, or a
// page on another site, or a replayed or forged link, gets: a refusal
// with its status, a word of why, and an audit line; and nothing reaches
// the upstream's authorization.
func TestConnectLinkAttacks(t *testing.T) {
	t.Run("used twice", func(t *testing.T) {
		f := newFixture(t)
		a := browser{}
		f.signIn(a, "alice")
		_, path := f.link("alice", "github")
		// The page names whom the account will act for, and says to
		// stop if that is not the person at the browser (a browser
		// someone else signed in, with a sign-in link of theirs).
		if resp := f.get(a, path); resp.StatusCode != http.StatusOK || !strings.Contains(readBody(resp), "If you are not Alice, stop here") {
			t.Fatalf("the link's page: %d", resp.StatusCode)
		}
		// Showing the page twice uses nothing up.
		if resp := f.get(a, path); resp.StatusCode != http.StatusOK {
			t.Fatalf("the link's page again: %d", resp.StatusCode)
		}
		f.authorizeFrom(f.post(a, path, nil))
		f.wantRefused(f.post(a, path, nil), http.StatusForbidden, "used already", "unknown")
		f.wantRefused(f.get(a, path), http.StatusForbidden, "used already", "unknown")
	})
	t.Run("expired", func(t *testing.T) {
		f := newFixture(t)
		a := browser{}
		f.signIn(a, "alice")
		_, path := f.link("alice", "github")
		f.clock.add(DefaultLifetime)
		f.wantRefused(f.get(a, path), http.StatusForbidden, "expired", "expired")
		f.wantRefused(f.post(a, path, nil), http.StatusForbidden, "expired", "expired")
		f.wantRefused(f.post(a, path, nil), http.StatusForbidden, "used already", "unknown")
	})
	t.Run("used by B while A caused it", func(t *testing.T) {
		f := newFixture(t)
		a, b := browser{}, browser{}
		f.signIn(a, "alice")
		f.signIn(b, "bob")
		_, path := f.link("alice", "github")
		f.wantRefused(f.get(b, path), http.StatusForbidden, "another person", "owner")
		f.wantRefused(f.post(b, path, nil), http.StatusForbidden, "another person", "owner")
		if got := f.lastRefusal(); got.Owner != "alice" || got.Browser != "bob" {
			t.Fatalf("audited %+v", got)
		}
		// Bob's tries did not burn Alice's link.
		f.authorizeFrom(f.post(a, path, nil))
	})
	t.Run("signed out: sign in, then back to the link", func(t *testing.T) {
		f := newFixture(t)
		a := browser{}
		_, path := f.link("alice", "github")
		resp := f.get(a, path)
		if resp.StatusCode != http.StatusUnauthorized || !strings.Contains(readBody(resp), "Sign in with a link") {
			t.Fatalf("signed out: %d", resp.StatusCode)
		}
		if back := f.signIn(a, "alice"); back != path {
			t.Fatalf("the sign-in went back to %q, not the link %q", back, path)
		}
		if resp := f.get(a, path); resp.StatusCode != http.StatusOK {
			t.Fatalf("the link's page once signed in: %d", resp.StatusCode)
		}
		// A press while signed out uses nothing up either.
		c := browser{}
		if resp := f.post(c, path, nil); resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("press signed out: %d", resp.StatusCode)
		}
		f.authorizeFrom(f.post(a, path, nil))
	})
	t.Run("forged and foreign links", func(t *testing.T) {
		f := newFixture(t)
		a := browser{}
		f.signIn(a, "alice")
		forged, err := newSecret()
		if err != nil {
			t.Fatal(err)
		}
		f.wantRefused(f.get(a, PathPrefix+forged), http.StatusForbidden, "unknown", "unknown")
		f.wantRefused(f.post(a, PathPrefix+forged, nil), http.StatusForbidden, "unknown", "unknown")
		_, path := f.link("alice", "github")
		secret := strings.TrimPrefix(path, PathPrefix)
		for _, p := range []string{
			PathPrefix + "zsl_" + strings.TrimPrefix(secret, "zcl_"), // a sign-in link's shape
			PathPrefix + secret + "A",
			PathPrefix + secret[:len(secret)-1],
			PathPrefix + "%7A" + secret[1:], // the secret spelled with an escape
			PathPrefix + secret + "/",
			PathPrefix,
		} {
			f.wantRefused(f.get(a, p), http.StatusNotFound, "not a connect link", "malformed")
		}
		// Another gateway's link (same path, another storage) is unknown here.
		other := newFixture(t)
		_, foreign := other.link("alice", "github")
		f.wantRefused(f.get(a, foreign), http.StatusForbidden, "unknown", "unknown")
		if len(f.auth.started) != 0 {
			t.Fatalf("an authorization started: %v", f.auth.started)
		}
	})
	t.Run("cross-origin POST", func(t *testing.T) {
		f := newFixture(t)
		a := browser{}
		f.signIn(a, "alice")
		_, path := f.link("alice", "github")
		for _, h := range []map[string]string{
			{"Origin": "https://evil.example", "Sec-Fetch-Site": "cross-site"},
			{"Origin": "https://evil.example", "Sec-Fetch-Site": ""},
			{"Origin": "null", "Sec-Fetch-Site": ""},
			{"Origin": "", "Sec-Fetch-Site": "same-site"},
			{"Origin": "", "Sec-Fetch-Site": ""},
			{"Origin": "https://gw.example.com.evil.example", "Sec-Fetch-Site": ""},
		} {
			f.wantRefused(f.post(a, path, h), http.StatusForbidden, "its own page", "cross_origin")
		}
		f.wantRefused(f.post(a, path+"?connect=1", nil), http.StatusBadRequest, "nothing in its address", "query")
		f.wantRefused(f.post(a, path, map[string]string{"Content-Type": "text/plain"}), http.StatusUnsupportedMediaType, "x-www-form-urlencoded", "content_type")
		// None of that used the link up.
		f.authorizeFrom(f.post(a, path, nil))
	})
}

// TestConnectCallbackAttacks: the upstream's answer is finished only in
// a browser signed in as the link's owner, once, before anything is
// redeemed: an authorization URL or callback URL forwarded to another
// person stores nothing for anyone.
func TestConnectCallbackAttacks(t *testing.T) {
	f := newFixture(t)
	a, b := browser{}, browser{}
	f.signIn(a, "alice")
	f.signIn(b, "bob")
	_, path := f.link("alice", "github")
	callback := f.authorizeFrom(f.post(a, path, nil))

	// Bob's browser lands on Alice's callback (Alice sent him her
	// authorization URL, or he sent his own to her): refused, and the
	// code is not redeemed.
	f.wantRefused(f.get(b, callback), http.StatusForbidden, "another person", "owner")
	if got := f.auth.finishedFor(); len(got) != 0 {
		t.Fatalf("finished for %v", got)
	}
	// Signed out, the callback asks to sign in and comes back to itself.
	c := browser{}
	if resp := f.get(c, callback); resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("signed out at the callback: %d", resp.StatusCode)
	}
	// A forged state, and a state given twice.
	f.wantRefused(f.get(a, CallbackPath+"?code=x&state="+rand.Text()), http.StatusForbidden, "unknown", "unknown")
	f.wantRefused(f.get(a, callback+"&state=x"), http.StatusBadRequest, "twice", "query")
	f.wantRefused(f.get(a, CallbackPath+"?code=x"), http.StatusBadRequest, "no state", "state")

	// The callback is known for what it is, wherever it lands; another
	// login's answer (the operator's, at the same redirect URL) is not.
	if !f.svc.Handles(httptest.NewRequest(http.MethodGet, "/zidane/oauth/callback/github"+callback[len(CallbackPath):], nil)) {
		t.Fatal("the flow's answer is not known as one")
	}
	if f.svc.Handles(httptest.NewRequest(http.MethodGet, "/zidane/oauth/callback/github?code=x&state="+rand.Text(), nil)) {
		t.Fatal("another login's answer is taken for a flow's")
	}
	// Alice's own browser finishes it, once.
	resp := f.get(a, callback)
	if body := readBody(resp); resp.StatusCode != http.StatusOK || !strings.Contains(body, "Go back to your MCP client") {
		t.Fatalf("callback: %d %s", resp.StatusCode, body)
	}
	wantPageHeaders(t, resp)
	if got := f.auth.finishedFor(); len(got) != 1 || got[0] != [2]string{"alice", "github"} {
		t.Fatalf("finished for %v", got)
	}
	if len(f.connected) != 1 || f.connected[0].Owner != "alice" || f.connected[0].Upstream != "github" || f.connected[0].Elicitation == "" {
		t.Fatalf("connected %+v", f.connected)
	}
	f.wantRefused(f.get(a, callback), http.StatusForbidden, "used already", "unknown")

	// A flow left past its lifetime is refused.
	_, path2 := f.link("alice", "github")
	callback2 := f.authorizeFrom(f.post(a, path2, nil))
	f.clock.add(FlowLifetime)
	f.wantRefused(f.get(a, callback2), http.StatusForbidden, "expired", "expired")
}

// TestConnectLinkCreate: a link is made only for an owner a person can
// sign in as, and an upstream's name; storage never holds its secret.
func TestConnectLinkCreate(t *testing.T) {
	f := newFixture(t)
	for _, c := range [][2]string{{"", "github"}, {"al ice", "github"}, {"alice", ""}, {"alice", "git/hub"}} {
		if _, err := f.svc.Create(context.Background(), c[0], c[1]); err == nil {
			t.Errorf("Create(%q, %q) made a link", c[0], c[1])
		}
	}
	l, _ := f.link("alice", "github")
	secret := strings.TrimPrefix(l.URL, site+PathPrefix)
	keys, err := f.svc.links.store.List(context.Background(), strings.TrimSuffix(LinkKeyPrefix, "/"), false)
	if err != nil || len(keys) != 1 {
		t.Fatalf("stored %v %v", keys, err)
	}
	raw, _ := f.svc.links.store.Load(context.Background(), keys[0])
	if strings.Contains(keys[0]+string(raw), secret) || strings.Contains(keys[0]+string(raw), strings.TrimPrefix(secret, "zcl_")) {
		t.Fatalf("storage holds the secret: %s %s", keys[0], raw)
	}
}

// TestConnectLinksPerOwner: a client that calls in a loop makes one link
// per call; past MaxLinksPerOwner the oldest stops working, and another
// owner's links are untouched.
func TestConnectLinksPerOwner(t *testing.T) {
	f := newFixture(t)
	a, b := browser{}, browser{}
	f.signIn(a, "alice")
	f.signIn(b, "bob")
	_, bobs := f.link("bob", "github")
	var paths []string
	for range MaxLinksPerOwner + 1 {
		_, p := f.link("alice", "github")
		paths = append(paths, p)
	}
	f.wantRefused(f.get(a, paths[0]), http.StatusForbidden, "unknown", "unknown")
	for _, p := range paths[1:] {
		if resp := f.get(a, p); resp.StatusCode != http.StatusOK {
			t.Fatalf("a newer link: %d", resp.StatusCode)
		}
	}
	if resp := f.get(b, bobs); resp.StatusCode != http.StatusOK {
		t.Fatalf("bob's link: %d", resp.StatusCode)
	}
	keys, err := f.svc.links.store.List(context.Background(), strings.TrimSuffix(LinkKeyPrefix, "/"), false)
	if err != nil || len(keys) != MaxLinksPerOwner+1 {
		t.Fatalf("stored links %d %v, want %d", len(keys), err, MaxLinksPerOwner+1)
	}
}

// TestConnectWait: a wait for an elicitation returns once its owner
// connects, whether the callback lands in this process or on another
// replica sharing the storage; a wait by another owner for that id
// learns nothing.
func TestConnectWait(t *testing.T) {
	f := newFixture(t)
	// A second replica: its own Service on the same storage.
	replica, err := New(Config{Site: site, Store: f.svc.links.store, People: f.signin, Authorizer: f.auth, Now: f.clock.now})
	if err != nil {
		t.Fatal(err)
	}
	a := browser{}
	f.signIn(a, "alice")
	for _, waiter := range []*Service{f.svc, replica} {
		l, path := f.link("alice", "github")
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		got := make(chan bool, 1)
		go func() { got <- waiter.Wait(ctx, "alice", l.Elicitation) }()
		callback := f.authorizeFrom(f.post(a, path, nil))
		if resp := f.get(a, callback); resp.StatusCode != http.StatusOK {
			t.Fatalf("callback: %d", resp.StatusCode)
		}
		if !<-got {
			t.Fatal("the wait did not see the connection")
		}
		cancel()
		// Done already: a wait returns at once, for its owner only.
		if !waiter.Wait(context.Background(), "alice", l.Elicitation) {
			t.Fatal("a later wait did not see it")
		}
		if waiter.Wait(context.Background(), "bob", l.Elicitation) {
			t.Fatal("bob's wait saw alice's connection")
		}
	}
}

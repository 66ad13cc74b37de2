package e2e

import (
	"crypto/rand"
	"encoding/json"
	"fmt"
	"html"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"
	"github.com/chromedp/chromedp"

	signin "github.com/Tahul/caddy-zidane-mcp/authserver/idp"
)

// signinSite is a small Go site that serves authserver/idp as the gateway
// will: /start sends the browser to sign in and come back to /whoami,
// which shows who is signed in; the package's own paths go to it. It
// records each request to the callback, as an attacker who saw one would.
type signinSite struct {
	URL       string
	svc       *signin.Service
	mu        sync.Mutex
	callbacks []recordedRequest
	refusals  []signin.Refusal
	signedIn  []string // "owner by via", as the audit log would have them
	// hold makes the callback record the IdP's answer and stop there, as
	// an attacker who caught it would, without using it.
	hold atomic.Bool
	// other is a second replica of the site (the same configuration and
	// key, as replicas derive it from the cluster key); with toOther set,
	// the IdP's answers land on it, as a load balancer may send them.
	other   *signin.Service
	toOther atomic.Bool
}

type recordedRequest struct {
	url    string
	cookie string
}

func startSigninSite(t *testing.T, configure func(site string) signin.Config) *signinSite {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &signinSite{URL: "http://" + ln.Addr().String()}
	cfg := configure(s.URL)
	cfg.Site = s.URL
	cfg.Key = make([]byte, 32)
	_, _ = rand.Read(cfg.Key)
	cfg.Audit = func(r signin.Refusal) {
		s.mu.Lock()
		s.refusals = append(s.refusals, r)
		s.mu.Unlock()
	}
	cfg.SignedIn = func(p signin.Person, via string) {
		s.mu.Lock()
		s.signedIn = append(s.signedIn, p.Owner+" by "+via)
		s.mu.Unlock()
	}
	if s.svc, err = signin.New(cfg); err != nil {
		t.Fatal(err)
	}
	if s.other, err = signin.New(cfg); err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/start", func(w http.ResponseWriter, r *http.Request) { s.svc.SignIn(w, r, "/whoami?from=start") })
	mux.HandleFunc("/whoami", func(w http.ResponseWriter, r *http.Request) {
		p, ok := s.svc.Current(r)
		if !ok {
			http.Error(w, "no one is signed in", http.StatusUnauthorized)
			return
		}
		j, _ := json.Marshal(map[string]any{"owner": p.Owner, "name": p.Name, "scopes": p.Scopes, "query": r.URL.RawQuery})
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		fmt.Fprintf(w, `<!DOCTYPE html><title>whoami</title><h1 id="title">whoami</h1><pre id="person">%s</pre>`, html.EscapeString(string(j)))
	})
	mux.HandleFunc(signin.CallbackPath, func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.callbacks = append(s.callbacks, recordedRequest{url: s.URL + r.URL.RequestURI(), cookie: r.Header.Get("Cookie")})
		s.mu.Unlock()
		switch {
		case s.hold.Load():
			fmt.Fprint(w, `<!DOCTYPE html><title>held</title><h1 id="title">held</h1>`)
		case s.toOther.Load():
			s.other.ServeHTTP(w, r)
		default:
			s.svc.ServeHTTP(w, r)
		}
	})
	mux.Handle(signin.LinkPath, s.svc)
	srv := &http.Server{Handler: mux}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return s
}

func (s *signinSite) lastRefusal() signin.Refusal {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.refusals) == 0 {
		return signin.Refusal{}
	}
	return s.refusals[len(s.refusals)-1]
}

// TestIdPSignIn signs people in through a real OpenID Certified IdP
// (panva's oidc-provider) in headless Chromium: alice, in the eng group,
// comes back signed in as owner alice with the scopes the rules grant;
// bob, whom no rule grants a scope, is told so and not signed in. The
// IdP's answer to alice's browser, replayed with her cookies, or opened in
// another browser, signs no one in.
func TestIdPSignIn(t *testing.T) {
	var issuer *testIdP
	site := startSigninSite(t, func(site string) signin.Config {
		issuer = startIdP(t, site+signin.CallbackPath)
		return signin.Config{OIDC: &signin.OIDC{
			Issuer: issuer.Issuer, ClientID: issuer.ClientID, ClientSecret: issuer.ClientSecret,
			Scopes: []string{"profile", "email", "groups"},
			Claims: signin.Claims{Rules: []signin.Rule{
				{Claim: "groups", Value: "eng", Scopes: []string{"upstream:github", "chat"}},
				{Claim: "groups", Value: "staff", Scopes: []string{"chat"}},
			}},
		}}
	})

	// The request to the IdP, as the browser is sent there: its redirect
	// URI comes from the configured site whatever Host says, with PKCE
	// S256, a nonce and a state of its own.
	noFollow := &http.Client{Timeout: 10 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	states := map[string]bool{}
	for range 2 {
		req, _ := http.NewRequest("GET", site.URL+"/start", nil)
		req.Host = "evil.example"
		req.Header.Set("X-Forwarded-Host", "evil.example")
		resp, err := noFollow.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		to, err := url.Parse(resp.Header.Get("Location"))
		if resp.StatusCode != http.StatusSeeOther || err != nil || !strings.HasPrefix(to.String(), issuer.Issuer+"/") {
			t.Fatalf("/start: %d to %q", resp.StatusCode, resp.Header.Get("Location"))
		}
		q := to.Query()
		if q.Get("redirect_uri") != site.URL+signin.CallbackPath || q.Get("code_challenge_method") != "S256" || len(q.Get("code_challenge")) != 43 ||
			q.Get("nonce") == "" || q.Get("state") == "" || q.Get("client_id") != issuer.ClientID || q.Get("response_type") != "code" ||
			q.Get("scope") != "openid profile email groups" || strings.Contains(to.String(), issuer.ClientSecret) {
			t.Fatalf("the authorization request: %s", to)
		}
		if states[q.Get("state")] {
			t.Fatal("two sign-ins got one state")
		}
		states[q.Get("state")] = true
		if cs := resp.Cookies(); len(cs) != 1 || cs[0].Name != "zidane-signin-flow" || !cs[0].HttpOnly || cs[0].SameSite != http.SameSiteLaxMode {
			t.Fatalf("the flow cookie: %v", resp.Cookies())
		}
	}

	loc, text := newBrowser(t).idpSignIn(t, site.URL+"/start", "alice")
	if loc != site.URL+"/whoami?from=start" {
		t.Fatalf("alice ended at %s:\n%s", loc, text)
	}
	var who struct {
		Owner, Name string
		Scopes      []string
	}
	if err := json.Unmarshal([]byte(text[strings.Index(text, "{"):]), &who); err != nil {
		t.Fatalf("whoami: %v\n%s", err, text)
	}
	if who.Owner != "alice" || who.Name != "Alice Example" || strings.Join(who.Scopes, " ") != "chat upstream:github" {
		t.Fatalf("alice signed in as %+v", who)
	}

	site.mu.Lock()
	if len(site.callbacks) != 1 {
		site.mu.Unlock()
		t.Fatalf("%d callbacks", len(site.callbacks))
	}
	cb := site.callbacks[0]
	site.mu.Unlock()
	if !strings.Contains(cb.url, "iss=") || !strings.Contains(cb.url, "code=") {
		t.Fatalf("the IdP's answer carries no iss or code: %s", cb.url)
	}
	for _, tc := range []struct {
		name, cookie string
		reason       string
	}{
		{"replayed with alice's cookies", cb.cookie, "replayed"},
		{"opened in another browser", "", "no_flow"},
	} {
		req, _ := http.NewRequest("GET", cb.url, nil)
		if tc.cookie != "" {
			req.Header.Set("Cookie", tc.cookie)
		}
		resp, err := shortClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || site.lastRefusal().Reason != tc.reason || !strings.Contains(string(b), "Start again") {
			t.Errorf("%s: %d %+v\n%s", tc.name, resp.StatusCode, site.lastRefusal(), b)
		}
		for _, c := range resp.Cookies() {
			if strings.HasSuffix(c.Name, "zidane-signin") && c.MaxAge >= 0 {
				t.Errorf("%s: signed in", tc.name)
			}
		}
	}

	loc, text = newBrowser(t).idpSignIn(t, site.URL+"/start", "bob")
	if !strings.HasPrefix(loc, site.URL+signin.CallbackPath) || !strings.Contains(text, "no rule of this gateway grants you a scope") || !strings.Contains(text, "Bob Example") {
		t.Fatalf("bob ended at %s:\n%s", loc, text)
	}
	if r := site.lastRefusal(); r.Reason != "no_scope" || r.Owner != "bob" || r.Status != http.StatusForbidden {
		t.Fatalf("bob's refusal: %+v", r)
	}
	site.mu.Lock()
	defer site.mu.Unlock()
	if strings.Join(site.signedIn, ",") != "alice by idp" {
		t.Fatalf("sign-ins reported: %q", site.signedIn)
	}
}

// TestSigninLinkInBrowser opens a sign-in link in headless Chromium as a
// person would: the sign-in started on the site (an authorization request
// with nobody signed in) says to get a link; fetching the link's page, as
// a mail scanner does, uses nothing; the page's script (allowed by its
// content security policy, by hash) takes the secret from the fragment
// into the form and out of the address bar; the button signs the browser
// in and brings it back where the sign-in started. The same link in a
// second browser is refused.
func TestSigninLinkInBrowser(t *testing.T) {
	store := &certmagic.FileStorage{Path: t.TempDir()}
	site := startSigninSite(t, func(string) signin.Config { return signin.Config{Links: store} })
	secret, _, err := signin.NewLinks(store, nil).Create(t.Context(), signin.LinkSpec{Owner: "carol", Name: "Carol", Scopes: []string{"chat"}})
	if err != nil {
		t.Fatal(err)
	}
	link := signin.LinkURL(site.URL, secret)

	for range 2 {
		resp, err := shortClient.Get(link)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || len(resp.Cookies()) != 0 {
			t.Fatalf("fetching the link: %d %v", resp.StatusCode, resp.Cookies())
		}
	}

	b := newBrowser(t)
	b.do(t, "starting a sign-in", chromedp.Navigate(site.URL+"/start"), chromedp.WaitReady(chromedp.ID("title")))
	if _, text := b.page(t); !strings.Contains(text, "signin-link") {
		t.Fatalf("the sign-in page does not say how to get a link:\n%s", text)
	}
	b.do(t, "opening the link", chromedp.Navigate(link), chromedp.WaitVisible(chromedp.ID("signin")))
	loc, _ := b.page(t)
	filled, err := chromedp.Run(b.ctx, chromedp.Evaluate[string](`document.getElementById("secret").value`))
	if err != nil || filled != secret {
		t.Fatalf("the page's script did not fill in the secret (CSP?): %q, %v", filled, err)
	}
	if strings.Contains(loc, secret) {
		t.Errorf("the secret stays in the address bar: %s", loc)
	}
	b.do(t, "pressing the button", chromedp.Click(chromedp.ID("signin")), chromedp.WaitNotPresent(chromedp.ID("signin")), chromedp.WaitReady(chromedp.ID("title")))
	loc, text := b.page(t)
	if loc != site.URL+"/whoami?from=start" || !strings.Contains(text, `"owner":"carol"`) || !strings.Contains(text, `"scopes":["chat"]`) {
		t.Fatalf("after the link: %s\n%s\n%+v", loc, text, site.lastRefusal())
	}

	other := newBrowser(t)
	other.do(t, "the same link in another browser", chromedp.Navigate(link), chromedp.WaitVisible(chromedp.ID("signin")),
		chromedp.Click(chromedp.ID("signin")), chromedp.WaitNotPresent(chromedp.ID("signin")), chromedp.WaitReady(chromedp.ID("title")))
	if _, text := other.page(t); !strings.Contains(text, "unknown or was used already") {
		t.Fatalf("the link's second use:\n%s", text)
	}
	if r := site.lastRefusal(); r.Step != "link" || r.Status != http.StatusForbidden {
		t.Fatalf("second use audited as %+v", r)
	}
}

// lastCallback is the IdP's last answer the site saw.
func (s *signinSite) lastCallback(t *testing.T) recordedRequest {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.callbacks) == 0 {
		t.Fatal("the IdP sent no browser back")
	}
	return s.callbacks[len(s.callbacks)-1]
}

// withParam is rawURL with its query parameter name set to that of from.
func withParam(t *testing.T, rawURL, from, name string) string {
	t.Helper()
	u, err := url.Parse(rawURL)
	f, err2 := url.Parse(from)
	if err != nil || err2 != nil {
		t.Fatal(err, err2)
	}
	q := u.Query()
	q.Set(name, f.Query().Get(name))
	u.RawQuery = q.Encode()
	return u.String()
}

// TestIdPSignInCrossBrowser: answers of the real IdP carried from one
// browser to another sign no one in. Bob's answer opened in Alice's
// browser (login CSRF: Alice would act as Bob) is refused for its state;
// Alice's code, caught and sent with Bob's own state and cookie (code
// injection), passes the state check but the IdP refuses it, since Bob's
// PKCE verifier is not the one Alice's sign-in committed to.
func TestIdPSignInCrossBrowser(t *testing.T) {
	var issuer *testIdP
	site := startSigninSite(t, func(site string) signin.Config {
		issuer = startIdP(t, site+signin.CallbackPath)
		return signin.Config{OIDC: &signin.OIDC{
			Issuer: issuer.Issuer, ClientID: issuer.ClientID, ClientSecret: issuer.ClientSecret,
			Scopes: []string{"profile", "groups"},
			Claims: signin.Claims{Rules: []signin.Rule{{Claim: "groups", Value: "eng", Scopes: []string{"chat"}}, {Claim: "groups", Value: "sales", Scopes: []string{"chat"}}}},
		}}
	})
	site.hold.Store(true)
	alice, bob := newBrowser(t), newBrowser(t)
	alice.idpSignIn(t, site.URL+"/start", "alice")
	aliceAnswer := site.lastCallback(t)
	bob.idpSignIn(t, site.URL+"/start", "bob")
	bobAnswer := site.lastCallback(t)
	site.hold.Store(false)

	alice.do(t, "opening Bob's answer in Alice's browser", chromedp.Navigate(bobAnswer.url), chromedp.WaitReady(chromedp.ID("title")))
	if _, text := alice.page(t); !strings.Contains(text, "does not belong to the sign-in under way in this browser") {
		t.Fatalf("Bob's answer in Alice's browser:\n%s", text)
	}
	if r := site.lastRefusal(); r.Reason != "state" {
		t.Fatalf("refused as %+v", r)
	}
	alice.do(t, "asking who Alice is", chromedp.Navigate(site.URL+"/whoami"), chromedp.WaitReady(chromedp.CSS("body")))
	if _, text := alice.page(t); !strings.Contains(text, "no one is signed in") {
		t.Fatalf("Alice's browser after Bob's answer:\n%s", text)
	}

	injected := withParam(t, bobAnswer.url, aliceAnswer.url, "code")
	req, _ := http.NewRequest("GET", injected, nil)
	req.Header.Set("Cookie", bobAnswer.cookie)
	resp, err := shortClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadGateway || site.lastRefusal().Reason != "exchange" || !strings.Contains(string(b), "invalid_grant") {
		t.Fatalf("Alice's code with Bob's state: %d %+v\n%s", resp.StatusCode, site.lastRefusal(), b)
	}
	for _, c := range resp.Cookies() {
		if strings.HasSuffix(c.Name, "zidane-signin") && c.MaxAge >= 0 {
			t.Fatal("signed in with an injected code")
		}
	}
}

// TestIdPSignInOnAnotherReplica: a sign-in started on one replica finishes
// on another (the flow cookie opens under the key they share), and the
// session it makes is read by both. The same answer replayed on the first
// replica, which did not see it used, is refused by the IdP, which redeems
// a code once.
func TestIdPSignInOnAnotherReplica(t *testing.T) {
	var issuer *testIdP
	site := startSigninSite(t, func(site string) signin.Config {
		issuer = startIdP(t, site+signin.CallbackPath)
		return signin.Config{OIDC: &signin.OIDC{
			Issuer: issuer.Issuer, ClientID: issuer.ClientID, ClientSecret: issuer.ClientSecret, Scopes: []string{"groups"},
			Claims: signin.Claims{Rules: []signin.Rule{{Claim: "groups", Value: "eng", Scopes: []string{"chat"}}}},
		}}
	})
	site.toOther.Store(true)
	loc, text := newBrowser(t).idpSignIn(t, site.URL+"/start", "alice")
	if loc != site.URL+"/whoami?from=start" || !strings.Contains(text, `"owner":"alice"`) {
		t.Fatalf("alice, her answer on the other replica: %s\n%s", loc, text)
	}
	answer := site.lastCallback(t)
	site.toOther.Store(false)
	req, _ := http.NewRequest("GET", answer.url, nil)
	req.Header.Set("Cookie", answer.cookie)
	resp, err := shortClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadGateway || site.lastRefusal().Reason != "exchange" || !strings.Contains(string(b), "invalid_grant") {
		t.Fatalf("the answer replayed on the first replica: %d %+v\n%s", resp.StatusCode, site.lastRefusal(), b)
	}
	for _, c := range resp.Cookies() {
		if strings.HasSuffix(c.Name, "zidane-signin") && c.MaxAge >= 0 {
			t.Fatal("signed in by a replayed answer")
		}
	}
}

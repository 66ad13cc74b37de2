package upstreamauth

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/Tahul/caddy-zidane-mcp/internal/oauthtest"
)

// exchangeEnv is an upstream whose authorization server trusts a company
// IdP (another oauthtest server, which signs ID tokens and ID-JAGs), and
// the sign-in tokens the gateway holds of its people.
type exchangeEnv struct {
	*env
	idp       *oauthtest.AuthServer
	secret    string // the gateway's client secret at the upstream's AS
	idpSecret string // ... and at the IdP

	mu     sync.Mutex
	signIn map[string]string // owner -> ID token
}

// gatewayAtIdP is the gateway's client at the IdP: the audience of the
// people's ID tokens.
const gatewayAtIdP = "gw-at-idp"

func newExchangeEnv(t *testing.T) *exchangeEnv {
	t.Helper()
	e := newEnv(t, oauthtest.AuthServerOptions{}, nil, "")
	idp := oauthtest.NewAuthServer(oauthtest.AuthServerOptions{Now: e.clock.Now})
	t.Cleanup(idp.Close)
	x := &exchangeEnv{env: e, idp: idp, secret: oauthtest.NewSecret("cs"), idpSecret: oauthtest.NewSecret("idp-cs"), signIn: map[string]string{}}
	e.as.AddClient("gw", x.secret, nil)
	e.as.TrustIdP(idp.URL, idp.JWKSURL(), gatewayAtIdP)
	idp.AddClient(gatewayAtIdP, x.idpSecret, nil)
	e.subjects = func(ctx context.Context, owner string) (string, error) {
		x.mu.Lock()
		defer x.mu.Unlock()
		tok, ok := x.signIn[owner]
		if !ok {
			return "", errors.New("no sign-in of yours is held: sign in to the gateway again")
		}
		return tok, nil
	}
	x.signedIn("alice@example.com", "alice", time.Hour)
	x.signedIn("bob@example.com", "bob", time.Hour)
	return x
}

// signedIn holds owner's sign-in token: an ID token of the IdP for user.
func (x *exchangeEnv) signedIn(owner, user string, ttl time.Duration) string {
	tok := x.idp.IDToken(user, gatewayAtIdP, ttl)
	x.mu.Lock()
	x.signIn[owner] = tok
	x.mu.Unlock()
	return tok
}

func (x *exchangeEnv) signedOut(owner string) {
	x.mu.Lock()
	delete(x.signIn, owner)
	x.mu.Unlock()
}

func (x *exchangeEnv) tokenExchange() Config {
	return Config{Grant: GrantTokenExchange, Credentials: CredentialsPerUser, ClientID: "gw", ClientSecret: x.secret, AuthorizationServer: x.as.URL}
}

func (x *exchangeEnv) crossAppAccess() Config {
	return Config{Grant: GrantCrossAppAccess, Credentials: CredentialsPerUser, ClientID: "gw", ClientSecret: x.secret, AuthorizationServer: x.as.URL,
		IDPTokenURL: x.idp.URL + "/token", IDPClientID: gatewayAtIdP, IDPClientSecret: x.idpSecret}
}

// grantsAt returns the grant types the server received.
func grantsAt(as *oauthtest.AuthServer) []string {
	var out []string
	for _, r := range as.TokenRequests() {
		out = append(out, r.GrantType)
	}
	return out
}

// Each person gets their own token from their sign-in token, with no
// browser step: A's calls run as A and B's as B, a warm call asks for no
// new token, and a person whose sign-in token is gone and whose
// connection is revoked has no access at all.
func TestExchangeGivesEachPersonTheirOwnToken(t *testing.T) {
	for _, tc := range []struct {
		name   string
		cfg    func(*exchangeEnv) Config
		grants []string // at the upstream's AS, per person
	}{
		{"token_exchange", (*exchangeEnv).tokenExchange, []string{oauthtest.GrantTokenExchange}},
		{"cross_app_access", (*exchangeEnv).crossAppAccess, []string{oauthtest.GrantJWTBearer}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x := newExchangeEnv(t)
			c := x.client(tc.cfg(x))
			for _, call := range []struct{ owner, user string }{
				{"alice@example.com", "alice"}, {"bob@example.com", "bob"}, {"alice@example.com", "alice"}, {"bob@example.com", "bob"},
			} {
				got, err := x.whoami(c, withOwner(call.owner))
				if err != nil || got != call.user {
					t.Fatalf("%s's call ran as %q (%v), want %q", call.owner, got, err, call.user)
				}
			}
			if n := len(x.as.AuthorizationRequests()); n != 0 {
				t.Errorf("%d authorization requests: a browser step happened", n)
			}
			// One token per person, then warm calls.
			if got, want := grantsAt(x.as), append(slices.Clone(tc.grants), tc.grants...); !slices.Equal(got, want) {
				t.Errorf("token requests at the upstream's AS %v, want %v", got, want)
			}
			if got := x.as.ExchangedUsers(); !slices.Equal(got, []string{"alice", "bob"}) {
				t.Errorf("tokens issued for %v", got)
			}
			// Alice's grant revoked: her sign-in token and her
			// connection are deleted; her next call reaches no one.
			x.signedOut("alice@example.com")
			oc, err := c.ForOwner("alice@example.com")
			if err != nil {
				t.Fatal(err)
			}
			if had, err := oc.Revoke(context.Background()); !had || err != nil {
				t.Fatalf("Revoke: %v %v", had, err)
			}
			before := x.mcp.Credentialed()
			if _, err := x.whoami(c, withOwner("alice@example.com")); err == nil || !strings.Contains(err.Error(), "sign in") {
				t.Errorf("Alice's call after revocation: %v", err)
			}
			if after := x.mcp.Credentialed(); after != before {
				t.Errorf("the refused call reached the upstream (%d requests, had %d)", after, before)
			}
			if got, err := x.whoami(c, withOwner("bob@example.com")); err != nil || got != "bob" {
				t.Errorf("Bob after Alice's revocation: %q %v", got, err)
			}
			leakCheck(t, x.env, append(append(x.as.Secrets(), x.idp.Secrets()...), x.secret, x.idpSecret), fmt.Sprint(c.State()))
		})
	}
}

// hostileTokenEndpoint is an authorization server's token endpoint that
// answers every request with body.
func hostileTokenEndpoint(t *testing.T, body string) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(body))
	}))
	t.Cleanup(srv.Close)
	return srv.URL + "/token"
}

// Every way a person's token without a browser could go wrong is refused
// before the upstream is reached, with a word of the reason; the
// subject token is never sent once expired, and an ID-JAG for another
// server or resource is never presented.
func TestExchangeAttacks(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(x *exchangeEnv) Config
		want  string // a word of the refusal
		// check, when set, asserts what reached the authorization
		// servers.
		check func(t *testing.T, x *exchangeEnv)
	}{
		{
			name: "expired subject token",
			setup: func(x *exchangeEnv) Config {
				x.signedIn("alice@example.com", "alice", -time.Minute)
				return x.tokenExchange()
			},
			want: "expired",
			check: func(t *testing.T, x *exchangeEnv) {
				if n := len(x.as.TokenRequests()); n != 0 {
					t.Errorf("the expired sign-in token was sent: %d token requests", n)
				}
			},
		},
		{
			name: "subject token of another IdP",
			setup: func(x *exchangeEnv) Config {
				other := oauthtest.NewAuthServer(oauthtest.AuthServerOptions{Now: x.clock.Now})
				t.Cleanup(other.Close)
				x.mu.Lock()
				x.signIn["alice@example.com"] = other.IDToken("alice", gatewayAtIdP, time.Hour)
				x.mu.Unlock()
				return x.tokenExchange()
			},
			want: "invalid_grant",
		},
		{
			name: "subject token issued to another client",
			setup: func(x *exchangeEnv) Config {
				x.mu.Lock()
				x.signIn["alice@example.com"] = x.idp.IDToken("alice", "another-client", time.Hour)
				x.mu.Unlock()
				return x.tokenExchange()
			},
			want: "invalid_grant",
		},
		{
			name:  "sign-in token removed",
			setup: func(x *exchangeEnv) Config { x.signedOut("alice@example.com"); return x.tokenExchange() },
			want:  "sign in",
			check: func(t *testing.T, x *exchangeEnv) {
				if n := len(x.as.TokenRequests()); n != 0 {
					t.Errorf("%d token requests without a sign-in token", n)
				}
			},
		},
		{
			name: "ID-JAG for another audience",
			setup: func(x *exchangeEnv) Config {
				x.idp.SetIDJAG(0, func(c jwt.MapClaims) { c["aud"] = "https://other-as.example.com" })
				return x.crossAppAccess()
			},
			want: "audience",
			check: func(t *testing.T, x *exchangeEnv) {
				if n := len(x.as.TokenRequests()); n != 0 {
					t.Errorf("the ID-JAG was presented: %d token requests at the upstream's AS", n)
				}
			},
		},
		{
			name: "ID-JAG for another resource",
			setup: func(x *exchangeEnv) Config {
				x.idp.SetIDJAG(0, func(c jwt.MapClaims) { c["resource"] = "https://other.example.com/mcp" })
				return x.crossAppAccess()
			},
			want: "resource",
			check: func(t *testing.T, x *exchangeEnv) {
				if n := len(x.as.TokenRequests()); n != 0 {
					t.Errorf("the ID-JAG was presented: %d token requests at the upstream's AS", n)
				}
			},
		},
		{
			name: "ID-JAG expired",
			setup: func(x *exchangeEnv) Config {
				x.idp.SetIDJAG(-time.Minute, nil)
				return x.crossAppAccess()
			},
			want: "expired",
		},
		{
			name: "exchange answer too large",
			setup: func(x *exchangeEnv) Config {
				cfg := x.tokenExchange()
				cfg.TokenURL = hostileTokenEndpoint(t, `{"access_token":"`+strings.Repeat("a", 2<<20)+`"}`)
				return cfg
			},
			want: "larger than",
		},
		{
			name: "exchange answer with the wrong issued_token_type",
			setup: func(x *exchangeEnv) Config {
				cfg := x.tokenExchange()
				cfg.TokenURL = hostileTokenEndpoint(t, `{"access_token":"at-hostile-0123456789","token_type":"Bearer","expires_in":3600,"issued_token_type":"urn:ietf:params:oauth:token-type:refresh_token"}`)
				return cfg
			},
			want: "not an access token",
		},
		{
			name: "exchange refused, the answer echoing the subject token",
			setup: func(x *exchangeEnv) Config {
				srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					r.ParseForm()
					w.Header().Set("Content-Type", "application/json")
					w.WriteHeader(http.StatusBadRequest)
					fmt.Fprintf(w, `{"error":"invalid_grant","error_description":"not taking %s"}`, r.PostForm.Get("subject_token"))
				}))
				t.Cleanup(srv.Close)
				cfg := x.tokenExchange()
				cfg.TokenURL = srv.URL + "/token"
				return cfg
			},
			want: "<redacted>",
		},
		{
			name: "exchange answer without issued_token_type",
			setup: func(x *exchangeEnv) Config {
				cfg := x.tokenExchange()
				cfg.TokenURL = hostileTokenEndpoint(t, `{"access_token":"at-hostile-0123456789","token_type":"Bearer","expires_in":3600}`)
				return cfg
			},
			want: "not an access token",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x := newExchangeEnv(t)
			c := x.client(tc.setup(x))
			before := x.mcp.Credentialed()
			_, err := x.whoami(c, withOwner("alice@example.com"))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Alice's call: %v; want a refusal saying %q", err, tc.want)
			}
			var sre *SignInRequiredError
			if !errors.As(err, &sre) || !strings.Contains(err.Error(), "sign in to the gateway again") {
				t.Errorf("the refusal is %T %v, want a SignInRequiredError saying to sign in again (fallback none)", err, err)
			}
			if after := x.mcp.Credentialed(); after != before {
				t.Errorf("the refused call reached the upstream with a credential")
			}
			if tc.check != nil {
				tc.check(t, x)
			}
			// Bob, whose sign-in token is good, is not affected by
			// Alice's refusal (where the server is a real one).
			if tc.setup != nil && !strings.Contains(tc.name, "answer") && !strings.Contains(tc.name, "ID-JAG") {
				if got, err := x.whoami(c, withOwner("bob@example.com")); err != nil || got != "bob" {
					t.Errorf("Bob: %q %v", got, err)
				}
			}
			leakCheck(t, x.env, append(x.idp.Secrets(), x.secret, x.idpSecret), err.Error())
		})
	}
}

// With fallback connect, a person whose token cannot be had by exchange
// gets the connect link (ErrConnectRequired), and connecting through it
// (the upstream's authorization code login) gives their own token.
func TestExchangeFallsBackToTheConnectLink(t *testing.T) {
	x := newExchangeEnv(t)
	cfg := x.tokenExchange()
	cfg.Fallback, cfg.RedirectURL = FallbackConnect, redirect
	c := x.client(cfg)
	x.signedOut("alice@example.com")
	_, err := x.whoami(c, withOwner("alice@example.com"))
	var cre *ConnectRequiredError
	if !errors.As(err, &cre) || !strings.Contains(cre.Reason, "sign-in") {
		t.Fatalf("Alice without a sign-in token: %v; want the connect link", err)
	}
	x.connect(c, "alice@example.com", "alice-at-upstream")
	if got, err := x.whoami(c, withOwner("alice@example.com")); err != nil || got != "alice-at-upstream" {
		t.Errorf("Alice after connecting: %q %v", got, err)
	}
	if got, err := x.whoami(c, withOwner("bob@example.com")); err != nil || got != "bob" {
		t.Errorf("Bob by exchange: %q %v", got, err)
	}
	// Without fallback connect, a person cannot begin a login.
	plain := x.client(x.tokenExchange())
	oc, err := plain.ForOwner("alice@example.com")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := oc.BeginLogin(context.Background()); err == nil || !strings.Contains(err.Error(), "needs no login") {
		t.Errorf("BeginLogin without fallback connect: %v", err)
	}
}

// The configs of a person's token without a browser that could not work,
// or would do something else than they say, are refused naming what to
// write.
func TestExchangeConfig(t *testing.T) {
	te := Config{Grant: GrantTokenExchange, Credentials: CredentialsPerUser, ClientID: "gw", ClientSecret: "s", AuthorizationServer: "https://as.example.com"}
	caa := Config{Grant: GrantCrossAppAccess, Credentials: CredentialsPerUser, ClientID: "gw", IDPIssuer: "https://idp.example.com", IDPClientID: "i", AuthorizationServer: "https://as.example.com"}
	with := func(c Config, f func(*Config)) Config { f(&c); return c }
	for _, good := range []Config{
		te, caa,
		with(te, func(c *Config) { c.Fallback, c.RedirectURL = FallbackConnect, redirect }),
		with(caa, func(c *Config) { c.Fallback, c.RedirectURL = FallbackConnect, redirect }),
		with(te, func(c *Config) { c.Audience, c.TokenURL = "urn:upstream", "https://as.example.com/token" }),
	} {
		if err := good.Validate(); err != nil {
			t.Errorf("%v refused: %v", good, err)
		}
	}
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{with(te, func(c *Config) { c.Credentials = "" }), "needs credentials per_user"},
		{with(te, func(c *Config) { c.AuthorizationServer = "" }), "set authorization_server"},
		{with(te, func(c *Config) { c.ClientSecret = "" }), "client credential"},
		{with(te, func(c *Config) { c.ClientID, c.ClientSecret = "", "" }), "client_id"},
		{with(te, func(c *Config) { c.RedirectURL = redirect }), "fallback connect"},
		{with(te, func(c *Config) { c.Fallback = FallbackConnect }), "needs redirect_url"},
		{with(te, func(c *Config) { c.Fallback = "browser" }), "not supported"},
		{with(te, func(c *Config) { c.IDTokenFile = "/run/id_token" }), "id_token_file"},
		{with(te, func(c *Config) { c.IDPIssuer = "https://idp.example.com" }), "idp_issuer"},
		{with(caa, func(c *Config) { c.IDTokenFile = "/run/id_token" }), "remove id_token_file"},
		{with(caa, func(c *Config) { c.AuthorizationServer = "" }), "set authorization_server"},
		{with(caa, func(c *Config) { c.Audience = "x" }), "audience applies to grant token_exchange"},
		{with(caa, func(c *Config) { c.ActorTokenFile = "/run/gw.jwt" }), "actor_token_file applies to grant token_exchange"},
		{with(te, func(c *Config) { c.ActorTokenFile = "/" }), "actor_token_file"},
		{Config{RedirectURL: redirect, Credentials: CredentialsPerUser, Fallback: FallbackConnect}, "fallback connect applies"},
		{Config{Grant: GrantJWTBearer, AssertionFile: "/x", Credentials: CredentialsPerUser}, "needs grant authorization_code"},
	} {
		if err := tc.cfg.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want %q", tc.cfg, err, tc.want)
		}
	}
}

// A person's ID token goes to the authorization server the config names,
// never to one only the upstream's metadata names: an upstream that lists
// another server (one that would take the token and answer), or that
// publishes no resource metadata so that its own origin would stand for
// its authorization server, gets no token request carrying it.
func TestExchangeSendsTheIDTokenOnlyToTheConfiguredServer(t *testing.T) {
	t.Run("metadata naming another server", func(t *testing.T) {
		x := newExchangeEnv(t)
		evil := oauthtest.NewAuthServer(oauthtest.AuthServerOptions{Now: x.clock.Now})
		t.Cleanup(evil.Close)
		evil.AddClient("gw", x.secret, nil)
		evil.TrustIdP(x.idp.URL, x.idp.JWKSURL(), gatewayAtIdP)
		x.mcp.Override(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"resource":%q,"authorization_servers":[%q]}`, x.mcp.URL, evil.URL)
		}))
		c := x.client(x.tokenExchange())
		_, err := x.whoami(c, withOwner("alice@example.com"))
		if err == nil || !strings.Contains(err.Error(), "not one the upstream lists") {
			t.Errorf("Alice's call: %v", err)
		}
		if n := len(evil.TokenRequests()); n != 0 {
			t.Errorf("the server the upstream named got %d token requests", n)
		}
	})
	t.Run("no metadata: the upstream's origin as its server", func(t *testing.T) {
		x := newExchangeEnv(t)
		var tokenRequests int
		var mu sync.Mutex
		x.mcp.Override(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			switch r.URL.Path {
			case "/.well-known/oauth-authorization-server":
				origin := "http://" + r.Host
				w.Header().Set("Content-Type", "application/json")
				fmt.Fprintf(w, `{"issuer":%q,"authorization_endpoint":"%s/authorize","token_endpoint":"%s/token","response_types_supported":["code"],"code_challenge_methods_supported":["S256"]}`, origin, origin, origin)
			case "/token":
				mu.Lock()
				tokenRequests++
				mu.Unlock()
				http.Error(w, "no", http.StatusBadRequest)
			default:
				http.NotFound(w, r)
			}
		}))
		c := x.client(x.tokenExchange())
		_, err := x.whoami(c, withOwner("alice@example.com"))
		if err == nil {
			t.Fatal("Alice's call went through")
		}
		mu.Lock()
		defer mu.Unlock()
		if tokenRequests != 0 {
			t.Errorf("the upstream's origin got %d token requests (%v)", tokenRequests, err)
		}
	})
}

// A person's exchange is single-flight across goroutines and replicas:
// many first calls at once, on two replicas sharing the storage (files,
// and a real nats-server), make one token request, and every call runs as
// the person.
func TestExchangeIsSingleFlightAcrossReplicas(t *testing.T) {
	for _, onNATS := range []bool{false, true} {
		t.Run(fmt.Sprintf("nats=%v", onNATS), func(t *testing.T) { testExchangeSingleFlight(t, onNATS) })
	}
}

func testExchangeSingleFlight(t *testing.T, onNATS bool) {
	x := newExchangeEnv(t)
	if onNATS {
		x.onNATS()
	}
	a, b := x.client(x.tokenExchange()), x.client(x.tokenExchange())
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for i := range 16 {
		c := a
		if i%2 == 1 {
			c = b
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			got, err := x.whoami(c, withOwner("alice@example.com"))
			if err == nil && got != "alice" {
				err = fmt.Errorf("ran as %q", got)
			}
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	if got := grantsAt(x.as); len(got) != 1 {
		t.Errorf("%d token requests for one person's first calls on two replicas: %v", len(got), got)
	}
}

// With actor_token_file the gateway's own JWT goes with the person's ID
// token as the exchange's actor_token, read at each exchange; one for
// another authorization server, or expired, is not sent, and neither is
// the person's ID token.
func TestExchangeActorToken(t *testing.T) {
	for _, tc := range []struct {
		name  string
		issue func(x *exchangeEnv, w *workload)
		want  string // "" for success
	}{
		{"the gateway's JWT for this server", func(x *exchangeEnv, w *workload) { w.issue(x.as.URL, x.clock.Now(), 5*time.Minute) }, ""},
		{"for another server", func(x *exchangeEnv, w *workload) {
			w.issue("https://other-as.example.com", x.clock.Now(), 5*time.Minute)
		}, "audience"},
		{"expired", func(x *exchangeEnv, w *workload) { w.issue(x.as.URL, x.clock.Now().Add(-time.Hour), 5*time.Minute) }, "expired"},
		{"not written yet", func(*exchangeEnv, *workload) {}, "actor_token_file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x := newExchangeEnv(t)
			w := newWorkload(t)
			x.as.TrustWorkloadKey(&w.key.PublicKey)
			tc.issue(x, w)
			cfg := x.tokenExchange()
			cfg.ActorTokenFile = w.file
			c := x.client(cfg)
			got, err := x.whoami(c, withOwner("alice@example.com"))
			reqs := x.as.TokenRequests()
			if tc.want == "" {
				if err != nil || got != "alice" {
					t.Fatalf("Alice's call: %q %v", got, err)
				}
				raw, _ := os.ReadFile(w.file)
				if len(reqs) != 1 || reqs[0].ActorToken != strings.TrimSpace(string(raw)) {
					t.Errorf("the exchange carried actor_token %.20q, want the gateway's JWT", reqs[0].ActorToken)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Alice's call: %v; want a refusal saying %q", err, tc.want)
			}
			if len(reqs) != 0 {
				t.Errorf("%d token requests: the person's ID token went out", len(reqs))
			}
		})
	}
}

// Once a person's exchanged token is warm, their calls read no storage
// and ask for no sign-in token: the exchange runs once per token.
func TestExchangeWarmCallReadsNoStorage(t *testing.T) {
	x := newExchangeEnv(t)
	cs := &countingStorage{Storage: x.store}
	x.store = cs
	var asked sync.Map
	subjects := x.subjects
	x.subjects = func(ctx context.Context, owner string) (string, error) {
		n, _ := asked.LoadOrStore(owner, new(int))
		*n.(*int)++
		return subjects(ctx, owner)
	}
	c := x.client(x.tokenExchange())
	for _, owner := range []string{"alice@example.com", "bob@example.com"} {
		if _, err := x.whoami(c, withOwner(owner)); err != nil {
			t.Fatal(err)
		}
	}
	loads, locks := cs.counts()
	for i := range 20 {
		owner, want := "alice@example.com", "alice"
		if i%2 == 1 {
			owner, want = "bob@example.com", "bob"
		}
		if got, err := x.whoami(c, withOwner(owner)); err != nil || got != want {
			t.Fatalf("%s's call ran as %q (%v)", owner, got, err)
		}
	}
	if l, k := cs.counts(); l != loads || k != locks {
		t.Errorf("20 warm calls read storage %d times and locked it %d times, want none", l-loads, k-locks)
	}
	asked.Range(func(owner, n any) bool {
		if *n.(*int) != 1 {
			t.Errorf("%s's sign-in token was asked for %d times", owner, *n.(*int))
		}
		return true
	})
	if got := grantsAt(x.as); len(got) != 2 {
		t.Errorf("%d token requests, want one per person", len(got))
	}
}

package upstreamauth

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"

	"github.com/Tahul/caddy-zidane-mcp/internal/oauthtest"
)

const redirect = "http://127.0.0.1:9/callback"

func pemKey(t testing.TB, key any) string {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}))
}

// leakCheck fails if any secret appears in what was logged, returned,
// stored or shown.
func leakCheck(t *testing.T, e *env, secrets []string, texts ...string) {
	t.Helper()
	haystacks := map[string]string{"logs": e.logs.String()}
	for i, s := range texts {
		haystacks[fmt.Sprintf("text %d", i)] = s
	}
	if b, err := e.store.Load(context.Background(), StorageKey(testUpstream)); err == nil {
		haystacks["storage"] = string(b)
	}
	for name, h := range haystacks {
		for _, s := range secrets {
			if s == "" {
				continue
			}
			if strings.Contains(h, s) || strings.Contains(h, base64.StdEncoding.EncodeToString([]byte(s))) {
				t.Errorf("%s holds a secret (%.6s…)", name, s)
			}
		}
	}
}

func TestConfigValidate(t *testing.T) {
	ecKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	const secret = "s3cret-value-that-must-not-show"
	good := []Config{
		{RedirectURL: redirect},
		{RedirectURL: "https://gw.example.com/cb", ClientMetadataURL: "https://gw.example.com/oauth/client.json", Scopes: []string{"read", "offline_access"}},
		{Grant: GrantClientCredentials, ClientID: "c", ClientSecret: secret, TokenEndpointAuthMethod: AuthClientSecretPost},
		{Grant: GrantClientCredentials, ClientID: "c", PrivateKey: pemKey(t, ecKey)},
		{Grant: GrantCrossAppAccess, ClientID: "c", IDPIssuer: "https://idp.example.com", IDPClientID: "i", IDTokenFile: "/run/id_token"},
	}
	for i, c := range good {
		if err := c.Validate(); err != nil {
			t.Errorf("good config %d: %v", i, err)
		}
	}
	bad := []struct {
		cfg  Config
		want string
	}{
		{Config{}, "redirect_url"},
		{Config{Grant: "password"}, "grant"},
		{Config{RedirectURL: "http://example.com/cb"}, "plain http"},
		{Config{RedirectURL: redirect, ClientMetadataURL: "https://gw.example.com"}, "client_metadata_url"},
		{Config{Grant: GrantClientCredentials, ClientID: "c"}, "client credential"},
		{Config{Grant: GrantClientCredentials, ClientSecret: secret}, "client_id"},
		{Config{Grant: GrantClientCredentials, ClientID: "c", ClientSecret: secret, TokenEndpointAuthMethod: AuthPrivateKeyJWT}, "private_key"},
		{Config{Grant: GrantClientCredentials, ClientID: "c", PrivateKey: "-----BEGIN PRIVATE KEY-----\n" + secret + "\n-----END PRIVATE KEY-----\n"}, "private_key"},
		{Config{Grant: GrantClientCredentials, ClientID: "c", PrivateKey: pemKey(t, ecKey), SigningAlgorithm: "RS256"}, "signing_algorithm"},
		{Config{Grant: GrantClientCredentials, ClientID: "c", ClientSecret: secret, Scopes: []string{"a b"}}, "scope"},
		{Config{Grant: GrantCrossAppAccess, ClientID: "c", IDPClientID: "i", IDTokenFile: "/x"}, "idp_issuer"},
		{Config{RedirectURL: redirect, MaxStepUp: 99}, "max_step_up"},
	}
	for i, b := range bad {
		err := b.cfg.Validate()
		if err == nil {
			t.Errorf("bad config %d: no error", i)
			continue
		}
		if !strings.Contains(err.Error(), b.want) {
			t.Errorf("bad config %d: %q does not mention %q", i, err, b.want)
		}
		if strings.Contains(err.Error(), secret) {
			t.Errorf("bad config %d: error quotes the secret", i)
		}
	}
	c := Config{Grant: GrantClientCredentials, ClientID: "c", ClientSecret: secret, PrivateKey: "k"}
	for _, s := range []string{c.String(), fmt.Sprintf("%v %+v %#v %s", c, c, c, c)} {
		if strings.Contains(s, secret) {
			t.Errorf("String shows the secret: %s", s)
		}
	}
}

// A key file or ID token file that is not a regular file of bounded size
// (a directory, /dev/zero, a named pipe nothing writes to, a file too big)
// is refused when the config is checked, without a read that would never
// end. An ID token file that is not there yet is fine: whatever keeps it
// fresh may write it after the start.
func TestConfigValidateRefusesFilesThatAreNotKeyFiles(t *testing.T) {
	ecKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	dir := t.TempDir()
	fifo := filepath.Join(dir, "pipe")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	key := filepath.Join(dir, "key.pem")
	if err := os.WriteFile(key, []byte(pemKey(t, ecKey)), 0o600); err != nil {
		t.Fatal(err)
	}
	big := filepath.Join(dir, "big.pem")
	if err := os.WriteFile(big, append([]byte(pemKey(t, ecKey)), bytes.Repeat([]byte("\n"), 1<<20)...), 0o600); err != nil {
		t.Fatal(err)
	}
	withKey := func(path string) Config {
		return Config{Grant: GrantClientCredentials, ClientID: "c", PrivateKeyFile: path}
	}
	withIDToken := func(path string) Config {
		return Config{Grant: GrantCrossAppAccess, ClientID: "c", IDPIssuer: "https://idp.example.com", IDPClientID: "i", IDTokenFile: path}
	}
	if err := withKey(key).Validate(); err != nil {
		t.Fatalf("a PEM key file: %v", err)
	}
	if err := withIDToken(filepath.Join(dir, "not-yet")).Validate(); err != nil {
		t.Fatalf("an ID token file not written yet: %v", err)
	}
	for _, c := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"key: directory", withKey(dir), "private_key_file: " + dir + " is a directory"},
		{"key: /dev/zero", withKey("/dev/zero"), "is a character device, not a regular file"},
		{"key: named pipe", withKey(fifo), "is a named pipe, not a regular file"},
		{"key: too big", withKey(big), "more than 1 MiB"},
		{"key: missing", withKey(filepath.Join(dir, "missing")), "no such file"},
		{"ID token: directory", withIDToken(dir), "id_token_file: " + dir + " is a directory"},
		{"ID token: /dev/zero", withIDToken("/dev/zero"), "is a character device, not a regular file"},
		{"ID token: named pipe", withIDToken(fifo), "is a named pipe, not a regular file"},
		{"ID token: too big", withIDToken(big), "more than 1 MiB"},
	} {
		if err := c.cfg.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: Validate() = %v; want an error saying %q", c.name, err, c.want)
		}
	}
}

func TestClientCredentials(t *testing.T) {
	ecKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	rsaKey, _ := rsa.GenerateKey(rand.Reader, 2048)
	cases := []struct {
		name    string
		methods []string
		cfg     func(id, secret string) Config
		pub     any
		want    string
	}{
		{"basic", []string{AuthClientSecretBasic, AuthClientSecretPost}, func(id, s string) Config {
			return Config{Grant: GrantClientCredentials, ClientID: id, ClientSecret: s}
		}, nil, AuthClientSecretBasic},
		{"post", []string{AuthClientSecretPost}, func(id, s string) Config {
			return Config{Grant: GrantClientCredentials, ClientID: id, ClientSecret: s}
		}, nil, AuthClientSecretPost},
		{"post-configured", []string{AuthClientSecretBasic, AuthClientSecretPost}, func(id, s string) Config {
			return Config{Grant: GrantClientCredentials, ClientID: id, ClientSecret: s, TokenEndpointAuthMethod: AuthClientSecretPost}
		}, nil, AuthClientSecretPost},
		{"private_key_jwt-ES256", []string{AuthPrivateKeyJWT}, func(id, _ string) Config {
			return Config{Grant: GrantClientCredentials, ClientID: id, PrivateKey: pemKey(t, ecKey), KeyID: "k1"}
		}, &ecKey.PublicKey, AuthPrivateKeyJWT},
		{"private_key_jwt-RS256", []string{AuthPrivateKeyJWT}, func(id, _ string) Config {
			return Config{Grant: GrantClientCredentials, ClientID: id, PrivateKey: pemKey(t, rsaKey)}
		}, &rsaKey.PublicKey, AuthPrivateKeyJWT},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, oauthtest.AuthServerOptions{AuthMethods: tc.methods}, []string{"mcp:read"}, "")
			// An id with a character that client_secret_basic must
			// form-encode (RFC 6749 §2.3.1).
			id, secret := "gateway:1", oauthtest.NewSecret("cs")
			if tc.pub != nil {
				secret = ""
			}
			e.as.AddClient(id, secret, tc.pub)
			c := e.client(tc.cfg(id, secret))
			if st := c.State(); st.State != StateReady {
				t.Fatalf("state before the first request: %+v", st)
			}
			if err := e.callEcho(c, "hi"); err != nil {
				t.Fatalf("call: %v", err)
			}
			grants, seen := e.counts()
			if !slices.Equal(grants, []string{"client_credentials"}) || !slices.Equal(seen, []string{tc.want}) {
				t.Errorf("token requests: grants %v with auth %v; want one client_credentials with %s", grants, seen, tc.want)
			}
			if got := e.scopeReqs(); !slices.Equal(got, []string{"mcp:read"}) {
				t.Errorf("requested scopes %q, want the resource's scopes_supported", got)
			}
			if got := e.resources(); !slices.Equal(got, []string{e.mcp.URL}) {
				t.Errorf("resource %q, want %s", got, e.mcp.URL)
			}
			st := c.State()
			if st.State != StateReady || !slices.Equal(st.Scopes, []string{"mcp:read"}) || st.Expiry.IsZero() {
				t.Errorf("state after the call: %+v", st)
			}
			// A second replica reuses the stored token instead of
			// asking for another.
			if err := e.callEcho(e.client(tc.cfg(id, secret)), "again"); err != nil {
				t.Fatal(err)
			}
			if grants, _ := e.counts(); len(grants) != 1 {
				t.Errorf("%d token requests, want the stored token reused", len(grants))
			}
			leakCheck(t, e, append(e.as.Secrets(), secret), fmt.Sprint(st), c.String())
		})
	}
}

func TestClientCredentialsRefusedSecretStaysOut(t *testing.T) {
	e := newEnv(t, oauthtest.AuthServerOptions{AuthMethods: []string{AuthClientSecretPost}, EchoSecret: true}, nil, "")
	e.as.AddClient("gw", "the-real-secret-value", nil)
	wrong := oauthtest.NewSecret("wrong-secret")
	c := e.client(Config{Grant: GrantClientCredentials, ClientID: "gw", ClientSecret: wrong})
	err := e.callEcho(c, "x")
	if err == nil {
		t.Fatal("call succeeded with a wrong secret")
	}
	var ue *UnavailableError
	if _, err2 := e.post(c, true); !errors.As(err2, &ue) || !strings.Contains(err2.Error(), "invalid_client") {
		t.Errorf("error %v, want an *UnavailableError naming invalid_client", err2)
	}
	st := c.State()
	if st.State != StateError || !strings.Contains(st.Err, "invalid_client") {
		t.Errorf("state %+v, want error with the server's refusal", st)
	}
	if !strings.Contains(e.logs.String(), "<redacted>") {
		t.Errorf("the server echoed the secret, but nothing was redacted: %s", e.logs.String())
	}
	leakCheck(t, e, []string{wrong}, err.Error(), st.Err)
	if _, requests := e.mcp.Stats(); requests != 0 {
		t.Errorf("the upstream got %d authorized requests", requests)
	}
}

func TestAuthorizationCodeLogin(t *testing.T) {
	e := newEnv(t, oauthtest.AuthServerOptions{AuthMethods: []string{AuthClientSecretBasic, AuthNone}, ScopesSupported: []string{"mcp:read", "offline_access"}, Iss: oauthtest.IssCorrect, IssAdvertised: true}, []string{"mcp:read"}, "")
	c := e.client(Config{RedirectURL: redirect})
	st := c.State()
	if st.State != StateAuthRequired {
		t.Fatalf("state before login: %+v", st)
	}
	// Without a token nothing is sent, and the error says how to log in.
	err := e.callEcho(c, "x")
	var are *AuthRequiredError
	if !errors.Is(err, ErrAuthRequired) || !errors.As(err, &are) || are.Upstream != testUpstream || !strings.Contains(err.Error(), "caddy zidane login up") {
		t.Fatalf("call before login: %v", err)
	}
	if req, _ := e.mcp.Stats(); req != 0 {
		t.Errorf("the upstream got %d requests before the login", req)
	}

	q, authURL := e.authorize(c)
	u, _ := url.Parse(authURL)
	aq := u.Query()
	if aq.Get("code_challenge_method") != "S256" || aq.Get("code_challenge") == "" || aq.Get("resource") != e.mcp.URL || aq.Get("redirect_uri") != redirect {
		t.Errorf("authorization request %v", aq)
	}
	if got := aq.Get("scope"); got != "mcp:read offline_access" {
		t.Errorf("scope %q, want the resource's scopes and offline_access", got)
	}
	if aq.Get("state") == "" || aq.Get("code_verifier") != "" {
		t.Errorf("state/verifier in the URL: %v", aq)
	}
	if err := c.Callback(context.Background(), q); err != nil {
		t.Fatalf("Callback: %v", err)
	}
	st = c.State()
	if st.State != StateReady || !slices.Equal(st.Scopes, []string{"mcp:read", "offline_access"}) || st.Expiry.IsZero() {
		t.Fatalf("state after login: %+v", st)
	}
	if err := e.callEcho(c, "hello"); err != nil {
		t.Fatal(err)
	}
	// The registration was dynamic (no client_id configured) and is
	// stored: a second login and a second replica reuse it.
	e.login(c)
	c2 := e.client(Config{RedirectURL: redirect})
	if err := e.callEcho(c2, "replica"); err != nil {
		t.Fatal(err)
	}
	if e.as.Registrations() != 1 {
		t.Errorf("%d registrations, want 1", e.as.Registrations())
	}
	_, seen := e.counts()
	for _, m := range seen {
		if m != AuthClientSecretBasic {
			t.Errorf("token request with %s, want the registered client_secret_basic", m)
		}
	}
	// A used state is refused.
	if err := c.Callback(context.Background(), q); !errors.Is(err, ErrLogin) {
		t.Errorf("replayed callback: %v", err)
	}
	leakCheck(t, e, e.as.Secrets(), fmt.Sprint(c.State()), c.String())
}

func TestCallbackRefusals(t *testing.T) {
	t.Run("iss-mismatch", func(t *testing.T) {
		e := newEnv(t, oauthtest.AuthServerOptions{Iss: oauthtest.IssWrong}, nil, "")
		c := e.client(Config{RedirectURL: redirect})
		q, _ := e.authorize(c)
		err := c.Callback(context.Background(), q)
		if !errors.Is(err, ErrLogin) || !strings.Contains(err.Error(), "RFC 9207") {
			t.Fatalf("Callback: %v", err)
		}
		if grants, _ := e.counts(); len(grants) != 0 {
			t.Errorf("the code was redeemed: %v", grants)
		}
		if c.State().State != StateAuthRequired {
			t.Errorf("state %+v", c.State())
		}
	})
	// RFC 9207 §2.4: iss is compared as a string; an issuer that only
	// normalizes to the right one is another issuer.
	t.Run("iss-normalized", func(t *testing.T) {
		e := newEnv(t, oauthtest.AuthServerOptions{Iss: oauthtest.IssNormalized, IssAdvertised: true}, nil, "")
		c := e.client(Config{RedirectURL: redirect})
		q, _ := e.authorize(c)
		if err := c.Callback(context.Background(), q); !errors.Is(err, ErrLogin) || !strings.Contains(err.Error(), "RFC 9207") {
			t.Fatalf("Callback: %v", err)
		}
		if grants, _ := e.counts(); len(grants) != 0 {
			t.Errorf("the code was redeemed: %v", grants)
		}
	})
	t.Run("iss-advertised-missing", func(t *testing.T) {
		e := newEnv(t, oauthtest.AuthServerOptions{IssAdvertised: true}, nil, "")
		c := e.client(Config{RedirectURL: redirect})
		q, _ := e.authorize(c)
		if err := c.Callback(context.Background(), q); !errors.Is(err, ErrLogin) {
			t.Fatalf("Callback: %v", err)
		}
		if grants, _ := e.counts(); len(grants) != 0 {
			t.Errorf("the code was redeemed: %v", grants)
		}
	})
	t.Run("state-mismatch", func(t *testing.T) {
		e := newEnv(t, oauthtest.AuthServerOptions{}, nil, "")
		c := e.client(Config{RedirectURL: redirect})
		q, _ := e.authorize(c)
		q.Set("state", q.Get("state")+"x")
		if err := c.Callback(context.Background(), q); !errors.Is(err, ErrLogin) || !strings.Contains(err.Error(), "state") {
			t.Fatalf("Callback: %v", err)
		}
		if grants, _ := e.counts(); len(grants) != 0 {
			t.Errorf("the code was redeemed: %v", grants)
		}
	})
	t.Run("pkce-verifier", func(t *testing.T) {
		// Two logins under way: the code of the first, presented with the
		// state (so the verifier) of the second, is refused by the
		// authorization server's PKCE check.
		e := newEnv(t, oauthtest.AuthServerOptions{}, nil, "")
		c := e.client(Config{RedirectURL: redirect})
		q1, _ := e.authorize(c)
		q2, _ := e.authorize(c)
		q1.Set("state", q2.Get("state"))
		err := c.Callback(context.Background(), q1)
		if err == nil || !strings.Contains(err.Error(), "PKCE") {
			t.Fatalf("Callback with another login's verifier: %v", err)
		}
		if c.State().State != StateAuthRequired {
			t.Errorf("state %+v", c.State())
		}
	})
	t.Run("server-error", func(t *testing.T) {
		e := newEnv(t, oauthtest.AuthServerOptions{}, nil, "")
		c := e.client(Config{RedirectURL: redirect})
		q, _ := e.authorize(c)
		q.Del("code")
		q.Set("error", "access_denied")
		if err := c.Callback(context.Background(), q); !errors.Is(err, ErrLogin) || !strings.Contains(err.Error(), "access_denied") {
			t.Fatalf("Callback: %v", err)
		}
	})
}

// loggedIn returns an env and a client with a token from a login.
func loggedIn(t *testing.T, opts oauthtest.AuthServerOptions, toolScope string, onNATS ...bool) (*env, *Client) {
	e := newEnv(t, opts, []string{"mcp:read"}, toolScope)
	if len(onNATS) > 0 && onNATS[0] {
		e.onNATS()
	}
	e.as.AddClient("gw", "", nil)
	c := e.client(Config{ClientID: "gw", RedirectURL: redirect})
	e.login(c)
	return e, c
}

func TestRefreshBeforeExpiry(t *testing.T) {
	e, c := loggedIn(t, oauthtest.AuthServerOptions{}, "")
	if err := e.callEcho(c, "a"); err != nil {
		t.Fatal(err)
	}
	first := c.State().Expiry
	// 30s before expiry: inside the skew, so the token is refreshed
	// before the request is sent, and the upstream never sees a
	// rejected token.
	e.clock.Advance(time.Hour - 30*time.Second)
	req0, auth0 := e.mcp.Stats()
	if err := e.callEcho(c, "b"); err != nil {
		t.Fatal(err)
	}
	grants, _ := e.counts()
	if !slices.Equal(grants, []string{"authorization_code", "refresh_token"}) {
		t.Errorf("grants %v, want one refresh", grants)
	}
	req1, auth1 := e.mcp.Stats()
	if req1-req0 == 0 || req1-req0 != auth1-auth0 {
		t.Errorf("the upstream refused requests: %d requests, %d authorized", req1-req0, auth1-auth0)
	}
	if got := c.State().Expiry; !got.After(first) {
		t.Errorf("expiry %v not after %v", got, first)
	}
	if e.resources()[1] != e.mcp.URL {
		t.Errorf("refresh without the resource indicator: %q", e.resources()[1])
	}
}

func TestUnauthorizedRefreshesAndRetriesOnce(t *testing.T) {
	e, c := loggedIn(t, oauthtest.AuthServerOptions{}, "")
	e.as.RevokeAccessTokens()
	req0, auth0 := e.mcp.Stats()
	status, err := e.post(c, true)
	if err != nil || status != http.StatusOK {
		t.Fatalf("post: %d %v", status, err)
	}
	grants, _ := e.counts()
	if !slices.Equal(grants, []string{"authorization_code", "refresh_token"}) {
		t.Errorf("grants %v, want one refresh", grants)
	}
	if req, auth := e.mcp.Stats(); req-req0 != 2 || auth-auth0 != 1 {
		t.Errorf("upstream saw %d requests (%d authorized), want the 401 and one retry", req, auth)
	}

	// A body that cannot be replayed: the 401 is returned, and the token
	// refreshed for the next request.
	e.as.RevokeAccessTokens()
	status, err = e.post(c, false)
	if err != nil || status != http.StatusUnauthorized {
		t.Fatalf("post without GetBody: %d %v", status, err)
	}
	if status, err := e.post(c, false); err != nil || status != http.StatusOK {
		t.Fatalf("next post: %d %v", status, err)
	}
	if grants, _ := e.counts(); len(grants) != 3 {
		t.Errorf("grants %v, want a second refresh", grants)
	}

	// Refused even after the refresh: no loop, auth-required.
	e.mcp.Override(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "no", http.StatusUnauthorized)
	}))
	_, err = e.post(c, true)
	if !errors.Is(err, ErrAuthRequired) {
		t.Fatalf("post to an upstream that refuses every token: %v", err)
	}
	if grants, _ := e.counts(); len(grants) != 4 {
		t.Errorf("grants %v, want exactly one more refresh", grants)
	}
}

func TestRefreshSingleFlightAcrossReplicas(t *testing.T) { testRefreshSingleFlight(t, false) }

func testRefreshSingleFlight(t *testing.T, onNATS bool) {
	e, a := loggedIn(t, oauthtest.AuthServerOptions{}, "", onNATS)
	b := e.client(Config{ClientID: "gw", RedirectURL: redirect}) // a second replica, same storage
	for round := range 3 {
		e.clock.Advance(time.Hour) // every token expired
		var wg sync.WaitGroup
		errs := make(chan error, 40)
		for i := range 40 {
			c := a
			if i%2 == 1 {
				c = b
			}
			wg.Go(func() {
				if status, err := e.post(c, true); err != nil || status != http.StatusOK {
					errs <- fmt.Errorf("round %d: %d %v", round, status, err)
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
	}
	grants, _ := e.counts()
	if want := []string{"authorization_code", "refresh_token", "refresh_token", "refresh_token"}; !slices.Equal(grants, want) {
		t.Errorf("grants %v, want one refresh per round", grants)
	}
	for _, r := range e.as.RefreshTokens() {
		if r.Redeemed > 1 {
			t.Errorf("refresh token %.8s… redeemed %d times", r.Token, r.Redeemed)
		}
	}
	if st := b.State(); st.State != StateReady {
		t.Errorf("replica b: %+v", st)
	}
}

func TestInvalidGrantGoesToAuthRequired(t *testing.T) {
	e, c := loggedIn(t, oauthtest.AuthServerOptions{}, "")
	e.as.RevokeAll()
	_, err := e.post(c, true)
	var are *AuthRequiredError
	if !errors.As(err, &are) || are.Upstream != testUpstream || !strings.Contains(err.Error(), "refresh token") {
		t.Fatalf("post: %v", err)
	}
	st := c.State()
	if st.State != StateAuthRequired || !strings.Contains(st.Err, "invalid_grant") {
		t.Errorf("state %+v", st)
	}
	// A restarted gateway knows it too.
	if st := e.client(Config{ClientID: "gw", RedirectURL: redirect}).State(); st.State != StateAuthRequired {
		t.Errorf("after a restart: %+v", st)
	}
	req0, _ := e.mcp.Stats()
	if _, err := e.post(c, true); !errors.Is(err, ErrAuthRequired) {
		t.Errorf("second post: %v", err)
	}
	if req1, _ := e.mcp.Stats(); req1 != req0 {
		t.Errorf("a request was sent without a token")
	}
	// Logging in again recovers.
	e.login(c)
	if err := e.callEcho(c, "back"); err != nil {
		t.Fatal(err)
	}
}

// OnState hears each change of state once: ready after the login,
// auth-required when the refresh token is refused, ready after the next
// login. Nothing it hears holds a token.
func TestOnStateReportsTransitions(t *testing.T) {
	e := newEnv(t, oauthtest.AuthServerOptions{}, []string{"mcp:read"}, "")
	e.as.AddClient("gw", "", nil)
	var mu sync.Mutex
	var seen []Status
	e.onState = func(s Status) {
		mu.Lock()
		seen = append(seen, s)
		mu.Unlock()
	}
	c := e.client(Config{ClientID: "gw", RedirectURL: redirect})
	e.login(c)
	e.as.RevokeAll()
	if _, err := e.post(c, true); !errors.Is(err, ErrAuthRequired) {
		t.Fatalf("post after the revocation: %v", err)
	}
	e.login(c)
	mu.Lock()
	defer mu.Unlock()
	var states []string
	for _, s := range seen {
		states = append(states, s.State)
		for _, secret := range e.as.Secrets() {
			if strings.Contains(fmt.Sprint(s), secret) {
				t.Fatalf("a reported state holds a token: %+v", s)
			}
		}
	}
	if want := []string{StateReady, StateAuthRequired, StateReady}; !slices.Equal(states, want) {
		t.Fatalf("states reported %v, want %v", states, want)
	}
}

func TestLogoutRevokes(t *testing.T) {
	e, c := loggedIn(t, oauthtest.AuthServerOptions{}, "")
	if err := e.callEcho(c, "x"); err != nil {
		t.Fatal(err)
	}
	secrets := e.as.Secrets()
	if err := c.Logout(context.Background()); err != nil {
		t.Fatalf("Logout: %v", err)
	}
	revoked := e.as.Revocations()
	rts, ats := e.as.RefreshTokens(), e.as.AccessTokens()
	if len(rts) != 1 || len(ats) != 1 {
		t.Fatalf("%d refresh and %d access tokens issued, want one of each", len(rts), len(ats))
	}
	if rt, at := rts[0].Token, ats[0]; !slices.Contains(revoked, rt) || !slices.Contains(revoked, at) {
		t.Errorf("revoked %d tokens, want the refresh and the access token", len(revoked))
	}
	if st := c.State(); st.State != StateAuthRequired {
		t.Errorf("state %+v", st)
	}
	rec, err := c.seal.open(e.stored())
	if err != nil || rec.AccessToken != "" || rec.RefreshToken != "" {
		t.Errorf("stored record after logout: %v, tokens left: %v", err, rec != nil && rec.AccessToken != "")
	}
	if err := e.callEcho(c, "y"); !errors.Is(err, ErrAuthRequired) {
		t.Errorf("call after logout: %v", err)
	}
	leakCheck(t, e, secrets)
}

func TestStorageIsSealed(t *testing.T) {
	e := newEnv(t, oauthtest.AuthServerOptions{AuthMethods: []string{AuthClientSecretPost}}, []string{"mcp:read"}, "")
	c := e.client(Config{RedirectURL: redirect}) // dynamic registration, with a secret
	e.login(c)
	e.clock.Advance(time.Hour)
	if err := e.callEcho(c, "x"); err != nil { // a refresh
		t.Fatal(err)
	}
	raw := e.stored()
	secrets := e.as.Secrets()
	if len(secrets) < 5 {
		t.Fatalf("only %d secrets issued", len(secrets))
	}
	for _, s := range append(secrets, "mcp:read", "refresh_token", e.as.URL) {
		if bytes.Contains(raw, []byte(s)) {
			t.Errorf("storage holds %.10s… in clear", s)
		}
	}
	// Another upstream's name (the associated data) or another key does
	// not open it.
	other, _ := newSealer(e.key, "other")
	if _, err := other.open(raw); err == nil {
		t.Error("the record opens under another upstream's name")
	}
	e.key = make([]byte, 32)
	c2 := e.client(Config{RedirectURL: redirect})
	if st := c2.State(); st.State != StateError || !strings.Contains(st.Err, "key") {
		t.Errorf("state with another key: %+v", st)
	}
	if err := e.callEcho(c2, "x"); err == nil {
		t.Error("call with an undecryptable record succeeded")
	}
	// A new login replaces the record.
	e.login(c2)
	if err := e.callEcho(c2, "x"); err != nil {
		t.Errorf("call after the login with the new key: %v", err)
	}
}

func TestStepUpAuthorizationCode(t *testing.T) {
	e, c := loggedIn(t, oauthtest.AuthServerOptions{}, "mcp:write")
	err := e.callEcho(c, "x")
	var are *AuthRequiredError
	if !errors.As(err, &are) || !slices.Contains(are.Scopes, "mcp:write") {
		t.Fatalf("call needing mcp:write: %v", err)
	}
	if st := c.State(); st.State != StateAuthRequired || !strings.Contains(st.Err, "mcp:write") {
		t.Errorf("state %+v", st)
	}
	_, authURL := e.authorize(c)
	u, _ := url.Parse(authURL)
	if got := strings.Fields(u.Query().Get("scope")); !slices.Contains(got, "mcp:read") || !slices.Contains(got, "mcp:write") {
		t.Errorf("step-up login asks for %v, want the granted and the needed scopes", got)
	}
	e.login(c)
	if err := e.callEcho(c, "y"); err != nil {
		t.Fatalf("call after the step-up login: %v", err)
	}
}

func TestStepUpRetryLimit(t *testing.T) {
	// The server grants mcp:read whatever is asked: step-ups never help.
	e, c := loggedIn(t, oauthtest.AuthServerOptions{GrantScopes: func([]string) []string { return []string{"mcp:read"} }}, "mcp:write")
	logins := 1
	var err error
	for ; logins < 10; logins++ {
		err = e.callEcho(c, "x")
		if !errors.Is(err, ErrAuthRequired) {
			break
		}
		e.login(c)
	}
	var ue *UnavailableError
	if !errors.As(err, &ue) || errors.Is(err, ErrAuthRequired) {
		t.Fatalf("after %d logins: %v", logins, err)
	}
	if want := 1 + DefaultMaxStepUp; logins != want {
		t.Errorf("%d logins before giving up, want %d", logins, want)
	}
	if st := c.State(); st.State != StateError || !strings.Contains(st.Err, "insufficient_scope") {
		t.Errorf("state %+v", st)
	}
}

func TestStepUpClientCredentials(t *testing.T) {
	e := newEnv(t, oauthtest.AuthServerOptions{}, []string{"mcp:read"}, "mcp:write")
	secret := oauthtest.NewSecret("cs")
	e.as.AddClient("gw", secret, nil)
	c := e.client(Config{Grant: GrantClientCredentials, ClientID: "gw", ClientSecret: secret})
	if err := e.callEcho(c, "x"); err != nil {
		t.Fatal(err)
	}
	if got := e.scopeReqs(); !slices.Equal(got, []string{"mcp:read", "mcp:read mcp:write"}) {
		t.Errorf("scopes requested %q, want mcp:read then the union", got)
	}
	if st := c.State(); !slices.Equal(st.Scopes, []string{"mcp:read", "mcp:write"}) {
		t.Errorf("state %+v", st)
	}
}

func TestUnauthorizedClientCredentialsFetchesNewToken(t *testing.T) {
	e := newEnv(t, oauthtest.AuthServerOptions{}, nil, "")
	secret := oauthtest.NewSecret("cs")
	e.as.AddClient("gw", secret, nil)
	c := e.client(Config{Grant: GrantClientCredentials, ClientID: "gw", ClientSecret: secret})
	if status, err := e.post(c, true); err != nil || status != 200 {
		t.Fatal(status, err)
	}
	e.as.RevokeAccessTokens()
	if status, err := e.post(c, true); err != nil || status != 200 {
		t.Fatal(status, err)
	}
	if grants, _ := e.counts(); !slices.Equal(grants, []string{"client_credentials", "client_credentials"}) {
		t.Errorf("grants %v", grants)
	}
	if err := c.Logout(context.Background()); err != nil {
		t.Fatal(err)
	}
	if st := c.State(); st.State != StateReady {
		t.Errorf("client credentials after logout: %+v", st)
	}
}

func TestCrossAppAccess(t *testing.T) {
	e := newEnv(t, oauthtest.AuthServerOptions{AuthMethods: []string{AuthClientSecretBasic}}, []string{"mcp:read"}, "")
	secret := oauthtest.NewSecret("cs")
	e.as.AddClient("gw", secret, nil)          // at the upstream's authorization server
	e.as.AddClient("gw-idp", "", nil)          // at the IdP (the same test server)
	idToken := oauthtest.NewSecret("id-token") // what the IdP issued to the gateway
	e.as.SetIDToken(idToken)
	file := t.TempDir() + "/id_token"
	if err := os.WriteFile(file, []byte(idToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c := e.client(Config{Grant: GrantCrossAppAccess, ClientID: "gw", ClientSecret: secret, IDPTokenURL: e.as.URL + "/token", IDPClientID: "gw-idp", IDTokenFile: file})
	if err := e.callEcho(c, "x"); err != nil {
		t.Fatal(err)
	}
	grants, seen := e.counts()
	if !slices.Equal(grants, []string{"urn:ietf:params:oauth:grant-type:token-exchange", "urn:ietf:params:oauth:grant-type:jwt-bearer"}) ||
		!slices.Equal(seen, []string{AuthNone, AuthClientSecretBasic}) {
		t.Errorf("grants %v with auth %v", grants, seen)
	}
	leakCheck(t, e, append(e.as.Secrets(), secret, idToken), fmt.Sprint(c.State()))
}

func TestBeginLoginRefusesForeignResource(t *testing.T) {
	e := newEnv(t, oauthtest.AuthServerOptions{}, nil, "")
	c := e.client(Config{RedirectURL: redirect})
	e.mcp.Override(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"resource":"https://evil.example.com/mcp","authorization_servers":[%q]}`, e.as.URL)
	}))
	_, err := c.BeginLogin(context.Background())
	if err == nil || !strings.Contains(err.Error(), "evil.example.com") {
		t.Fatalf("BeginLogin: %v", err)
	}
	if len(e.as.AuthorizationRequests()) != 0 {
		t.Error("an authorization request was made")
	}
}

func BenchmarkTransportAttach(b *testing.B) {
	key := make([]byte, 32)
	c, err := New(context.Background(), "bench", "https://upstream.example.com/mcp", Config{Grant: GrantClientCredentials, ClientID: "c", ClientSecret: "s"}, Options{Storage: &certmagic.FileStorage{Path: b.TempDir()}, Key: key})
	if err != nil {
		b.Fatal(err)
	}
	c.adopt(&record{AccessToken: "at-bench", Expiry: time.Now().Add(time.Hour), IssuedAt: time.Now()})
	rt := c.Transport(roundTripFunc(func(r *http.Request) (*http.Response, error) {
		return &http.Response{StatusCode: 200, Body: http.NoBody, Header: http.Header{}}, nil
	}))
	req, _ := http.NewRequest(http.MethodPost, "https://upstream.example.com/mcp", nil)
	req.Header.Set("Content-Type", "application/json")
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := rt.RoundTrip(req); err != nil {
				b.Fatal(err)
			}
		}
	})
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// The document the gateway serves at client_metadata_url: it is its own
// client_id, names the login callback, and holds no secret.
func TestClientMetadataDocument(t *testing.T) {
	e := newEnv(t, oauthtest.AuthServerOptions{}, nil, "")
	const cimd = "https://gw.example.com/oauth/client.json"
	c := e.client(Config{RedirectURL: redirect, ClientMetadataURL: cimd, ClientName: "Our gateway"})
	doc, ok := c.ClientMetadataDocument()
	if !ok {
		t.Fatal("no document for a client_metadata_url")
	}
	var got struct {
		ClientID     string   `json:"client_id"`
		ClientName   string   `json:"client_name"`
		RedirectURIs []string `json:"redirect_uris"`
		GrantTypes   []string `json:"grant_types"`
		AuthMethod   string   `json:"token_endpoint_auth_method"`
	}
	if err := json.Unmarshal(doc, &got); err != nil {
		t.Fatal(err)
	}
	if got.ClientID != cimd || got.ClientName != "Our gateway" || !slices.Equal(got.RedirectURIs, []string{redirect}) ||
		!slices.Contains(got.GrantTypes, "authorization_code") || got.AuthMethod != AuthNone {
		t.Fatalf("document %s", doc)
	}
	if _, ok := e.client(Config{RedirectURL: redirect}).ClientMetadataDocument(); ok {
		t.Fatal("a document without client_metadata_url")
	}
}

package upstreamauth

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/Tahul/caddy-zidane-mcp/internal/oauthtest"
)

// workload is a workload's identity: the key its platform signs its JWTs
// with (SEP-1933), and the file the platform keeps the current one in.
type workload struct {
	t    *testing.T
	key  *ecdsa.PrivateKey
	file string
}

func newWorkload(t *testing.T) *workload {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return &workload{t: t, key: k, file: filepath.Join(t.TempDir(), "workload.jwt")}
}

// issue writes a new JWT for audience, valid from now for ttl, and
// returns it.
func (w *workload) issue(audience string, now time.Time, ttl time.Duration) string {
	w.t.Helper()
	tok, err := jwt.NewWithClaims(jwt.SigningMethodES256, jwt.RegisteredClaims{
		Issuer: "https://idp.example.com", Subject: "workload-1", Audience: jwt.ClaimStrings{audience},
		IssuedAt: jwt.NewNumericDate(now), ExpiresAt: jwt.NewNumericDate(now.Add(ttl)), ID: rand.Text(),
	}).SignedString(w.key)
	if err != nil {
		w.t.Fatal(err)
	}
	if err := os.WriteFile(w.file, []byte(tok+"\n"), 0o600); err != nil {
		w.t.Fatal(err)
	}
	return tok
}

// The jwt_bearer grant presents the workload's current JWT, read from its
// file at each grant, as an RFC 7523 assertion for the upstream's
// resource; no login, no secret of the gateway's own.
func TestJWTBearerGrant(t *testing.T) {
	e := newEnv(t, oauthtest.AuthServerOptions{AuthMethods: []string{AuthNone}}, []string{"mcp:read"}, "")
	w := newWorkload(t)
	e.as.TrustWorkloadKey(&w.key.PublicKey)
	e.as.AddClient("workload-1", "", nil)
	first := w.issue(e.as.URL, e.clock.Now(), 5*time.Minute)
	c := e.client(Config{Grant: GrantJWTBearer, ClientID: "workload-1", AssertionFile: w.file})
	if st := c.State(); st.State != StateReady {
		t.Fatalf("state %+v; a workload needs no login", st)
	}
	if err := e.callEcho(c, "x"); err != nil {
		t.Fatal(err)
	}
	reqs := e.as.TokenRequests()
	if len(reqs) != 1 || reqs[0].GrantType != oauthtest.GrantJWTBearer || reqs[0].Assertion != first || reqs[0].Resource != e.mcp.URL || reqs[0].Error != "" {
		t.Fatalf("token requests %+v", reqs)
	}
	// The platform renews the JWT; the next grant presents the new one.
	e.clock.Advance(time.Hour)
	second := w.issue(e.as.URL, e.clock.Now(), 5*time.Minute)
	if err := e.callEcho(c, "y"); err != nil {
		t.Fatal(err)
	}
	reqs = e.as.TokenRequests()
	if len(reqs) != 2 || reqs[1].Assertion != second {
		t.Fatalf("token requests %+v; want a second grant with the renewed JWT", reqs)
	}
	leakCheck(t, e, append(e.as.Secrets(), first, second), fmt.Sprint(c.State()), c.String())
}

// The workload's JWT goes only to the authorization server it was issued
// for: an upstream whose metadata names another one (a mix-up, or an
// upstream that would replay the JWT where it is accepted) gets no grant
// request at all. An expired JWT is not sent either.
func TestJWTBearerAssertionStaysWithItsAudience(t *testing.T) {
	e := newEnv(t, oauthtest.AuthServerOptions{}, nil, "") // the server the upstream names
	intended := oauthtest.NewAuthServer(oauthtest.AuthServerOptions{Now: e.clock.Now})
	defer intended.Close()
	w := newWorkload(t)
	e.as.TrustWorkloadKey(&w.key.PublicKey)
	e.as.AddClient("workload-1", "", nil)
	jwtFor := w.issue(intended.URL, e.clock.Now(), 5*time.Minute)
	c := e.client(Config{Grant: GrantJWTBearer, ClientID: "workload-1", AssertionFile: w.file})
	err := e.callEcho(c, "x")
	if err == nil || !strings.Contains(err.Error(), "audience") {
		t.Fatalf("call: %v; want a refusal naming the audience", err)
	}
	if n := len(e.as.TokenRequests()); n != 0 {
		t.Fatalf("%d token requests at a server the JWT is not for", n)
	}

	expired := newEnv(t, oauthtest.AuthServerOptions{}, nil, "")
	expired.as.TrustWorkloadKey(&w.key.PublicKey)
	expired.as.AddClient("workload-1", "", nil)
	w.issue(expired.as.URL, expired.clock.Now().Add(-time.Hour), 5*time.Minute)
	c = expired.client(Config{Grant: GrantJWTBearer, ClientID: "workload-1", AssertionFile: w.file})
	if err := expired.callEcho(c, "x"); err == nil || !strings.Contains(err.Error(), "expired") {
		t.Fatalf("call with an expired JWT: %v", err)
	}
	if n := len(expired.as.TokenRequests()); n != 0 {
		t.Fatalf("%d token requests with an expired JWT", n)
	}
	leakCheck(t, e, []string{jwtFor}, fmt.Sprint(c.State()))
}

// A JWT the authorization server refused is not presented again: the
// next grant waits for the platform to write a new one (SEP-1933 asks
// clients not to retry a refused assertion).
func TestJWTBearerRefusedAssertionIsNotRetried(t *testing.T) {
	e := newEnv(t, oauthtest.AuthServerOptions{}, nil, "")
	w := newWorkload(t)
	e.as.AddClient("workload-1", "", nil)
	w.issue(e.as.URL, e.clock.Now(), 10*time.Minute) // signed by a key the server does not trust
	c := e.client(Config{Grant: GrantJWTBearer, ClientID: "workload-1", AssertionFile: w.file})
	if err := e.callEcho(c, "x"); err == nil || !strings.Contains(err.Error(), "invalid_grant") {
		t.Fatalf("call: %v", err)
	}
	e.clock.Advance(time.Minute) // past the failure backoff
	if err := e.callEcho(c, "x"); err == nil || !strings.Contains(err.Error(), "refused") {
		t.Fatalf("second call: %v", err)
	}
	if n := len(e.as.TokenRequests()); n != 1 {
		t.Fatalf("%d token requests; the refused JWT was presented again", n)
	}
	e.as.TrustWorkloadKey(&w.key.PublicKey)
	e.clock.Advance(time.Minute)
	w.issue(e.as.URL, e.clock.Now(), 10*time.Minute)
	if err := e.callEcho(c, "x"); err != nil {
		t.Fatalf("with a new JWT: %v", err)
	}
	if n := len(e.as.TokenRequests()); n != 2 {
		t.Fatalf("%d token requests", n)
	}
}

func TestConfigValidateJWTBearer(t *testing.T) {
	good := []Config{
		{Grant: GrantJWTBearer, AssertionFile: "/run/workload/token"},
		{Grant: GrantJWTBearer, ClientID: "w", AssertionFile: "/run/workload/token", DPoP: DPoPRequired, Scopes: []string{"mcp:read"}},
	}
	for i, c := range good {
		if err := c.Validate(); err != nil {
			t.Errorf("good config %d: %v", i, err)
		}
	}
	for i, b := range []struct {
		cfg  Config
		want string
	}{
		{Config{Grant: GrantJWTBearer}, "assertion_file"},
		{Config{Grant: GrantJWTBearer, AssertionFile: t.TempDir()}, "is a directory"},
		{Config{Grant: GrantJWTBearer, AssertionFile: "/x", RedirectURL: redirect}, "redirect_url"},
		{Config{Grant: GrantJWTBearer, AssertionFile: "/x", IDPIssuer: "https://idp.example.com"}, "idp_issuer"},
		{Config{RedirectURL: redirect, AssertionFile: "/x"}, "assertion_file"},
		{Config{Grant: GrantClientCredentials, ClientID: "c", ClientSecret: "s", AssertionFile: "/x"}, "assertion_file"},
		{Config{RedirectURL: redirect, DPoP: "sometimes"}, "dpop"},
	} {
		if err := b.cfg.Validate(); err == nil || !strings.Contains(err.Error(), b.want) {
			t.Errorf("bad config %d: %v; want an error naming %q", i, err, b.want)
		}
	}
}

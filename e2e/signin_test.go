package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"html"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/modelcontextprotocol/go-sdk/oauthex"

	"github.com/Tahul/caddy-zidane-mcp/authserver"
	signinidp "github.com/Tahul/caddy-zidane-mcp/authserver/idp"
)

// authServerSite is a gateway with a signin block (registration dynamic: the
// go-sdk client registers itself; a Client ID Metadata Document on
// loopback would be refused by the fetch guard) and a sessions site whose
// resource is its absolute URL.
func authServerSite(t *testing.T) (c *Caddy, base string) {
	t.Helper()
	base = fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
	c = startCaddy(t, fmt.Sprintf(`{
	admin {{ADMIN}}
	zidane {
		signin {
			issuer %[1]s
			registration dynamic
		}
	}
}

%[1]s {
	zidane_mcp {
		sessions
		resource %[1]s/mcp
	}
}
`, base))
	return c, base
}

// formBrowser is a person's browser: a cookie jar, and no redirect followed
// off the gateway's origin (the client's loopback callback is where the
// flow ends).
type formBrowser struct {
	t    *testing.T
	base string // where the forms are posted
	// origin is the Origin the posts carry: the origin of the page the
	// form was on, base unless a test posts a page's form to another
	// replica.
	origin string
	hc     *http.Client
}

func newFormBrowser(t *testing.T, base string) *formBrowser {
	jar, _ := cookiejar.New(nil)
	b := &formBrowser{t: t, base: base, origin: base}
	b.hc = &http.Client{Jar: jar, Timeout: 30 * time.Second, CheckRedirect: func(req *http.Request, via []*http.Request) error {
		if req.URL.Hostname() != "127.0.0.1" || req.URL.Path == "/callback" || len(via) > 5 {
			return http.ErrUseLastResponse
		}
		return nil
	}}
	return b
}

func (b *formBrowser) get(u string) (*http.Response, string) {
	b.t.Helper()
	resp, err := b.hc.Get(u)
	if err != nil {
		b.t.Fatal(err)
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
	return resp, string(body)
}

func (b *formBrowser) post(path string, form url.Values) (*http.Response, string) {
	b.t.Helper()
	req, _ := http.NewRequest(http.MethodPost, b.base+path, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", b.origin)
	resp, err := b.hc.Do(req)
	if err != nil {
		b.t.Fatal(err)
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
	return resp, string(body)
}

var consentField = regexp.MustCompile(`name="(client_id|request|csrf|scope)" value="([^"]*)"`)

// consent fills the consent page as the person would: every scope
// offered, or only those in keep, and Allow. It returns where the
// gateway sent the browser.
func (b *formBrowser) consent(page string, keep ...string) *url.URL {
	b.t.Helper()
	form := url.Values{"decision": {"allow"}}
	for _, m := range consentField.FindAllStringSubmatch(page, -1) {
		v := html.UnescapeString(m[2])
		if m[1] == "scope" && keep != nil && !contains(keep, v) {
			continue
		}
		form.Add(m[1], v)
	}
	if form.Get("request") == "" {
		b.t.Fatalf("no consent form on the page:\n%s", page)
	}
	resp, body := b.post(authserver.ConsentPath, form)
	if resp.StatusCode != http.StatusSeeOther {
		b.t.Fatalf("consent answered %d:\n%s", resp.StatusCode, body)
	}
	loc, err := url.Parse(resp.Header.Get("Location"))
	if err != nil {
		b.t.Fatal(err)
	}
	return loc
}

func contains(list []string, s string) bool {
	for _, l := range list {
		if l == s {
			return true
		}
	}
	return false
}

// signInLink makes a one-time sign-in link for owner with `caddy zidane
// signin-link`, and returns its secret.
func signInLink(t *testing.T, c *Caddy, owner string, scopes ...string) string {
	t.Helper()
	args := []string{"zidane", "signin-link", "--owner", owner}
	for _, s := range scopes {
		args = append(args, "--scope", s)
	}
	out, stderr, err := c.Run(t, append(args, "--config", c.Caddyfile)...)
	if err != nil {
		t.Fatalf("signin-link: %v\n%s", err, stderr)
	}
	_, secret, ok := strings.Cut(strings.TrimSpace(out), signinidp.LinkPath+"#")
	if !ok || secret == "" {
		t.Fatalf("signin-link printed %q", out)
	}
	return secret
}

// TestSigninGoSDKClient: go-sdk's client goes from a bare URL to a tool
// call through the gateway's authorization server: the 401 and its RFC
// 9728 document, the RFC 8414 metadata, dynamic registration, the
// browser's sign-in (a one-time link) and consent, the code with PKCE,
// resource and iss, and the token; the grant is then listed with its
// owner and client, and the scope the person unticked is not in it.
func TestSigninGoSDKClient(t *testing.T) {
	c, base := authServerSite(t)
	secret := signInLink(t, c, "alice", "chat", "read")
	b := newFormBrowser(t, base)
	var consented []string
	fetcher := func(ctx context.Context, args *auth.AuthorizationArgs) (*auth.AuthorizationResult, error) {
		resp, body := b.get(args.URL)
		if resp.StatusCode == http.StatusUnauthorized {
			// Not signed in: the gateway's sign-in page; the link signs the
			// browser in and brings it back to the authorization request.
			resp, body = b.post(signinidp.LinkPath, url.Values{"secret": {secret}})
		}
		if resp.StatusCode != http.StatusOK {
			return nil, fmt.Errorf("the authorization request answered %d: %s", resp.StatusCode, body)
		}
		for _, m := range consentField.FindAllStringSubmatch(body, -1) {
			if m[1] == "scope" {
				consented = append(consented, m[2])
			}
		}
		loc := b.consent(body, "read")
		q := loc.Query()
		if q.Get("iss") != base {
			return nil, fmt.Errorf("the authorization response's iss is %q, want %q", q.Get("iss"), base)
		}
		return &auth.AuthorizationResult{Code: q.Get("code"), State: q.Get("state"), Iss: q.Get("iss")}, nil
	}
	h, err := auth.NewAuthorizationCodeHandler(&auth.AuthorizationCodeHandlerConfig{
		DynamicClientRegistrationConfig: &auth.DynamicClientRegistrationConfig{
			Metadata: &oauthex.ClientRegistrationMetadata{
				ClientName:              "e2e go-sdk client",
				RedirectURIs:            []string{"http://127.0.0.1:41234/callback"},
				GrantTypes:              []string{"authorization_code", "refresh_token"},
				TokenEndpointAuthMethod: "none",
			},
		},
		AuthorizationCodeFetcher: fetcher,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "e2e-signin", Version: "1"}, nil).Connect(ctx,
		&mcp.StreamableClientTransport{Endpoint: base + "/mcp", OAuthHandler: h, MaxRetries: -1}, nil)
	if err != nil {
		t.Fatalf("connect through the sign-in: %v", err)
	}
	defer cs.Close()
	tools, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatalf("tools/list with the issued token: %v", err)
	}
	if len(tools.Tools) == 0 {
		t.Fatal("no tools listed")
	}
	if !contains(consented, "chat") || !contains(consented, "read") {
		t.Errorf("the consent offered %v, want alice's chat and read", consented)
	}
	out, stderr, err := c.Run(t, "zidane", "token", "list", "--owner", "alice")
	if err != nil {
		t.Fatalf("token list: %v\n%s", err, stderr)
	}
	var line string
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, "grt_") {
			line = l
		}
	}
	// One grant, alice's, to the client as it named itself, with the one
	// scope she left ticked.
	if strings.Count(out, "grt_") != 1 || !strings.Contains(line, "alice") || !strings.Contains(line, `"e2e go-sdk client"`) ||
		!regexp.MustCompile(`\sread\s`).MatchString(line) || strings.Contains(line, "chat") {
		t.Errorf("token list --owner alice:\n%s", out)
	}
	logs := c.Logs()
	for _, s := range []string{secret} {
		if strings.Contains(logs, s) {
			t.Error("a secret reached caddy's log")
		}
	}
}

// TestSigninMetadata: the RFC 9728 document of a zidane_mcp resource names
// the gateway's issuer, whose RFC 8414 document go-sdk reads and checks.
func TestSigninMetadata(t *testing.T) {
	_, base := authServerSite(t)
	ctx := context.Background()
	prm, err := oauthex.GetProtectedResourceMetadata(ctx, base+"/.well-known/oauth-protected-resource/mcp", base+"/mcp", http.DefaultClient)
	if err != nil {
		t.Fatal(err)
	}
	if len(prm.AuthorizationServers) == 0 || prm.AuthorizationServers[0] != base {
		t.Fatalf("authorization_servers %v, want the issuer %s first", prm.AuthorizationServers, base)
	}
	asm, err := oauthex.GetAuthServerMeta(ctx, base+authserver.WellKnown, base, http.DefaultClient)
	if err != nil {
		t.Fatal(err)
	}
	if asm.RegistrationEndpoint != base+authserver.RegisterPath || !asm.AuthorizationResponseIssParameterSupported {
		t.Errorf("metadata %+v", asm)
	}
	resp, err := http.Get(base + authserver.WellKnown)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&m)
	resp.Body.Close()
	if _, ok := m["dpop_signing_alg_values_supported"]; !ok {
		t.Errorf("no dpop_signing_alg_values_supported in %v", m)
	}
}

// TestSigninResourceMustBeAbsolute: with a signin block, a site whose
// resource is a path alone is refused at load, saying what to write.
func TestSigninResourceMustBeAbsolute(t *testing.T) {
	base := fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
	c := newCaddy(t, "{\n\tadmin {{ADMIN}}\n}\n")
	cfg := fmt.Sprintf("{\n\tadmin {{ADMIN}}\n\tzidane {\n\t\tsignin {\n\t\t\tissuer %[1]s\n\t\t}\n\t}\n}\n%[1]s {\n\tzidane_mcp {\n\t\tsessions\n\t\tresource /mcp\n\t}\n}\n", base)
	c.writeCaddyfile(t, cfg)
	out, stderr, err := c.Run(t, "validate", "--config", c.Caddyfile, "--adapter", "caddyfile")
	if err == nil || !strings.Contains(out+stderr, "give the resource as an absolute URL") {
		t.Fatalf("validate: %v\n%s%s", err, out, stderr)
	}
}

// TestSigninTypeScriptClient: the TypeScript SDK's client (what Claude Code
// is built on) goes from a bare URL to tools/list through the gateway's
// authorization server: it registers, the test plays the person's browser
// (the sign-in link, the consent page), and the client redeems the code
// and calls with the token.
func TestSigninTypeScriptClient(t *testing.T) {
	c, base := authServerSite(t)
	secret := signInLink(t, c, "bob", "read")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ts := startLineScript(t, ctx, true, "tsoauth.mjs", "--url", base+"/mcp", "--redirect", "http://127.0.0.1:41235/callback")
	authURL, _ := ts.line(t)["authorize"].(string)
	if !strings.HasPrefix(authURL, base+authserver.AuthorizePath+"?") {
		t.Fatalf("the client was sent to %q, not the gateway's authorization endpoint", authURL)
	}
	b := newFormBrowser(t, base)
	resp, body := b.get(authURL)
	if resp.StatusCode == http.StatusUnauthorized {
		resp, body = b.post(signinidp.LinkPath, url.Values{"secret": {secret}})
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("the authorization request answered %d:\n%s", resp.StatusCode, body)
	}
	back := b.consent(body)
	if back.Query().Get("iss") != base || back.Query().Get("code") == "" {
		t.Fatalf("sent back to %s", back.Redacted())
	}
	if _, err := io.WriteString(ts.stdin, back.String()+"\n"); err != nil {
		t.Fatal(err)
	}
	got := ts.line(t)
	tools, _ := got["tools"].([]any)
	if len(tools) == 0 || got["token_type"] != "Bearer" || got["scope"] != "read" {
		t.Errorf("the client ended with %v", got)
	}
	ts.stdin.Close()
	for _, s := range []string{secret, back.Query().Get("code")} {
		if strings.Contains(c.Logs(), s) {
			t.Error("a secret reached caddy's log")
		}
	}
}

// manualClient is an OAuth client written out by hand, so that a test can
// send what no SDK would: it registers, has a person's browser consent,
// and redeems the code.
type manualClient struct {
	t        *testing.T
	base     string
	id       string
	redirect string
}

func registerClient(t *testing.T, base string) *manualClient {
	t.Helper()
	m := &manualClient{t: t, base: base, redirect: "http://127.0.0.1:41236/callback"}
	body := `{"client_name":"manual","redirect_uris":["` + m.redirect + `"],"token_endpoint_auth_method":"none"}`
	resp, err := http.Post(base+authserver.RegisterPath, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var got struct {
		ClientID string `json:"client_id"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&got); err != nil || resp.StatusCode != http.StatusCreated {
		t.Fatalf("registration: %d %v", resp.StatusCode, err)
	}
	m.id = got.ClientID
	return m
}

// authorizeQuery is an authorization request for resource, with the
// S256 challenge of verifier.
func (m *manualClient) authorizeQuery(verifier, resource string) url.Values {
	sum := sha256.Sum256([]byte(verifier))
	return url.Values{
		"response_type": {"code"}, "client_id": {m.id}, "redirect_uri": {m.redirect},
		"code_challenge": {base64.RawURLEncoding.EncodeToString(sum[:])}, "code_challenge_method": {"S256"},
		"resource": {resource}, "state": {randomHex(8)},
	}
}

// code has b consent to an authorization request for resource and
// returns the code and its PKCE verifier.
func (m *manualClient) code(b *formBrowser, secret, resource string) (code, verifier string) {
	m.t.Helper()
	verifier = randomHex(32)
	q := m.authorizeQuery(verifier, resource)
	resp, body := b.get(m.base + authserver.AuthorizePath + "?" + q.Encode())
	if resp.StatusCode == http.StatusUnauthorized {
		resp, body = b.post(signinidp.LinkPath, url.Values{"secret": {secret}})
	}
	if resp.StatusCode != http.StatusOK {
		m.t.Fatalf("authorization: %d\n%s", resp.StatusCode, body)
	}
	back := b.consent(body)
	if back.Query().Get("state") != q.Get("state") || back.Query().Get("iss") != m.base {
		m.t.Fatalf("sent back with %v", back.Query())
	}
	return back.Query().Get("code"), verifier
}

// token posts a token request, with a DPoP header for each proof, and
// returns its status and JSON.
func (m *manualClient) token(form url.Values, proofs ...string) (int, map[string]any) {
	m.t.Helper()
	form.Set("client_id", m.id)
	req, _ := http.NewRequest(http.MethodPost, m.base+authserver.TokenPath, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for _, p := range proofs {
		req.Header.Add("DPoP", p)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		m.t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&out)
	if resp.Header.Get("Cache-Control") != "no-store" {
		m.t.Errorf("a token endpoint answer without Cache-Control: no-store")
	}
	return resp.StatusCode, out
}

func (m *manualClient) redeem(code, verifier, resource string, proofs ...string) (int, map[string]any) {
	return m.token(url.Values{"grant_type": {"authorization_code"}, "code": {code}, "code_verifier": {verifier},
		"redirect_uri": {m.redirect}, "resource": {resource}}, proofs...)
}

// listToolsStatus initializes a session at endpoint with token, and
// returns the status and the challenge.
func listToolsStatus(t *testing.T, endpoint, token string) (int, string) {
	t.Helper()
	a := post(t, endpoint, token, initializeBody)
	return a.status, a.header.Get("WWW-Authenticate")
}

// TestSigninAtTheGateway: what the gateway's authorization server refuses,
// through the real binary: a token issued for one site's resource used at
// another site of the same gateway (401 invalid_token), a code redeemed
// twice (the second refused, and the grant of the first revoked), a wrong
// PKCE verifier, and a refresh token used twice (the grant revoked).
func TestSigninAtTheGateway(t *testing.T) {
	base := fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
	other := fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
	c := startCaddy(t, fmt.Sprintf(`{
	admin {{ADMIN}}
	zidane {
		signin {
			issuer %[1]s
			registration dynamic
		}
	}
}

%[1]s {
	zidane_mcp {
		sessions
		resource %[1]s/mcp
	}
}

%[2]s {
	zidane_mcp {
		sessions
		resource %[2]s/mcp
	}
}
`, base, other))
	secret := signInLink(t, c, "carol", "read")
	m := registerClient(t, base)
	b := newFormBrowser(t, base)

	code, verifier := m.code(b, secret, base+"/mcp")
	status, tok := m.redeem(code, verifier, base+"/mcp")
	if status != http.StatusOK {
		t.Fatalf("redeem: %d %v", status, tok)
	}
	access := tok["access_token"].(string)
	if got, _ := listToolsStatus(t, base+"/mcp", access); got != http.StatusOK {
		t.Fatalf("the token at its own resource: %d", got)
	}
	if got, challenge := listToolsStatus(t, other+"/mcp", access); got != http.StatusUnauthorized || !strings.Contains(challenge, "issued for "+base+"/mcp, not for "+other+"/mcp") {
		t.Errorf("the token at another site's resource: %d %q, want 401 invalid_token", got, challenge)
	}

	// The same code again: refused, and the grant it gave is revoked.
	if status, out := m.redeem(code, verifier, base+"/mcp"); status != http.StatusBadRequest || out["error"] != "invalid_grant" {
		t.Errorf("the code redeemed twice: %d %v", status, out)
	}
	if got, _ := listToolsStatus(t, base+"/mcp", access); got != http.StatusUnauthorized {
		t.Errorf("the grant of a code redeemed twice still works: %d", got)
	}

	// A wrong verifier spends the code.
	code, verifier = m.code(b, secret, base+"/mcp")
	if status, out := m.redeem(code, randomHex(32), base+"/mcp"); status != http.StatusBadRequest || out["error"] != "invalid_grant" {
		t.Errorf("a wrong verifier: %d %v", status, out)
	}
	if status, _ := m.redeem(code, verifier, base+"/mcp"); status != http.StatusBadRequest {
		t.Errorf("the code after a wrong verifier: %d, want it spent", status)
	}

	// Refresh rotation; the old refresh token again revokes the grant.
	code, verifier = m.code(b, secret, base+"/mcp")
	_, tok = m.redeem(code, verifier, base+"/mcp")
	first := tok["refresh_token"].(string)
	status, next := m.token(url.Values{"grant_type": {"refresh_token"}, "refresh_token": {first}})
	if status != http.StatusOK || next["refresh_token"] == first {
		t.Fatalf("refresh: %d %v", status, next)
	}
	if status, out := m.token(url.Values{"grant_type": {"refresh_token"}, "refresh_token": {first}}); status != http.StatusBadRequest || out["error"] != "invalid_grant" {
		t.Errorf("a refresh token used twice: %d %v", status, out)
	}
	if got, _ := listToolsStatus(t, base+"/mcp", next["access_token"].(string)); got != http.StatusUnauthorized {
		t.Errorf("the grant after its refresh token's reuse still works: %d", got)
	}
	for _, s := range []string{secret, code, verifier, first, access} {
		if strings.Contains(c.Logs(), s) {
			t.Error("a secret reached caddy's log")
		}
	}
	if !strings.Contains(c.Logs(), `"event":"signin_refused"`) {
		t.Error("no refusal of the authorization server was audited")
	}
}

// TestSigninDPoPBound: a token request with a DPoP proof gets tokens bound
// to the proof's key (token_type DPoP), which the edge then takes only
// with a proof of that key: as Bearer, or with another key's proof, they
// are refused; a refresh of the bound grant needs that key's proof too.
func TestSigninDPoPBound(t *testing.T) {
	c, base := authServerSite(t)
	secret := signInLink(t, c, "dave", "read")
	m := registerClient(t, base)
	b := newFormBrowser(t, base)
	key := newDPoPKey(t)
	tokenURL := base + authserver.TokenPath

	code, verifier := m.code(b, secret, base+"/mcp")
	status, tok := m.redeem(code, verifier, base+"/mcp", key.proof(t, http.MethodPost, tokenURL, "", ""))
	if status != http.StatusOK || tok["token_type"] != "DPoP" {
		t.Fatalf("redeem with a proof: %d %v", status, tok)
	}
	access := tok["access_token"].(string)
	if a := postDPoP(t, base+"/mcp", "", "DPoP "+access, []string{key.proof(t, http.MethodPost, base+"/mcp", access, "")}, initializeBody); a.status != http.StatusOK {
		t.Errorf("the bound token with its key's proof: %d %s", a.status, a.body)
	}
	if a := post(t, base+"/mcp", access, initializeBody); a.status != http.StatusUnauthorized {
		t.Errorf("the bound token as Bearer: %d", a.status)
	}
	other := newDPoPKey(t)
	if a := postDPoP(t, base+"/mcp", "", "DPoP "+access, []string{other.proof(t, http.MethodPost, base+"/mcp", access, "")}, initializeBody); a.status != http.StatusUnauthorized {
		t.Errorf("the bound token with another key's proof: %d", a.status)
	}
	refresh := url.Values{"grant_type": {"refresh_token"}, "refresh_token": {tok["refresh_token"].(string)}}
	if status, out := m.token(refresh, other.proof(t, http.MethodPost, tokenURL, "", "")); status != http.StatusBadRequest || out["error"] != "invalid_grant" {
		t.Errorf("refresh of the bound grant with another key: %d %v", status, out)
	}
	if status, out := m.token(refresh, key.proof(t, http.MethodPost, tokenURL, "", "")); status != http.StatusOK || out["token_type"] != "DPoP" {
		t.Errorf("refresh of the bound grant with its key: %d %v", status, out)
	}
	// A proof for another URL is refused at the token endpoint.
	code, verifier = m.code(b, secret, base+"/mcp")
	if status, out := m.redeem(code, verifier, base+"/mcp", key.proof(t, http.MethodPost, base+"/elsewhere", "", "")); status != http.StatusBadRequest || out["error"] != "invalid_dpop_proof" {
		t.Errorf("a proof for another URL at the token endpoint: %d %v", status, out)
	}
}

// TestSigninAcrossReload: a config reload keeps what a person is in the
// middle of: a consent page shown before the reload is taken after it, the
// browser is still signed in, and the code it gives is redeemed, under the
// new config's access_lifetime.
func TestSigninAcrossReload(t *testing.T) {
	c, base := authServerSite(t)
	secret := signInLink(t, c, "frank", "read")
	m := registerClient(t, base)
	b := newFormBrowser(t, base)
	verifier := randomHex(32)
	q := m.authorizeQuery(verifier, base+"/mcp")
	resp, body := b.get(base + authserver.AuthorizePath + "?" + q.Encode())
	if resp.StatusCode == http.StatusUnauthorized {
		resp, body = b.post(signinidp.LinkPath, url.Values{"secret": {secret}})
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("authorization: %d\n%s", resp.StatusCode, body)
	}
	cfg, err := os.ReadFile(c.Caddyfile)
	if err != nil {
		t.Fatal(err)
	}
	c.Reload(t, strings.Replace(strings.Replace(string(cfg), c.AdminAddr, AdminPlaceholder, 1), "registration dynamic", "registration dynamic\n\t\t\taccess_lifetime 5m", 1))
	back := b.consent(body)
	status, tok := m.redeem(back.Query().Get("code"), verifier, base+"/mcp")
	if status != http.StatusOK {
		t.Fatalf("the code of a consent given across a reload: %d %v", status, tok)
	}
	// The default is 10m: 5m shows the reloaded config issued the token.
	if ttl, _ := tok["expires_in"].(float64); ttl > 300 || ttl < 240 {
		t.Errorf("expires_in %v after the reload set access_lifetime 5m", ttl)
	}
	resp, body = b.get(base + authserver.AuthorizePath + "?" + m.authorizeQuery(randomHex(32), base+"/mcp").Encode())
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, "Allow access?") {
		t.Errorf("the browser signed in before the reload is not after it: %d", resp.StatusCode)
	}
}

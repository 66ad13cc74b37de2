package oauthtest

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"
)

// servers starts an AuthServer on a test clock with a registered public
// client "c", and an MCPServer behind it.
func servers(t *testing.T, ttl time.Duration) (*Clock, *AuthServer, *MCPServer) {
	t.Helper()
	clk := NewClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	as := NewAuthServer(AuthServerOptions{Now: clk.Now, AccessTokenTTL: ttl})
	t.Cleanup(as.Close)
	m := NewMCPServer(as, MCPOptions{ScopesSupported: []string{"read"}, EchoScope: "read", AdminScope: "admin"})
	t.Cleanup(m.Close)
	as.AddClient("c", "", nil)
	return clk, as, m
}

type tokens struct {
	Access  string `json:"access_token"`
	Refresh string `json:"refresh_token"`
	Expires int    `json:"expires_in"`
	Scope   string `json:"scope"`
	Error   string `json:"error"`
}

func token(t *testing.T, as *AuthServer, form url.Values) tokens {
	t.Helper()
	resp, err := http.PostForm(as.URL+"/token", form)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var tr tokens
	json.NewDecoder(resp.Body).Decode(&tr)
	return tr
}

// login runs the authorization-code flow with PKCE for scope.
func login(t *testing.T, as *AuthServer, m *MCPServer, scope string) tokens {
	t.Helper()
	verifier := NewSecret("verifier")
	sum := sha256.Sum256([]byte(verifier))
	q := url.Values{"response_type": {"code"}, "client_id": {"c"}, "redirect_uri": {"http://127.0.0.1:9/cb"}, "scope": {scope},
		"code_challenge": {base64.RawURLEncoding.EncodeToString(sum[:])}, "code_challenge_method": {"S256"}, "resource": {m.URL}, "state": {"s"}}
	browser := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := browser.Get(as.URL + "/authorize?" + q.Encode())
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	loc, _ := url.Parse(resp.Header.Get("Location"))
	code := loc.Query().Get("code")
	if resp.StatusCode != http.StatusFound || code == "" || loc.Query().Get("state") != "s" {
		t.Fatalf("authorize: %d %s", resp.StatusCode, loc)
	}
	form := url.Values{"grant_type": {GrantAuthorizationCode}, "client_id": {"c"}, "code": {code}, "redirect_uri": {"http://127.0.0.1:9/cb"}, "resource": {m.URL}}
	if tr := token(t, as, withVerifier(form, "wrong")); tr.Error != "invalid_grant" {
		t.Fatalf("a wrong verifier: %+v", tr)
	}
	// The code is spent by the failed attempt: a new one is needed.
	resp, err = browser.Get(as.URL + "/authorize?" + q.Encode())
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	loc, _ = url.Parse(resp.Header.Get("Location"))
	form.Set("code", loc.Query().Get("code"))
	tr := token(t, as, withVerifier(form, verifier))
	if tr.Access == "" || tr.Refresh == "" {
		t.Fatalf("token: %+v", tr)
	}
	return tr
}

func withVerifier(form url.Values, v string) url.Values {
	out := url.Values{}
	for k, vs := range form {
		out[k] = slices.Clone(vs)
	}
	out.Set("code_verifier", v)
	return out
}

// mcpCall posts a tools/call of tool with bearer and returns the status
// and WWW-Authenticate.
func mcpCall(t *testing.T, m *MCPServer, bearer, tool string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, m.URL, strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"`+tool+`","arguments":{}}}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if bearer != "" {
		req.Header.Set("Authorization", "Bearer "+bearer)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode, resp.Header.Get("WWW-Authenticate")
}

func TestLoginScopesAndExpiry(t *testing.T) {
	clk, as, m := servers(t, time.Minute)
	if status, www := mcpCall(t, m, "", "echo"); status != http.StatusUnauthorized || !strings.Contains(www, `resource_metadata="`+m.ResourceMetadataURL()+`"`) {
		t.Fatalf("no token: %d %q", status, www)
	}
	tr := login(t, as, m, "read")
	if tr.Expires != 60 || tr.Scope != "read" || as.PKCEVerified() != 1 {
		t.Fatalf("token %+v, %d PKCE verifications", tr, as.PKCEVerified())
	}
	if status, _ := mcpCall(t, m, tr.Access, "echo"); status != http.StatusOK {
		t.Fatalf("echo: %d", status)
	}
	status, www := mcpCall(t, m, tr.Access, "admin_op")
	if status != http.StatusForbidden || !strings.Contains(www, `error="insufficient_scope"`) || !strings.Contains(www, `scope="read admin"`) {
		t.Fatalf("admin_op with scope read: %d %q", status, www)
	}
	if got := m.Bearers(); !slices.Equal(got, []string{tr.Access}) {
		t.Errorf("bearers seen %v", got)
	}
	clk.Advance(time.Minute)
	if status, _ := mcpCall(t, m, tr.Access, "echo"); status != http.StatusUnauthorized {
		t.Errorf("an expired token: %d", status)
	}
	secrets := as.Secrets()
	for _, s := range []string{tr.Access, tr.Refresh} {
		if !slices.Contains(secrets, s) {
			t.Errorf("Secrets lacks %.6s…", s)
		}
	}
	if n := len(secrets); n != 4 { // a code per authorization, the access and the refresh token
		t.Errorf("%d secrets listed, want 4", n)
	}
	if codes := as.AuthorizationCodes(); len(codes) != 2 || !slices.Contains(secrets, codes[0]) || !slices.Contains(secrets, codes[1]) {
		t.Errorf("authorization codes %d, want the 2 handed out", len(codes))
	}
}

func TestRefreshRotationAndRevocation(t *testing.T) {
	_, as, m := servers(t, time.Hour)
	tr := login(t, as, m, "read admin")
	refresh := func(rt string) tokens {
		return token(t, as, url.Values{"grant_type": {GrantRefreshToken}, "client_id": {"c"}, "refresh_token": {rt}, "resource": {m.URL}})
	}
	next := refresh(tr.Refresh)
	if next.Access == "" || next.Refresh == "" || next.Refresh == tr.Refresh || next.Scope != "read admin" {
		t.Fatalf("refresh: %+v", next)
	}
	if status, _ := mcpCall(t, m, next.Access, "admin_op"); status != http.StatusOK {
		t.Errorf("admin_op with scope admin: %d", status)
	}
	if as.RefreshReuses() != 0 {
		t.Errorf("%d reuses counted before any", as.RefreshReuses())
	}

	// A rotated refresh token presented again is refused, counted, and
	// revokes the grant: the tokens its rotation issued stop working.
	other := login(t, as, m, "read") // another grant, which the reuse leaves alone
	if again := refresh(tr.Refresh); again.Error != "invalid_grant" {
		t.Errorf("a rotated refresh token redeemed again: %+v", again)
	}
	if n := as.RefreshReuses(); n != 1 {
		t.Errorf("%d reuses counted, want 1", n)
	}
	if status, _ := mcpCall(t, m, next.Access, "echo"); status != http.StatusUnauthorized {
		t.Errorf("an access token of the grant whose refresh token was reused: %d, want 401", status)
	}
	if r := refresh(next.Refresh); r.Error != "invalid_grant" {
		t.Errorf("the refresh token of the grant whose refresh token was reused: %+v", r)
	}
	if status, _ := mcpCall(t, m, other.Access, "echo"); status != http.StatusOK {
		t.Errorf("another grant's access token after the reuse: %d", status)
	}

	// Revoking the refresh tokens leaves the access tokens until they
	// expire.
	as.RevokeRefreshTokens()
	if status, _ := mcpCall(t, m, other.Access, "echo"); status != http.StatusOK {
		t.Errorf("the access token stopped working with the refresh tokens: %d", status)
	}
	if r := refresh(other.Refresh); r.Error != "invalid_grant" {
		t.Errorf("a revoked refresh token: %+v", r)
	}
	rts := as.RefreshTokens()
	if len(rts) != 3 || rts[0].Redeemed != 2 || !rts[0].Revoked || !rts[1].Revoked || rts[1].Redeemed != 1 || !rts[2].Revoked {
		t.Errorf("refresh tokens %+v", rts)
	}
	var failed []string
	for _, r := range as.TokenRequests() {
		if r.Error != "" {
			failed = append(failed, r.GrantType+":"+r.Error)
		}
	}
	if want := []string{"authorization_code:invalid_grant", "authorization_code:invalid_grant", "refresh_token:invalid_grant", "refresh_token:invalid_grant", "refresh_token:invalid_grant"}; !slices.Equal(failed, want) {
		t.Errorf("refused token requests %v, want %v", failed, want)
	}
	as.RevokeAccessTokens()
	if status, _ := mcpCall(t, m, other.Access, "echo"); status != http.StatusUnauthorized {
		t.Errorf("a revoked access token: %d", status)
	}
}

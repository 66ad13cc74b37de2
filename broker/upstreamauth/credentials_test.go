package upstreamauth

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/Tahul/caddy-zidane-mcp/internal/oauthtest"
)

// A pre-registered client (client_id and client_secret in the oauth
// block) belongs to the authorization server that issued it (SEP-2352:
// credentials of one server are not presented to another). The gateway
// logged in there; then the upstream, compromised or misconfigured, names
// another server in its protected resource metadata, and the operator,
// asked to log in again, does. The secret must not reach that server, as
// the workload JWT of jwt_bearer does not: whoever runs it could present
// the secret where it is valid. The login is refused before anything is
// sent there, with a message that names both servers and how to move on
// purpose (authorization_server).
func TestPreRegisteredClientStaysWithItsAuthorizationServer(t *testing.T) {
	e := newEnv(t, oauthtest.AuthServerOptions{AuthMethods: []string{AuthClientSecretBasic}}, []string{"mcp:read"}, "")
	secret := oauthtest.NewSecret("cs")
	e.as.AddClient("gw", secret, nil)
	c := e.client(Config{ClientID: "gw", ClientSecret: secret, RedirectURL: redirect})
	e.login(c)
	if err := e.callEcho(c, "x"); err != nil {
		t.Fatal(err)
	}

	// The server the upstream names now takes any client it is shown:
	// what reaches it is what it harvests.
	other := oauthtest.NewAuthServer(oauthtest.AuthServerOptions{Now: e.clock.Now, AuthMethods: []string{AuthClientSecretBasic}})
	defer other.Close()
	other.AddClient("gw", secret, nil)
	prm := e.mcp.ResourceMetadataURL()
	e.mcp.Override(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/.well-known/oauth-protected-resource/mcp" {
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"resource":%q,"authorization_servers":[%q],"scopes_supported":["mcp:read"]}`, e.mcp.URL, other.URL)
			return
		}
		w.Header().Set("WWW-Authenticate", fmt.Sprintf(`Bearer error="invalid_token", resource_metadata=%q`, prm))
		http.Error(w, "unauthorized", http.StatusUnauthorized)
	}))

	authURL, err := c.BeginLogin(context.Background())
	if err == nil {
		// The operator's browser follows the link, and the server sends
		// it back to the callback, as a server that wants the secret
		// would.
		browser := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
		resp, gerr := browser.Get(authURL)
		if gerr != nil {
			t.Fatal(gerr)
		}
		resp.Body.Close()
		if loc, perr := url.Parse(resp.Header.Get("Location")); perr == nil && resp.StatusCode == http.StatusFound {
			err = c.Callback(context.Background(), loc.Query())
		}
	}
	if n, m := len(other.AuthorizationRequests()), len(other.TokenRequests()); n != 0 || m != 0 {
		t.Fatalf("the pre-registered client went to the server the upstream names now: %d authorization requests, %d token requests (%+v)", n, m, other.TokenRequests())
	}
	if err == nil || !strings.Contains(err.Error(), other.URL) || !strings.Contains(err.Error(), e.as.URL) || !strings.Contains(err.Error(), "authorization_server") {
		t.Fatalf("login: %v; want a refusal naming both servers and authorization_server", err)
	}
	leakCheck(t, e, []string{secret}, err.Error(), fmt.Sprint(c.State()))

	// An operator who moved the upstream on purpose says so.
	moved := e.client(Config{ClientID: "gw", ClientSecret: secret, RedirectURL: redirect, AuthorizationServer: other.URL})
	if _, err := moved.BeginLogin(context.Background()); err != nil {
		t.Fatalf("login with authorization_server naming the new server: %v", err)
	}
}

package caddymodule

import (
	"context"
	"crypto/rand"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"

	"github.com/Tahul/caddy-zidane-mcp/broker/upstream"
	"github.com/Tahul/caddy-zidane-mcp/broker/upstreamauth"
	"github.com/Tahul/caddy-zidane-mcp/internal/oauthtest"
	"github.com/Tahul/caddy-zidane-mcp/policy"
)

// Revoking the last of a person's live grants (the clients they signed
// in) ends their own upstream connections, revoked at the authorization
// server too; revoking one of two grants, or a token that is not a grant,
// ends none, nor does it touch another person's.
func TestGrantRevocationEndsThePersonsConnections(t *testing.T) {
	ctx := context.Background()
	as := oauthtest.NewAuthServer(oauthtest.AuthServerOptions{})
	t.Cleanup(as.Close)
	up := oauthtest.NewMCPServer(as, oauthtest.MCPOptions{})
	t.Cleanup(up.Close)
	fs := &certmagic.FileStorage{Path: t.TempDir()}
	key := make([]byte, 32)
	rand.Read(key)
	cfg := upstreamauth.Config{RedirectURL: "http://127.0.0.1:9/cb", Credentials: upstreamauth.CredentialsPerUser}
	c, err := upstreamauth.New(ctx, "remote", up.URL, cfg, upstreamauth.Options{Storage: fs, Key: key})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	browser := &http.Client{Timeout: 10 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	for _, owner := range []string{"alice", "bob"} {
		oc, err := c.ForOwner(owner)
		if err != nil {
			t.Fatal(err)
		}
		authURL, err := oc.BeginLogin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := browser.Get(authURL + "&login_hint=" + owner)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		loc, _ := url.Parse(resp.Header.Get("Location"))
		if err := oc.Callback(ctx, loc.Query()); err != nil {
			t.Fatal(err)
		}
	}

	store, err := policy.OpenTokenStore(ctx, fs)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.SetGrantKey(key); err != nil {
		t.Fatal(err)
	}
	app := &App{
		oauth:     map[string]*upstreamauth.Client{"remote": c},
		upstreams: map[string]upstream.Config{"remote": {Name: "remote", URL: up.URL, OAuth: &cfg}},
		tokens:    &tokenState{store: store},
	}
	unhook := app.hookGrantRevocations()
	if unhook == nil {
		t.Fatal("no hook for an app with a per_user upstream")
	}
	defer unhook()

	// bob's plain token (not a grant) is revoked: his connection stays.
	_, bobTok, err := store.Create(ctx, policy.TokenSpec{Name: "bob-laptop", Scopes: []string{"upstream:remote"}, Owner: "bob"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.Revoke(ctx, bobTok.ID); err != nil {
		t.Fatal(err)
	}
	var grants []string
	for _, client := range []string{"https://client.example/metadata.json", "https://other.example/metadata.json"} {
		iss, err := store.CreateGrant(ctx, policy.GrantSpec{Owner: "alice", Client: client,
			Resource: "https://gw.example/mcp", Scopes: []string{"upstream:remote"}}, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		grants = append(grants, iss.GrantID)
	}
	// One of her two clients is revoked: she is still signed in with the
	// other, and her connection stays.
	first, err := store.Revoke(ctx, grants[0])
	if err != nil {
		t.Fatal(err)
	}
	if _, last := lastGrantRevoked(store, first, time.Now()); last {
		t.Fatal("one of alice's two grants revoked counts as her last")
	}
	// A grant displaced by the ninth sign-in of one client (policy keeps
	// eight per client) is not her last either.
	for range 9 {
		if _, err := store.CreateGrant(ctx, policy.GrantSpec{Owner: "carol", Client: "https://client.example/metadata.json",
			Resource: "https://gw.example/mcp", Scopes: []string{"upstream:remote"}}, time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	displaced := 0
	for _, tok := range store.List() {
		if tok.IsGrant() && tok.Owner == "carol" && tok.Revoked != nil {
			displaced++
			if _, last := lastGrantRevoked(store, tok, time.Now()); last {
				t.Error("carol's displaced grant counts as her last")
			}
		}
	}
	if displaced != 1 {
		t.Fatalf("%d of carol's grants displaced by her ninth sign-in, want 1", displaced)
	}
	if _, last := lastGrantRevoked(store, bobTok, time.Now()); last {
		t.Fatal("bob's plain token counts as a grant")
	}
	if _, err := store.Revoke(ctx, grants[1]); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		conns, err := c.Connections(ctx, "alice")
		if err != nil {
			t.Fatal(err)
		}
		if len(conns) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("alice's connection is still there 20s after her grant was revoked")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if n := len(as.Revocations()); n != 2 {
		t.Errorf("%d tokens revoked at the authorization server, want alice's refresh and access tokens", n)
	}
	if conns, _ := c.Connections(ctx, "bob"); len(conns) != 1 {
		t.Errorf("bob's connection after his plain token and alice's grant were revoked: %+v", conns)
	}
}

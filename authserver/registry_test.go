package authserver

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/authserver/clients"
)

// TestWithRegistry runs the authorization endpoint on the real client
// registry: a client registers itself at RegisterPath (the metadata names
// it), and its redirect URIs are matched by the registry's rules.
func TestWithRegistry(t *testing.T) {
	var reg *clients.Registry
	f := newFixture(t, func(f *fixture, c *Config) {
		var err error
		reg, err = clients.New(clients.Config{Storage: f.store, Registration: true, Now: func() time.Time { return f.now }})
		if err != nil {
			t.Fatal(err)
		}
		c.Clients = registryClients{reg}
		c.Register = http.HandlerFunc(reg.Register)
	})
	r := httptest.NewRequest(http.MethodPost, testIssuer+RegisterPath,
		strings.NewReader(`{"client_name":"Registered","redirect_uris":["http://127.0.0.1/callback"],"token_endpoint_auth_method":"none"}`))
	r.Header.Set("Content-Type", "application/json")
	resp := f.do(r)
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("registration: %d %s", resp.StatusCode, readBody(resp))
	}
	var got struct {
		ClientID string `json:"client_id"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&got)

	q := f.authzQuery(newPKCE(f))
	q.Set("client_id", got.ClientID)
	for _, tc := range []struct {
		redirect string
		ok       bool
	}{
		{"http://127.0.0.1:50999/callback", true}, // any port of a loopback redirect URI
		{"http://localhost:50999/callback", false},
		{"http://127.0.0.1:50999/callback/", false},
		{"http://127.0.0.1:50999/callback?x=1", false},
		{"http://[::1]:50999/callback", false},
	} {
		q.Set("redirect_uri", tc.redirect)
		resp := f.authorize(q.Encode(), "alice")
		body := readBody(resp)
		if tc.ok != (resp.StatusCode == http.StatusOK) {
			t.Errorf("%s: status %d, want consent %v", tc.redirect, resp.StatusCode, tc.ok)
		}
		if !tc.ok && resp.Header.Get("Location") != "" {
			t.Errorf("%s: redirected to %q", tc.redirect, resp.Header.Get("Location"))
		}
		if tc.ok && !strings.Contains(body, "it calls itself “Registered”") {
			t.Errorf("the consent page does not show the registered name")
		}
	}
	q.Set("client_id", "zdc_neverregistered")
	q.Set("redirect_uri", "http://127.0.0.1:50999/callback")
	if resp := f.authorize(q.Encode(), "alice"); resp.StatusCode != http.StatusBadRequest || resp.Header.Get("Location") != "" {
		t.Errorf("a client never registered: %d to %q", resp.StatusCode, resp.Header.Get("Location"))
	}
}

// registryClients is what the gateway's wiring does: the registry's
// Client is an authserver.Client.
type registryClients struct{ r *clients.Registry }

func (c registryClients) Resolve(ctx context.Context, id string) (Client, error) {
	cl, err := c.r.Resolve(ctx, id)
	if err != nil {
		return nil, err
	}
	return cl, nil
}

// staticClients resolves to the clients package's own Client values.
type staticClients map[string]clients.Client

func (cs staticClients) Resolve(_ context.Context, id string) (Client, error) {
	if c, ok := cs[id]; ok {
		return c, nil
	}
	return nil, errors.New("no such client")
}

// TestNamelessClientGetsTokens: a client whose metadata document gives no
// client_name is shown by its client_id URL, which may be up to
// clients.MaxClientIDLength bytes; the grant records no name for it
// rather than the URL as one, and the client gets its tokens.
func TestNamelessClientGetsTokens(t *testing.T) {
	long := "https://nameless.example/" + strings.Repeat("c", 300) + "/client.json"
	f := newFixture(t, func(f *fixture, c *Config) {
		c.Clients = staticClients{long: {ID: long, RedirectURIs: []string{redirectA}, Source: clients.SourceMetadataDocument}}
	})
	p := newPKCE(f)
	code := f.consentCode(p, func(q url.Values) { q.Set("client_id", long) })
	req := codeRequest(code, p)
	req.Set("client_id", long)
	if a := f.post(TokenPath, req); a.status != http.StatusOK || a.str("access_token") == "" {
		t.Fatalf("the nameless client's code: %d %v, want its tokens", a.status, a.body)
	}
	if g := f.grants.List(); len(g) != 1 || g[0].Client != long || g[0].ClientName != "" {
		t.Errorf("grants %+v, want one for the client, with no name", g)
	}
}

package authserver

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
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

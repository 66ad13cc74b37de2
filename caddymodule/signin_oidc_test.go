package caddymodule

import (
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

// TestSigninOIDCCaddyfile: the oidc block reads into the relying party's
// configuration; a literal secret, an option twice, a rule without scopes,
// an issuer off https and the like are refused at adapt time, with the
// line and what to write.
func TestSigninOIDCCaddyfile(t *testing.T) {
	good := `oidc {
		issuer https://login.example.com
		client_id gateway
		client_secret {env.OIDC_CLIENT_SECRET}
		idp_scopes profile email groups
		owner_claim sub
		scopes groups eng upstream:github chat
		scopes groups staff chat
	}`
	d := caddyfile.NewTestDispenser(good)
	d.Next()
	c, err := unmarshalSigninOIDC(d)
	if err != nil {
		t.Fatal(err)
	}
	if c.Issuer != "https://login.example.com" || c.ClientID != "gateway" || c.ClientSecret != "{env.OIDC_CLIENT_SECRET}" ||
		strings.Join(c.Scopes, " ") != "profile email groups" || len(c.Rules) != 2 ||
		c.Rules[0].Claim != "groups" || c.Rules[0].Value != "eng" || strings.Join(c.Rules[0].Scopes, " ") != "upstream:github chat" {
		t.Fatalf("read %+v", c)
	}

	if c.PrivateNetwork {
		t.Fatal("private_network is on without being written")
	}
	dp := caddyfile.NewTestDispenser(strings.Replace(good, "owner_claim sub", "owner_claim sub\nprivate_network", 1))
	dp.Next()
	if cp, err := unmarshalSigninOIDC(dp); err != nil || !cp.PrivateNetwork {
		t.Fatalf("private_network: %+v, %v", cp, err)
	} else if o, err := cp.config(); err != nil || !o.PrivateNetwork {
		t.Fatalf("private_network does not reach the relying party: %+v, %v", o, err)
	}

	t.Setenv("OIDC_CLIENT_SECRET", "")
	if _, err := c.relyingParty(); err == nil || !strings.Contains(err.Error(), "{env.OIDC_CLIENT_SECRET}") {
		t.Fatalf("unset secret: %v", err)
	}
	t.Setenv("OIDC_CLIENT_SECRET", "s3cret-value")
	rp, err := c.relyingParty()
	if err != nil || rp.ClientSecret != "s3cret-value" || rp.Claims.Rules[1].Value != "staff" {
		t.Fatalf("relying party: %+v, %v", rp, err)
	}

	for _, tc := range []struct {
		name, block, word string
	}{
		{"a literal secret", strings.Replace(good, "{env.OIDC_CLIENT_SECRET}", "hunter2", 1), "literal"},
		{"a {$VAR} secret, replaced when read", strings.Replace(good, "{env.OIDC_CLIENT_SECRET}", "$SECRET", 1), "literal"},
		{"private_network with a value", strings.Replace(good, "owner_claim sub", "owner_claim sub\nprivate_network yes", 1), "takes no value"},
		{"issuer twice", strings.Replace(good, "client_id gateway", "client_id gateway\nissuer https://evil.example", 1), "twice"},
		{"client_id twice", strings.Replace(good, "client_id gateway", "client_id gateway\nclient_id other", 1), "twice"},
		{"a rule without scopes", strings.Replace(good, "scopes groups staff chat", "scopes groups staff", 1), "a claim, a value and the scopes"},
		{"a rule with a bad scope", strings.Replace(good, "scopes groups staff chat", "scopes groups staff \"a b\"", 1), "scope \"a b\""},
		{"no issuer", strings.Replace(good, "issuer https://login.example.com", "", 1), "needs an issuer"},
		{"no client_id", strings.Replace(good, "client_id gateway", "", 1), "needs a client_id"},
		{"no client_secret", strings.Replace(good, "client_secret {env.OIDC_CLIENT_SECRET}", "", 1), "needs a client_secret"},
		{"plain http issuer", strings.Replace(good, "https://login.example.com", "http://login.example.com", 1), "issuer"},
		{"an unknown option", strings.Replace(good, "owner_claim sub", "owner sub", 1), "unknown option"},
		{"an argument", strings.Replace(good, "oidc {", "oidc https://login.example.com {", 1), "no argument"},
		{"two owner claims", strings.Replace(good, "owner_claim sub", "owner_claim sub email", 1), "one value"},
	} {
		d := caddyfile.NewTestDispenser(tc.block)
		d.Next()
		_, err := unmarshalSigninOIDC(d)
		if err == nil || !strings.Contains(err.Error(), tc.word) {
			t.Errorf("%s: %v, want an error with %q", tc.name, err, tc.word)
		}
		if err != nil && strings.Contains(err.Error(), "hunter2") {
			t.Errorf("%s: the error shows the secret: %v", tc.name, err)
		}
	}
}

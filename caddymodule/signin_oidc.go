package caddymodule

import (
	"fmt"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/Tahul/caddy-zidane-mcp/authserver/idp"
)

// SigninOIDC is the `oidc` block of `signin`: the company IdP people sign
// in through, the gateway being its OpenID Connect client (package
// authserver/idp). Register the gateway at the IdP as a confidential web
// client whose redirect URI is the signin issuer followed by
// /zidane/signin/idp/callback.
type SigninOIDC struct {
	// Issuer is the IdP's issuer URL, exactly as its discovery document
	// spells it (https; http only on loopback). Required.
	Issuer string `json:"issuer"`

	// ClientID is the gateway's client id at the IdP. Required.
	ClientID string `json:"client_id"`

	// ClientSecret is the client's secret, as a placeholder such as
	// {env.OIDC_CLIENT_SECRET}: a literal is refused, since the admin API
	// serves the config and autosave.json keeps it. Required.
	ClientSecret string `json:"client_secret"`

	// Scopes are asked of the IdP besides openid, such as profile, email
	// or groups: whatever puts the claims the rules read in the ID token.
	Scopes []string `json:"scopes,omitempty"`

	// OwnerClaim is the claim that names the person's owner. Default: sub,
	// which an IdP never reassigns; an email can change hands.
	OwnerClaim string `json:"owner_claim,omitempty"`

	// NameClaim is the claim pages show. Default: name, then
	// preferred_username, then email.
	NameClaim string `json:"name_claim,omitempty"`

	// Rules grant the scopes a person may give clients, from the ID
	// token's claims. None by default: a person no rule grants a scope
	// is told so, and not signed in.
	Rules []idp.Rule `json:"rules,omitempty"`

	// PrivateNetwork lets the gateway reach an IdP on private addresses
	// (an on-premises IdP); see idp.OIDC.PrivateNetwork. Off by default.
	PrivateNetwork bool `json:"private_network,omitempty"`
}

// unmarshalSigninOIDC reads an `oidc` block, the dispenser on its name:
//
//	oidc {
//		issuer         <url>
//		client_id      <id>
//		client_secret  {env.VAR}
//		idp_scopes     <scope…>
//		owner_claim    <claim>
//		name_claim     <claim>
//		scopes         <claim> <value> <scope…>   # repeat for more rules
//		private_network                         # an IdP on private addresses
//	}
func unmarshalSigninOIDC(d *caddyfile.Dispenser) (*SigninOIDC, error) {
	if d.NextArg() {
		return nil, d.Err("oidc takes no argument, only a block: oidc { issuer <url> … }")
	}
	c := new(SigninOIDC)
	seen := map[string]bool{}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		key := d.Val()
		if key != "scopes" && seen[key] {
			return nil, d.Errf("oidc: %s is given twice; give it once", key)
		}
		seen[key] = true
		args := d.RemainingArgs()
		one := func(dst *string, what string) error {
			if len(args) != 1 {
				return d.Errf("oidc %s takes one value: %s", key, what)
			}
			*dst = args[0]
			return nil
		}
		var err error
		switch key {
		case "issuer":
			err = one(&c.Issuer, "the IdP's issuer URL, such as https://login.example.com")
		case "client_id":
			err = one(&c.ClientID, "the gateway's client id at the IdP")
		case "client_secret":
			err = one(&c.ClientSecret, "a placeholder such as {env.OIDC_CLIENT_SECRET}")
			if err == nil && !caddyPlaceholder.MatchString(c.ClientSecret) {
				err = d.Err(literalError("oidc client_secret", "{env.VAR}").Error())
			}
		case "idp_scopes":
			if len(args) == 0 {
				err = d.Err("oidc idp_scopes takes the scopes to ask the IdP for besides openid, such as: idp_scopes profile email groups")
			}
			c.Scopes = append(c.Scopes, args...)
		case "owner_claim":
			err = one(&c.OwnerClaim, "the claim that names the owner, such as sub")
		case "name_claim":
			err = one(&c.NameClaim, "the claim pages show, such as name")
		case "scopes":
			if len(args) < 3 {
				err = d.Err("oidc scopes takes a claim, a value and the scopes it grants, such as: scopes groups eng upstream:github chat")
			} else {
				c.Rules = append(c.Rules, idp.Rule{Claim: args[0], Value: args[1], Scopes: args[2:]})
			}
		case "private_network":
			if len(args) != 0 {
				err = d.Err("oidc private_network takes no value: write it alone to let the gateway reach an IdP on private addresses")
			}
			c.PrivateNetwork = true
		default:
			err = d.Errf("oidc: unknown option %q; use issuer, client_id, client_secret, idp_scopes, owner_claim, name_claim, scopes or private_network", key)
		}
		if err != nil {
			return nil, err
		}
	}
	if _, err := c.config(); err != nil {
		return nil, d.Err(err.Error())
	}
	return c, nil
}

// config is the relying party's configuration, with the secret read from
// Caddy's environment; it says what is missing or wrong. The secret never
// appears in an error.
func (c *SigninOIDC) config() (*idp.OIDC, error) {
	switch {
	case c.Issuer == "":
		return nil, fmt.Errorf("oidc needs an issuer, the IdP's issuer URL")
	case c.ClientID == "":
		return nil, fmt.Errorf("oidc needs a client_id, the gateway's client at the IdP")
	case c.ClientSecret == "":
		return nil, fmt.Errorf("oidc needs a client_secret, such as {env.OIDC_CLIENT_SECRET}")
	case !caddyPlaceholder.MatchString(c.ClientSecret):
		return nil, literalError("oidc client_secret", "{env.VAR}")
	}
	o := &idp.OIDC{Issuer: c.Issuer, ClientID: c.ClientID, Scopes: c.Scopes, PrivateNetwork: c.PrivateNetwork,
		Claims: idp.Claims{OwnerClaim: c.OwnerClaim, NameClaim: c.NameClaim, Rules: c.Rules}}
	// Checked with the placeholder standing in for the secret: it is
	// there, and it is not what any check reads.
	o.ClientSecret = c.ClientSecret
	err := o.Check()
	o.ClientSecret = ""
	return o, err
}

// relyingParty is config with the secret expanded: at Provision, where
// the config is used. An unset variable is refused, naming the variable.
func (c *SigninOIDC) relyingParty() (*idp.OIDC, error) {
	cfg, err := c.config()
	if err != nil {
		return nil, err
	}
	secret, err := caddy.NewReplacer().ReplaceOrErr(c.ClientSecret, true, true)
	if err != nil || secret == "" {
		return nil, fmt.Errorf("oidc client_secret %s is empty in caddy's environment: set it", c.ClientSecret)
	}
	cfg.ClientSecret = secret
	return cfg, nil
}

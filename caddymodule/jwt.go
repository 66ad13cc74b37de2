package caddymodule

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap/exp/zapslog"

	"github.com/Tahul/caddy-zidane-mcp/internal/configfile"
	"github.com/Tahul/caddy-zidane-mcp/pinnedfetch"
	"github.com/Tahul/caddy-zidane-mcp/policy"
)

// JWTConfig accepts JWT access tokens issued by an external identity
// provider, alongside the opaque tokens of `caddy zidane token`.
type JWTConfig struct {
	// Issuer is the provider's issuer identifier; `iss` must equal it.
	Issuer string `json:"issuer"`
	// Audiences a token's `aud` must name one of. Default: the resource
	// URL, when it is absolute.
	Audiences []string `json:"audiences,omitempty"`
	// Algorithms allowed in the token header. Default: RS256 and ES256.
	// "none" and HMAC algorithms are always refused.
	Algorithms []string `json:"algorithms,omitempty"`
	// JWKSURL is the provider's key set. It is fetched through the
	// origin-pinned egress client, cached, and re-fetched when a token
	// names an unknown key id.
	JWKSURL string `json:"jwks_url,omitempty"`
	// PublicKeyFile is a PEM file with the provider's public key(s), in
	// place of a JWKS URL: a regular file of at most 1 MiB. A private key
	// is refused.
	PublicKeyFile string `json:"public_key_file,omitempty"`
	// Leeway is the clock skew allowed on exp, nbf and iat. Default: 30s.
	Leeway caddy.Duration `json:"leeway,omitempty"`
	// MachineScope marks tokens with this scope as machine tokens.
	MachineScope string `json:"machine_scope,omitempty"`
}

// build returns the verifier of c, or an error that names the option to
// change. On error the verifier is nil: nothing to close.
func (c *JWTConfig) build(ctx caddy.Context, resource *url.URL) (*policy.JWTVerifier, error) {
	cfg := policy.JWTConfig{
		Issuer:       c.Issuer,
		Audiences:    c.Audiences,
		Algorithms:   c.Algorithms,
		JWKSURL:      c.JWKSURL,
		Leeway:       time.Duration(c.Leeway),
		MachineScope: c.MachineScope,
		Logger:       slog.New(zapslog.NewHandler(ctx.Logger().Named("jwt").Core())),
	}
	if len(cfg.Audiences) == 0 {
		if !resource.IsAbs() {
			return nil, fmt.Errorf("jwt: set `audience` in the jwt block, or give `resource` as an absolute URL: a JWT must be issued for this resource")
		}
		cfg.Audiences = []string{resource.String()}
	}
	if c.PublicKeyFile != "" {
		pem, err := configfile.Read(c.PublicKeyFile)
		if err != nil {
			return nil, fmt.Errorf("jwt public_key_file: %w; give the path of the identity provider's public key, in PEM", err)
		}
		if len(pem) == 0 {
			return nil, fmt.Errorf("jwt public_key_file %s is empty; give the path of the identity provider's public key, in PEM", c.PublicKeyFile)
		}
		cfg.PublicKeyPEM = pem
	}
	// Key fetches leave through the origin-pinned client: a JWKS endpoint
	// that redirects elsewhere, or resolves to a private address, is refused.
	var hc *http.Client
	if c.JWKSURL != "" {
		var err error
		if hc, err = pinnedfetch.New(c.JWKSURL, nil); err != nil {
			return nil, fmt.Errorf("jwt jwks_url: %w", err)
		}
	}
	v, err := policy.NewJWTVerifier(ctx, cfg, hc)
	if err != nil {
		if pe := (*policy.PEMError)(nil); errors.As(err, &pe) && c.PublicKeyFile != "" {
			return nil, fmt.Errorf("jwt public_key_file %s: %s", c.PublicKeyFile, pe.Reason)
		}
		return nil, err
	}
	return v, nil
}

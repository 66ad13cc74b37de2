package upstreamauth

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/oauthex"

	"github.com/Tahul/caddy-zidane-mcp/pinnedfetch"
)

// challenge is what a 401 or 403 answer of the upstream said in its
// WWW-Authenticate Bearer challenge.
type challenge struct {
	ResourceMetadata string
	Scopes           []string
	Error            string
	At               time.Time
}

// parseChallenge reads the Bearer or DPoP challenge of resp (nil when
// there is none or it does not parse): both name the resource metadata
// and the scopes the same way (RFC 6750 §3, RFC 9449 §7.1).
func parseChallenge(h http.Header, now time.Time) *challenge {
	values := h.Values("WWW-Authenticate")
	if len(values) == 0 {
		return nil
	}
	cs, err := oauthex.ParseWWWAuthenticate(values)
	if err != nil {
		return nil
	}
	for _, c := range cs {
		if c.Scheme != "bearer" && c.Scheme != "dpop" {
			continue
		}
		ch := &challenge{ResourceMetadata: c.Params["resource_metadata"], Error: c.Params["error"], At: now}
		for _, s := range strings.Fields(c.Params["scope"]) {
			if validScope(s) && len(ch.Scopes) < MaxScopes {
				ch.Scopes = append(ch.Scopes, s)
			}
		}
		return ch
	}
	return nil
}

// asMeta is an authorization server's metadata with what oauthex does not
// read: the DPoP algorithms (RFC 9449 §5.1).
type asMeta struct {
	oauthex.AuthServerMeta
	DPoPSigningAlgValuesSupported []string `json:"dpop_signing_alg_values_supported,omitempty"`
}

// server is what discovery found about an upstream's authorization.
type server struct {
	Resource string // the resource indicator to request tokens for
	// PRMScopes is the resource's scopes_supported.
	PRMScopes []string
	// DPoPRequired is the resource's dpop_bound_access_tokens_required.
	DPoPRequired bool `json:",omitempty"`
	// Legacy: no protected resource metadata, the 2025-03-26 rules.
	Legacy bool
	Meta   asMeta
	// NoMeta: no metadata document at all; the endpoints are the
	// 2025-03-26 defaults at the server's root.
	NoMeta bool
}

// probeBody is the unauthenticated request sent to learn the upstream's
// challenge: a JSON-RPC ping, which has no effect on any server.
const probeBody = `{"jsonrpc":"2.0","id":"zidane-oauth-probe","method":"ping"}`

// probe sends one unauthenticated request to the MCP endpoint and returns
// the challenge of its 401 or 403 answer, or nil.
func (c *Client) probe(ctx context.Context) *challenge {
	hc, err := c.egress.client(c.mcpURL, true)
	if err != nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.mcpURL, strings.NewReader(probeBody))
	if err != nil {
		return nil
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	resp, err := hc.Do(req)
	if err != nil {
		c.logger.Debug("upstream oauth: probe failed", "upstream", c.name, "error", unwrapURLError(err).Error())
		return nil
	}
	// Only the headers matter; a streaming answer is not read.
	io.CopyN(io.Discard, resp.Body, 4<<10)
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized && resp.StatusCode != http.StatusForbidden {
		return nil
	}
	return parseChallenge(resp.Header, c.now())
}

// prmCandidates lists where the protected resource metadata may be, in
// the order of the MCP spec (2025-11-25): the challenge's
// resource_metadata, then the well-known URI with the endpoint's path,
// then at the root; each with the resource it must name.
func prmCandidates(metadataURL, mcpURL string) [][2]string {
	var out [][2]string
	if metadataURL != "" {
		out = append(out, [2]string{metadataURL, mcpURL})
	}
	u, err := url.Parse(mcpURL)
	if err != nil {
		return out
	}
	root := *u
	root.Path, root.RawPath, root.RawQuery, root.Fragment = "", "", "", ""
	if p := strings.Trim(u.Path, "/"); p != "" {
		w := root
		w.Path = "/.well-known/oauth-protected-resource/" + p
		out = append(out, [2]string{w.String(), mcpURL})
	}
	w := root
	w.Path = "/.well-known/oauth-protected-resource"
	out = append(out, [2]string{w.String(), root.String()})
	return out
}

// asMetadataCandidates lists the metadata URLs of an issuer (RFC 8414
// with path insertion, OpenID Connect Discovery with insertion and with
// appending).
func asMetadataCandidates(issuer string) []string {
	u, err := url.Parse(issuer)
	if err != nil {
		return nil
	}
	u.RawQuery, u.Fragment = "", ""
	p := strings.Trim(u.Path, "/")
	mk := func(path string) string { c := *u; c.Path, c.RawPath = path, ""; return c.String() }
	if p == "" {
		return []string{mk("/.well-known/oauth-authorization-server"), mk("/.well-known/openid-configuration")}
	}
	return []string{
		mk("/.well-known/oauth-authorization-server/" + p),
		mk("/.well-known/openid-configuration/" + p),
		mk("/" + p + "/.well-known/openid-configuration"),
	}
}

func issuersEqual(a, b string) bool {
	return strings.TrimSuffix(a, "/") == strings.TrimSuffix(b, "/")
}

// discover finds the upstream's authorization server: the protected
// resource metadata (RFC 9728) located from ch or the well-known URIs,
// then the server's metadata (RFC 8414 / OpenID), with the 2025-03-26
// fallbacks when the upstream publishes no resource metadata.
//
// A metadata document that names another resource than the upstream's is
// an error, not a reason to look further: the upstream would be handing
// the gateway's token to someone else.
func (c *Client) discover(ctx context.Context, ch *challenge) (*server, error) {
	metadataURL := ""
	if ch != nil {
		metadataURL = ch.ResourceMetadata
	}
	var prm *oauthex.ProtectedResourceMetadata
	for _, cand := range prmCandidates(metadataURL, c.mcpURL) {
		var doc oauthex.ProtectedResourceMetadata
		err := c.egress.getJSON(ctx, cand[0], &doc)
		if errors.Is(err, errNotFound) {
			continue
		}
		if err != nil {
			if cand[0] == metadataURL {
				// The upstream pointed there: say why it failed.
				return nil, fmt.Errorf("protected resource metadata: %v", err)
			}
			c.logger.Debug("upstream oauth: protected resource metadata not usable", "upstream", c.name, "url", shown(cand[0]), "error", err.Error())
			continue
		}
		if doc.Resource != cand[1] {
			return nil, fmt.Errorf("the protected resource metadata at %s is for resource %q, not this upstream (%s); refusing to get a token for another resource", shown(cand[0]), clip(doc.Resource, 200), shown(cand[1]))
		}
		if len(doc.AuthorizationServers) == 0 {
			return nil, fmt.Errorf("the protected resource metadata at %s lists no authorization_servers", shown(cand[0]))
		}
		prm = &doc
		break
	}
	if prm == nil {
		return c.discoverLegacy(ctx)
	}
	issuer := prm.AuthorizationServers[0]
	if c.cfg.AuthorizationServer != "" {
		i := slices.IndexFunc(prm.AuthorizationServers, func(s string) bool { return issuersEqual(s, c.cfg.AuthorizationServer) })
		if i < 0 {
			return nil, fmt.Errorf("authorization_server %s is not one the upstream lists (%s)", c.cfg.AuthorizationServer, strings.Join(prm.AuthorizationServers, ", "))
		}
		issuer = prm.AuthorizationServers[i]
	}
	if err := checkURL(issuer); err != nil {
		return nil, fmt.Errorf("authorization server %s: %v", shown(issuer), err)
	}
	meta, err := c.authServerMeta(ctx, issuer)
	if err != nil {
		return nil, err
	}
	if meta == nil {
		return nil, fmt.Errorf("the authorization server %s publishes no metadata (tried %s)", shown(issuer), strings.Join(asMetadataCandidates(issuer), ", "))
	}
	return &server{Resource: prm.Resource, PRMScopes: validScopes(prm.ScopesSupported), DPoPRequired: prm.DPOPBoundAccessTokensRequired, Meta: *meta}, nil
}

// authServerMeta fetches and checks the metadata of issuer; nil when no
// candidate location has it.
func (c *Client) authServerMeta(ctx context.Context, issuer string) (*asMeta, error) {
	for _, cand := range asMetadataCandidates(issuer) {
		var meta asMeta
		err := c.egress.getJSON(ctx, cand, &meta)
		if errors.Is(err, errNotFound) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("authorization server metadata: %v", err)
		}
		if !issuersEqual(meta.Issuer, issuer) {
			return nil, fmt.Errorf("the authorization server metadata at %s names issuer %q, not %s (RFC 8414 §3.3)", shown(cand), clip(meta.Issuer, 200), shown(issuer))
		}
		if err := checkEndpoints(&meta.AuthServerMeta); err != nil {
			return nil, err
		}
		return &meta, nil
	}
	return nil, nil
}

// discoverLegacy applies the 2025-03-26 rules: the authorization base URL
// is the MCP server's origin; its RFC 8414 metadata is at the root
// well-known URI; without it, the endpoints are /authorize, /token and
// /register there.
func (c *Client) discoverLegacy(ctx context.Context) (*server, error) {
	u, err := url.Parse(c.mcpURL)
	if err != nil {
		return nil, err
	}
	base := *u
	base.Path, base.RawPath, base.RawQuery, base.Fragment = "", "", "", ""
	origin := base.String()
	var meta asMeta
	err = c.egress.getJSON(ctx, origin+"/.well-known/oauth-authorization-server", &meta)
	switch {
	case errors.Is(err, errNotFound):
		return &server{
			Resource: c.mcpURL,
			Legacy:   true,
			NoMeta:   true,
			Meta: asMeta{AuthServerMeta: oauthex.AuthServerMeta{
				Issuer:                origin,
				AuthorizationEndpoint: origin + "/authorize",
				TokenEndpoint:         origin + "/token",
				RegistrationEndpoint:  origin + "/register",
			}},
		}, nil
	case err != nil:
		return nil, fmt.Errorf("authorization server metadata: %v", err)
	}
	// In 2025-03-26 the issuer is not known beforehand: the document found
	// at the MCP server's root is taken for its authorization server, and
	// its issuer may carry a path (https://host/oauth). It must stay on
	// the MCP server's origin: anything else is a third party the
	// resource never named.
	iu, err := url.Parse(meta.Issuer)
	if err != nil || pinnedfetch.Origin(iu) != pinnedfetch.Origin(u) {
		return nil, fmt.Errorf("the authorization server metadata at %s/.well-known/oauth-authorization-server names issuer %q, which is not on the MCP server's origin; publish protected resource metadata (RFC 9728) to name another authorization server", origin, clip(meta.Issuer, 200))
	}
	if err := checkEndpoints(&meta.AuthServerMeta); err != nil {
		return nil, err
	}
	return &server{Resource: c.mcpURL, Legacy: true, Meta: meta}, nil
}

// checkEndpoints applies the egress rule to the endpoints the gateway
// calls or sends the operator to.
func checkEndpoints(m *oauthex.AuthServerMeta) error {
	for _, e := range []struct{ name, value string }{
		{"authorization_endpoint", m.AuthorizationEndpoint},
		{"token_endpoint", m.TokenEndpoint},
		{"registration_endpoint", m.RegistrationEndpoint},
		{"revocation_endpoint", m.RevocationEndpoint},
	} {
		if e.value == "" {
			continue
		}
		if err := checkURL(e.value); err != nil {
			return fmt.Errorf("authorization server metadata: %s %s: %v", e.name, shown(e.value), err)
		}
	}
	if m.TokenEndpoint == "" {
		return errors.New("authorization server metadata has no token_endpoint")
	}
	return nil
}

func validScopes(in []string) []string {
	var out []string
	for _, s := range in {
		if validScope(s) && len(out) < MaxScopes {
			out = append(out, s)
		}
	}
	return out
}

// union returns the scopes of a then those of b not in a, without
// duplicates, bounded by MaxScopes.
func union(a, b []string) []string {
	var out []string
	for _, s := range slices.Concat(a, b) {
		if !slices.Contains(out, s) && len(out) < MaxScopes {
			out = append(out, s)
		}
	}
	return out
}

// covers reports whether granted holds every scope of need.
func covers(granted, need []string) bool {
	for _, s := range need {
		if !slices.Contains(granted, s) {
			return false
		}
	}
	return true
}

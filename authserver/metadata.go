package authserver

import (
	"encoding/json"
	"net/http"
	"slices"

	"github.com/modelcontextprotocol/go-sdk/oauthex"

	"github.com/Tahul/caddy-zidane-mcp/dpop"
)

// Metadata is the server's RFC 8414 document: go-sdk's type, with the
// member it lacks (RFC 9449 §5.1's dpop_signing_alg_values_supported).
type Metadata struct {
	oauthex.AuthServerMeta
	DPoPSigningAlgValuesSupported []string `json:"dpop_signing_alg_values_supported"`
}

// MarshalJSON writes the document without jwks_uri, which go-sdk's type
// always writes: this server signs nothing a client verifies (its tokens
// are opaque), and an empty jwks_uri fails the TypeScript SDK's check that
// it is a URL.
func (m Metadata) MarshalJSON() ([]byte, error) {
	type plain Metadata // no MarshalJSON: no recursion
	raw, err := json.Marshal(plain(m))
	if err != nil {
		return nil, err
	}
	var members map[string]json.RawMessage
	if err := json.Unmarshal(raw, &members); err != nil {
		return nil, err
	}
	if m.JWKSURI == "" {
		delete(members, "jwks_uri")
	}
	return json.Marshal(members)
}

// Metadata returns the server's document.
func (s *Server) Metadata() Metadata {
	var scopes []string
	for _, res := range s.cfg.Resources.All() {
		for _, sc := range res.Scopes {
			if !slices.Contains(scopes, sc) {
				scopes = append(scopes, sc)
			}
		}
	}
	slices.Sort(scopes)
	algs := make([]string, len(dpop.Algorithms))
	for i, a := range dpop.Algorithms {
		algs[i] = string(a)
	}
	m := Metadata{
		AuthServerMeta: oauthex.AuthServerMeta{
			Issuer:                                     s.issuer,
			AuthorizationEndpoint:                      s.issuer + AuthorizePath,
			TokenEndpoint:                              s.issuer + TokenPath,
			RevocationEndpoint:                         s.issuer + RevokePath,
			ScopesSupported:                            scopes,
			ResponseTypesSupported:                     []string{"code"},
			ResponseModesSupported:                     []string{"query"},
			GrantTypesSupported:                        []string{"authorization_code", "refresh_token"},
			TokenEndpointAuthMethodsSupported:          []string{"none"},
			RevocationEndpointAuthMethodsSupported:     []string{"none"},
			CodeChallengeMethodsSupported:              []string{"S256"},
			ClientIDMetadataDocumentSupported:          true,
			AuthorizationResponseIssParameterSupported: true,
		},
		DPoPSigningAlgValuesSupported: algs,
	}
	if s.cfg.Register != nil {
		m.RegistrationEndpoint = s.issuer + RegisterPath
	}
	return m
}

func (s *Server) serveMetadata(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		s.audit(r, Refusal{Error: "invalid_request", Reason: "the metadata is read with GET"})
		http.Error(w, "the metadata is read with GET", http.StatusMethodNotAllowed)
		return
	}
	body, err := json.Marshal(s.Metadata())
	if err != nil {
		http.Error(w, "metadata unavailable", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "max-age=300")
	_, _ = w.Write(body)
}

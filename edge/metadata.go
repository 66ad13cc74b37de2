package edge

import (
	"encoding/json"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/oauthex"
)

// WellKnownResource is where RFC 9728 protected-resource metadata is
// served: at this path, and at this path followed by the resource's path.
const WellKnownResource = "/.well-known/oauth-protected-resource"

// ProtectedResource is the MCP server a site is, as its clients know it:
// what its RFC 9728 metadata says, and where the challenges of its
// refusals point.
type ProtectedResource struct {
	// URL is the configured resource: absolute, or a path alone, whose
	// scheme and host are then each request's.
	URL *url.URL
	// AuthorizationServers are the issuers whose access tokens the site
	// takes (its JWT issuer), if any.
	AuthorizationServers []string
	// Scopes are the scopes its rules know, for scopes_supported.
	Scopes []string
	// DPoPAlgs are the DPoP proof algorithms it verifies (see
	// [DPoPAlgorithms]); empty when it can check no proof.
	DPoPAlgs []string
	// DPoPRequired says it takes DPoP-bound access tokens only.
	DPoPRequired bool
}

// ResourceURL is the absolute URL of the resource for r.
func (res ProtectedResource) ResourceURL(r *http.Request) string {
	if res.URL.IsAbs() {
		return res.URL.String()
	}
	return requestOrigin(r) + res.URL.Path
}

// MetadataURL is where r's client finds the metadata.
func (res ProtectedResource) MetadataURL(r *http.Request) string {
	if res.URL.IsAbs() {
		u := *res.URL
		u.Path = WellKnownResource + strings.TrimSuffix(res.URL.Path, "/")
		return u.String()
	}
	return requestOrigin(r) + WellKnownResource + strings.TrimSuffix(res.URL.Path, "/")
}

// requestOrigin is r's scheme and Host: for a resource configured as a
// path alone, which names no host, a client reaches it where it asked.
func requestOrigin(r *http.Request) string {
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	return scheme + "://" + r.Host
}

// ServesMetadata says whether path is one of the metadata documents.
func (res ProtectedResource) ServesMetadata(path string) bool {
	return path == WellKnownResource || path == WellKnownResource+strings.TrimSuffix(res.URL.Path, "/")
}

// Metadata is the RFC 9728 document of the resource for r.
func (res ProtectedResource) Metadata(r *http.Request) oauthex.ProtectedResourceMetadata {
	return oauthex.ProtectedResourceMetadata{
		Resource:               res.ResourceURL(r),
		AuthorizationServers:   res.AuthorizationServers,
		ScopesSupported:        res.Scopes,
		BearerMethodsSupported: []string{"header"},
		ResourceName:           "caddy-zidane-mcp",

		DPOPSigningAlgValuesSupported: res.DPoPAlgs,
		DPOPBoundAccessTokensRequired: res.DPoPRequired,
	}
}

// ServeMetadata answers a request for the metadata: GET or HEAD, else 405.
func (res ProtectedResource) ServeMetadata(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, http.StatusText(http.StatusMethodNotAllowed), http.StatusMethodNotAllowed)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "max-age=300")
	_ = json.NewEncoder(w).Encode(res.Metadata(r))
}

// AgentBase is where the agents of sessions that r creates reach this
// gateway: the resource's origin when it is absolute, else the listener r
// arrived on (scheme://ip:port, which the client cannot choose), never r's
// Host or X-Forwarded-* headers. The URLs handed to agents carry their
// tokens. Empty when neither gives one (a unix socket).
func (res ProtectedResource) AgentBase(r *http.Request) string {
	if res.URL.IsAbs() {
		return res.URL.Scheme + "://" + res.URL.Host
	}
	addr, ok := r.Context().Value(http.LocalAddrContextKey).(*net.TCPAddr)
	if !ok {
		return ""
	}
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	return scheme + "://" + net.JoinHostPort(addr.IP.String(), strconv.Itoa(addr.Port))
}

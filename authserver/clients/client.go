package clients

import (
	"net/url"
	"time"
)

// Where a client comes from ([Client.Source]).
const (
	// SourceMetadataDocument: the client_id is an https URL, and the
	// client is what the document at that URL says.
	SourceMetadataDocument = "metadata-document"
	// SourceRegistered: the client registered itself through dynamic
	// registration (RFC 7591) and is kept in storage.
	SourceRegistered = "registered"
)

// Client is an OAuth client this server accepts: a public client (no
// secret; token endpoint authentication "none") using the authorization
// code flow with PKCE.
type Client struct {
	// ID is the client_id: an https URL for a metadata document, or the
	// id this server gave at registration.
	ID string `json:"client_id"`
	// Name is the client's client_name, as the client itself states it:
	// nothing vouches for it.
	Name string `json:"client_name,omitempty"`
	// RedirectURIs are the registered redirect URIs, each valid by
	// [CheckRedirectURI].
	RedirectURIs []string `json:"redirect_uris"`
	// Source is SourceMetadataDocument or SourceRegistered.
	Source string `json:"source"`
	// LogoURI and ClientURI are https URLs the client states, or "".
	LogoURI   string `json:"logo_uri,omitempty"`
	ClientURI string `json:"client_uri,omitempty"`
	// Scope is the space-separated scopes the client says it will restrict
	// itself to, or "" for no statement.
	Scope string `json:"scope,omitempty"`
	// IssuedAt is when a registered client was registered.
	IssuedAt time.Time `json:"issued_at,omitzero"`
	// LastUsed is when a registered client was last resolved, to within
	// a day; it expires when unused for the registry's RegisteredTTL.
	LastUsed time.Time `json:"last_used,omitzero"`
}

// ClientID returns the client_id.
func (c Client) ClientID() string { return c.ID }

// DisplayName is the name the client gives itself (client_name), or its
// client_id when it gave none. It is the client's claim, never a fact: a
// consent page shows it beside the client_id, which for a metadata
// document is the URL its domain serves. It is at most MaxNameLength
// bytes and has no control or formatting characters (a right-to-left
// override would make a name read backwards); a page still escapes it.
func (c Client) DisplayName() string {
	if c.Name != "" {
		return c.Name
	}
	return c.ID
}

// Host is the host of the client_id URL of a metadata-document client,
// "" for a registered client.
func (c Client) Host() string {
	if c.Source != SourceMetadataDocument {
		return ""
	}
	u, err := url.Parse(c.ID)
	if err != nil {
		return ""
	}
	return u.Host
}

// AllowsRedirect reports whether uri, the redirect_uri of an authorization
// request, matches one of the client's redirect URIs by [MatchRedirect].
func (c Client) AllowsRedirect(uri string) bool {
	for _, r := range c.RedirectURIs {
		if MatchRedirect(r, uri) == nil {
			return true
		}
	}
	return false
}

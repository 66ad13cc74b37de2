package clients

import (
	"encoding/json"
	"errors"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"unicode"

	"github.com/Tahul/caddy-zidane-mcp/message"
)

// Bounds on client metadata, registered or fetched.
const (
	// MaxMetadataBytes bounds a metadata document and a registration
	// request body.
	MaxMetadataBytes = 16 << 10
	// MaxRedirectURIs bounds the redirect URIs of one client.
	MaxRedirectURIs = 16
	// MaxNameLength bounds client_name, in bytes.
	MaxNameLength = 128
	// MaxScopeLength bounds scope, in bytes.
	MaxScopeLength = 1024
)

// metadataFields are the members this package reads (RFC 7591 §2, the
// client ID metadata document draft §4.1). Any other member is ignored, as
// RFC 7591 §2 asks, unless it is one of these spelled in another case,
// which encoding/json and other readers would take for it: that is
// refused, so that every reader reads the same client.
var metadataFields = []string{
	"client_id", "redirect_uris", "client_name", "client_uri", "logo_uri", "scope",
	"grant_types", "response_types", "token_endpoint_auth_method",
	"client_secret", "client_secret_expires_at",
}

// metadata is what a registration request or a metadata document says.
type metadata struct {
	clientID     string
	hasClientID  bool
	redirectURIs []string
	name         string
	clientURI    string
	logoURI      string
	scope        string
}

func badMetadata(reason, description string) *Error {
	return refuse(CodeInvalidClientMetadata, reason, description)
}

// parseMetadata reads client metadata: a JSON object read once (package
// message's rule: no member twice, no two names equal but for case, valid
// UTF-8), whose members are then taken by their exact names.
//
// Why not oauthex.ClientRegistrationMetadata: it is decoded with
// encoding/json, which matches member names case-insensitively, and it
// types jwks as a string where RFC 7591 has an object.
func parseMetadata(raw []byte) (metadata, error) {
	var m metadata
	if err := message.Validate(raw); err != nil {
		if errors.Is(err, message.ErrAmbiguous) {
			return m, badMetadata("ambiguous", "the client metadata is JSON that readers could read differently (a member twice, two names equal but for case, invalid UTF-8); send each member once")
		}
		return m, badMetadata("json", "the client metadata is not valid JSON; send one JSON object")
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(raw, &obj); err != nil || obj == nil {
		return m, badMetadata("json", "the client metadata must be one JSON object")
	}
	for k := range obj {
		for _, f := range metadataFields {
			if k != f && strings.EqualFold(k, f) {
				return m, badMetadata("ambiguous", "the client metadata spells a member in another case than RFC 7591 does; use "+f)
			}
		}
	}
	if _, ok := obj["client_secret"]; ok {
		return m, badMetadata("secret", "the client metadata carries a client_secret; this server accepts public clients only (token_endpoint_auth_method none) and never takes a shared secret")
	}
	if _, ok := obj["client_secret_expires_at"]; ok {
		return m, badMetadata("secret", "the client metadata carries client_secret_expires_at; this server accepts public clients only and never takes a shared secret")
	}
	if v, ok := obj["token_endpoint_auth_method"]; ok {
		var method string
		if json.Unmarshal(v, &method) != nil || method != "none" {
			return m, badMetadata("auth_method", "token_endpoint_auth_method must be \"none\" (or absent): this server accepts public clients using PKCE, without client_secret_basic, client_secret_post or other client authentication")
		}
	}
	if v, ok := obj["client_id"]; ok {
		if json.Unmarshal(v, &m.clientID) != nil {
			return m, badMetadata("client_id_mismatch", "client_id must be a string")
		}
		m.hasClientID = true
	}
	v, ok := obj["redirect_uris"]
	if !ok {
		return m, badMetadata("redirect_uris", "redirect_uris is required: list the client's redirect URIs")
	}
	if json.Unmarshal(v, &m.redirectURIs) != nil || len(m.redirectURIs) == 0 || len(m.redirectURIs) > MaxRedirectURIs {
		return m, badMetadata("redirect_uris", "redirect_uris must be an array of 1 to "+strconv.Itoa(MaxRedirectURIs)+" strings")
	}
	for _, u := range m.redirectURIs {
		if err := CheckRedirectURI(u); err != nil {
			return m, err
		}
	}
	if err := checkList(obj, "grant_types", "authorization_code"); err != nil {
		return m, err
	}
	if err := checkList(obj, "response_types", "code"); err != nil {
		return m, err
	}
	if m.name, ok = stringMember(obj, "client_name"); !ok || !displayable(m.name) {
		return m, badMetadata("client_name", "client_name must be a string of at most "+strconv.Itoa(MaxNameLength)+" bytes without control or formatting characters")
	}
	for _, f := range []struct {
		name string
		dst  *string
	}{{"client_uri", &m.clientURI}, {"logo_uri", &m.logoURI}} {
		s, ok := stringMember(obj, f.name)
		if !ok || (s != "" && !httpsURL(s)) {
			return m, badMetadata(f.name, f.name+" must be an https URL without userinfo or fragment, of at most "+strconv.Itoa(MaxRedirectURILength)+" bytes")
		}
		*f.dst = s
	}
	if m.scope, ok = stringMember(obj, "scope"); !ok || !validScope(m.scope) {
		return m, badMetadata("scope", "scope must be a string of space-separated scope tokens (RFC 6749 §3.3), at most "+strconv.Itoa(MaxScopeLength)+" bytes")
	}
	return m, nil
}

// stringMember returns obj's member name as a string; "" and true when
// absent, false when it is not a string.
func stringMember(obj map[string]json.RawMessage, name string) (string, bool) {
	v, ok := obj[name]
	if !ok {
		return "", true
	}
	var s string
	if json.Unmarshal(v, &s) != nil {
		return "", false
	}
	return s, true
}

// checkList checks an optional array member: when present, it is an
// array of at most 16 strings that holds need. Other values are ignored,
// not refused: a metadata document is written once for every server, and
// a client that also lists, say, the device grant may still use this one;
// the token endpoint serves only the grants this server has.
func checkList(obj map[string]json.RawMessage, name, need string) error {
	v, ok := obj[name]
	if !ok {
		return nil
	}
	var list []string
	if json.Unmarshal(v, &list) != nil || len(list) > 16 || !slices.Contains(list, need) {
		return badMetadata(name, name+" must be an array that lists "+need+": this server runs the authorization code flow with PKCE for public clients")
	}
	return nil
}

// displayable reports whether a name may be shown to a person as it is:
// bounded, and without control or formatting characters (a right-to-left
// override would make "moc.live" read as "evil.com").
func displayable(s string) bool {
	if len(s) > MaxNameLength {
		return false
	}
	for _, r := range s {
		if unicode.IsControl(r) || unicode.Is(unicode.Cf, r) || r == unicode.ReplacementChar {
			return false
		}
	}
	return true
}

// httpsURL reports whether s is an absolute https URL fit to show or link
// to from a consent page.
func httpsURL(s string) bool {
	if len(s) > MaxRedirectURILength || !strings.HasPrefix(s, "https://") || strings.ContainsAny(s, "#\\ \"'<>") {
		return false
	}
	u, err := url.Parse(s)
	return err == nil && u.User == nil && u.Host != "" && checkHost(u.Host, u.Hostname()) == ""
}

// validScope reports whether s is a space-separated list of scope tokens
// (RFC 6749 §3.3: %x21 / %x23-5B / %x5D-7E), bounded.
func validScope(s string) bool {
	if len(s) > MaxScopeLength {
		return false
	}
	if s == "" {
		return true
	}
	for tok := range strings.SplitSeq(s, " ") {
		if tok == "" {
			return false
		}
		for i := 0; i < len(tok); i++ {
			c := tok[i]
			if c < 0x21 || c == '"' || c == '\\' || c > 0x7e {
				return false
			}
		}
	}
	return true
}

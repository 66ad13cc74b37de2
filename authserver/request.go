package authserver

import (
	"crypto/hkdf"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"strings"
)

// params are the parameters this server reads, by endpoint. A parameter
// spelled like one of them in another letter case is refused: a reader
// that folds case would take it for the one this server read.
var params = []string{
	"client_id", "redirect_uri", "response_type", "scope", "state", "code_challenge",
	"code_challenge_method", "resource", "dpop_jkt", "grant_type", "code", "code_verifier",
	"refresh_token", "token", "token_type_hint", "client_secret", "client_assertion",
	"client_assertion_type", "request", "csrf", "decision",
}

// errDuplicate is a parameter given twice, or in two letter cases.
type errDuplicate struct{ name string }

func (e errDuplicate) Error() string {
	return fmt.Sprintf("the parameter %s is given more than once (or in two letter cases); send it once", e.name)
}

// readValues parses an application/x-www-form-urlencoded string (a query
// or a form body) with one reading: a bad escape or a semicolon is
// refused (url.ParseQuery's own rule), and so is a parameter given twice
// or spelled like a known one in another case, except the names in multi,
// which a form may repeat. With an errDuplicate it returns the values
// too, so that the caller may still say where the refusal goes.
func readValues(raw string, multi ...string) (url.Values, error) {
	v, err := url.ParseQuery(raw)
	if err != nil {
		return nil, errors.New("the parameters do not parse as application/x-www-form-urlencoded (a bad %-escape, or a ';')")
	}
	// Known names in params' order, so that a request with two faults
	// is refused for the same one every time, client_id and
	// redirect_uri first.
	for _, p := range params {
		n, variant := len(v[p]), false
		for name := range v {
			if name != p && strings.EqualFold(name, p) {
				variant = true
			}
		}
		if variant || (n > 1 && !contains(multi, p)) {
			return v, errDuplicate{p}
		}
	}
	return v, nil
}

func contains(list []string, s string) bool {
	for _, l := range list {
		if l == s {
			return true
		}
	}
	return false
}

// readForm reads r's body as a bounded form, posted with the form content
// type.
func readForm(r *http.Request, multi ...string) (url.Values, error) {
	mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil || mt != "application/x-www-form-urlencoded" {
		return nil, errors.New("post the parameters as application/x-www-form-urlencoded")
	}
	if len(r.URL.RawQuery) > 0 {
		// One place for each parameter: a query beside a form body is a
		// second reader's input.
		return nil, errors.New("send the parameters in the body alone, with no query string")
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, maxForm+1))
	if err != nil {
		return nil, errors.New("the body could not be read")
	}
	if len(body) > maxForm {
		return nil, fmt.Errorf("the body is over %d bytes", maxForm)
	}
	return readValues(string(body), multi...)
}

// isB64SHA256 says whether s is an unpadded base64url SHA-256 value: a
// PKCE S256 challenge, or a JWK thumbprint, in its one spelling (strict
// decoding: a last character with bits the value does not use is a second
// spelling, which would match no verifier and no key, compared as strings
// as both are; the token store reads a thumbprint so too).
func isB64SHA256(s string) bool {
	if len(s) != 43 {
		return false
	}
	b, err := base64.RawURLEncoding.Strict().DecodeString(s)
	return err == nil && len(b) == sha256.Size
}

// isVerifier says whether s is a PKCE code_verifier (RFC 7636 §4.1):
// 43 to 128 unreserved characters.
func isVerifier(s string) bool {
	if len(s) < 43 || len(s) > 128 {
		return false
	}
	for _, c := range []byte(s) {
		switch {
		case c >= 'A' && c <= 'Z', c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '-', c == '.', c == '_', c == '~':
		default:
			return false
		}
	}
	return true
}

// s256 is the S256 challenge of verifier.
func s256(verifier string) string {
	sum := sha256.Sum256([]byte(verifier))
	return base64.RawURLEncoding.EncodeToString(sum[:])
}

// deriveKey derives a key for one purpose from the configured key, so
// that the sealing key never doubles as a MAC key.
func deriveKey(key []byte, purpose string) []byte {
	k, err := hkdf.Key(sha256.New, key, nil, purpose, 32)
	if err != nil {
		// hkdf.Key fails only for a length over 255 hashes.
		panic(err)
	}
	return k
}

// canonicalResource is uri with its scheme and host in lower case, which
// the MCP authorization rules ask a server to accept (a resource's
// canonical form is lower case); nothing else is normalized. Empty when
// uri is not an absolute URL without a fragment.
func canonicalResource(uri string) string {
	u, err := url.Parse(uri)
	if err != nil || !u.IsAbs() || u.Host == "" || u.Fragment != "" || u.User != nil {
		return ""
	}
	u.Scheme = strings.ToLower(u.Scheme)
	u.Host = strings.ToLower(u.Host)
	return u.String()
}

// checkRedirectShape refuses a redirect URI no client may have: one that
// is not https, or http on a loopback address (RFC 8252 §7.3), or that
// has a fragment (RFC 6749 §3.1.2) or user information. The client's own
// list is checked after it.
func checkRedirectShape(uri string) error {
	u, err := url.Parse(uri)
	if err != nil || !u.IsAbs() || u.Host == "" {
		return errors.New("the redirect_uri is not an absolute URL")
	}
	if u.Fragment != "" || strings.Contains(uri, "#") {
		return errors.New("the redirect_uri has a fragment, which a redirect URI may not have")
	}
	if u.User != nil {
		return errors.New("the redirect_uri has user information, which a redirect URI may not have")
	}
	switch u.Scheme {
	case "https":
		return nil
	case "http":
		if isLoopbackHost(u.Hostname()) {
			return nil
		}
		return errors.New("the redirect_uri is plain http off loopback; a redirect URI is https, or http on 127.0.0.1, [::1] or localhost")
	}
	return errors.New("the redirect_uri's scheme is neither https nor http on loopback")
}

// withParams returns uri with the parameters added to its query, keeping
// the query it had as it was written (RFC 6749 §3.1.2: the endpoint URI's
// query is retained).
func withParams(uri string, add url.Values) string {
	u, err := url.Parse(uri)
	if err != nil {
		return uri
	}
	if u.RawQuery != "" {
		u.RawQuery += "&" + add.Encode()
	} else {
		u.RawQuery = add.Encode()
	}
	return u.String()
}

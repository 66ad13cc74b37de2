package htmlpage

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/url"
	"strings"

	"github.com/Tahul/caddy-zidane-mcp/pinnedfetch"
)

// Form is what a page needs to take its own forms back: the origin they
// must be posted from (for formpost.Read) and the tokens that bind each
// form to what it was shown for (a person, an approval), so that a form
// shown to one person is good for no other.
type Form struct {
	origin  string
	key     []byte
	purpose string
}

// NewForm returns the forms of a page on the site origin (an absolute
// http(s) URL: the sign-in site's issuer), with tokens made under key (32
// bytes) for purpose: a name of the page, so that one page's token is
// never another's even under one key.
func NewForm(origin string, key []byte, purpose string) (*Form, error) {
	u, err := url.Parse(origin)
	if err != nil || u.Host == "" || (u.Scheme != "https" && u.Scheme != "http") {
		return nil, errors.New("the sign-in origin must be an absolute http(s) URL")
	}
	if len(key) != 32 {
		return nil, errors.New("the key must be 32 bytes")
	}
	if purpose == "" || strings.ContainsRune(purpose, 0) {
		return nil, errors.New("a form's purpose is a name, without NUL")
	}
	return &Form{origin: pinnedfetch.Origin(u), key: key, purpose: purpose}, nil
}

// Origin is the site's origin, as pinnedfetch spells it: the site a post
// must come from.
func (f *Form) Origin() string { return f.origin }

// Token is the token of the form shown for fields (e.g. a person's owner
// id and an approval's id): HMAC-SHA256 under the key of the purpose and
// the fields, each after a NUL, in hex: the pages' tokens before this
// package, so a form shown before an upgrade answers after it. A field
// holding NUL would read as two; the pages' fields are owner ids, which
// the sign-in gives, and approval ids, which the store must know, so a
// token for a shifted split names no form a person was shown.
func (f *Form) Token(fields ...string) string {
	m := hmac.New(sha256.New, f.key)
	m.Write([]byte(f.purpose))
	for _, x := range fields {
		m.Write([]byte{0})
		m.Write([]byte(x))
	}
	return hex.EncodeToString(m.Sum(nil))
}

// Valid reports, in constant time, whether token is [Form.Token] of
// fields.
func (f *Form) Valid(token string, fields ...string) bool {
	return hmac.Equal([]byte(token), []byte(f.Token(fields...)))
}

package idp

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/internal/seal"
)

// The cookies' names. On an https site each takes the __Host- prefix, which
// a browser keeps only for a Secure cookie set by this host with Path=/
// and no Domain, so that no sibling subdomain can plant one.
const (
	sessionCookie = "zidane-signin"
	flowCookie    = "zidane-signin-flow"
)

const (
	// DefaultSessionLifetime is how long a sign-in lasts: long enough to
	// consent to a few clients, short because a cookie cannot be revoked.
	DefaultSessionLifetime = time.Hour
	// MaxSessionLifetime bounds a configured lifetime.
	MaxSessionLifetime = 24 * time.Hour
	// flowLifetime bounds one sign-in at the IdP, or the wait for a link.
	flowLifetime = 10 * time.Minute
	// clockSkew is how far in the future an issued-at may be: the
	// replicas that seal and open a cookie read different clocks.
	clockSkew = time.Minute
	// maxCookieBytes bounds a cookie this package reads or writes.
	maxCookieBytes = 3800
)

// sessionValue is what the session cookie holds, sealed.
type sessionValue struct {
	Owner  string   `json:"o"`
	Name   string   `json:"n"`
	Scopes []string `json:"s"`
	IAT    int64    `json:"iat"`
	EXP    int64    `json:"exp"`
}

// flowValue is what the flow cookie holds, sealed: one sign-in under way in
// this browser. Kind "oidc" is a trip to the IdP (state, nonce and PKCE
// verifier); kind "link" is a wait for a sign-in link, with only the path
// to come back to.
type flowValue struct {
	Kind     string `json:"k"`
	State    string `json:"st,omitempty"`
	Nonce    string `json:"no,omitempty"`
	Verifier string `json:"v,omitempty"`
	Return   string `json:"r,omitempty"`
	IAT      int64  `json:"iat"`
	EXP      int64  `json:"exp"`
}

// jar seals and opens the two cookies of one site.
type jar struct {
	session, flow *seal.Sealer
	secure        bool   // an https site: Secure and __Host-
	ad            []byte // the site's origin: a cookie of one site opens on no other
	lifetime      time.Duration
	now           func() time.Time
}

func newJar(key []byte, origin string, secure bool, lifetime time.Duration, now func() time.Time) (*jar, error) {
	s, err := seal.New(key, "signin session")
	if err != nil {
		return nil, err
	}
	f, err := seal.New(key, "signin flow")
	if err != nil {
		return nil, err
	}
	return &jar{session: s, flow: f, secure: secure, ad: seal.AD(origin), lifetime: lifetime, now: now}, nil
}

func (j *jar) name(base string) string {
	if j.secure {
		return "__Host-" + base
	}
	return base
}

// set writes cookie name with value for maxAge (a negative maxAge deletes
// it).
func (j *jar) set(w http.ResponseWriter, name, value string, maxAge time.Duration) {
	c := &http.Cookie{Name: j.name(name), Value: value, Path: "/", HttpOnly: true, Secure: j.secure, SameSite: http.SameSiteLaxMode}
	if maxAge < 0 {
		c.MaxAge = -1
	} else {
		c.MaxAge = int(maxAge / time.Second)
	}
	http.SetCookie(w, c)
}

// read returns the one cookie named name. Two of that name (one planted by
// a sibling host, or by plain http on a site that is https too) are not
// one reading: neither is read.
func (j *jar) read(r *http.Request, name string) (string, bool) {
	cs := r.CookiesNamed(j.name(name))
	if len(cs) != 1 || len(cs[0].Value) > maxCookieBytes {
		return "", false
	}
	return cs[0].Value, true
}

var errCookie = errors.New("the cookie does not open, or has expired")

func (j *jar) seal(s *seal.Sealer, v any) (string, error) {
	plain, err := json.Marshal(v)
	if err != nil {
		return "", err
	}
	out := base64.RawURLEncoding.EncodeToString(s.Seal(nil, plain, j.ad))
	if len(out) > maxCookieBytes {
		return "", errors.New("the sign-in is too large for a cookie: give the person fewer scopes")
	}
	return out, nil
}

func (j *jar) open(s *seal.Sealer, value string, v any) error {
	raw, err := base64.RawURLEncoding.Strict().DecodeString(value)
	if err != nil {
		return errCookie
	}
	plain, err := s.Open(nil, raw, j.ad)
	if err != nil {
		return errCookie
	}
	if json.Unmarshal(plain, v) != nil {
		return errCookie
	}
	return nil
}

// fresh reports whether a value issued at iat and expiring at exp is valid
// now and no longer lived than max.
func (j *jar) fresh(iat, exp int64, max time.Duration) bool {
	now := j.now()
	return exp > now.Unix() && iat <= now.Add(clockSkew).Unix() && exp-iat <= int64(max/time.Second)
}

// startSession signs the browser in as p.
func (j *jar) startSession(w http.ResponseWriter, p Person) error {
	now := j.now()
	v, err := j.seal(j.session, sessionValue{Owner: p.Owner, Name: p.Name, Scopes: p.Scopes, IAT: now.Unix(), EXP: now.Add(j.lifetime).Unix()})
	if err != nil {
		return err
	}
	j.set(w, sessionCookie, v, j.lifetime)
	return nil
}

// current is the person the request's session cookie names, if it opens,
// is fresh and names a person policy accepts.
func (j *jar) current(r *http.Request) (Person, bool) {
	raw, ok := j.read(r, sessionCookie)
	if !ok {
		return Person{}, false
	}
	var v sessionValue
	if j.open(j.session, raw, &v) != nil || !j.fresh(v.IAT, v.EXP, MaxSessionLifetime) {
		return Person{}, false
	}
	p := Person{Owner: v.Owner, Name: v.Name, Scopes: v.Scopes}
	if p.check() != nil {
		return Person{}, false
	}
	return p, true
}

// startFlow keeps f in the browser for flowLifetime.
func (j *jar) startFlow(w http.ResponseWriter, f flowValue) error {
	now := j.now()
	f.IAT, f.EXP = now.Unix(), now.Add(flowLifetime).Unix()
	v, err := j.seal(j.flow, f)
	if err != nil {
		return err
	}
	j.set(w, flowCookie, v, flowLifetime)
	return nil
}

// currentFlow is the sign-in under way in the request's browser.
func (j *jar) currentFlow(r *http.Request) (flowValue, bool) {
	raw, ok := j.read(r, flowCookie)
	if !ok {
		return flowValue{}, false
	}
	var f flowValue
	if j.open(j.flow, raw, &f) != nil || !j.fresh(f.IAT, f.EXP, flowLifetime) {
		return flowValue{}, false
	}
	return f, true
}

func (j *jar) endFlow(w http.ResponseWriter) { j.set(w, flowCookie, "", -1) }

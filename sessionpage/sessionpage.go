// Package sessionpage serves the read-only web page behind a session's
// `link`: its state, transcript and pending interactions. The URL carries a
// short-lived capability, a JWT signed with a key the gateway holds and bound
// to that one session, so the page needs no login and the link opens nothing
// else. It never changes a session: answering and steering happen through
// the MCP tools.
package sessionpage

import (
	"crypto/rand"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/Tahul/caddy-zidane-mcp/internal/htmlpage"
	"github.com/Tahul/caddy-zidane-mcp/policy"
	"github.com/Tahul/caddy-zidane-mcp/sessions"
)

// PathPrefix is where pages are served: PathPrefix + <session id>.
const PathPrefix = "/zidane/session/"

// audience keeps these capabilities from being taken for any other JWT.
const audience = "zidane-session-page"

// DefaultTTL is how long a link stays valid.
const DefaultTTL = time.Hour

// Signer issues and checks page capabilities.
type Signer struct {
	key []byte
	ttl time.Duration
	now func() time.Time
}

// NewSigner returns a signer with a fresh random key. Links it signs stop
// working when the process that holds the key ends, or after ttl.
func NewSigner(ttl time.Duration) *Signer {
	key := make([]byte, 32)
	rand.Read(key)
	if ttl <= 0 {
		ttl = DefaultTTL
	}
	return &Signer{key: key, ttl: ttl, now: time.Now}
}

// NewSignerKey returns a signer with key (at least 32 bytes): the key the
// replicas of a cluster derive from its cluster key, so that a link one
// signs opens on every other.
func NewSignerKey(key []byte, ttl time.Duration) (*Signer, error) {
	if len(key) < 32 {
		return nil, errors.New("sessionpage: a signing key has at least 32 bytes")
	}
	if ttl <= 0 {
		ttl = DefaultTTL
	}
	return &Signer{key: key, ttl: ttl, now: time.Now}, nil
}

// Link returns the page URL of sessionID under base (scheme://host).
func (s *Signer) Link(base, sessionID string) string {
	now := s.now()
	tok := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.RegisteredClaims{
		Subject:   sessionID,
		Audience:  jwt.ClaimStrings{audience},
		IssuedAt:  jwt.NewNumericDate(now),
		ExpiresAt: jwt.NewNumericDate(now.Add(s.ttl)),
	})
	signed, _ := tok.SignedString(s.key) // HMAC signing cannot fail with a key
	return strings.TrimSuffix(base, "/") + PathPrefix + url.PathEscape(sessionID) + "?cap=" + signed
}

// ErrCapability is returned for a missing, forged, expired or misbound
// capability.
var ErrCapability = errors.New("this session link is not valid")

// Verify checks that capability grants sessionID.
func (s *Signer) Verify(sessionID, capability string) error {
	if capability == "" {
		return fmt.Errorf("%w: it has no capability", ErrCapability)
	}
	var claims jwt.RegisteredClaims
	_, err := jwt.ParseWithClaims(capability, &claims, func(*jwt.Token) (any, error) { return s.key, nil },
		jwt.WithValidMethods([]string{jwt.SigningMethodHS256.Alg()}),
		jwt.WithAudience(audience),
		jwt.WithExpirationRequired(),
		jwt.WithTimeFunc(s.now))
	if err != nil {
		if errors.Is(err, jwt.ErrTokenExpired) {
			return fmt.Errorf("%w: it has expired; ask for the session again to get a fresh link", ErrCapability)
		}
		return fmt.Errorf("%w: it was not issued by this gateway", ErrCapability)
	}
	if claims.Subject != sessionID {
		return fmt.Errorf("%w: it belongs to another session", ErrCapability)
	}
	return nil
}

// Reader is who reads a session for its page, by the capability
// capability: the capability in the link, which the session's owner was
// given and which is bound to that one session, stands for the owner, so
// the page reads whoever's session it is. It has no token; the node of a
// cluster that runs the session for another replica checks the capability
// itself ([Signer.Verify]) before it reads for it.
func Reader(capability string) sessions.Owner {
	return sessions.Owner{TokenName: "session page", OtherSessions: sessions.AccessRead, OtherInteractions: sessions.AccessRead,
		Credential: capability}
}

// pageReads are what a page reads of a session, as a tool and a verb of
// the sessions endpoint.
var pageReads = map[[2]string]bool{{"sessions", "read"}: true, {"sessions", "transcript"}: true, {"interactions", "pending"}: true}

// ForwardedReader is the [Reader] of session sessionID by capability, on
// the node of a cluster that runs the session, for another replica's page
// of it: the capability is checked here, and is good only for what a page
// reads (tool with one of verbs: sessions read or transcript,
// interactions pending). Whoever holds the cluster key can send the node
// such a request, so the node takes no reader without a capability of
// that one session. An error for another use wraps
// [policy.ErrScopesClaimed]; one for the capability, [ErrCapability].
func (s *Signer) ForwardedReader(capability, sessionID, tool string, verbs []string) (sessions.Owner, error) {
	if err := s.Verify(sessionID, capability); err != nil {
		return sessions.Owner{}, err
	}
	if !slices.ContainsFunc(verbs, func(v string) bool { return pageReads[[2]string{tool, v}] }) {
		return sessions.Owner{}, fmt.Errorf("%w: a session page's reader asks for %s %s, and a page only reads its session", policy.ErrScopesClaimed, tool, strings.Join(verbs, " or "))
	}
	return Reader(capability), nil
}

// pageCSP: the page's style is inline, and it has no form and no script.
var pageCSP = htmlpage.MustCSP("style-src 'unsafe-inline'", "base-uri 'none'", "form-action 'none'", "frame-ancestors 'none'")

// Page serves session pages.
type Page struct {
	Sessions sessions.Sessions
	Signer   *Signer
}

// ServeHTTP answers GET PathPrefix<id>?cap=….
func (p *Page) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	// The capability is in the URL: no Referer may carry it elsewhere, and
	// the page loads nothing from anywhere. A refusal below is plain text
	// (http.Error sets its own Content-Type) under the same headers.
	htmlpage.SetHeaders(h, pageCSP, htmlpage.NoReferrer)
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		h.Set("Allow", "GET, HEAD")
		http.Error(w, "this page is read-only", http.StatusMethodNotAllowed)
		return
	}
	id, err := url.PathUnescape(strings.TrimPrefix(r.URL.Path, PathPrefix))
	if err != nil || id == "" || strings.Contains(id, "/") {
		http.Error(w, "no such session page", http.StatusNotFound)
		return
	}
	capability := r.URL.Query().Get("cap")
	if err := p.Signer.Verify(id, capability); err != nil {
		http.Error(w, err.Error(), http.StatusForbidden)
		return
	}
	reader := Reader(capability)
	view, err := p.Sessions.Read(reader, id, true)
	if err != nil {
		http.Error(w, "this session no longer exists", http.StatusNotFound)
		return
	}
	turns, _ := p.Sessions.Transcript(reader, id, 50, true)
	pending, _ := p.Sessions.Pending(reader, id)
	data := pageData{View: view, Turns: turns, Pending: pending, Now: time.Now().UTC()}
	if err := pageTemplate.Execute(w, data); err != nil {
		// Headers are out; the page is cut short and the error is the
		// connection's to report.
		return
	}
}

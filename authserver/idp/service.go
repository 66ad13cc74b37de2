package idp

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/internal/formpost"
	"github.com/Tahul/caddy-zidane-mcp/internal/replay"
	"github.com/Tahul/caddy-zidane-mcp/pinnedfetch"
	"github.com/Tahul/caddy-zidane-mcp/policy"
	"github.com/Tahul/caddy-zidane-mcp/storage"
)

// The paths the gateway serves this package at.
const (
	// CallbackPath is where the IdP sends the browser back: the redirect
	// URI to register at the IdP is the site's origin and this path.
	CallbackPath = "/zidane/signin/idp/callback"
	// LinkPath is where a sign-in link is opened (GET, a page with a
	// button) and redeemed (POST from that page).
	LinkPath = "/zidane/signin/link"
)

// Config sets up a [Service].
type Config struct {
	// Site is the origin this site is served at, from configuration
	// (https://gw.example.com; http only on loopback). The callback URL,
	// the cookies' form and the same-origin check of the link form come
	// from it, never from a request's Host.
	Site string
	// Key seals the cookies (seal.KeySize bytes): on a cluster one derived
	// from the cluster key, so that every replica opens what another
	// sealed; on one node a key of the process.
	Key []byte
	// SessionLifetime is how long a sign-in lasts: DefaultSessionLifetime
	// when zero, at most MaxSessionLifetime.
	SessionLifetime time.Duration
	// OIDC is the IdP people sign in through; nil for none.
	OIDC *OIDC
	// Links keeps the one-time sign-in links; nil for none.
	Links storage.Storage
	// KeepSignIns, when set, keeps each person's last sign-in through the
	// IdP (its ID token, and its refresh token when the IdP gave one),
	// sealed, for [Service.SubjectToken]: an upstream that trusts the same
	// IdP then gives the person their own token without a browser. Nil
	// keeps nothing.
	KeepSignIns storage.Storage
	// Audit receives every refusal. Optional.
	Audit func(Refusal)
	// SignedIn receives every sign-in, with how it was made ("idp" or
	// "link"), for the audit log. Optional.
	SignedIn func(p Person, via string)
	// Limit bounds the requests of one client address to the paths this
	// package serves (IPv6 by /64): DefaultLimit when zero.
	Limit policy.Limit
	// ClientIP is a request's client address, as the edge established it;
	// the peer's address when nil. Never X-Forwarded-For unchecked.
	ClientIP func(*http.Request) string
	// Now is time.Now when nil.
	Now func() time.Time
}

// DefaultLimit is an address's rate at the sign-in paths: a person's
// sign-in takes a few requests; a script that posts link secrets or
// replays IdP answers is slowed to this.
var DefaultLimit = policy.Limit{Rate: 2, Burst: 30}

// Refusal is one refused sign-in step, for the audit log. It never holds a
// secret, a code or a token.
type Refusal struct {
	Step   string // "callback", "link", "signin"
	Reason string // a short code: "state", "iss", "id_token", "no_scope", …
	Detail string // what the person was told
	Owner  string // when known
	Status int
}

// Service signs browsers in. It is safe for concurrent use.
type Service struct {
	origin string
	jar    *jar
	rp     *relyingParty // nil without an IdP
	links  *Links        // nil without links
	kept   *keeper       // nil: sign-ins are not kept
	states *replay.Check
	audit  func(Refusal)
	signed func(Person, string)
	limit  *policy.Limiter
	ip     func(*http.Request) string
	now    func() time.Time
}

// maxPendingStates bounds the states one node remembers as used.
const maxPendingStates = 1 << 16

// New checks cfg and returns its Service. It does not reach the IdP: its
// discovery document is read at the first sign-in, so that a gateway
// starts while its IdP is down.
func New(cfg Config) (*Service, error) {
	origin, err := SiteOrigin(cfg.Site)
	if err != nil {
		return nil, err
	}
	life := cfg.SessionLifetime
	if life == 0 {
		life = DefaultSessionLifetime
	}
	if life < time.Minute || life > MaxSessionLifetime {
		return nil, fmt.Errorf("signin session lifetime %s: give between 1m and %s", life, MaxSessionLifetime)
	}
	now := cfg.Now
	if now == nil {
		now = time.Now
	}
	j, err := newJar(cfg.Key, origin, strings.HasPrefix(origin, "https:"), life, now)
	if err != nil {
		return nil, fmt.Errorf("signin key: %w", err)
	}
	s := &Service{origin: origin, jar: j, states: replay.New(maxPendingStates, flowLifetime), audit: cfg.Audit, now: now}
	if cfg.OIDC != nil {
		if s.rp, err = newRelyingParty(*cfg.OIDC, webOrigin(origin)+CallbackPath); err != nil {
			return nil, err
		}
	}
	if cfg.Links != nil {
		s.links = NewLinks(cfg.Links, now)
	}
	if cfg.KeepSignIns != nil && s.rp != nil {
		if s.kept, err = newKeeper(cfg.KeepSignIns, cfg.Key); err != nil {
			return nil, fmt.Errorf("signin key: %w", err)
		}
	}
	if s.audit == nil {
		s.audit = func(Refusal) {}
	}
	if cfg.Limit == (policy.Limit{}) {
		cfg.Limit = DefaultLimit
	}
	if err := cfg.Limit.Validate(); err != nil {
		return nil, fmt.Errorf("signin limit: %w", err)
	}
	s.limit = policy.NewLimiter(cfg.Limit)
	s.ip = cfg.ClientIP
	if s.ip == nil {
		s.ip = peerIP
	}
	s.signed = cfg.SignedIn
	if s.signed == nil {
		s.signed = func(Person, string) {}
	}
	return s, nil
}

// SiteOrigin checks a site's origin as configured (https://gw.example.com;
// http only on a loopback address; no path, query or user) and returns it
// normalized (scheme and host in lower case, the port always written).
func SiteOrigin(site string) (string, error) {
	u, err := url.Parse(site)
	if err != nil || u.Host == "" || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.ForceQuery || u.Fragment != "" || u.User != nil {
		return "", fmt.Errorf("signin site %q: give the site's origin, such as https://gw.example.com", site)
	}
	switch {
	case u.Scheme == "https":
	case u.Scheme == "http" && pinnedfetch.IsLoopbackHost(u.Hostname()):
	default:
		return "", fmt.Errorf("signin site %q: use https (http only on a loopback address)", site)
	}
	return pinnedfetch.Origin(u), nil
}

// webOrigin is origin, as [SiteOrigin] returns it (the port always
// written), as browsers and IdPs write it (RFC 6454 §6.2): without the
// scheme's default port. The callback URL sent to the IdP is built from
// it, so that it is the URL the operator registered there, which an IdP
// compares character by character.
func webOrigin(origin string) string {
	switch {
	case strings.HasPrefix(origin, "https://"):
		return strings.TrimSuffix(origin, ":443")
	case strings.HasPrefix(origin, "http://"):
		return strings.TrimSuffix(origin, ":80")
	}
	return origin
}

// Current is the person the request's browser is signed in as.
func (s *Service) Current(r *http.Request) (Person, bool) { return s.jar.current(r) }

// SignIn sends the browser to sign in, to come back to returnTo (a path on
// this site, see [CheckReturnTo]): to the IdP, or, with links alone, to a
// page that says how to get one. Anything else is refused on a page.
func (s *Service) SignIn(w http.ResponseWriter, r *http.Request, returnTo string) {
	if err := CheckReturnTo(returnTo); err != nil {
		s.refuse(w, Refusal{Step: "signin", Reason: "return_to", Status: http.StatusBadRequest,
			Detail: "The sign-in was asked to return to an address that is not a page of this site. Start again from your MCP client."})
		return
	}
	switch {
	case s.rp != nil:
		d, err := s.rp.discover(r.Context())
		if err != nil {
			s.refuse(w, Refusal{Step: "signin", Reason: "idp_unavailable", Status: http.StatusBadGateway,
				Detail: "The company sign-in (IdP) cannot be reached right now. Try again in a minute; if it persists, tell this gateway's operator: " + err.Error()})
			return
		}
		f := flowValue{Kind: "oidc", State: randomString(), Nonce: randomString(), Verifier: randomVerifier(), Return: returnTo}
		if err := s.jar.startFlow(w, f); err != nil {
			s.refuse(w, Refusal{Step: "signin", Reason: "cookie", Status: http.StatusInternalServerError, Detail: "The sign-in could not start: " + err.Error()})
			return
		}
		noStore(w)
		http.Redirect(w, r, d.authURL(f.State, f.Nonce, f.Verifier), http.StatusSeeOther)
	case s.links != nil:
		if err := s.jar.startFlow(w, flowValue{Kind: "link", Return: returnTo}); err != nil {
			s.refuse(w, Refusal{Step: "signin", Reason: "cookie", Status: http.StatusInternalServerError, Detail: "The sign-in could not start: " + err.Error()})
			return
		}
		writePage(w, http.StatusUnauthorized, page{Title: "Sign in with a link",
			Lines: []string{"This gateway signs people in with one-time links.",
				"Ask its operator for one (caddy zidane signin-link --owner YOU --scope …), open it in this browser within 10 minutes, and you will be brought back here."}})
	default:
		s.refuse(w, Refusal{Step: "signin", Reason: "no_signin", Status: http.StatusServiceUnavailable,
			Detail: "This gateway has no way to sign people in: its operator configures an IdP (signin { oidc … }) or hands out sign-in links."})
	}
}

// ServeHTTP serves CallbackPath (with an IdP) and LinkPath (with links);
// any other path is 404.
func (s *Service) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if (r.URL.Path == CallbackPath && s.rp != nil) || (r.URL.Path == LinkPath && s.links != nil) {
		if ok, wait := s.limit.Allow(policy.AddressKey(s.ip(r), policy.DefaultIPv6Prefix), s.now()); !ok {
			w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(wait.Seconds()))))
			s.refuse(w, Refusal{Step: "signin", Reason: "rate_limited", Status: http.StatusTooManyRequests,
				Detail: "Too many sign-in requests from this address. Wait a few seconds and try again."})
			return
		}
	}
	switch {
	case r.URL.Path == CallbackPath && s.rp != nil:
		if r.Method != http.MethodGet {
			methodNotAllowed(w, "GET")
			return
		}
		s.callback(w, r)
	case r.URL.Path == LinkPath && s.links != nil:
		switch r.Method {
		case http.MethodGet, http.MethodHead:
			writeLinkPage(w)
		case http.MethodPost:
			s.redeem(w, r)
		default:
			methodNotAllowed(w, "GET, POST")
		}
	default:
		http.NotFound(w, r)
	}
}

// callback finishes a sign-in at the IdP.
func (s *Service) callback(w http.ResponseWriter, r *http.Request) {
	step := func(reason string, status int, detail string) {
		s.refuse(w, Refusal{Step: "callback", Reason: reason, Status: status, Detail: detail})
	}
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		step("query", http.StatusBadRequest, "The sign-in response's address does not read. Start again from your MCP client.")
		return
	}
	for name, v := range q {
		if len(v) > 1 {
			step("query", http.StatusBadRequest, fmt.Sprintf("The sign-in response carries %s twice. Start again from your MCP client.", safeCode(name)))
			return
		}
	}
	f, ok := s.jar.currentFlow(r)
	if !ok || f.Kind != "oidc" {
		step("no_flow", http.StatusBadRequest, "No sign-in is under way in this browser: it started in another browser, or more than 10 minutes ago. Start again from your MCP client.")
		return
	}
	if subtle.ConstantTimeCompare([]byte(q.Get("state")), []byte(f.State)) != 1 {
		step("state", http.StatusBadRequest, "The sign-in response does not belong to the sign-in under way in this browser (state). Start again from your MCP client.")
		return
	}
	s.jar.endFlow(w)
	id, err := stateID(f.State)
	if err != nil {
		step("state", http.StatusBadRequest, "The sign-in state does not read. Start again from your MCP client.")
		return
	}
	switch s.states.Take("", id, f.IAT*1000, s.now()) {
	case replay.Taken:
	case replay.Full:
		step("busy", http.StatusServiceUnavailable, "Too many sign-ins are under way. Try again in a minute.")
		return
	default:
		step("replayed", http.StatusBadRequest, "This sign-in response was used already. Start again from your MCP client.")
		return
	}
	d, err := s.rp.discover(r.Context())
	if err != nil {
		step("idp_unavailable", http.StatusBadGateway, "The company sign-in (IdP) cannot be reached right now. Try again in a minute.")
		return
	}
	if err := checkIss(q["iss"], s.rp.cfg.Issuer, d.issParam); err != nil {
		step("iss", http.StatusBadRequest, "The sign-in response names another issuer than this gateway's IdP (iss), so it is not used. Start again from your MCP client.")
		return
	}
	if e := q.Get("error"); e != "" {
		status := http.StatusBadRequest
		if e == "access_denied" {
			status = http.StatusForbidden
		}
		step("idp_error", status, "The company sign-in (IdP) answered "+safeCode(e)+". Start again from your MCP client, or ask your IdP's administrators.")
		return
	}
	code := q.Get("code")
	if code == "" {
		step("no_code", http.StatusBadRequest, "The sign-in response carries no code. Start again from your MCP client.")
		return
	}
	got, err := d.exchange(r.Context(), s.rp.cfg.ClientID, code, f.Verifier, f.Nonce)
	if err != nil {
		reason := "id_token"
		if errors.Is(err, errExchange) {
			reason = "exchange"
		}
		step(reason, http.StatusBadGateway, "The sign-in could not be finished: "+err.Error()+". Start again from your MCP client.")
		return
	}
	p, err := s.rp.cfg.Claims.person(got.claims)
	if err != nil {
		r := Refusal{Step: "callback", Reason: "no_owner", Status: http.StatusForbidden, Owner: p.Owner,
			Detail: "Your company sign-in worked, but " + err.Error() + ". Ask this gateway's operator."}
		if errors.Is(err, ErrNoScope) {
			r.Reason = "no_scope"
			r.Detail = fmt.Sprintf("You are %s at your company sign-in, but no rule of this gateway grants you a scope, so you are not signed in here. Ask this gateway's operator.", p.Name)
		}
		s.refuse(w, r)
		return
	}
	if s.kept != nil {
		rec := &keptSignIn{Owner: p.Owner, IDToken: got.idToken, RefreshToken: got.refreshToken, Expiry: got.expiry, SignedIn: s.now()}
		if err := s.kept.keep(r.Context(), rec); err != nil {
			// The sign-in stands; only the tokens without a browser
			// wait for the next one.
			s.audit(Refusal{Step: "kept_signin", Reason: "storage", Owner: p.Owner, Status: http.StatusServiceUnavailable,
				Detail: "your sign-in could not be kept for the upstreams that trust the company IdP: " + err.Error()})
		}
	}
	s.signedIn(w, r, p, "idp", f.Return)
}

// redeem signs the browser in with a link's secret, posted from the link
// page of this site.
func (s *Service) redeem(w http.ResponseWriter, r *http.Request) {
	step := func(reason string, status int, detail string) {
		s.refuse(w, Refusal{Step: "link", Reason: reason, Status: status, Detail: detail})
	}
	form, bad := formpost.Read(w, r, s.origin, 4096)
	if bad != nil {
		step(bad.Reason, bad.Status, map[*formpost.Refusal]string{
			formpost.CrossOrigin: "A sign-in link is used from its own page on this site. Open the link again and press the button.",
			formpost.Query:       "A sign-in link's secret goes in the form, never in the address. Open the link again and press the button.",
			formpost.ContentType: "Send the sign-in form as application/x-www-form-urlencoded, as the link's page does.",
			formpost.Unreadable:  "The sign-in form does not read (at most 4 KiB). Open the link again and press the button.",
		}[bad])
		return
	}
	secrets := form["secret"]
	if len(secrets) != 1 || len(form) != 1 {
		step("form", http.StatusBadRequest, "The sign-in form carries one field, secret, once. Open the link again and press the button.")
		return
	}
	p, err := s.links.Redeem(r.Context(), strings.TrimSpace(secrets[0]))
	switch {
	case errors.Is(err, ErrLinkUnknown), errors.Is(err, ErrLinkExpired):
		step("link", http.StatusForbidden, capitalize(err.Error())+".")
		return
	case err != nil:
		step("storage", http.StatusServiceUnavailable, capitalize(err.Error())+".")
		return
	}
	returnTo := ""
	if f, ok := s.jar.currentFlow(r); ok && f.Kind == "link" && CheckReturnTo(f.Return) == nil {
		returnTo = f.Return
		s.jar.endFlow(w)
	}
	s.signedIn(w, r, p, "link", returnTo)
}

// signedIn starts p's session, and goes back to returnTo, or says so on a
// page when there is nowhere to go back to.
func (s *Service) signedIn(w http.ResponseWriter, r *http.Request, p Person, via, returnTo string) {
	if err := s.jar.startSession(w, p); err != nil {
		s.refuse(w, Refusal{Step: "signin", Reason: "cookie", Owner: p.Owner, Status: http.StatusInternalServerError, Detail: "The sign-in could not be kept: " + err.Error()})
		return
	}
	s.signed(p, via)
	if CheckReturnTo(returnTo) == nil {
		noStore(w)
		http.Redirect(w, r, returnTo, http.StatusSeeOther)
		return
	}
	writePage(w, http.StatusOK, page{Title: "Signed in", Person: &p,
		Lines: []string{"You are signed in to this gateway in this browser. Go back to your MCP client and connect again."}})
}

func (s *Service) refuse(w http.ResponseWriter, rf Refusal) {
	s.audit(rf)
	writePage(w, rf.Status, page{Title: "Not signed in", Lines: []string{rf.Detail}})
}

func methodNotAllowed(w http.ResponseWriter, allow string) {
	w.Header().Set("Allow", allow)
	writePage(w, http.StatusMethodNotAllowed, page{Title: "Not here", Lines: []string{"Use " + allow + " here."}})
}

func noStore(w http.ResponseWriter) {
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Referrer-Policy", "no-referrer")
}

// randomString is 32 random bytes in base64url: a state or a nonce.
func randomString() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}

// randomVerifier is a PKCE verifier (RFC 7636 §4.1: 43 characters of
// base64url from 32 random bytes).
func randomVerifier() string { return randomString() }

// stateID is the id the replay check keeps of a state: its first 16 bytes,
// random.
func stateID(state string) ([16]byte, error) {
	var id [16]byte
	b, err := base64.RawURLEncoding.DecodeString(state)
	if err != nil || len(b) < len(id) {
		return id, errors.New("bad state")
	}
	copy(id[:], b)
	return id, nil
}

// peerIP is the host of r's peer address.
func peerIP(r *http.Request) string {
	if host, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		return host
	}
	return r.RemoteAddr
}

func capitalize(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

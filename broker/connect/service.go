package connect

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/authserver/idp"
	"github.com/Tahul/caddy-zidane-mcp/broker/upstream"
	"github.com/Tahul/caddy-zidane-mcp/internal/formpost"
	"github.com/Tahul/caddy-zidane-mcp/policy"
	"github.com/Tahul/caddy-zidane-mcp/storage"
)

// The paths the gateway serves this package at.
const (
	// PathPrefix is where a connect link is opened (GET, a page with a
	// button) and used (POST from that page): PathPrefix and the link's
	// secret.
	PathPrefix = "/zidane/connect/"
	// CallbackPath is where an upstream's authorization server sends the
	// browser back: the redirect URI of a person's authorization is the
	// site's origin and this path.
	CallbackPath = "/zidane/connect/callback"
)

// Persons is who a browser is signed in as, and how to sign it in:
// *idp.Service.
type Persons interface {
	Current(*http.Request) (idp.Person, bool)
	SignIn(w http.ResponseWriter, r *http.Request, returnTo string)
}

// Authorizer runs an upstream's authorization for one owner: the upstream
// OAuth client's per-owner login (discovery, CIMD or DCR, PKCE, resource,
// iss, scopes from the challenge), whose result it keeps sealed under
// (owner, upstream).
type Authorizer interface {
	// Begin starts owner's authorization at upstream, with redirect URI
	// the site's CallbackPath, and returns the URL to send the browser
	// to. That URL carries the authorization's state in its query, once.
	Begin(ctx context.Context, owner, upstream string) (authURL string, err error)
	// Finish completes the authorization with the callback's query. The
	// Service calls it only after it has checked that the state is one
	// it started for owner and upstream and that the browser is signed
	// in as owner; Finish still refuses a state it did not start for
	// them.
	Finish(ctx context.Context, owner, upstream string, query url.Values) error
}

// Connection is one account connected through a link, for the audit log
// and for the notification to the client that asked.
type Connection struct {
	Owner, Upstream string
	// Elicitation is the id of the elicitation the link answered.
	Elicitation string
}

// Refusal is one refused step, for the audit log. It never holds a
// secret, a state or a code.
type Refusal struct {
	Step     string // "link", "connect", "callback"
	Reason   string // a short code: "unknown", "expired", "owner", "cross_origin", …
	Detail   string // what the person was told
	Owner    string // the link's owner, when known
	Browser  string // who the browser is signed in as, when known
	Upstream string
	Status   int
}

// Config sets up a [Service].
type Config struct {
	// Site is the origin the gateway's site is served at, from
	// configuration (never from a request's Host): links are made on it,
	// and the same-origin check of the link's form compares with it.
	Site string
	// Store keeps the links and the authorizations under way.
	Store storage.Storage
	// People says who a browser is signed in as.
	People Persons
	// Authorizer runs the upstreams' authorizations.
	Authorizer Authorizer
	// Lifetime is a link's: DefaultLifetime when zero, at most
	// MaxLifetime.
	Lifetime time.Duration
	// Audit receives every refusal. Optional.
	Audit func(Refusal)
	// Connected receives every account connected. Optional.
	Connected func(Connection)
	// Limit bounds one client address's requests to these paths (IPv6 by
	// /64): idp.DefaultLimit when zero.
	Limit policy.Limit
	// ClientIP is a request's client address as the edge established it;
	// the peer's address when nil.
	ClientIP func(*http.Request) string
	// Now is time.Now when nil.
	Now func() time.Time
}

// Service makes connect links and serves them. It is safe for concurrent
// use.
type Service struct {
	origin    string // normalized, for the same-origin check
	site      string // as configured, for the links
	links     *records
	flows     *records
	dones     *records
	people    Persons
	auth      Authorizer
	life      time.Duration
	audit     func(Refusal)
	connected func(Connection)
	limit     *policy.Limiter
	ip        func(*http.Request) string
	now       func() time.Time
	waits     waiters
}

// New checks cfg and returns its Service.
func New(cfg Config) (*Service, error) {
	origin, err := idp.SiteOrigin(cfg.Site)
	if err != nil {
		return nil, err
	}
	if cfg.Store == nil || cfg.People == nil || cfg.Authorizer == nil {
		return nil, errors.New("connect: a store, the sign-in and an authorizer are needed")
	}
	if cfg.Lifetime == 0 {
		cfg.Lifetime = DefaultLifetime
	}
	if cfg.Lifetime < time.Minute || cfg.Lifetime > MaxLifetime {
		return nil, fmt.Errorf("connect link lifetime %s: give between 1m and %s", cfg.Lifetime, MaxLifetime)
	}
	if cfg.Limit == (policy.Limit{}) {
		cfg.Limit = idp.DefaultLimit
	}
	if err := cfg.Limit.Validate(); err != nil {
		return nil, fmt.Errorf("connect limit: %w", err)
	}
	now := cfg.Now
	if now == nil {
		now = time.Now
	}
	s := &Service{
		origin:    origin,
		site:      strings.TrimSuffix(cfg.Site, "/"),
		links:     &records{store: cfg.Store, prefix: LinkKeyPrefix, now: now},
		flows:     &records{store: cfg.Store, prefix: FlowKeyPrefix, now: now},
		dones:     &records{store: cfg.Store, prefix: DoneKeyPrefix, now: now},
		people:    cfg.People,
		auth:      cfg.Authorizer,
		life:      cfg.Lifetime,
		audit:     cfg.Audit,
		connected: cfg.Connected,
		limit:     policy.NewLimiter(cfg.Limit),
		ip:        cfg.ClientIP,
		now:       now,
	}
	if s.audit == nil {
		s.audit = func(Refusal) {}
	}
	if s.connected == nil {
		s.connected = func(Connection) {}
	}
	if s.ip == nil {
		s.ip = peerIP
	}
	return s, nil
}

// Link is a connect link just made.
type Link struct {
	// URL is what the person opens; it holds the secret.
	URL string
	// Elicitation is the id of the elicitation that carries the link.
	Elicitation string
	Expires     time.Time
}

// ErrNotPerson is wrapped by [Service.Create]'s refusal of an owner no
// person can sign in as (or of a name that is no upstream's): no link
// could ever be used, so none is made.
var ErrNotPerson = errors.New("no connect link for this caller")

// Create makes a link for owner to connect their account at upstream.
func (s *Service) Create(ctx context.Context, owner, up string) (Link, error) {
	if err := policy.ValidatePersonOwner(owner); err != nil {
		return Link{}, fmt.Errorf("%w: %v", ErrNotPerson, err)
	}
	if !upstream.ValidName(up) {
		return Link{}, fmt.Errorf("%w: %q is not an upstream's name", ErrNotPerson, up)
	}
	secret, err := newSecret()
	if err != nil {
		return Link{}, err
	}
	id, err := newElicitationID()
	if err != nil {
		return Link{}, err
	}
	exp := s.now().Add(s.life)
	if err := s.links.putOwned(ctx, secret, record{Owner: owner, Upstream: up, Elicitation: id, Expires: exp}); err != nil {
		return Link{}, fmt.Errorf("keeping the connect link: %w", err)
	}
	return Link{URL: s.site + PathPrefix + secret, Elicitation: id, Expires: exp}, nil
}

// ServeHTTP serves a link under PathPrefix and the upstreams' callback at
// CallbackPath; anything else is 404.
func (s *Service) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	secret, isLink := strings.CutPrefix(r.URL.Path, PathPrefix)
	if r.URL.Path != CallbackPath && !isLink {
		http.NotFound(w, r)
		return
	}
	if r.URL.Path == CallbackPath {
		s.ServeCallback(w, r)
		return
	}
	if !s.allow(w, r) {
		return
	}
	// One reading of the path: the secret spelled with escapes is not
	// the same path to every server in front of this one.
	if r.URL.RawPath != "" || !validSecret(secret) {
		s.refuse(w, Refusal{Step: "link", Reason: "malformed", Status: http.StatusNotFound,
			Detail: "This is not a connect link. Call the tool again from your MCP client for a new one."})
		return
	}
	switch r.Method {
	case http.MethodGet, http.MethodHead:
		s.show(w, r, secret)
	case http.MethodPost:
		s.use(w, r, secret)
	default:
		methodNotAllowed(w, "GET, POST")
	}
}

// allow applies the per-address limit, and refuses past it.
func (s *Service) allow(w http.ResponseWriter, r *http.Request) bool {
	ok, wait := s.limit.Allow(policy.AddressKey(s.ip(r), policy.DefaultIPv6Prefix), s.now())
	if !ok {
		w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(wait.Seconds()))))
		s.refuse(w, Refusal{Step: "link", Reason: "rate_limited", Status: http.StatusTooManyRequests,
			Detail: "Too many requests from this address. Wait a few seconds and try again."})
	}
	return ok
}

// ServeCallback serves the upstream's authorization answer: at
// CallbackPath, or at whatever path of the site an upstream's configured
// redirect URL names (the gateway hands it over from there). When the
// browser is not signed in, the sign-in comes back to CallbackPath.
func (s *Service) ServeCallback(w http.ResponseWriter, r *http.Request) {
	if !s.allow(w, r) {
		return
	}
	if r.Method != http.MethodGet {
		methodNotAllowed(w, "GET")
		return
	}
	s.callback(w, r)
}

// Handles reports whether r is the answer to an authorization started
// from a connect link: its state is one kept here. An upstream's
// redirect URL also takes the operator's own logins, which are not.
func (s *Service) Handles(r *http.Request) bool {
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil || len(q["state"]) != 1 || q["state"][0] == "" {
		return false
	}
	_, err = s.flows.peek(r.Context(), q["state"][0])
	return err == nil || errors.Is(err, ErrExpired)
}

// show is the link's page: who it connects, and a button. It never uses
// the link up.
func (s *Service) show(w http.ResponseWriter, r *http.Request, secret string) {
	p, ok := s.people.Current(r)
	if !ok {
		s.people.SignIn(w, r, PathPrefix+secret)
		return
	}
	rec, err := s.links.peek(r.Context(), secret)
	if err == nil && rec.Owner != p.Owner {
		err = ErrOwner
	}
	if err != nil {
		s.refuseLink(w, "link", err, rec, p)
		return
	}
	writeConnectPage(w, PathPrefix+secret, rec.Upstream, p)
}

// use uses the link up and starts the upstream's authorization.
func (s *Service) use(w http.ResponseWriter, r *http.Request, secret string) {
	step := func(reason string, status int, detail string) {
		s.refuse(w, Refusal{Step: "connect", Reason: reason, Status: status, Detail: detail})
	}
	form, bad := formpost.Read(w, r, s.origin, 1024)
	if bad != nil && bad != formpost.Unreadable {
		step(bad.Reason, bad.Status, map[*formpost.Refusal]string{
			formpost.CrossOrigin: "A connect link is used from its own page on this site. Open the link again and press the button.",
			formpost.Query:       "The connect form carries nothing in its address. Open the link again and press the button.",
			formpost.ContentType: "Send the connect form as application/x-www-form-urlencoded, as the link's page does.",
		}[bad])
		return
	}
	if bad != nil || len(form) != 1 || len(form["connect"]) != 1 {
		step("form", http.StatusBadRequest, "The connect form carries one field, connect, once. Open the link again and press the button.")
		return
	}
	p, ok := s.people.Current(r)
	if !ok {
		s.people.SignIn(w, r, PathPrefix+secret)
		return
	}
	rec, err := s.links.take(r.Context(), secret, p.Owner)
	if err != nil {
		s.refuseLink(w, "connect", err, rec, p)
		return
	}
	authURL, err := s.auth.Begin(r.Context(), rec.Owner, rec.Upstream)
	if err != nil {
		s.refuse(w, Refusal{Step: "connect", Reason: "authorize", Owner: rec.Owner, Browser: p.Owner, Upstream: rec.Upstream, Status: http.StatusBadGateway,
			Detail: fmt.Sprintf("The authorization at %s could not start: %v. Call the tool again from your MCP client for a new link.", rec.Upstream, err)})
		return
	}
	state, ok := oneState(authURL)
	if !ok {
		s.refuse(w, Refusal{Step: "connect", Reason: "state", Owner: rec.Owner, Upstream: rec.Upstream, Status: http.StatusInternalServerError,
			Detail: "The authorization could not start (it has no single state). Tell this gateway's operator."})
		return
	}
	flow := record{Owner: rec.Owner, Upstream: rec.Upstream, Elicitation: rec.Elicitation, Expires: s.now().Add(FlowLifetime)}
	if err := s.flows.put(r.Context(), state, flow); err != nil {
		s.refuse(w, Refusal{Step: "connect", Reason: "storage", Owner: rec.Owner, Upstream: rec.Upstream, Status: http.StatusServiceUnavailable,
			Detail: "The authorization could not be kept until it comes back. Call the tool again from your MCP client for a new link."})
		return
	}
	noStore(w)
	w.Header().Set("Referrer-Policy", "no-referrer")
	http.Redirect(w, r, authURL, http.StatusSeeOther)
}

// callback finishes an authorization started from a link: only in a
// browser signed in as the owner it was started for, checked before the
// Authorizer redeems the code.
func (s *Service) callback(w http.ResponseWriter, r *http.Request) {
	step := func(reason string, status int, detail string) {
		s.refuse(w, Refusal{Step: "callback", Reason: reason, Status: status, Detail: detail})
	}
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		step("query", http.StatusBadRequest, "The authorization's answer does not read. Call the tool again from your MCP client for a new link.")
		return
	}
	for name, v := range q {
		if len(v) > 1 {
			step("query", http.StatusBadRequest, fmt.Sprintf("The authorization's answer carries %s twice. Call the tool again from your MCP client for a new link.", safeCode(name)))
			return
		}
	}
	state := q.Get("state")
	if state == "" {
		step("state", http.StatusBadRequest, "The authorization's answer carries no state. Call the tool again from your MCP client for a new link.")
		return
	}
	p, ok := s.people.Current(r)
	if !ok {
		back := CallbackPath + "?" + r.URL.RawQuery
		if idp.CheckReturnTo(back) != nil {
			step("signed_out", http.StatusUnauthorized, "Sign in to this gateway in this browser, then call the tool again from your MCP client for a new link.")
			return
		}
		s.people.SignIn(w, r, back)
		return
	}
	rec, err := s.flows.take(r.Context(), state, p.Owner)
	if err != nil {
		s.refuseLink(w, "callback", err, rec, p)
		return
	}
	if err := s.auth.Finish(r.Context(), rec.Owner, rec.Upstream, q); err != nil {
		s.refuse(w, Refusal{Step: "callback", Reason: "authorize", Owner: rec.Owner, Browser: p.Owner, Upstream: rec.Upstream, Status: http.StatusBadGateway,
			Detail: fmt.Sprintf("The authorization at %s did not finish: %v. Call the tool again from your MCP client for a new link.", rec.Upstream, err)})
		return
	}
	conn := Connection{Owner: rec.Owner, Upstream: rec.Upstream, Elicitation: rec.Elicitation}
	s.done(r.Context(), conn)
	s.connected(conn)
	writePage(w, http.StatusOK, page{Title: "Connected", Person: &p, Lines: []string{
		fmt.Sprintf("Your account at %s is connected to this gateway.", rec.Upstream),
		"Go back to your MCP client: it carries on with your request. If it does not, ask it again.",
	}})
}

// refuseLink refuses a link or a flow that cannot be used, saying why.
func (s *Service) refuseLink(w http.ResponseWriter, stepName string, err error, rec record, p idp.Person) {
	rf := Refusal{Step: stepName, Browser: p.Owner, Owner: rec.Owner, Upstream: rec.Upstream}
	again := " Call the tool again from your MCP client for a new link."
	switch {
	case errors.Is(err, ErrOwner):
		rf.Reason, rf.Status = "owner", http.StatusForbidden
		rf.Detail = fmt.Sprintf("This browser is signed in to the gateway as %s, and this link was made for another person's request, so nothing was connected. If someone sent you this link, do not use it. If it is yours, sign in here as yourself.", p.Name)
	case errors.Is(err, ErrExpired):
		rf.Reason, rf.Status, rf.Detail = "expired", http.StatusForbidden, capitalize(err.Error())+"."+again
	case errors.Is(err, ErrUnknown):
		rf.Reason, rf.Status, rf.Owner, rf.Upstream = "unknown", http.StatusForbidden, "", ""
		rf.Detail = capitalize(err.Error()) + "." + again
		if stepName == "callback" {
			rf.Detail = "This authorization's answer is unknown, was used already, or did not start in this gateway." + again
		}
	default:
		rf.Reason, rf.Status, rf.Detail = "storage", http.StatusServiceUnavailable, capitalize(err.Error())+"."
	}
	s.refuse(w, rf)
}

func (s *Service) refuse(w http.ResponseWriter, rf Refusal) {
	s.audit(rf)
	writePage(w, rf.Status, page{Title: "Not connected", Lines: []string{rf.Detail}})
}

// oneState is the state an authorization URL carries, once.
func oneState(authURL string) (string, bool) {
	u, err := url.Parse(authURL)
	if err != nil {
		return "", false
	}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil || len(q["state"]) != 1 || q["state"][0] == "" {
		return "", false
	}
	return q["state"][0], true
}

// safeCode is a query parameter's name fit for a page: printable ASCII,
// bounded.
func safeCode(s string) string {
	var b strings.Builder
	for i := 0; i < len(s) && b.Len() < 32; i++ {
		if c := s[i]; c > ' ' && c < 0x7f {
			b.WriteByte(c)
		}
	}
	return b.String()
}

func methodNotAllowed(w http.ResponseWriter, allow string) {
	w.Header().Set("Allow", allow)
	writePage(w, http.StatusMethodNotAllowed, page{Title: "Not here", Lines: []string{"Use " + allow + " here."}})
}

func noStore(w http.ResponseWriter) {
	w.Header().Set("Cache-Control", "no-store")
}

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

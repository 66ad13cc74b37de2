package authserver

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/dpop"
	"github.com/Tahul/caddy-zidane-mcp/internal/seal"
	"github.com/Tahul/caddy-zidane-mcp/pinnedfetch"
	"github.com/Tahul/caddy-zidane-mcp/policy"
	"github.com/Tahul/caddy-zidane-mcp/storage"
)

// Paths of the endpoints, on the issuer's origin.
const (
	WellKnown     = "/.well-known/oauth-authorization-server"
	Base          = "/zidane/signin/"
	AuthorizePath = Base + "authorize"
	ConsentPath   = Base + "consent"
	TokenPath     = Base + "token"
	RevokePath    = Base + "revoke"
	RegisterPath  = Base + "register"
)

// Defaults of a [Config] whose fields are zero.
const (
	// DefaultCodeLifetime is how long an authorization code may wait for
	// its redemption: the browser's redirect and one token request.
	DefaultCodeLifetime = 60 * time.Second
	// DefaultConsentLifetime is how long a consent page's form stays
	// good: the time a person takes to read it.
	DefaultConsentLifetime = 10 * time.Minute
)

// DefaultLimit is an address's rate at the endpoints: a person's sign-in
// takes four requests, a client's refresh one; a burst of 30 leaves room
// for a few clients behind one address. It is per address and not per
// client: a client_id is public (Claude Code's is the same for everyone),
// so a limit per client would let anyone exhaust every person's.
var DefaultLimit = policy.Limit{Rate: 2, Burst: 30}

// Bounds on what a client sends.
const (
	// maxQuery bounds an authorization request's query, in bytes: the
	// parameters of a real request (a CIMD URL, a loopback redirect, a
	// challenge, a resource, a few scopes, a state) take well under 4 KiB.
	maxQuery = 8 << 10
	// maxForm bounds a form posted to the consent, token or revocation
	// endpoint, in bytes.
	maxForm = 16 << 10
	// maxState bounds the state a client asks to get back.
	maxState = 1024
	// maxScopes bounds how many scopes one request may name.
	maxScopes = 64
)

// Client is an OAuth client as the authorization server sees it: resolved
// from a Client ID Metadata Document or a registration.
type Client interface {
	// ClientID is the client's id: a metadata document's URL, or the id
	// registration gave it.
	ClientID() string
	// DisplayName is the name the client gives itself (client_name), to
	// be shown as the client's claim, never as a fact.
	DisplayName() string
	// AllowsRedirect says whether uri is one of the client's redirect
	// URIs: exactly, but for the port of a loopback one (RFC 8252 §7.3).
	AllowsRedirect(uri string) bool
}

// Clients resolves a client_id to its client.
type Clients interface {
	// Resolve returns the client clientID names, or an error saying why
	// there is none (unknown, its document unreachable or invalid). The
	// error's text is shown to the person and must carry no secret; one
	// that matches ErrClientUnavailable says the client may be resolved
	// later (too many fetches at once, storage down).
	Resolve(ctx context.Context, clientID string) (Client, error)
}

// ErrClientUnavailable is a client that could not be resolved now, for a
// reason that is not the client's: the person is told to try again (503),
// not that the client is unknown.
var ErrClientUnavailable = errors.New("the client could not be looked up just now")

// Person is who is signed in on a browser.
type Person struct {
	// Owner is the stable id of the person: what grants and sessions
	// belong to.
	Owner string
	// Name is how the person is shown to themselves.
	Name string
	// Scopes are the scopes this person may grant a client.
	Scopes []string
}

// People is the browser sign-in of the persons who consent.
type People interface {
	// Current returns the person signed in on the browser r came from.
	Current(r *http.Request) (Person, bool)
	// SignIn sends the browser to sign in, and back to returnTo (a path
	// and query on this origin) once signed in.
	SignIn(w http.ResponseWriter, r *http.Request, returnTo string)
}

// Resource is one protected resource (an MCP endpoint) tokens may be
// issued for.
type Resource struct {
	// URL is the resource's canonical URL, absolute, as its RFC 9728
	// document names it.
	URL string
	// Scopes are the scopes the resource knows.
	Scopes []string
}

// Resources are the resources this server issues tokens for.
type Resources interface {
	// Resource returns the resource whose URL is uri.
	Resource(uri string) (Resource, bool)
	// All returns every resource, for the metadata's scopes_supported.
	All() []Resource
}

// StaticResources is a fixed list of resources.
type StaticResources []Resource

// Resource returns the resource whose URL is uri.
func (rs StaticResources) Resource(uri string) (Resource, bool) {
	for _, r := range rs {
		if r.URL == uri {
			return r, true
		}
	}
	return Resource{}, false
}

// All returns the list.
func (rs StaticResources) All() []Resource { return rs }

// Refusal is one refused request, for the audit. It never holds a code,
// a token, a verifier, a state, a proof or a cookie: only what names the
// parties and why.
type Refusal struct {
	// Endpoint is the path refused at.
	Endpoint string
	// Error is the OAuth error code (invalid_request, invalid_grant…).
	Error string
	// Reason says why, in words.
	Reason string
	// Client is the client_id the request named, if any.
	Client string
	// Owner is the person signed in, if known.
	Owner string
	// Resource is the resource the request named, if any.
	Resource string
	// Remote is the address the request came from.
	Remote string
}

// Config is what a [Server] is built from.
type Config struct {
	// Issuer is the server's issuer identifier: an https origin (http on
	// loopback alone), with no path, query or fragment. Every URL the
	// server gives out is built from it, never from a request's Host.
	Issuer string
	// Resources are the resources tokens may be issued for.
	Resources Resources
	// Clients resolves client ids.
	Clients Clients
	// People signs persons in.
	People People
	// Grants issues, refreshes and revokes the tokens.
	Grants Grants
	// AccessLifetime and RefreshLifetime are an access token's and a
	// refresh token's (unused); zero takes the token store's defaults.
	AccessLifetime, RefreshLifetime time.Duration
	// Storage holds the authorization codes.
	Storage storage.Storage
	// Key seals the consent forms and keys their CSRF tokens:
	// seal.KeySize bytes, the same on every replica.
	Key []byte
	// DPoP verifies the proofs sent to the token endpoint. Nil verifies
	// with dpop's defaults and no replay check, which a server should not
	// run with.
	DPoP *dpop.Verifier
	// Register, when set, serves dynamic client registration (RFC 7591)
	// at RegisterPath, and the metadata names it.
	Register http.Handler
	// Audit receives every refusal. Nil drops them.
	Audit func(Refusal)
	// CodeLifetime is an authorization code's; DefaultCodeLifetime when
	// zero.
	CodeLifetime time.Duration
	// ConsentLifetime is a consent form's; DefaultConsentLifetime when
	// zero.
	ConsentLifetime time.Duration
	// Limit bounds the requests of one client address to the
	// authorization, consent, token and revocation endpoints;
	// DefaultLimit when zero. Registration has its own.
	Limit policy.Limit
	// ClientIP is a request's client address, as the edge established
	// it (through the server's trusted proxies); nil takes the request's
	// remote address, never X-Forwarded-For.
	ClientIP func(*http.Request) string
	// Now is the clock; time.Now when nil.
	Now func() time.Time
}

// Server is the authorization server: its metadata and endpoints, as one
// http.Handler for the paths [Server.Handles] names.
type Server struct {
	cfg       Config
	issuer    string
	origin    string // the issuer's, as pinnedfetch.Origin writes it
	authorize string
	token     *url.URL
	consent   *seal.Sealer
	csrfKey   []byte
	dpop      *dpop.Verifier
	secure    bool // the issuer is https: cookies are Secure and __Host-
	limiter   *policy.Limiter
}

// New checks cfg and builds the server.
func New(cfg Config) (*Server, error) {
	iss, err := CheckIssuer(cfg.Issuer)
	if err != nil {
		return nil, err
	}
	if cfg.Resources == nil || cfg.Clients == nil || cfg.People == nil || cfg.Grants == nil || cfg.Storage == nil {
		return nil, errors.New("authserver: Resources, Clients, People, Grants and Storage are required")
	}
	sealer, err := seal.New(cfg.Key, "signin consent")
	if err != nil {
		return nil, fmt.Errorf("authserver: consent key: %w", err)
	}
	if cfg.CodeLifetime <= 0 {
		cfg.CodeLifetime = DefaultCodeLifetime
	}
	if cfg.ConsentLifetime <= 0 {
		cfg.ConsentLifetime = DefaultConsentLifetime
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Limit == (policy.Limit{}) {
		cfg.Limit = DefaultLimit
	}
	if err := cfg.Limit.Validate(); err != nil {
		return nil, fmt.Errorf("authserver: limit: %w", err)
	}
	if cfg.ClientIP == nil {
		cfg.ClientIP = remoteIP
	}
	v := cfg.DPoP
	if v == nil {
		v = &dpop.Verifier{}
	}
	tok, _ := url.Parse(iss + TokenPath)
	return &Server{
		cfg:       cfg,
		issuer:    iss,
		origin:    pinnedfetch.Origin(tok),
		authorize: iss + AuthorizePath,
		token:     tok,
		consent:   sealer,
		csrfKey:   deriveKey(cfg.Key, "signin csrf"),
		dpop:      v,
		secure:    strings.HasPrefix(iss, "https://"),
		limiter:   policy.NewLimiter(cfg.Limit),
	}, nil
}

// CheckIssuer returns the issuer identifier s names, or why it cannot be
// one: an absolute https URL (http only on a loopback address, for tests
// and a local gateway) with a host, and no path, query, fragment or user
// information, so that the metadata is at WellKnown on its origin and the
// endpoints at Base.
func CheckIssuer(s string) (string, error) {
	u, err := url.Parse(s)
	if err != nil {
		return "", fmt.Errorf("signin issuer %q is not a URL: %v", s, err)
	}
	switch {
	case u.Scheme != "https" && u.Scheme != "http", u.Host == "":
		return "", fmt.Errorf("signin issuer %q must be an absolute https URL such as https://mcp.example.com", s)
	case u.Scheme == "http" && !isLoopbackHost(u.Hostname()):
		return "", fmt.Errorf("signin issuer %q: plain http is allowed on a loopback address only; use https", s)
	case u.User != nil, u.RawQuery != "", u.Fragment != "", u.ForceQuery:
		return "", fmt.Errorf("signin issuer %q must have no user information, query or fragment", s)
	case u.Path != "" && u.Path != "/":
		return "", fmt.Errorf("signin issuer %q must have no path: the authorization server is served at the root of its origin", s)
	case strings.ToLower(u.Host) != u.Host:
		return "", fmt.Errorf("signin issuer %q: write the host in lower case, as clients compare the issuer character by character", s)
	}
	return u.Scheme + "://" + u.Host, nil
}

// Issuer is the server's issuer identifier.
func (s *Server) Issuer() string { return s.issuer }

// Handles says whether path is one of the server's.
func (s *Server) Handles(path string) bool {
	switch path {
	case WellKnown, AuthorizePath, ConsentPath, TokenPath, RevokePath:
		return true
	case RegisterPath:
		return s.cfg.Register != nil
	}
	return false
}

// ServeHTTP serves the metadata and the endpoints; any other path is 404.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if s.Handles(r.URL.Path) && cors(w, r) {
		return
	}
	switch r.URL.Path {
	case AuthorizePath, ConsentPath, TokenPath, RevokePath:
		if !s.allow(w, r) {
			return
		}
	}
	switch r.URL.Path {
	case WellKnown:
		s.serveMetadata(w, r)
	case AuthorizePath:
		s.serveAuthorize(w, r)
	case ConsentPath:
		s.serveConsent(w, r)
	case TokenPath:
		s.serveToken(w, r)
	case RevokePath:
		s.serveRevoke(w, r)
	case RegisterPath:
		if s.cfg.Register == nil {
			http.NotFound(w, r)
			return
		}
		s.cfg.Register.ServeHTTP(w, r)
	default:
		http.NotFound(w, r)
	}
}

func (s *Server) audit(r *http.Request, ref Refusal) {
	if s.cfg.Audit == nil {
		return
	}
	ref.Endpoint = r.URL.Path
	ref.Remote = s.cfg.ClientIP(r)
	// A client_id and a resource are what the request said: bounded, and
	// without a query, which no good one has and a bad one may fill.
	ref.Client, ref.Resource = clip(ref.Client), clip(ref.Resource)
	s.cfg.Audit(ref)
}

// maxAuditValue bounds a value the request chose in an audit line.
const maxAuditValue = 256

func clip(v string) string {
	if i := strings.IndexAny(v, "?#"); i >= 0 {
		v = v[:i]
	}
	if len(v) > maxAuditValue {
		v = v[:maxAuditValue] + "…"
	}
	return v
}

// allow takes one request of r's address from its bucket, or refuses it
// 429 with Retry-After: as a page at the browser's endpoints, in JSON at
// the client's.
func (s *Server) allow(w http.ResponseWriter, r *http.Request) bool {
	ok, wait := s.limiter.Allow(policy.AddressKey(s.cfg.ClientIP(r), policy.DefaultIPv6Prefix), s.cfg.Now())
	if ok {
		return true
	}
	w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(wait.Seconds()))))
	reason := "too many requests from this address; try again after the Retry-After delay"
	switch r.URL.Path {
	case TokenPath, RevokePath:
		s.refuseJSON(w, r, oauthError{http.StatusTooManyRequests, "temporarily_unavailable", reason}, Refusal{})
	default:
		s.refusePage(w, r, http.StatusTooManyRequests, Refusal{Error: "temporarily_unavailable", Reason: reason})
	}
	return false
}

// cors lets a client that runs in a browser (on any origin) read the
// metadata and call the token and revocation endpoints, and answers its
// preflight (it returns true when it did). These endpoints read no cookie
// and take no credential but what the request carries, so any origin may
// call them: "*", without credentials, is what lets a page use them and
// gives it nothing of another's. The browser's endpoints (authorization,
// consent) are navigations, never fetched, and get no CORS header; nor
// does registration, so that a page cannot make each of its visitors'
// browsers register a client and fill the registered clients' bound.
func cors(w http.ResponseWriter, r *http.Request) bool {
	switch r.URL.Path {
	case WellKnown, TokenPath, RevokePath:
	default:
		return false
	}
	if r.Header.Get("Origin") == "" {
		return false
	}
	h := w.Header()
	h.Set("Access-Control-Allow-Origin", "*")
	h.Set("Access-Control-Expose-Headers", "DPoP-Nonce, WWW-Authenticate, Retry-After")
	if r.Method != http.MethodOptions || r.Header.Get("Access-Control-Request-Method") == "" {
		return false
	}
	h.Set("Access-Control-Allow-Methods", "GET, POST")
	h.Set("Access-Control-Allow-Headers", "Content-Type, DPoP")
	h.Set("Access-Control-Max-Age", "600")
	w.WriteHeader(http.StatusNoContent)
	return true
}

// remoteIP is the host of r's remote address.
func remoteIP(r *http.Request) string {
	if host, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		return host
	}
	return r.RemoteAddr
}

// isLoopbackHost says whether host (no port, brackets removed) is a
// loopback address, or the name localhost, which RFC 8252 §8.3 discourages
// but clients (Claude Code among them) use: pinnedfetch's predicate, the
// module's one, so that no spelling (an IPv4-mapped address, a zone) is
// loopback here and not to the egress rules.
func isLoopbackHost(host string) bool { return pinnedfetch.IsLoopbackHost(host) }

// scopesIn returns the scopes of want that are in have, in want's order.
func scopesIn(want, have []string) []string {
	var out []string
	for _, w := range want {
		if slices.Contains(have, w) {
			out = append(out, w)
		}
	}
	return out
}

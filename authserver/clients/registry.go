package clients

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/policy"
	"github.com/Tahul/caddy-zidane-mcp/storage"
)

// Defaults of [Config].
const (
	// DefaultMaxRegistered bounds the registered clients kept at once.
	DefaultMaxRegistered = 1000
	// DefaultRegisteredTTL is how long a registered client is kept after
	// its last use: a client that registered and never came back is
	// forgotten after 30 days, and registers again if it does come back.
	DefaultRegisteredTTL = 30 * 24 * time.Hour
)

// DefaultRegistrationLimit is the registrations one address may make: 10
// at once, then one every 6 minutes. A client registers once per server
// it is added to, so a person is far below it.
var DefaultRegistrationLimit = policy.Limit{Rate: 1.0 / 360, Burst: 10}

// StoragePrefix is where registered clients are kept, one key per client:
// StoragePrefix + "/" + client_id.
const StoragePrefix = "zidane/signin/clients"

// Config configures a [Registry].
type Config struct {
	// Storage keeps registered clients. Required when Registration is on.
	Storage storage.Storage
	// Registration allows dynamic client registration (RFC 7591). Off by
	// default: Register refuses, and only metadata-document clients are
	// accepted, with the clients registered while it was on (when Storage
	// holds them) until they expire unused.
	Registration bool
	// RegistrationLimit is the per-address rate of registrations;
	// DefaultRegistrationLimit when zero.
	RegistrationLimit policy.Limit
	// Limiter, when set, keeps the per-address buckets instead of a new
	// limiter of RegistrationLimit: one kept across config reloads (and
	// shared with other replicas through its usage) so that a reload does
	// not refill every address's bucket.
	Limiter *policy.Limiter
	// MaxRegistered bounds the registered clients kept; when reached,
	// registration is refused until unused ones expire.
	// DefaultMaxRegistered when zero.
	MaxRegistered int
	// RegisteredTTL is how long a registered client is kept after its last
	// use; DefaultRegisteredTTL when zero.
	RegisteredTTL time.Duration
	// FetchTimeout bounds one fetch of a metadata document, body included;
	// DefaultFetchTimeout when zero.
	FetchTimeout time.Duration
	// ClientIP is the address of a registration request's client, as the
	// edge established it (e.g. from Caddy's trusted proxies); nil takes
	// the request's remote address, never X-Forwarded-For.
	ClientIP func(*http.Request) string
	// OnRefusal, when set, receives every refusal, for the audit log.
	OnRefusal func(Refusal)
	// Now is the clock; time.Now when nil.
	Now func() time.Time
}

// Refusal is one refused resolution or registration, for the audit log.
// It carries no secret: no request body, no client_secret, no URL query.
type Refusal struct {
	// Kind is "resolve" or "registration".
	Kind string
	// ClientID is the client_id asked for, shown without query or
	// userinfo and clipped; "" for a registration.
	ClientID string
	// Address is the client address of a registration request.
	Address string
	// Code is the OAuth error code, Reason one word of why.
	Code, Reason string
}

// Registry resolves the client_id of an authorization or token request to
// a [Client], and registers clients when the operator allows it.
type Registry struct {
	cfg     Config
	docs    *documents
	limiter *policy.Limiter
}

// New returns a registry for cfg.
func New(cfg Config) (*Registry, error) {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.RegistrationLimit == (policy.Limit{}) {
		cfg.RegistrationLimit = DefaultRegistrationLimit
	}
	if err := cfg.RegistrationLimit.Validate(); err != nil {
		return nil, fmt.Errorf("registration limit: %w", err)
	}
	if cfg.MaxRegistered == 0 {
		cfg.MaxRegistered = DefaultMaxRegistered
	}
	if cfg.MaxRegistered < 0 {
		return nil, fmt.Errorf("max registered clients %d: give a positive number", cfg.MaxRegistered)
	}
	if cfg.RegisteredTTL == 0 {
		cfg.RegisteredTTL = DefaultRegisteredTTL
	}
	if cfg.RegisteredTTL < time.Hour {
		return nil, fmt.Errorf("registered client lifetime %v: give at least 1h", cfg.RegisteredTTL)
	}
	if cfg.FetchTimeout == 0 {
		cfg.FetchTimeout = DefaultFetchTimeout
	}
	if cfg.FetchTimeout < 0 || cfg.FetchTimeout > time.Minute {
		return nil, fmt.Errorf("metadata document fetch timeout %v: give up to 1m", cfg.FetchTimeout)
	}
	if cfg.Registration && cfg.Storage == nil {
		return nil, fmt.Errorf("dynamic client registration needs a storage")
	}
	limiter := cfg.Limiter
	if limiter == nil {
		limiter = policy.NewLimiter(cfg.RegistrationLimit)
	}
	return &Registry{
		cfg:     cfg,
		docs:    newDocuments(cfg.FetchTimeout, cfg.Now),
		limiter: limiter,
	}, nil
}

// RegistrationEnabled reports whether Register accepts registrations, for
// the authorization server's metadata (registration_endpoint).
func (r *Registry) RegistrationEnabled() bool { return r.cfg.Registration }

// Resolve returns the client that clientID names: for an https URL, the
// client its metadata document describes (fetched, checked and cached);
// for an id this server registered, the stored client. Any other
// clientID, an unknown or expired registration, or a document that was
// refused is an *[Error] with code invalid_client and a description that
// says what the client must change.
func (r *Registry) Resolve(ctx context.Context, clientID string) (Client, error) {
	c, err := r.resolve(ctx, clientID)
	if err != nil {
		r.refused(Refusal{Kind: "resolve", ClientID: shownClientID(clientID), Code: codeOf(err), Reason: Reason(err)})
	}
	return c, err
}

func (r *Registry) resolve(ctx context.Context, clientID string) (Client, error) {
	switch {
	case strings.HasPrefix(clientID, registeredPrefix):
		return r.loadRegistered(ctx, clientID)
	case hasURLScheme(clientID):
		return r.docs.resolve(ctx, clientID)
	}
	return Client{}, refuse(CodeInvalidClient, "unknown_client", "client_id: no such client; use an https URL of a client ID metadata document, or register first")
}

// hasURLScheme reports whether s starts like a URL (scheme:), so that an
// http or HTTPS client_id is refused for what it is.
func hasURLScheme(s string) bool {
	i := strings.IndexByte(s, ':')
	if i <= 0 {
		return false
	}
	for j := 0; j < i; j++ {
		c := s[j]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || j > 0 && ('0' <= c && c <= '9' || c == '+' || c == '-' || c == '.')) {
			return false
		}
	}
	return true
}

func (r *Registry) refused(ev Refusal) {
	if r.cfg.OnRefusal != nil {
		r.cfg.OnRefusal(ev)
	}
}

func codeOf(err error) string {
	if e, ok := err.(*Error); ok {
		return e.Code
	}
	return CodeTemporarilyUnavailable
}

// shownClientID is clientID fit for a log line: a URL without userinfo or
// query values, clipped to 200 bytes.
func shownClientID(id string) string {
	if hasURLScheme(id) {
		if u, err := url.Parse(id); err == nil {
			s := u.Scheme + "://" + u.Host + u.EscapedPath()
			if u.RawQuery != "" || u.ForceQuery {
				s += "?…"
			}
			id = s
		} else {
			id = "(a client_id that does not parse)"
		}
	}
	if len(id) > 200 {
		id = strings.ToValidUTF8(id[:200], "") + "…"
	}
	return id
}

// clientAddress is the address a registration request came from.
func (r *Registry) clientAddress(req *http.Request) string {
	if r.cfg.ClientIP != nil {
		return r.cfg.ClientIP(req)
	}
	host, _, err := net.SplitHostPort(req.RemoteAddr)
	if err != nil {
		return req.RemoteAddr
	}
	return host
}

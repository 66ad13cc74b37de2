package pinnedfetch

import (
	"crypto/tls"
	"fmt"
	"net/http"
	"net/url"
	"time"
)

// MaxRedirects is the most redirects a pinned client follows in one chain.
// [WithMaxRedirects] can lower it, never raise it.
const MaxRedirects = 10

// MaxResponseHeaderBytes bounds the headers of one answer (net/http's own
// default is 10 MiB). A client keeps an answer's headers for as long as its
// body is open, which for an event stream may be hours, and no bound on
// bodies counts them.
const MaxResponseHeaderBytes = 1 << 20

// Option configures [New].
type Option func(*options)

type options struct {
	decisions    func(Decision)
	maxRedirects int
	tlsConfig    *tls.Config
	deny         *bool
	credentials  func(next http.RoundTripper) http.RoundTripper
	lookup       lookupFunc
	safetyNet    func(address string) error
}

// WithDecisions has every decision of the client (each hop sent, followed or
// refused, and which header names were stripped) reported to fn, e.g. for an
// audit log. fn runs synchronously on the request's goroutine and may be
// called from several goroutines at once.
func WithDecisions(fn func(Decision)) Option {
	return func(o *options) { o.decisions = fn }
}

// WithMaxRedirects lowers the number of redirects followed in one chain,
// from [MaxRedirects] to n (0 refuses every redirect). New refuses n outside
// 0..MaxRedirects.
func WithMaxRedirects(n int) Option {
	return func(o *options) { o.maxRedirects = n }
}

// WithTLSConfig sets the TLS client configuration, e.g. RootCAs for a
// private CA. The config is cloned; MinVersion is raised to TLS 1.2 when
// lower.
func WithTLSConfig(cfg *tls.Config) Option {
	return func(o *options) { o.tlsConfig = cfg }
}

// DenyPrivateAddresses switches the dial-time address guard on or off. When
// on, every connection is checked after DNS resolution, on the address
// actually dialed, and refused unless it is globally reachable: private,
// loopback, link-local, CGNAT, documentation, benchmarking, reserved,
// multicast and cloud metadata addresses are refused, and so are IPv6 forms
// that carry one (NAT64, 6to4, Teredo; see [CheckAddress] for the list). By
// default the guard is on, except when the configured URL
// is itself loopback: plain http to a local server is the allowed local case.
func DenyPrivateAddresses(deny bool) Option {
	return func(o *options) { o.deny = &deny }
}

// WithCredentials installs the layer that adds credentials, such as an OAuth
// transport: wrap receives the network transport and returns a RoundTripper
// that adds credentials and then calls it.
//
// The pinned client calls the wrapped transport only for hops that still
// carry credentials (hops on the pinned origin, before the chain ever left
// it); every other hop bypasses the layer and goes to the network directly,
// so an injected Authorization never leaves the origin. As a second line,
// the transport handed to wrap refuses any request off the pinned origin.
func WithCredentials(wrap func(next http.RoundTripper) http.RoundTripper) Option {
	return func(o *options) { o.credentials = wrap }
}

// New returns an HTTP client pinned to the origin of configuredURL.
//
// headerNames lists the headers that carry secrets besides Authorization,
// Proxy-Authorization and Cookie (e.g. "X-Api-Key"); those, and the three,
// are removed from every hop off the pinned origin and stay removed for the
// rest of the chain.
//
// The client follows redirects in its own transport, checking every hop
// against the remote-URL rule, refusing HTTPS→HTTP downgrades, loops, chains
// longer than [MaxRedirects] and 307/308 hops whose body cannot be replayed.
// Its CheckRedirect returns [http.ErrUseLastResponse], so net/http's own
// redirect logic, which keeps Authorization on subdomains and after a
// downgrade, never runs. It has no Timeout, which would cut long-lived SSE
// streams; bound requests with their context. It never uses a proxy from the
// environment and never adds a Referer (net/http does, which tells the next
// origin the path it came from).
//
// Requests to another origin than the pinned one are allowed, if the URL
// passes the rule, but go out without credentials.
func New(configuredURL string, headerNames []string, opts ...Option) (*http.Client, error) {
	pinned, err := url.Parse(configuredURL)
	if err != nil {
		return nil, fmt.Errorf("pinnedfetch: configured URL does not parse (%v); write an absolute URL such as https://api.example.com/mcp", redactParseError(err))
	}
	if err := CheckRemoteURL(pinned); err != nil {
		return nil, err
	}
	o := options{maxRedirects: MaxRedirects}
	for _, opt := range opts {
		opt(&o)
	}
	if o.maxRedirects < 0 || o.maxRedirects > MaxRedirects {
		return nil, fmt.Errorf("pinnedfetch: WithMaxRedirects(%d) is out of range; use 0 to %d", o.maxRedirects, MaxRedirects)
	}
	sensitive, err := sensitiveSet(headerNames)
	if err != nil {
		return nil, err
	}
	deny := !IsLoopbackHost(pinned.Hostname())
	if o.deny != nil {
		deny = *o.deny
	}

	network := &http.Transport{
		Proxy:             nil,
		DialContext:       newDialContext(deny, o.lookup, o.safetyNet),
		ForceAttemptHTTP2: true,
		// A pinned client talks to one origin, so its whole idle pool is
		// that host's: net/http's default of 2 idle connections per host
		// closed and redialed most connections under concurrent load (a
		// gateway's MCP sessions share one client per upstream). Idle
		// connections still close after IdleConnTimeout.
		MaxIdleConns:           256,
		MaxIdleConnsPerHost:    256,
		IdleConnTimeout:        90 * time.Second,
		TLSHandshakeTimeout:    10 * time.Second,
		ExpectContinueTimeout:  1 * time.Second,
		MaxResponseHeaderBytes: MaxResponseHeaderBytes,
		TLSClientConfig:        tlsConfig(o.tlsConfig),
	}
	t := &transport{
		pinned:       pinned,
		origin:       Origin(pinned),
		sensitive:    sensitive,
		maxRedirects: o.maxRedirects,
		decisions:    o.decisions,
		network:      network,
		credentialed: network,
	}
	if o.credentials != nil {
		t.credentialed = o.credentials(&originGate{origin: t.origin, next: network})
		t.cloneFirst = true
	}
	return &http.Client{
		Transport: t,
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		},
	}, nil
}

func tlsConfig(cfg *tls.Config) *tls.Config {
	if cfg == nil {
		return &tls.Config{MinVersion: tls.VersionTLS12}
	}
	c := cfg.Clone()
	if c.MinVersion < tls.VersionTLS12 {
		c.MinVersion = tls.VersionTLS12
	}
	return c
}

// redactParseError keeps url.Parse's complaint but not the URL it quotes,
// which may hold a password.
func redactParseError(err error) error {
	if ue, ok := err.(*url.Error); ok {
		return ue.Err
	}
	return err
}

// sensitiveSet returns the canonical names of the headers that never leave
// the pinned origin.
func sensitiveSet(names []string) (map[string]bool, error) {
	set := map[string]bool{"Authorization": true, "Proxy-Authorization": true, "Cookie": true}
	for _, n := range names {
		if !validHeaderName(n) {
			return nil, fmt.Errorf("pinnedfetch: header name %q is not a valid HTTP field name; list names such as X-Api-Key", n)
		}
		set[http.CanonicalHeaderKey(n)] = true
	}
	return set, nil
}

func validHeaderName(n string) bool {
	if n == "" {
		return false
	}
	for i := 0; i < len(n); i++ {
		c := n[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case c < 0x80 && c > ' ' && c != 0x7f && !isSeparator(c):
		default:
			return false
		}
	}
	return true
}

func isSeparator(c byte) bool {
	switch c {
	case '(', ')', '<', '>', '@', ',', ';', ':', '\\', '"', '/', '[', ']', '?', '=', '{', '}':
		return true
	}
	return false
}

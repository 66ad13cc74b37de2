package upstream

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/broker/answerlimit"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/Tahul/caddy-zidane-mcp/pinnedfetch"
)

// States of a [Conn], as [Conn.State] reports them.
const (
	// ConnConnecting: a connection attempt is under way that callers wait
	// for (the first one after Dial, or the new session that replaces one
	// the upstream forgot).
	ConnConnecting = "connecting"
	// ConnReady: a live, initialized session.
	ConnReady = "ready"
	// ConnReconnecting: the session was lost or an attempt failed; the
	// Conn retries in the background with backoff, and calls fail fast.
	ConnReconnecting = "reconnecting"
	// ConnClosed: Close was called.
	ConnClosed = "closed"
)

// ConnOptions configures [Dial].
type ConnOptions struct {
	// Lookup reads the environment variables of the upstream's ${VAR}
	// placeholders; nil means os.LookupEnv. A config marked FromUntrusted
	// never calls it.
	Lookup func(string) (string, bool)

	// ClientInfo names the broker to the upstream in initialize. Default:
	// caddy-zidane-mcp.
	ClientInfo *mcp.Implementation

	// ClientOptions are the go-sdk client options (notification handlers,
	// capabilities, ...). One mcp.Client is built from them and used for
	// every session of this Conn.
	ClientOptions *mcp.ClientOptions

	// OnDecision receives every redirect decision of the egress client,
	// for audit (http and sse).
	OnDecision func(pinnedfetch.Decision)

	// DenyPrivateAddresses, when set, turns pinnedfetch's dial-time address
	// guard on or off. Unset keeps its default: on, except for an upstream
	// URL on loopback.
	DenyPrivateAddresses *bool

	// Logger receives warnings: unset variables, lost connections, failed
	// attempts and, for stdio upstreams, every line the process writes to
	// stderr. Nil discards them.
	Logger *slog.Logger

	// Backoff bounds the delay between reconnection attempts.
	Backoff Backoff

	// Credentials, when set, wraps the egress transport of an http or sse
	// upstream for hops on its origin (see
	// [PassThroughOptions.Credentials]).
	Credentials func(next http.RoundTripper) http.RoundTripper

	// ProtocolVersion, when set, is the MCP version the broker asks for
	// in initialize (e.g. "2025-11-25" for upstreams that do not speak the
	// SDK's newest one). Empty lets the SDK choose.
	ProtocolVersion string

	// AnswerBudget, when set, bounds the bytes of upstream answers held at
	// once across every upstream that shares it (see [answerlimit.Budget]).
	AnswerBudget *answerlimit.Budget
}

// MaxStderrLine bounds one logged line of a stdio upstream's stderr; the
// rest of a longer line is dropped and the log record says it was cut.
const MaxStderrLine = 4 << 10

// Conn is the broker's own MCP client connection to one upstream, for the
// aggregated route. It keeps one session open and replaces it when it is
// lost:
//
//   - Dial returns at once and connects in the background. Until the first
//     attempt ends, [Conn.Session] and the calls wait for it (bounded by
//     their ctx).
//   - When the upstream answers 404 to the session (go-sdk's
//     [mcp.ErrSessionMissing]: it restarted or expired the session), the
//     call that saw it initializes a new session and is retried once on
//     it.
//   - When the connection drops (transport closed, EOF, connection refused)
//     the Conn reconnects in the background with exponential backoff and
//     jitter ([ConnOptions.Backoff]); calls meanwhile fail fast with an error
//     that names the upstream and the cause. [Conn.CallTool] turns such
//     failures into a tool-error result.
//
// Transports: "http" uses go-sdk's streamable client and "sse" its SSE
// client, both over a pinnedfetch client pinned to the upstream URL that
// adds the configured headers on that origin only. Any request to another
// origin is refused before it is sent, so an SSE server whose endpoint event
// points elsewhere is refused. "stdio" runs the command with only PATH, HOME
// and the configured env, and logs its stderr line by line as warnings.
//
// A Conn is safe for concurrent use.
type Conn struct {
	name    string
	e       Config // expanded
	shown   string // the URL as it may appear in messages
	client  *mcp.Client
	tr      *Transports
	http    *http.Client // nil for stdio
	guard   *originGuard // nil for stdio
	logger  *slog.Logger
	backoff Backoff
	timeout time.Duration // bound of one connection attempt
	version string        // ConnOptions.ProtocolVersion

	ctx    context.Context // lifetime; cancelled by Close
	cancel context.CancelFunc
	done   chan struct{} // closed when the supervisor exits

	mu      sync.Mutex
	state   string
	lastErr error
	cur     *live
	retired *live         // the last session retired, while no other is live
	changed chan struct{} // closed and replaced on every state change
	now     chan struct{} // asks the supervisor to skip its backoff
}

// live is one session and what tears it down.
type live struct {
	cs     *mcp.ClientSession
	cancel context.CancelFunc
	dead   chan struct{}
	once   sync.Once
	// set before dead is closed
	missing bool
}

func (l *live) kill(missing bool) bool {
	killed := false
	l.once.Do(func() {
		l.missing = missing
		close(l.dead)
		killed = true
	})
	return killed
}

// Dial builds the connection to u and returns at once; the first session is
// opened in the background (use [Conn.Session] to wait for it). Errors here
// are configuration errors (transport, URL, headers, placeholders), naming
// the upstream. Close the Conn when done.
func Dial(ctx context.Context, u Config, opts ConnOptions) (*Conn, error) {
	logger := opts.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	n, err := Normalize(u)
	if err != nil {
		return nil, err
	}
	e, warnings := n.Expanded(opts.Lookup)
	for _, w := range warnings {
		logger.Warn(w)
	}
	c := &Conn{
		name:    n.Name,
		e:       e,
		logger:  logger,
		backoff: opts.Backoff.withDefaults(),
		timeout: cmp.Or(n.Timeout, DefaultHeaderTimeout),
		version: opts.ProtocolVersion,
		state:   ConnConnecting,
		changed: make(chan struct{}),
		now:     make(chan struct{}, 1),
		done:    make(chan struct{}),
	}
	if c.tr, err = NewTransports(n, e, opts, logger); err != nil {
		return nil, err
	}
	c.http, c.guard = c.tr.HTTP, c.tr.guard
	if c.http != nil {
		c.shown = n.Redacted().URL
	}
	info := opts.ClientInfo
	if info == nil {
		info = &mcp.Implementation{Name: "caddy-zidane-mcp", Version: "1"}
	}
	c.client = mcp.NewClient(info, opts.ClientOptions)
	// The lifetime is not the caller's ctx: Dial returns at once and the
	// connection outlives it. Its values (trace ids) are kept.
	c.ctx, c.cancel = context.WithCancel(context.WithoutCancel(ctx))
	go c.supervise()
	return c, nil
}

// connHTTPClient builds the pinned egress client for an http or sse
// upstream, as the pass-through route does, guarded against requests to
// any other origin.
func connHTTPClient(n, e Config, opts ConnOptions) (*http.Client, error) {
	endpoint, err := e.Endpoint()
	if err != nil {
		return nil, err
	}
	headers, err := ConfiguredHeaders(e)
	if err != nil {
		return nil, err
	}
	pinned, err := PinnedClient(e.URL, headers, opts.OnDecision, opts.DenyPrivateAddresses, opts.Credentials, false)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", Describe(n), err)
	}
	limit := answerlimit.NewTransport(&TraceTransport{Upstream: n.Name, Next: &originGuard{upstream: n.Name, origin: pinnedfetch.Origin(endpoint), next: pinned.Transport}},
		n.Name, n.MaxResponse, opts.AnswerBudget)
	limit.SDKLines = true
	return &http.Client{
		// Every answer is bounded by max_response and the budget, under
		// whatever reads it (go-sdk's transports, the fast path).
		Transport:     limit,
		CheckRedirect: pinned.CheckRedirect,
		// No Timeout: it would cut SSE streams. Requests are bounded by
		// their context.
	}, nil
}

// ErrOffOrigin is wrapped by the error of a request the broker's client
// refused because it was not for the configured upstream's origin, such as
// an SSE endpoint event that points to another server.
var ErrOffOrigin = errors.New("request to another origin than the configured upstream URL")

// originGuard refuses every request whose URL is not on the pinned origin.
// pinnedfetch checks the redirects it follows; this checks the requests
// themselves, which the SSE client aims at whatever URL the server's
// endpoint event names.
type originGuard struct {
	upstream string
	origin   string
	next     http.RoundTripper
	refused  atomic.Pointer[error] // the last refusal, for the attempt's error
}

func (g *originGuard) RoundTrip(req *http.Request) (*http.Response, error) {
	if got := pinnedfetch.Origin(req.URL); got != g.origin {
		if req.Body != nil {
			req.Body.Close()
		}
		err := fmt.Errorf("upstream %q: refused a %s to %s: %w (%s); the server's SSE endpoint event must name a URL on the configured origin",
			g.upstream, req.Method, cmp.Or(got, "a URL without origin"), ErrOffOrigin, g.origin)
		g.refused.Store(&err)
		return nil, err
	}
	return g.next.RoundTrip(req)
}

func (g *originGuard) CloseIdleConnections() {
	if ci, ok := g.next.(interface{ CloseIdleConnections() }); ok {
		ci.CloseIdleConnections()
	}
}

// Transports builds the go-sdk client transports of one upstream.
// [Conn] and the aggregated route ([Aggregate]) both use it, so that the
// pinned, origin-guarded egress client (http, sse) and the stdio launcher
// exist once.
type Transports struct {
	name   string
	guard  *originGuard           // nil for stdio
	limit  *answerlimit.Transport // bounds every answer; nil for stdio
	logger *slog.Logger           // receives a stdio process's stderr

	// Expanded is the upstream's config, placeholders expanded.
	Expanded Config
	// HTTP is the egress client of http and sse: pinned, origin-guarded,
	// every answer bounded and traced; nil for stdio.
	HTTP *http.Client
	// MaxRetries is the streamable client's MaxRetries (0: go-sdk's
	// default).
	MaxRetries int
	// PIDDir, when set, receives a pid file for every stdio process
	// (see [CleanOrphans]).
	PIDDir string
}

// WrapHTTP puts the RoundTripper wrap returns in front of the http
// transport's egress client, under go-sdk's streamable client and the
// aggregated route's fast paths alike (the aggregated route counts the
// notifications in its upstreams' event streams there, and hands go-sdk
// each event as a client reads it). It does nothing for the other
// transports.
func (t *Transports) WrapHTTP(wrap func(http.RoundTripper) http.RoundTripper) {
	if t.Expanded.Transport != TransportHTTP || t.HTTP == nil {
		return
	}
	t.HTTP = &http.Client{Transport: wrap(t.HTTP.Transport), CheckRedirect: t.HTTP.CheckRedirect}
}

// NewTransports checks the transport of the normalized upstream n
// (e is n expanded) and builds what its transports share: for http and sse
// the egress client, as [connHTTPClient] does. Errors name the upstream.
func NewTransports(n, e Config, opts ConnOptions, logger *slog.Logger) (*Transports, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	t := &Transports{name: n.Name, Expanded: e, logger: logger}
	switch n.Transport {
	case TransportHTTP, TransportSSE:
		hc, err := connHTTPClient(n, e, opts)
		if err != nil {
			return nil, err
		}
		t.limit = hc.Transport.(*answerlimit.Transport)
		t.HTTP, t.guard = hc, t.limit.Next.(*TraceTransport).Next.(*originGuard)
	case TransportStdio:
		if v, ok := FirstPlaceholder(e.Command); ok {
			return nil, fmt.Errorf("%s: command still holds the placeholder for %s: set %s in the environment of the Caddy process", Describe(n), v, v)
		}
	default:
		return nil, fmt.Errorf("%s: transport %q is not supported by the broker's client", Describe(n), n.Transport)
	}
	return t, nil
}

// NewTransport returns a new go-sdk transport for one connection: the
// streamable or SSE client over the guarded egress client, or, for stdio,
// one that starts the command on Connect (the process ends when that
// connection is closed).
func (t *Transports) NewTransport() mcp.Transport {
	switch t.Expanded.Transport {
	case TransportHTTP:
		return &mcp.StreamableClientTransport{Endpoint: t.Expanded.URL, HTTPClient: t.HTTP, MaxRetries: t.MaxRetries}
	case TransportSSE:
		return &mcp.SSEClientTransport{Endpoint: t.Expanded.URL, HTTPClient: t.HTTP}
	default:
		return &stdioTransport{t: t}
	}
}

// WatchLimit calls fn with the limit failure of an answer on the upstream
// session sid (http and sse), until the returned func is called.
func (t *Transports) WatchLimit(sid string, fn func(error)) (unwatch func()) {
	if t.limit == nil {
		return func() {}
	}
	return t.limit.Watch(sid, fn)
}

// LimitMax is the upstream's max_response (0 for stdio).
func (t *Transports) LimitMax() int64 {
	if t.limit == nil {
		return 0
	}
	return t.limit.Max
}

// Refusal returns, and forgets, the last request the origin guard refused
// (nil when none, or for stdio). The SDK may report a failed attempt as a
// closed connection rather than the refusal that closed it.
func (t *Transports) Refusal() error {
	if t.guard == nil {
		return nil
	}
	if r := t.guard.refused.Swap(nil); r != nil {
		return *r
	}
	return nil
}

// CloseIdle releases the egress client's idle connections.
func (t *Transports) CloseIdle() {
	if t.HTTP != nil {
		t.HTTP.CloseIdleConnections()
	}
}

// transport returns a new go-sdk transport for one connection attempt.
func (c *Conn) transport() mcp.Transport { return c.tr.NewTransport() }

// supervise keeps a session open until Close: it connects, waits for the
// session to die, and reconnects with backoff.
func (c *Conn) supervise() {
	defer close(c.done)
	failures := 0
	for {
		select {
		case <-c.now:
		default:
		}
		l, err := c.connect()
		c.mu.Lock()
		if c.state == ConnClosed {
			c.mu.Unlock()
			if l != nil {
				l.kill(false)
				c.drop(l)
			}
			return
		}
		if err != nil {
			c.setLocked(ConnReconnecting, err)
			c.mu.Unlock()
			delay := c.backoff.Delay(failures)
			failures++
			c.logger.Warn("upstream connection attempt failed; retrying", "upstream", c.name, "error", err.Error(), "retry_in", delay)
			if !c.sleep(delay) {
				return
			}
			continue
		}
		opened := time.Now()
		c.cur, c.retired = l, nil
		c.setLocked(ConnReady, nil)
		c.mu.Unlock()
		go func() {
			err := cmp.Or(l.cs.Wait(), io.EOF)
			if errors.Is(err, mcp.ErrSessionMissing) {
				c.invalidate(l, fmt.Errorf("the upstream no longer knows the session (HTTP 404): %s", c.clean(err)), true)
				return
			}
			c.invalidate(l, fmt.Errorf("connection lost: %s", c.clean(err)), false)
		}()
		select {
		case <-l.dead:
		case <-c.ctx.Done():
			return
		}
		if time.Since(opened) > c.backoff.Max {
			failures = 0 // it was up for a while: start the backoff again
		}
		if !l.missing {
			// A dropped connection: back off before the first attempt
			// too, so a server that accepts and drops at once is not
			// hammered.
			delay := c.backoff.Delay(failures)
			failures++
			if !c.sleep(delay) {
				return
			}
		}
	}
}

func (c *Conn) sleep(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-c.now:
		return true
	case <-c.ctx.Done():
		return false
	}
}

// connect opens and initializes one session, within the attempt timeout.
func (c *Conn) connect() (*live, error) {
	// The connection's context lives as long as the session (the SSE
	// client reads its stream under it); a timer bounds the attempt.
	connCtx, cancel := context.WithCancel(c.ctx)
	if c.guard != nil {
		c.guard.refused.Store(nil)
	}
	timer := time.AfterFunc(c.timeout, cancel)
	var sessOpts *mcp.ClientSessionOptions
	if c.version != "" {
		sessOpts = &mcp.ClientSessionOptions{ProtocolVersion: c.version}
	}
	cs, err := c.client.Connect(connCtx, c.transport(), sessOpts)
	expired := !timer.Stop()
	if err == nil && expired {
		cs.Close()
		err = context.DeadlineExceeded
	}
	if err != nil {
		cancel()
		if c.ctx.Err() != nil {
			return nil, errors.New("connection closed")
		}
		if expired {
			return nil, fmt.Errorf("no answer to initialize within %v", c.timeout)
		}
		if c.guard != nil {
			// The SDK may report the closed connection rather than the
			// refusal that closed it.
			if refused := c.guard.refused.Swap(nil); refused != nil {
				return nil, *refused
			}
		}
		return nil, c.clean(err)
	}
	return &live{cs: cs, cancel: cancel, dead: make(chan struct{})}, nil
}

// invalidate retires l, if it is still the current session, because of
// cause: with missing (the upstream forgot the session) a new session is
// opened at once and callers wait for it; otherwise the Conn reconnects in
// the background and callers fail fast meanwhile.
func (c *Conn) invalidate(l *live, cause error, missing bool) {
	c.mu.Lock()
	if c.state == ConnClosed {
		c.mu.Unlock()
		return
	}
	if c.cur != l {
		// Already retired, e.g. as a lost connection by the watcher of
		// its Wait, while a call learned that the upstream only forgot the
		// session: skip the backoff, and let callers wait for the attempt.
		if missing && c.retired == l && c.state == ConnReconnecting {
			c.setLocked(ConnConnecting, cause)
			select {
			case c.now <- struct{}{}:
			default:
			}
		}
		c.mu.Unlock()
		return
	}
	c.cur, c.retired = nil, l
	if missing {
		c.setLocked(ConnConnecting, cause)
	} else {
		c.setLocked(ConnReconnecting, cause)
	}
	c.mu.Unlock()
	c.logger.Warn("upstream session lost; reconnecting", "upstream", c.name, "error", cause.Error())
	l.kill(missing)
	go c.drop(l)
}

// drop closes a retired session.
func (c *Conn) drop(l *live) {
	_ = l.cs.Close()
	l.cancel()
}

// setLocked changes the state and wakes the waiters. c.mu is held.
func (c *Conn) setLocked(state string, err error) {
	c.state, c.lastErr = state, err
	close(c.changed)
	c.changed = make(chan struct{})
}

// UpstreamError is the error of a call that could not reach the upstream:
// it names the upstream, the Conn's state and the cause.
type UpstreamError struct {
	Upstream string
	State    string
	Err      error
}

func (e *UpstreamError) Error() string {
	switch e.State {
	case ConnClosed:
		return fmt.Sprintf("upstream MCP server %q: the broker's connection to it is closed", e.Upstream)
	case ConnReconnecting:
		return fmt.Sprintf("upstream MCP server %q is unavailable (%v); the broker is reconnecting, try again shortly", e.Upstream, e.Err)
	case ConnConnecting:
		return fmt.Sprintf("upstream MCP server %q is still connecting (%v)", e.Upstream, e.Err)
	}
	return fmt.Sprintf("upstream MCP server %q failed: %v", e.Upstream, e.Err)
}

func (e *UpstreamError) Unwrap() error { return e.Err }

// await returns the live session. In the connecting state it waits for the
// attempt under way, bounded by ctx; in any other state but ready it fails
// at once.
func (c *Conn) await(ctx context.Context) (*live, error) {
	for {
		c.mu.Lock()
		state, l, lastErr, changed := c.state, c.cur, c.lastErr, c.changed
		c.mu.Unlock()
		switch state {
		case ConnReady:
			return l, nil
		case ConnClosed:
			return nil, &UpstreamError{Upstream: c.name, State: state, Err: errors.New("closed")}
		case ConnReconnecting:
			return nil, &UpstreamError{Upstream: c.name, State: state, Err: lastErr}
		}
		select {
		case <-changed:
		case <-ctx.Done():
			cause := ctx.Err()
			if lastErr != nil {
				cause = fmt.Errorf("%w, after %v", cause, lastErr)
			}
			return nil, &UpstreamError{Upstream: c.name, State: state, Err: cause}
		}
	}
}

// Session returns the current live session. While the first connection
// (or the replacement of a session the upstream forgot) is under way it
// waits for it, bounded by ctx; while reconnecting after a failure, or
// after Close, it fails at once with an [*UpstreamError] naming the
// upstream and what happened.
func (c *Conn) Session(ctx context.Context) (*mcp.ClientSession, error) {
	l, err := c.await(ctx)
	if err != nil {
		return nil, err
	}
	return l.cs, nil
}

// do runs fn on the live session, handles its failure (a forgotten session
// is replaced and fn retried once on the new one; a lost connection starts
// a reconnect) and returns an [*UpstreamError] for failures to reach the
// upstream. Errors the upstream answered (JSON-RPC errors) and the
// caller's cancellation are returned as they are.
func (c *Conn) do(ctx context.Context, fn func(*mcp.ClientSession) error) error {
	l, err := c.await(ctx)
	if err != nil {
		return err
	}
	err = fn(l.cs)
	if err == nil || !c.handle(ctx, l, err) {
		return c.clean(err)
	}
	if !errors.Is(err, mcp.ErrSessionMissing) {
		return &UpstreamError{Upstream: c.name, State: ConnReconnecting, Err: c.clean(err)}
	}
	// The upstream forgot the session: initialize a new one and retry once.
	if l, err = c.await(ctx); err != nil {
		return err
	}
	err = fn(l.cs)
	if err == nil || !c.handle(ctx, l, err) {
		return c.clean(err)
	}
	return &UpstreamError{Upstream: c.name, State: ConnReconnecting, Err: c.clean(err)}
}

// handle classifies a failed call on l. It reports whether the failure was
// the connection's (and retires l); false means the error is the upstream's
// answer or the caller's cancellation.
func (c *Conn) handle(ctx context.Context, l *live, err error) bool {
	if ctx.Err() != nil {
		return false
	}
	var rpcErr *jsonrpc.Error
	switch {
	case errors.Is(err, mcp.ErrSessionMissing):
		c.invalidate(l, fmt.Errorf("the upstream no longer knows the session (HTTP 404): %s", c.clean(err)), true)
		return true
	case connFailure(err):
		c.invalidate(l, c.clean(err), false)
		return true
	case errors.As(err, &rpcErr):
		return false
	}
	return false
}

// connFailure reports whether err says the connection failed (rather than
// the upstream answering with an error).
func connFailure(err error) bool {
	var (
		ue *url.Error
		oe *net.OpError
	)
	return errors.Is(err, mcp.ErrConnectionClosed) || errors.Is(err, io.EOF) ||
		errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) ||
		errors.Is(err, ErrOffOrigin) || errors.As(err, &ue) || errors.As(err, &oe)
}

// sessionIDs matches the upstream's session ids in the SDK's errors (the
// streamable "(session ID: …)" and the SSE endpoint's sessionid query):
// they are the upstream's, and no client of the broker may see them.
var sessionIDs = regexp.MustCompile(`\(session ID: [^)]*\)|(?i)(sessionid=)[^&"\s]*`)

// clean returns err with the expanded URL (which may hold a key in its
// query) replaced by its redacted form and upstream session ids removed.
func (c *Conn) clean(err error) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	out := msg
	if c.e.URL != "" && c.shown != c.e.URL {
		out = strings.ReplaceAll(out, c.e.URL, c.shown)
	}
	out = sessionIDs.ReplaceAllStringFunc(out, func(m string) string {
		if strings.HasPrefix(m, "(") {
			return "(session ID redacted)"
		}
		return m[:len("sessionid=")] + "redacted"
	})
	if out == msg {
		return err
	}
	return &cleanError{msg: out, err: err}
}

type cleanError struct {
	msg string
	err error
}

func (e *cleanError) Error() string { return e.msg }
func (e *cleanError) Unwrap() error { return e.err }

// CallTool calls a tool of the upstream (by its own name). When the
// upstream cannot be reached (still connecting past ctx, reconnecting, the
// connection dropped during the call, Close called) it returns a tool-error
// result (IsError, with a text naming the upstream and the cause) and a nil
// error, so the agent sees why. A JSON-RPC error the upstream answered, and
// the caller's own cancellation, are returned as errors.
func (c *Conn) CallTool(ctx context.Context, params *mcp.CallToolParams) (*mcp.CallToolResult, error) {
	var res *mcp.CallToolResult
	err := c.do(ctx, func(cs *mcp.ClientSession) error {
		var err error
		res, err = cs.CallTool(ctx, params)
		return err
	})
	if err == nil {
		return res, nil
	}
	var ue *UpstreamError
	if errors.As(err, &ue) && !errors.Is(ctx.Err(), context.Canceled) {
		return &mcp.CallToolResult{
			IsError: true,
			Content: []mcp.Content{&mcp.TextContent{Text: ue.Error()}},
		}, nil
	}
	return nil, err
}

// ListTools lists every tool of the upstream, following pagination. Its
// errors are as for [Conn.CallTool], but returned as errors
// ([*UpstreamError] when the upstream cannot be reached).
func (c *Conn) ListTools(ctx context.Context) ([]*mcp.Tool, error) {
	var tools []*mcp.Tool
	err := c.do(ctx, func(cs *mcp.ClientSession) error {
		tools = tools[:0]
		for t, err := range cs.Tools(ctx, nil) {
			if err != nil {
				return err
			}
			tools = append(tools, t)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return tools, nil
}

// State reports the connection state: "connecting", "ready",
// "reconnecting" or "closed", followed by the last error when there is
// one, e.g. "reconnecting: connection lost: EOF".
func (c *Conn) State() string {
	state, err := c.Status()
	if err != nil && state != ConnReady {
		return state + ": " + err.Error()
	}
	return state
}

// Status returns the state (one of the Conn* constants) and the last
// error, if any.
func (c *Conn) Status() (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.state, c.lastErr
}

// Name returns the upstream's name.
func (c *Conn) Name() string { return c.name }

// Close closes the session (for stdio, stops the process: stdin closed,
// then SIGTERM after 5s) and stops reconnecting. Calls then fail with an
// [*UpstreamError]. Close waits for the background work to stop; it is safe
// to call more than once.
func (c *Conn) Close() error {
	c.mu.Lock()
	if c.state == ConnClosed {
		c.mu.Unlock()
		<-c.done
		return nil
	}
	l := c.cur
	c.cur = nil
	c.setLocked(ConnClosed, nil)
	c.mu.Unlock()
	var err error
	if l != nil {
		l.kill(false)
		err = l.cs.Close()
		l.cancel()
	}
	c.cancel()
	<-c.done
	if c.http != nil {
		c.http.CloseIdleConnections()
	}
	if errors.Is(err, mcp.ErrConnectionClosed) || errors.Is(err, io.EOF) {
		err = nil
	}
	return err
}

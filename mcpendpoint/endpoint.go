//lint:file-ignore SA1019 session events travel as notifications/message to 2025-11-25 clients only (deprecated from 2026-07-28, SEP-2577, whose clients get resource updates instead); see doc.go.

package mcpendpoint

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/Tahul/caddy-zidane-mcp/approvals"
	"github.com/Tahul/caddy-zidane-mcp/internal/mcpidle"
	"github.com/Tahul/caddy-zidane-mcp/policy"
	"github.com/Tahul/caddy-zidane-mcp/sessions"
)

// Options configure an [Endpoint].
type Options struct {
	// Sessions is the session engine. Required.
	Sessions sessions.Sessions
	// Agents are the names of the configured agents, which `create` accepts
	// in its `agent` argument and its schema lists. Empty means any name is
	// passed to the engine, which decides.
	Agents []string
	// MaxRequestBodyBytes bounds each request body; larger ones get 413.
	// Zero means go-sdk's default (4 MiB).
	MaxRequestBodyBytes int64
	// SessionTimeout closes an MCP session that has had no request in
	// flight for this long; an open GET stream is a request in flight, so
	// a client listening for session events keeps its session. Its memory
	// (go-sdk's session, its event-store entries, the push queue) is
	// released; the client gets 404 and initializes again. Zero means MCP
	// sessions never time out.
	SessionTimeout time.Duration
	// NewSessionID, when set, gives the id of each new 2025-11-25 MCP
	// session (go-sdk's ServerOptions.GetSessionID); by default go-sdk's
	// random one. In a cluster it seals the node that holds the session
	// into its id, so that another replica can forward to it. It must be
	// unguessable and visible ASCII.
	NewSessionID func() string
	// Logger receives the endpoint's and go-sdk's diagnostics. Nil discards
	// them.
	Logger *slog.Logger
	// Approvals, when set, are the calls approve rules hold: the
	// interactions tool lists those the caller may answer and answers
	// them (package approvals).
	Approvals *approvals.Store
	// OnRefusal, when set, hears of every call refused for whose session it
	// is, for the tools it asked for, or for a directory the engine keeps
	// from agents (the edge audits the others).
	OnRefusal func(Refusal)
}

// Refusal is a tool call the endpoint refused on its own rules: a session
// of another owner (Reason "not_owner"), an orchestrator's tools beyond
// the caller's scopes ("tools_beyond_scope"), or a session directory that
// reaches a path of the gateway's own ("denied_path", the engine's
// sessions.ErrDenied).
type Refusal struct {
	Principal policy.Principal
	Tool      string
	Verb      string
	// Target is the session or request id the call named, if any.
	Target  string
	Reason  string
	Message string
}

// Access is what the route in front of the endpoint says of its host: the
// scope map that decided the call, and whether sessions are shared. The
// endpoint is shared by every site over one storage, so each request
// carries its route's (see WithAccess).
type Access struct {
	// Scopes is the route's scope map. create checks an orchestrator's
	// tools against it: the session's token may only hold verbs its
	// creator may call. Nil means the default rules.
	Scopes *policy.ScopeMap
	// ShareSessions lets every caller read every owner's sessions, for a
	// host with one person behind every token (the share_sessions option).
	// Acting on them still takes sessions:any.
	ShareSessions bool
}

type accessKey struct{}

// WithAccess returns a context that carries a, for requests to the
// endpoint.
func WithAccess(ctx context.Context, a Access) context.Context {
	return context.WithValue(ctx, accessKey{}, a)
}

// defaultScopes decides orchestrators' tools when a request carries no
// route's scope map (a test, or an embedding without the edge).
var defaultScopes, _ = policy.NewScopeMap(nil, true)

func accessFrom(ctx context.Context) Access {
	a, _ := ctx.Value(accessKey{}).(Access)
	if a.Scopes == nil {
		a.Scopes = defaultScopes
	}
	return a
}

// Endpoint serves the `sessions` and `interactions` tools over MCP's
// streamable HTTP transport and pushes session events to connected clients.
type Endpoint struct {
	engine    sessions.Sessions
	approvals *approvals.Store
	agents    []string
	log       *slog.Logger
	server    *mcp.Server
	handler   http.Handler
	// modern and stateless serve MCP 2026-07-28: the same tools and the
	// sessions' events resources, with no state between requests.
	modern    *mcp.Server
	stateless http.Handler
	// listening counts the open subscriptions/listen streams; updates
	// queues the sessions whose events they wait for.
	listening *listens
	updates   chan string
	// eventStore keeps what was pushed to an MCP session for replay when
	// its GET stream (re)connects.
	eventStore *mcp.MemoryEventStore
	// idle closes the MCP sessions left unused for Options.SessionTimeout.
	// It replaces go-sdk's SessionTimeout, which does not count a GET
	// stream as use.
	idle *mcpidle.Sessions

	unsubscribe func()
	onRefusal   func(Refusal)

	mu     sync.Mutex
	peers  map[string]*peer // connected MCP sessions, by MCP session id
	closed bool
	wg     sync.WaitGroup // push and sweep goroutines

	stopSweep chan struct{}
}

// edgeAuthorization replaces the client's Authorization header before the
// request reaches go-sdk: its bearer middleware wants a header, but the
// identity comes from the principal in the context, and the credential
// itself has no business further in.
const edgeAuthorization = "Bearer edge-authenticated"

// New builds the MCP server, its HTTP handler, and subscribes to the
// engine's events. Call Close to unsubscribe and end the MCP sessions.
func New(opts Options) (*Endpoint, error) {
	if opts.Sessions == nil {
		return nil, errors.New("mcpendpoint: Options.Sessions is required")
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	e := &Endpoint{
		engine: opts.Sessions,
		agents: append([]string(nil), opts.Agents...),
		log:    log,
		peers:  make(map[string]*peer),
		idle:   mcpidle.New(opts.SessionTimeout),

		onRefusal: opts.OnRefusal,
		approvals: opts.Approvals,
	}

	e.server = mcp.NewServer(&mcp.Implementation{
		Name:    "zidane-sessions",
		Title:   "Coding-agent sessions",
		Version: "1",
	}, &mcp.ServerOptions{
		Instructions: serverInstructions,
		Logger:       log,
		GetSessionID: opts.NewSessionID,
		Capabilities: &mcp.ServerCapabilities{
			Logging: &mcp.LoggingCapabilities{},
			// Claude Code listens for notifications/claude/channel from
			// servers that declare this.
			Experimental: map[string]any{channelCapability: map[string]any{}},
		},
	})
	e.server.AddTool(sessionsTool(e.agents), e.callSessions)
	e.server.AddTool(interactionsTool(), e.callInteractions)
	e.server.AddReceivingMiddleware(e.onInitialize)

	e.eventStore = mcp.NewMemoryEventStore(nil)
	streamable := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return e.server },
		&mcp.StreamableHTTPOptions{
			EventStore:          e.eventStore,
			MaxRequestBodyBytes: opts.MaxRequestBodyBytes,
			Logger:              log,
		})
	bearer := auth.RequireBearerToken(verifyPrincipal, &auth.RequireBearerTokenOptions{
		// Principals carry no expiry of their own: the edge checked it.
		AllowMissingExpiration: true,
	})
	e.handler = bearer(channelStreams(streamable))

	// MCP 2026-07-28: a temporary go-sdk session per POST, closed when the
	// POST ends; no event store, since there is no stream to resume.
	e.modern = e.newModernServer()
	e.listening = newListens()
	e.updates = make(chan string, updateQueue)
	e.stateless = bearer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return e.modern },
		&mcp.StreamableHTTPOptions{
			Stateless:           true,
			MaxRequestBodyBytes: opts.MaxRequestBodyBytes,
			Logger:              quietLogger(log),
			// A client that hangs up ends its call (a wait, a listen).
			PropagateRequestCancellation: true,
		}))

	e.unsubscribe = e.engine.Subscribe(e.onEvent)
	e.stopSweep = make(chan struct{})
	e.wg.Add(2)
	go e.sweepPeers(peerSweepEvery)
	go e.sendUpdates()
	return e, nil
}

// ServeHTTP serves MCP's streamable HTTP transport (POST, GET, DELETE). The
// request must carry the policy.Principal the edge authenticated; without
// one it gets 401, and a machine principal gets 403. An MCP session id
// presented with another principal than the one that opened it gets 403
// from go-sdk.
func (e *Endpoint) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if e.isClosed() {
		http.Error(w, "the sessions endpoint is shutting down: reconnect in a moment", http.StatusServiceUnavailable)
		return
	}
	p, ok := policy.PrincipalFrom(r.Context())
	if ok && p.Kind == policy.KindMachine {
		http.Error(w, fmt.Sprintf("token %q is a machine token, and machine tokens may not drive coding-agent sessions: use a user token", p.Name),
			http.StatusForbidden)
		return
	}
	modern := isModern(r)
	if sid := r.Header.Get("Mcp-Session-Id"); sid != "" && ok && !modern {
		defer e.idle.Use(sid, p.TokenID)()
	}
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", edgeAuthorization)
	if modern {
		e.stateless.ServeHTTP(w, r)
		return
	}
	e.handler.ServeHTTP(w, r)
}

// Close stops event delivery and closes every connected MCP session. It
// waits for tool calls in flight to return. ServeHTTP answers 503 after.
func (e *Endpoint) Close() error {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil
	}
	e.closed = true
	close(e.stopSweep)
	e.idle.Stop()
	peers := make([]*peer, 0, len(e.peers))
	for _, p := range e.peers {
		peers = append(peers, p)
	}
	e.mu.Unlock()

	e.unsubscribe()
	e.listening.closeAll()
	var errs []error
	for _, p := range peers {
		if err := p.ss.Close(); err != nil {
			errs = append(errs, fmt.Errorf("closing MCP session %s: %w", p.ss.ID(), err))
		}
	}
	e.wg.Wait()
	e.mu.Lock()
	for id, p := range e.peers {
		delete(e.peers, id)
		p.mu.Lock()
		p.gone, p.queue = true, nil
		p.mu.Unlock()
	}
	e.mu.Unlock()
	return errors.Join(errs...)
}

func (e *Endpoint) isClosed() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.closed
}

// verifyPrincipal is the go-sdk TokenVerifier. It ignores the raw token (the
// edge verified it) and describes the principal the edge put in the request
// context, with a JWT principal's access token when the edge kept it there
// (policy.WithJWT, on a cluster). UserID is what go-sdk binds an MCP
// session to.
func verifyPrincipal(_ context.Context, _ string, r *http.Request) (*auth.TokenInfo, error) {
	p, ok := policy.PrincipalFrom(r.Context())
	if !ok || p.TokenID == "" {
		return nil, fmt.Errorf("%w: no authenticated caller: this endpoint serves only requests the zidane_mcp edge authenticated; send Authorization: Bearer <token> to it",
			auth.ErrInvalidToken)
	}
	extra := map[string]any{"principal": p, "access": accessFrom(r.Context())}
	if policy.IsJWTID(p.TokenID) {
		// For a session another replica runs: that replica verifies the
		// JWT itself (sessions.Owner.Credential).
		if jwt := policy.JWTFrom(r.Context()); jwt != "" {
			extra["jwt"] = jwt
		}
	}
	return &auth.TokenInfo{UserID: p.TokenID, Scopes: p.Scopes, Extra: extra}, nil
}

// onInitialize is receiving middleware. When a session initializes, it sets
// the session's log level to "info" through the SDK's own logging/setLevel
// handler (go-sdk drops every log message until a level is set) and starts
// tracking the session for event pushes.
func (e *Endpoint) onInitialize(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		res, err := next(ctx, method, req)
		if method != "initialize" || err != nil {
			return res, err
		}
		ss, ok := req.GetSession().(*mcp.ServerSession)
		if !ok || ss.ID() == "" {
			return res, err
		}
		if _, lerr := next(ctx, "logging/setLevel", &mcp.ServerRequest[*mcp.SetLoggingLevelParams]{
			Session: ss,
			Params:  &mcp.SetLoggingLevelParams{Level: "info"},
		}); lerr != nil {
			e.log.Warn("mcpendpoint: could not set the default log level; the client must call logging/setLevel to get session events",
				"mcp_session", ss.ID(), "error", lerr)
		}
		e.track(ss)
		if extra := req.GetExtra(); extra != nil && extra.TokenInfo != nil {
			id := ss.ID()
			e.idle.Opened(id, extra.TokenInfo.UserID, func() {
				e.log.Debug("mcpendpoint: MCP session closed after being idle", "mcp_session", id)
				ss.Close()
				e.untrack(id)
			})
		}
		return res, err
	}
}

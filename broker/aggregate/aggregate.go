package aggregate

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/broker/answerlimit"
	"github.com/Tahul/caddy-zidane-mcp/broker/upstream"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/yosida95/uritemplate/v3"

	"github.com/Tahul/caddy-zidane-mcp/broker/upstreamauth"
	"github.com/Tahul/caddy-zidane-mcp/internal/mcpidle"
	"github.com/Tahul/caddy-zidane-mcp/message"
	"github.com/Tahul/caddy-zidane-mcp/pinnedfetch"
	"github.com/Tahul/caddy-zidane-mcp/policy"
)

// Prefix modes of [Options.Prefix].
const (
	PrefixAlways      = "always"
	PrefixConditional = "conditional"
)

// RouteAggregate is the Route of the aggregated route's [CallRecord]s.
const RouteAggregate = "aggregate"

// aggProtocolVersion is the newest session-based protocol, where a server
// may send requests (sampling, elicitation) to its client: the fast path
// serves downstream and upstream sessions at it or older only.
const aggProtocolVersion = "2025-11-25"

// aggInitWait bounds how long initialize and the list methods wait for the
// catalog's first round (each upstream connected, or failed once).
const aggInitWait = 5 * time.Second

// catalogBackoff spaces a catalog session's reconnection attempts.
var catalogBackoff = upstream.Backoff{Min: 500 * time.Millisecond, Max: 30 * time.Second}

// aggConnectTimeout bounds one connection attempt when the upstream sets no
// Timeout.
const aggConnectTimeout = 30 * time.Second

// Options configures [New].
type Options struct {
	// AnswerBudget, when set, bounds the bytes of upstream answers the
	// route holds at once, across its upstreams and every other route
	// that shares it (see [answerlimit.Budget]).
	AnswerBudget *answerlimit.Budget

	// Credentials, when set, returns the credentials layer of the named
	// upstream's egress (see [PassThroughOptions.Credentials]); nil for an
	// upstream without one.
	Credentials func(upstream string) func(next http.RoundTripper) http.RoundTripper

	// Lookup reads the environment variables of the upstreams' ${VAR}
	// placeholders; nil means os.LookupEnv.
	Lookup func(string) (string, bool)
	// Prefix is "always" (the default: tools and prompts are named
	// mcp_<server>_<name>) or "conditional" (with a single upstream, names
	// are offered as the upstream gives them).
	Prefix string
	// OnCall receives a record of every forwarded call when it ends.
	OnCall func(upstream.CallRecord)
	// Instructions, when set, decides what the route merges of an
	// upstream's instructions: given the upstream's name and the
	// instructions its initialize (or server/discover) answered, it
	// returns those to serve (the edge's pins: the pinned ones when they
	// changed). It is asked when the upstream's catalog connects and on
	// every downstream initialize and server/discover.
	Instructions func(upstream, instructions string) string
	// OnDecision receives every redirect decision of the egress clients.
	OnDecision func(pinnedfetch.Decision)
	// Logger receives warnings; nil discards them.
	Logger *slog.Logger
	// MaxRequestBodyBytes bounds a request body (go-sdk's default when 0).
	MaxRequestBodyBytes int64
	// StdioIdle closes a shared stdio upstream's process after this long
	// without a call (0: [DefaultStdioIdle], 10 minutes; negative: never).
	// The next call starts it again; its listing stays offered meanwhile.
	StdioIdle time.Duration
	// PIDDir, when set, is a directory where every stdio process's pid is
	// recorded while it runs (<PIDDir>/<upstream>-<pid>.pid, holding its
	// command line). New first ends the processes that leftover
	// files name ([upstream.CleanOrphans]).
	PIDDir string
	// ToolCache, when set, keeps each upstream's tool listing across
	// restarts (see [ToolCache]).
	ToolCache ToolCache
	// SessionTimeout closes a downstream session that has had no request
	// in flight for this long (an open GET stream, and a tools/call on the
	// fast path, are requests in flight), with what the route keeps for
	// it: its token binding, its upstream client sessions (a stdio
	// upstream of its own ends), its subscriptions. The client gets 404
	// and initializes again. Zero means sessions never time out. go-sdk's
	// own StreamableHTTPOptions.SessionTimeout is not used: it counts
	// neither GET streams nor the fast path, which bypasses go-sdk.
	SessionTimeout time.Duration
	// AuthRequired, when set, reports whether the named upstream waits for
	// an operator's OAuth login. After a failed connection to such an
	// upstream its tools, prompts and resources are withdrawn; they come
	// back when it connects again (see [Aggregate.Reconnect]).
	AuthRequired func(upstream string) bool
	// MayUse, when set, reports whether principal p may use the named
	// upstream. The edge authorizes subscriptions/listen (MCP 2026-07-28)
	// as a method that names no upstream; the resources it subscribes to
	// are checked here, each against its owner, and a resource of an
	// upstream the token may not use fails the listen request.
	MayUse func(p policy.Principal, upstream string) bool
	// NewSessionID, when set, gives the id of each new 2025-11-25
	// downstream session (go-sdk's ServerOptions.GetSessionID); by
	// default 128 random bits. In a cluster it seals the node that holds
	// the session into its id, so that another replica can forward to it.
	// It must be unguessable and visible ASCII.
	NewSessionID func() string
	// BridgeKey and Node, in a cluster, seal the requestState of a
	// 2026-07-28 call bridged to a 2025-11-25 upstream under a key every
	// replica holds (32 bytes, derived from the cluster key), naming this
	// node, which holds the pending call: another replica that gets the
	// retry reads the node ([Aggregate.BridgeNode]) and forwards it there.
	// Without them the key is drawn at start and no node is named.
	BridgeKey []byte
	Node      string
	// Tasks says that the edge binds the route's task handles (MCP
	// 2026-07-28's Tasks extension; package edge): the route then offers
	// the extension, carries a CreateTaskResult to the client and sends
	// tasks/get, tasks/update and tasks/cancel to the upstream that holds
	// the task (see aggregate_tasks.go). Without it no call carries the
	// extension upstream.
	Tasks bool

	// PerUser, when set, reports whether the named upstream takes each
	// person's own credentials (credentials per_user): the route then
	// keeps a session to it per person, marked with that person, and no
	// catalog (see person.go). Such an upstream must be http or sse.
	PerUser func(upstream string) bool
	// ConnectRequired, when set, makes the answer to call c (the edge's
	// reading) of a per-person upstream's tool, by owner, who has no
	// usable connection at upstream: the connect link, as a whole
	// JSON-RPC response for the call's protocol version and the client's
	// capabilities (initCaps: a 2025-11-25 session's, as JSON). Without
	// it such a call gets a tool error saying the account is not
	// connected.
	ConnectRequired func(ctx context.Context, owner, upstream string, c message.Call, initCaps []byte) ([]byte, error)
	// Settle, when set, is called before a 2026-07-28 call of a
	// per-person upstream's tool: it waits, bounded, for owner to finish
	// connecting when the call is the retry of a connect answer, and
	// reports whether the person declined.
	Settle func(ctx context.Context, owner string, c message.Call) (declined bool)
	// ConnectState, when set, reports whether a call's requestState is
	// the one of the route's own connect answer (not the upstream's): a
	// retry carrying it goes upstream without it and its inputResponses,
	// which answered the gateway, not the upstream.
	ConnectState func(requestState string) bool
	// AwaitConnect, when set, waits until owner has finished connecting
	// through the link of elicitation, or ctx ends, and reports whether
	// they did.
	AwaitConnect func(ctx context.Context, owner, elicitation string) bool
	// Connected, when set, reports whether owner's connection at the
	// per-person upstream is still usable; a person's upstream session
	// whose connection is not is closed (checked every second, in
	// memory).
	Connected func(upstream, owner string) bool
	// MaxPeople bounds the person sessions open at once (0:
	// [DefaultMaxPeople]).
	MaxPeople int
	// PersonIdle closes a person session, with its upstream sessions,
	// after this long without a call (0: [DefaultPersonIdle]).
	PersonIdle time.Duration
}

// DefaultStdioIdle is the default of [Options.StdioIdle].
const DefaultStdioIdle = 10 * time.Minute

// Aggregate is the aggregated route: one MCP endpoint (go-sdk streamable
// HTTP handlers, stateful and stateless, over one shared server) offering the tools,
// prompts, resources and resource templates of several upstreams.
//
// A "catalog" client session per upstream lists its features and registers
// them, namespaced, on the shared server, and follows its list_changed
// notifications. Each downstream session gets its own upstream client
// sessions, opened on first use, whose sampling, elicitation, logging and
// progress traffic is forwarded to that downstream session only.
//
// Instructions: go-sdk fixes ServerOptions.Instructions at server creation,
// so the route sets InitializeResult.Instructions itself, in a middleware,
// from the upstreams whose catalog has connected (in config order), each
// as [Options.Instructions] decides (the edge's pins). An
// initialize (and the list methods) waits for the catalog's first round,
// bounded by the request and by 5 seconds, so a client that connects right
// after start sees every reachable upstream.
//
// Shared stdio upstreams: their one process is the catalog session, and
// every downstream session's calls go through it. Its requests to the
// client (sampling, elicitation) cannot be attributed to one downstream
// session, so the broker does not offer those capabilities to it and
// refuses such requests with a JSON-RPC error saying so. Progress
// notifications reach the caller whose request carried the progress token
// (the broker gives each call a token of its own); its log messages are
// dropped (logged at debug level), and logging/setLevel is not forwarded.
//
// Protocol: downstream, the route serves the session-based protocol
// (2025-11-25 and older) through a stateful handler and 2026-07-28 through
// a stateless one over the same server, chosen per request by
// MCP-Protocol-Version (see aggregate_modern.go). Upstream, go-sdk's client
// tries 2026-07-28 and falls back to 2025-11-25. Multi-round-trip calls
// work in each combination (aggregate_mrtr.go, aggregate_bridge.go).
//
// Fast paths: a tools/call of a 2026-07-28 client to a 2026-07-28
// streamable-HTTP upstream that the token's principal session is connected
// to goes as one POST with the tool renamed (see aggregate_fastmodern.go).
// A tools/call of a 2025-11-25 client that offers neither
// sampling nor elicitation, to a streamable-HTTP upstream whose session for
// it is open and speaks 2025-11-25, is forwarded as JSON bytes on that session rather than decoded and
// encoded again by go-sdk on both sides; its result is normalized only
// when it holds other blocks than text. Audit records, allow/deny, tool
// errors, progress, logs and cancellation behave as on the go-sdk path
// (see aggregate_fast.go), except that an upstream's JSON-RPC error is
// passed on exactly as it came.
//
// Failures: an upstream that never connected offers nothing (its catalog
// retries with backoff); one that went away keeps its last listing, and a
// call to it gets a tool error naming it. Sessions are bound to the token
// that initialized them, and closed, with their upstream sessions, after
// [Options.SessionTimeout] without a request in flight.
type Aggregate struct {
	ups          []*aggUpstream
	byName       map[string]*aggUpstream
	ns           *upstream.Namespace
	conditional  bool
	server       *mcp.Server
	handler      *mcp.StreamableHTTPHandler // 2025-11-25 and older: sessions
	stateless    *mcp.StreamableHTTPHandler // 2026-07-28 (see aggregate_modern.go)
	pidle        *mcpidle.Sessions          // principal sessions
	bridge       *bridge                    // 2026-07-28 calls pending on 2025-11-25 upstreams
	onCall       func(upstream.CallRecord)
	pinned       func(upstream, instructions string) string
	logger       *slog.Logger
	cache        ToolCache
	authRequired func(string) bool
	mayUse       func(policy.Principal, string) bool
	maxBody      int64 // MaxRequestBodyBytes, for the fast path's read
	idle         *mcpidle.Sessions
	tasks        bool // AggregateOptions.Tasks

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	ready  chan struct{}

	mu         sync.Mutex
	pending    int                                    // upstreams whose catalog has not had a first round
	tools      map[string]upstream.Qualified          // registered tool name -> upstream, original
	prompts    map[string]upstream.Qualified          // registered prompt name -> upstream, original
	resOwner   map[string]string                      // resource URI -> upstream
	tmplOwner  map[string]string                      // URI template -> upstream
	tmplMatch  map[string]*regexp.Regexp              // URI template -> its compiled matcher, made at first use
	sessions   map[*mcp.ServerSession]*aggSession     // downstream sessions
	byID       map[string]*aggSession                 // downstream sessions by session id
	bindings   map[string]string                      // downstream session id -> token id
	subs       map[string]map[*mcp.ServerSession]bool // resource URI -> subscribed sessions
	withdrawn  map[string]string                      // tool name -> upstream, while it waits for a login
	principals map[string]*aggSession                 // token id -> its 2026-07-28 requests' upstream sessions
	per        perUsers                               // per-person upstreams (see person.go)

	noModernFast    atomic.Bool  // tests: 2026-07-28 tools/call always through go-sdk
	modernFastCalls atomic.Int64 // tools/call served by the 2026-07-28 fast path
	closed          bool
}

type aggUpstream struct {
	cfg     upstream.Config      // normalized
	tr      *upstream.Transports // shared with [Conn]: egress client, SSE origin guard, stdio launcher
	timeout time.Duration
	notes   *noteCounter // an http upstream's notifications, counted (see noteCounter); nil for the other transports

	refresh sync.Mutex // serializes re-listing
	// relisting marks, per kind (tools, prompts, resources), a re-listing
	// scheduled that has not started yet (see [Aggregate.listChanged]).
	relisting [3]atomic.Bool

	// A shared stdio upstream (stdio, "shared" unset or true): its catalog
	// session is the one process every downstream session's calls use.
	shared   bool
	idle     time.Duration // StdioIdle; <= 0: never closed for idleness
	wake     chan struct{} // a call asks the closed catalog to start
	progress sync.Map      // broker progress token -> *sharedProgress

	mu           sync.Mutex
	catalog      *mcp.ClientSession
	instructions string
	lastErr      string
	tools        []string // registered names
	prompts      []string
	resources    []string
	templates    []string
	changed      chan struct{}  // closed and replaced when catalog changes or an attempt fails
	failures     int            // failed catalog attempts
	inflight     int            // calls on the shared catalog session
	idleGen      int            // invalidates armed idle timers
	idleClosed   bool           // the catalog was closed for idleness
	ttl          [numKinds]int  // ttlMs of the last listing of each kind (see aggregate_cacheable.go)
	ttlKnown     [numKinds]bool // the upstream gave one
	cachedJSON   []byte         // what the ToolCache holds, as last loaded or stored
	fromCache    bool           // its tools were registered from the ToolCache at start

	// instructionsRead is set once a catalog connected and instructions
	// holds what it answered (an upstream that never connected has none
	// to pin).
	instructionsRead bool
}

// New builds the aggregated route over ups, which must have
// distinct names. Their transports (streamable HTTP, SSE, stdio) are built
// as [upstream.Conn] builds them: http and sse go through the pinned egress client
// that refuses any other origin (an SSE endpoint event naming another
// server fails the connection); a stdio upstream starts its command for
// every upstream session. A shared stdio upstream (the default) runs one
// process, its catalog session, which every downstream session's calls
// use (see [Aggregate] for what it cannot forward); it is closed after
// [Options.StdioIdle] without a call and started again by the
// next call. With "shared": false, each downstream session that uses the
// upstream gets a process of its own too. Each process ends when its
// session closes (idleness, the downstream session's end, or
// [Aggregate.Close]: stdin closed, SIGTERM after 5s, SIGKILL 5s later).
// With [Options.PIDDir] set it first runs [upstream.CleanOrphans] there. It
// never blocks on the network: the catalog connects in the background (see
// [Aggregate.Ready]).
func New(ups []upstream.Config, opts Options) (*Aggregate, error) {
	logger := opts.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if len(ups) == 0 {
		return nil, errors.New("aggregate: no upstreams; name at least one")
	}
	switch opts.Prefix {
	case "", PrefixAlways, PrefixConditional:
	default:
		return nil, fmt.Errorf("aggregate: prefix %q is not known; use \"always\" or \"conditional\"", opts.Prefix)
	}
	a := &Aggregate{
		byName:       map[string]*aggUpstream{},
		onCall:       opts.OnCall,
		pinned:       opts.Instructions,
		logger:       logger,
		cache:        opts.ToolCache,
		authRequired: opts.AuthRequired,
		mayUse:       opts.MayUse,
		ready:        make(chan struct{}),
		tools:        map[string]upstream.Qualified{},
		prompts:      map[string]upstream.Qualified{},
		resOwner:     map[string]string{},
		tmplOwner:    map[string]string{},
		tmplMatch:    map[string]*regexp.Regexp{},
		sessions:     map[*mcp.ServerSession]*aggSession{},
		byID:         map[string]*aggSession{},
		maxBody:      opts.MaxRequestBodyBytes,
		bindings:     map[string]string{},
		subs:         map[string]map[*mcp.ServerSession]bool{},
		idle:         mcpidle.New(opts.SessionTimeout),
		principals:   map[string]*aggSession{},
		bridge:       newBridge(opts.BridgeKey, opts.Node),
		tasks:        opts.Tasks,
		per:          newPerUsers(opts),
	}
	if opts.SessionTimeout > 0 {
		a.pidle = mcpidle.New(opts.SessionTimeout)
	} else {
		a.pidle = mcpidle.New(principalIdle)
	}
	names, err := a.addUpstreams(ups, opts, logger)
	if err != nil {
		return nil, err
	}
	for _, up := range a.ups {
		if opts.PerUser == nil || !opts.PerUser(up.cfg.Name) {
			continue
		}
		if up.cfg.Transport != upstream.TransportHTTP && up.cfg.Transport != upstream.TransportSSE {
			return nil, fmt.Errorf("aggregate: %s takes each person's own credentials, which only an http or sse upstream can carry", upstream.Describe(up.cfg))
		}
		a.per.upstreams[up.cfg.Name] = true
	}
	ns, err := upstream.NewNamespace(names)
	if err != nil {
		return nil, err
	}
	a.ns = ns
	cleanOrphans(opts.PIDDir, logger)
	a.conditional = opts.Prefix == PrefixConditional && len(a.ups) == 1

	a.server = mcp.NewServer(aggImplementation, &mcp.ServerOptions{
		Logger:             logger,
		InitializedHandler: func(_ context.Context, req *mcp.InitializedRequest) { a.session(req.Session) },
		//lint:ignore SA1019 SEP-2577 deprecates roots, but clients and upstreams on earlier protocol versions still use it, so the aggregated route relays it
		RootsListChangedHandler: func(_ context.Context, req *mcp.RootsListChangedRequest) {
			a.session(req.Session).rootsChanged()
		},
		CompletionHandler:         a.complete,
		SetCacheable:              a.setCacheable,
		SubscribeHandler:          a.subscribe,
		UnsubscribeHandler:        a.unsubscribe,
		GetSessionID:              opts.NewSessionID,
		SupportedProtocolVersions: []string{protocolModern, "2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"},
		Capabilities: &mcp.ServerCapabilities{
			//lint:ignore SA1019 SEP-2577 deprecates logging, but clients and upstreams on earlier protocol versions still use it, so the aggregated route relays it
			Logging:   &mcp.LoggingCapabilities{},
			Tools:     &mcp.ToolCapabilities{ListChanged: true},
			Prompts:   &mcp.PromptCapabilities{ListChanged: true},
			Resources: &mcp.ResourceCapabilities{ListChanged: true, Subscribe: true},
		},
	})
	a.server.AddReceivingMiddleware(a.middleware)
	a.server.AddSendingMiddleware(elicitResultHolder)
	a.handler = mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return a.server },
		&mcp.StreamableHTTPOptions{MaxRequestBodyBytes: opts.MaxRequestBodyBytes})
	a.stateless = mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return a.server },
		&mcp.StreamableHTTPOptions{Stateless: true, MaxRequestBodyBytes: opts.MaxRequestBodyBytes})

	a.ctx, a.cancel = context.WithCancel(context.Background())
	// A per-person upstream has no catalog (see person.go): only its
	// connect tool is registered, and the route is ready without it.
	a.pending = len(a.ups) - len(a.per.upstreams)
	if a.pending == 0 {
		close(a.ready)
	}
	for _, up := range a.ups {
		if a.per.upstreams[up.cfg.Name] {
			a.server.AddTool(a.connectTool(up), a.connectToolHandler(up))
			continue
		}
		a.offerCachedTools(up)
	}
	for _, up := range a.ups {
		if a.per.upstreams[up.cfg.Name] {
			continue
		}
		a.wg.Add(1)
		go a.superviseCatalog(up)
	}
	if len(a.per.upstreams) > 0 && a.per.connected != nil {
		a.wg.Add(1)
		go a.sweepPeople()
	}
	return a, nil
}

// addUpstreams adds the route's state of each of ups, and returns their
// names.
func (a *Aggregate) addUpstreams(ups []upstream.Config, opts Options, logger *slog.Logger) ([]string, error) {
	var names []string
	for _, u := range ups {
		n, err := upstream.Normalize(u)
		if err != nil {
			return nil, err
		}
		if _, dup := a.byName[n.Name]; dup {
			return nil, fmt.Errorf("%s is named twice; upstream names must be unique", upstream.Describe(n))
		}
		up, err := newAggUpstream(n, opts, logger)
		if err != nil {
			return nil, err
		}
		a.ups = append(a.ups, up)
		a.byName[up.cfg.Name] = up
		names = append(names, up.cfg.Name)
	}
	return names, nil
}

// newAggUpstream builds the route's state of the normalized upstream n:
// expanded, with its transports.
func newAggUpstream(n upstream.Config, opts Options, logger *slog.Logger) (*aggUpstream, error) {
	e, warnings := n.Expanded(opts.Lookup)
	for _, w := range warnings {
		logger.Warn(w)
	}
	copts := upstream.ConnOptions{OnDecision: opts.OnDecision, AnswerBudget: opts.AnswerBudget}
	if opts.Credentials != nil {
		copts.Credentials = opts.Credentials(n.Name)
	}
	tr, err := upstream.NewTransports(n, e, copts, logger)
	if err != nil {
		return nil, err
	}
	if n.Transport == upstream.TransportHTTP {
		tr.MaxRetries = -1
	}
	tr.PIDDir = opts.PIDDir
	up := &aggUpstream{cfg: n, tr: tr, timeout: n.Timeout, changed: make(chan struct{}), wake: make(chan struct{}, 1)}
	tr.WrapHTTP(func(next http.RoundTripper) http.RoundTripper {
		up.notes = &noteCounter{next: next, max: int(tr.LimitMax())}
		return up.notes
	})
	if n.Transport == upstream.TransportStdio && n.IsShared() {
		up.shared = true
		up.idle = opts.StdioIdle
		if up.idle == 0 {
			up.idle = DefaultStdioIdle
		}
	}
	if up.timeout == 0 {
		up.timeout = aggConnectTimeout
	}
	return up, nil
}

// cleanOrphans ends the stdio processes that pid files left in pidDir
// name, when it is set (see [upstream.CleanOrphans]).
func cleanOrphans(pidDir string, logger *slog.Logger) {
	if pidDir == "" {
		return
	}
	if killed, err := upstream.CleanOrphans(pidDir, logger); err != nil {
		logger.Warn("aggregate: cleaning orphaned stdio processes", "pid_dir", pidDir, "ended", killed, "error", err.Error())
	} else if killed > 0 {
		logger.Warn("aggregate: ended orphaned stdio processes", "pid_dir", pidDir, "ended", killed)
	}
}

// offerCachedTools registers up's cached tool listing, if the cache holds
// one, until the upstream lists again.
func (a *Aggregate) offerCachedTools(up *aggUpstream) {
	if listed := a.loadCachedTools(up); listed != nil {
		a.registerTools(up, listed)
		up.fromCache = true
		a.logger.Info("aggregate: offering the cached tool listing until the upstream lists again", "upstream", up.cfg.Name, "tools", len(up.tools))
	}
}

// Ready waits until every upstream's catalog has connected and listed once,
// or failed its first attempt, or ctx ends.
func (a *Aggregate) Ready(ctx context.Context) error {
	select {
	case <-a.ready:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// ToolServer resolves an aggregated tool name into its upstream and the
// upstream's own tool name.
func (a *Aggregate) ToolServer(name string) (server, tool string, ok bool) {
	a.mu.Lock()
	q, found := a.tools[name]
	a.mu.Unlock()
	if found {
		return q.Server, q.Name, true
	}
	if a.conditional {
		return a.ups[0].cfg.Name, name, true
	}
	return a.ns.Resolve(name)
}

// PromptServer resolves an aggregated prompt name into its upstream and
// the upstream's own name for it.
func (a *Aggregate) PromptServer(name string) (server, prompt string, ok bool) {
	a.mu.Lock()
	q, found := a.prompts[name]
	a.mu.Unlock()
	if found {
		return q.Server, q.Name, true
	}
	if a.conditional {
		return a.ups[0].cfg.Name, name, true
	}
	return a.ns.Resolve(name)
}

// ResourceOwners returns the upstreams that could serve a read of uri: the
// upstream that offers that resource, else the upstreams whose resource
// templates match it (go-sdk tries resources, then templates, as here).
func (a *Aggregate) ResourceOwners(uri string) []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	if owner, ok := a.resOwner[uri]; ok {
		return []string{owner}
	}
	var owners []string
	for tmpl, owner := range a.tmplOwner {
		// Compiled once per template, not on every read and every listed
		// resource (this runs under a.mu).
		re, seen := a.tmplMatch[tmpl]
		if !seen {
			if t, err := uritemplate.New(tmpl); err == nil {
				re = t.Regexp()
			}
			a.tmplMatch[tmpl] = re // nil: a template that does not parse matches nothing
		}
		if re != nil && re.MatchString(uri) && !slices.Contains(owners, owner) {
			owners = append(owners, owner)
		}
	}
	slices.Sort(owners)
	return owners
}

// CompletionResource returns the upstream that serves a completion of a
// ref/resource reference: the one that offers that resource, else the one
// that offers that template. The edge authorizes a completion on it, and
// the route sends it there.
func (a *Aggregate) CompletionResource(uri string) (string, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.completionResourceLocked(uri)
}

func (a *Aggregate) completionResourceLocked(uri string) (string, bool) {
	if owner, ok := a.resOwner[uri]; ok {
		return owner, true
	}
	owner, ok := a.tmplOwner[uri]
	return owner, ok
}

// TemplateOwner returns the upstream that offers a resource template.
func (a *Aggregate) TemplateOwner(uriTemplate string) (string, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	owner, ok := a.tmplOwner[uriTemplate]
	return owner, ok
}

// Close stops the catalog, closes every upstream and downstream session and
// releases idle connections.
func (a *Aggregate) Close() error {
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return nil
	}
	a.closed = true
	a.idle.Stop()
	a.pidle.Stop()
	sessions := make([]*aggSession, 0, len(a.sessions)+len(a.principals))
	for _, s := range a.sessions {
		sessions = append(sessions, s)
	}
	for _, s := range a.principals {
		sessions = append(sessions, s)
	}
	clear(a.principals)
	a.per.idle.Stop()
	for _, s := range a.per.people {
		sessions = append(sessions, s)
	}
	clear(a.per.people)
	a.mu.Unlock()
	a.cancel()
	for ss := range a.server.Sessions() {
		ss.Close()
	}
	for _, s := range sessions {
		s.closeAll()
	}
	for _, up := range a.ups {
		up.mu.Lock()
		cs := up.catalog
		up.mu.Unlock()
		if cs != nil {
			cs.Close()
		}
	}
	a.wg.Wait()
	for _, up := range a.ups {
		up.tr.CloseIdle()
	}
	return nil
}

// ServeHTTP serves the MCP endpoint. It expects the edge's principal in the
// request context, and binds each session to the token that opened it: a
// session id presented with another token gets 404.
func (a *Aggregate) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p, ok := policy.PrincipalFrom(r.Context())
	if !ok || p.TokenID == "" {
		a.logger.Error("aggregated route called without a principal in the request context; it must sit behind the zidane_mcp edge")
		upstream.WriteRPCError(w, http.StatusInternalServerError, nil, message.CodeInternalError,
			"the broker route is misconfigured (it must sit behind the zidane_mcp edge); ask the operator to check the server log")
		return
	}
	if modernRequest(r) {
		// No session: the request's calls go through its token's
		// principal session (see aggregate_modern.go).
		if a.servePersonConnect(w, r, p, "") || a.serveTask(w, r) || a.serveModernFast(w, r) {
			return
		}
		a.stateless.ServeHTTP(w, r)
		return
	}
	if sid := r.Header.Get(upstream.HeaderSessionID); sid != "" {
		a.mu.Lock()
		owner, known := a.bindings[sid]
		a.mu.Unlock()
		if known && owner != p.TokenID {
			upstream.WriteRPCError(w, http.StatusNotFound, nil, message.CodeUnknownSession,
				"unknown session: start a new session by initializing again without Mcp-Session-Id")
			return
		}
		defer a.idle.Use(sid, p.TokenID)()
		if known && (a.servePersonConnect(w, r, p, sid) || a.serveFast(w, r, sid)) {
			return
		}
		if r.Method == http.MethodGet && known {
			a.mu.Lock()
			s := a.byID[sid]
			a.mu.Unlock()
			if s != nil {
				w = &tellingWriter{ResponseWriter: w, s: s}
			}
		}
		a.handler.ServeHTTP(w, r)
		return
	}
	a.handler.ServeHTTP(&bindingWriter{ResponseWriter: w, bind: func(sid string) {
		a.mu.Lock()
		if _, known := a.bindings[sid]; !known {
			a.bindings[sid] = p.TokenID
			a.per.sessionOwner[sid] = p.OwnerID()
		}
		a.mu.Unlock()
		a.idle.Opened(sid, p.TokenID, func() { a.expire(sid) })
	}}, r)
}

// URLElicitation reports whether r's 2025-11-25 session, opened with p's
// token and held here, declared URL elicitation at its initialize: the
// edge then answers a call an approve rule holds with -32042, whose URL
// elicitation is the approval's status page, instead of a tool error.
func (a *Aggregate) URLElicitation(r *http.Request, p policy.Principal) bool {
	sid := r.Header.Get(upstream.HeaderSessionID)
	if sid == "" || modernRequest(r) {
		return false
	}
	a.mu.Lock()
	owner, known := a.bindings[sid]
	s := a.byID[sid]
	a.mu.Unlock()
	if !known || owner != p.TokenID || s == nil {
		return false
	}
	ip := s.ss.InitializeParams()
	return ip != nil && ip.Capabilities != nil && ip.Capabilities.Elicitation != nil && ip.Capabilities.Elicitation.URL != nil
}

// expire closes downstream session sid, idle for SessionTimeout: its
// server session (whose end releases what the route holds for it, see
// dropSession) and its token binding, which a session that never finished
// initializing has without any other state.
func (a *Aggregate) expire(sid string) {
	a.mu.Lock()
	s := a.byID[sid]
	a.mu.Unlock()
	if s != nil {
		s.ss.Close()
	} else {
		for ss := range a.server.Sessions() {
			if ss.ID() == sid {
				ss.Close()
			}
		}
	}
	a.mu.Lock()
	delete(a.bindings, sid)
	delete(a.per.sessionOwner, sid)
	a.mu.Unlock()
	a.logger.Debug("aggregate: downstream session closed after being idle", "session", sid)
}

// bindingWriter records the session id the handler gives out.
type bindingWriter struct {
	http.ResponseWriter
	bind  func(string)
	wrote bool
}

func (b *bindingWriter) WriteHeader(status int) {
	if !b.wrote {
		b.wrote = true
		if sid := b.Header().Get(upstream.HeaderSessionID); sid != "" && status < 300 {
			b.bind(sid)
		}
	}
	b.ResponseWriter.WriteHeader(status)
}

func (b *bindingWriter) Write(p []byte) (int, error) {
	if !b.wrote {
		b.WriteHeader(http.StatusOK)
	}
	return b.ResponseWriter.Write(p)
}

func (b *bindingWriter) Flush() {
	if f, ok := b.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (b *bindingWriter) Unwrap() http.ResponseWriter { return b.ResponseWriter }

// middleware sets the merged instructions on initialize, waits (bounded)
// for the catalog's first round before initialize and the list methods, and
// forwards logging/setLevel to the session's open upstream sessions.
func (a *Aggregate) middleware(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		switch method {
		case "initialize", "server/discover", "tools/list", "prompts/list", "resources/list", "resources/templates/list":
			wctx, cancel := context.WithTimeout(ctx, aggInitWait)
			_ = a.Ready(wctx)
			cancel()
		case "tools/call":
			if p, ok := req.GetParams().(*mcp.CallToolParamsRaw); ok && p != nil {
				if up, orig := a.perUserTool(p.Name); up != nil {
					return a.personToolCall(ctx, req, up, orig, p)
				}
				if up := a.waitingForLogin(p.Name); up != nil {
					rec := upstream.CallRecord{Upstream: up.cfg.Name, Method: "tools/call", Tool: p.Name, Outcome: upstream.OutcomeAuthRequired,
						ClientIP: upstream.ExtraClientIP(req.GetExtra())}
					if ss, ok := req.GetSession().(*mcp.ServerSession); ok {
						rec.TokenID, rec.TokenName = a.principal(ctx, ss, req.GetExtra())
					}
					a.record(rec, time.Now())
					return a.unreachable(up, upstreamauth.ErrAuthRequired), nil
				}
			}
		}
		res, err := next(ctx, method, req)
		if err != nil {
			return res, err
		}
		switch method {
		case "tools/list":
			if lr, ok := res.(*mcp.ListToolsResult); ok && lr != nil && len(a.per.upstreams) > 0 {
				ss, _ := req.GetSession().(*mcp.ServerSession)
				a.listForPerson(ctx, ss, lr)
			}
		case "server/discover":
			if dr, ok := res.(*mcp.DiscoverResult); ok && dr != nil {
				dr.Instructions = a.instructions()
				a.offerTasks(dr.Capabilities)
			}
		case "initialize":
			if ir, ok := res.(*mcp.InitializeResult); ok && ir != nil {
				ir.Instructions = a.instructions()
				a.offerTasks(ir.Capabilities)
			}
			// The session's state, and the watcher that drops it with its
			// binding when the session ends, exist from here on, not only
			// once the client sends notifications/initialized.
			if ss, ok := req.GetSession().(*mcp.ServerSession); ok {
				a.session(ss)
			}
		case "logging/setLevel":
			if ss, ok := req.GetSession().(*mcp.ServerSession); ok {
				//lint:ignore SA1019 SEP-2577 deprecates logging, but clients and upstreams on earlier protocol versions still use it, so the aggregated route relays it
				if p, ok := req.GetParams().(*mcp.SetLoggingLevelParams); ok && p != nil {
					a.session(ss).setLevel(ctx, p.Level)
				}
			}
		}
		return res, err
	}
}

// instructions merges the connected upstreams' instructions in config
// order: "## <name>\n<instructions>", joined by blank lines; each as
// Options.Instructions decides.
func (a *Aggregate) instructions() string {
	var parts []string
	for _, up := range a.ups {
		up.mu.Lock()
		in, read := up.instructions, up.instructionsRead
		up.mu.Unlock()
		if a.pinned != nil && read {
			in = a.pinned(up.cfg.Name, in)
		}
		if in = strings.TrimSpace(in); in != "" {
			parts = append(parts, "## "+up.cfg.Name+"\n"+in)
		}
	}
	return strings.Join(parts, "\n\n")
}

// principal returns who a handler's request acts for: the request's token
// info when the transport set one, else for a 2026-07-28 request the
// principal in its context, else the principal bound to the session.
func (a *Aggregate) principal(ctx context.Context, ss *mcp.ServerSession, extra *mcp.RequestExtra) (id, name string) {
	if extra != nil && extra.TokenInfo != nil {
		return tokenInfoPrincipal(extra.TokenInfo)
	}
	if modernSession(ss) {
		// A 2026-07-28 request is its own session: the edge's principal
		// travels in its context.
		if p, ok := policy.PrincipalFrom(ctx); ok {
			return p.TokenID, p.Name
		}
		return "", ""
	}
	if ss != nil {
		a.mu.Lock()
		id = a.bindings[ss.ID()]
		a.mu.Unlock()
	}
	return id, ""
}

func tokenInfoPrincipal(ti *auth.TokenInfo) (id, name string) {
	id = ti.UserID
	if n, ok := ti.Extra["name"].(string); ok {
		name = n
	}
	return id, name
}

// record sends a call record.
func (a *Aggregate) record(rec upstream.CallRecord, start time.Time) {
	rec.Route = RouteAggregate
	// Every call the route makes upstream answers a client's JSON-RPC
	// request, which came in a POST at either protocol version.
	rec.HTTPMethod = http.MethodPost
	rec.Duration = time.Since(start)
	if a.onCall != nil {
		a.onCall(rec)
	}
}

// outcome classifies a forwarded call's error.
func outcome(ctx context.Context, err error) (string, string) {
	switch {
	case err == nil:
		return upstream.OutcomeOK, ""
	case ctx.Err() != nil:
		return upstream.OutcomeCanceled, ""
	default:
		return upstream.OutcomeError, upstream.SafeError(err)
	}
}

// aggImplementation is the aggregated route's own server identity.
var aggImplementation = &mcp.Implementation{Name: "zidane-mcp-aggregate", Version: "1"}

// upstreamRPCError is what to pass on for err when it carries a JSON-RPC
// error, else nil: the error the upstream answered as it answered it,
// code, message and data (a -32021's data names the client capabilities
// the call needs), as the fast path and the pass-through route pass it.
// go-sdk's client wraps it in its own words ("calling ...: rejected by
// transport: Bad Request"), which a server would send with the code and
// without the data. The transport's own refusal (-32005, for an upstream
// that answered a transient HTTP status), which no upstream worded, stays
// wrapped, with what go-sdk said of the status.
func upstreamRPCError(err error) error {
	var re *jsonrpc.Error
	if !errors.As(err, &re) {
		return nil
	}
	if re.Code == message.CodeTransportRejected {
		return err
	}
	return re
}

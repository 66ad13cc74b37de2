package caddymodule

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/broker/answerlimit"
	"github.com/Tahul/caddy-zidane-mcp/broker/upstream"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyevents"
	"github.com/caddyserver/certmagic"
	"go.uber.org/zap"
	"go.uber.org/zap/exp/zapslog"

	"github.com/Tahul/caddy-zidane-mcp/approvals"
	"github.com/Tahul/caddy-zidane-mcp/broker/upstreamauth"
	"github.com/Tahul/caddy-zidane-mcp/cluster"
	"github.com/Tahul/caddy-zidane-mcp/gatewayfiles"
	"github.com/Tahul/caddy-zidane-mcp/mcpendpoint"
	"github.com/Tahul/caddy-zidane-mcp/policy"
	"github.com/Tahul/caddy-zidane-mcp/policy/rules"
	"github.com/Tahul/caddy-zidane-mcp/sessions"
	"github.com/Tahul/caddy-zidane-mcp/storage"
)

func init() {
	caddy.RegisterModule(App{})
}

// App is the `zidane` app: the state that outlives a config reload. Every
// durable object sits in a caddy.UsagePool keyed by what identifies it, so
// that a reload, which provisions the new config before it stops the old
// one, hands the same token store, rate-limit buckets and open streams to
// the new handlers.
type App struct {
	// TokenSync is how often the token file in storage is re-read, so a
	// token created or revoked by `caddy zidane token …` while no server
	// answered the admin API takes effect. Default: 1s.
	TokenSync caddy.Duration `json:"token_sync,omitempty"`

	// ApprovalPending is how long a call an approve rule holds waits for
	// a person's answer; ApprovalApproved how long, once approved, the
	// same call may be made again to run. Each from 1s to 24h. Defaults:
	// 30m and 10m (docs/policy.md#approvals).
	ApprovalPending  caddy.Duration `json:"approval_pending,omitempty"`
	ApprovalApproved caddy.Duration `json:"approval_approved,omitempty"`

	// LastUsedFlush is how often the last-used times of tokens are written
	// to storage. Default: 30s.
	LastUsedFlush caddy.Duration `json:"last_used_flush,omitempty"`

	// Agents are the ACP agents that sessions can run, by name. The
	// built-in agent `demo` (this binary's `caddy zidane demo-agent`, for
	// demos and tests: it needs no API key) is always there unless an agent
	// of that name is configured. Agent changes apply at the next start.
	Agents map[string]*AgentConfig `json:"agents,omitempty"`

	// DefaultAgent runs sessions that name no agent. Default: the only
	// configured agent, else demo.
	DefaultAgent string `json:"default_agent,omitempty"`

	// WorktreeRoot is where worktree environments are created. Default: a
	// .worktrees directory next to the repository.
	WorktreeRoot string `json:"worktree_root,omitempty"`

	// LinkTTL is how long a session link stays valid. Default: 1h.
	LinkTTL caddy.Duration `json:"link_ttl,omitempty"`

	// MaxAgents bounds the agent processes running at once. Default: 64.
	MaxAgents int `json:"max_agents,omitempty"`

	// MaxSessions bounds the sessions kept; ended ones are dropped first.
	// Default: 1000.
	MaxSessions int `json:"max_sessions,omitempty"`

	// AgentIdleTimeout stops the process of a session idle this long, when
	// its agent supports session/load; the next prompt relaunches it.
	// Default: 30m.
	AgentIdleTimeout caddy.Duration `json:"agent_idle_timeout,omitempty"`

	// MaxSessionsPerToken bounds the live (not ended) sessions one token
	// created. Default: a tenth of max_sessions (100).
	MaxSessionsPerToken int `json:"max_sessions_per_token,omitempty"`

	// MaxAgentsPerToken bounds the agent processes the sessions of one
	// token hold. Default: a quarter of max_agents (16). At this limit, or
	// at max_agents, the least recently used idle agent that supports
	// session/load is stopped to make room; a launch is refused only when
	// there is none.
	MaxAgentsPerToken int `json:"max_agents_per_token,omitempty"`

	// MCPSessionIdleTimeout closes an MCP session on the sessions endpoint
	// or an aggregated route that has had no request in flight this long
	// (an open GET stream counts as one), freeing what it holds; the client
	// initializes again. Default: 30m; negative: never.
	MCPSessionIdleTimeout caddy.Duration `json:"mcp_session_idle_timeout,omitempty"`

	// Roots confine sessions to these directory trees: a session's cwd,
	// and for a worktree environment its repository, git directory and new
	// worktree, must lie inside one of them once symlinks are resolved.
	// A token's own roots (`caddy zidane token create --root`) narrow
	// these. Empty: any directory the gateway's user can reach.
	Roots []string `json:"roots,omitempty"`

	// Upstreams are the remote MCP servers the broker offers, by name.
	// Header values may hold ${VAR} placeholders, expanded only where the
	// connection is built; a credential given literally is refused.
	Upstreams []upstream.Config `json:"upstreams,omitempty"`

	// UpstreamsFiles are mcp.json files with more upstreams, in the shapes
	// clients use (a list, a name-keyed map, or one under mcpServers).
	UpstreamsFiles []string `json:"upstreams_files,omitempty"`

	// ShareSessions lets every token read every owner's sessions (list,
	// read, transcript, wait, events; interactions pending), for a host
	// with one person behind every token. Acting on another owner's
	// session (send, steer, cancel; answer) still takes the scope
	// sessions:any (interactions:any). Default: false, each token sees its
	// owner's sessions only.
	ShareSessions bool `json:"share_sessions,omitempty"`

	// SessionUpstreams are the upstreams every session's agent is given, as
	// MCP servers of this gateway reached with a per-session machine token.
	// The agent never holds the upstream's credential.
	SessionUpstreams []string `json:"session_upstreams,omitempty"`

	// UpstreamTokenKey seals the upstreams' OAuth tokens in storage
	// (AES-256-GCM): 32 bytes, base64-encoded. Give it as a placeholder
	// such as {env.ZIDANE_UPSTREAM_TOKEN_KEY}, which is read at start and
	// never written to a config file (a literal key is refused); default:
	// that variable. Required
	// when an upstream has an oauth block. Every replica needs the same
	// key, and a new key means the upstreams need a new login.
	UpstreamTokenKey string `json:"upstream_token_key,omitempty"`

	// MaxInflightResponse bounds the bytes of upstream answers the
	// broker holds at once, across every route and upstream (see
	// answerlimit.Budget); past it a call fails with an error that says
	// so. Default: 256 MiB.
	MaxInflightResponse int64 `json:"max_inflight_response,omitempty"`

	// Cluster is the former place of the cluster's settings, read with a
	// bare `storage zidane_nats`; they now go in that storage's own object
	// (see NATSStorage), and giving them in both places is refused. With
	// a cluster, every replica keeps its state in one NATS JetStream,
	// which is Caddy's storage.
	Cluster *ClusterConfig `json:"cluster,omitempty"`

	// Signin makes the gateway the OAuth authorization server of its MCP
	// clients, on every site that runs zidane_mcp (see SigninConfig and
	// docs/signin.md). Off when unset.
	Signin *SigninConfig `json:"signin,omitempty"`

	// Policy is the rules over calls of every site, before each site's
	// own (docs/policy.md).
	Policy []PolicyRule `json:"policy,omitempty"`
	policy *rules.Set

	cluster    *cluster.Storage // the cluster's storage, in cluster mode
	clusterKey string           // this config's hold on natsPool

	answerBudget *answerlimit.Budget

	tokens    *tokenState
	tokensKey string
	pins      *pinsState // the pinned tool definitions (package pins)
	pinsKey   string
	storage   storage.Storage  // the configured storage (Caddy's)
	approvals *approvals.Store // the calls approve rules hold (package approvals)
	upstreams map[string]upstream.Config
	oauth     map[string]*upstreamauth.Client // by upstream name
	oauthKeys []string                        // this config's holds on oauthPool
	// unhookGrants removes the hook that ends a person's upstream
	// connections when their grant is revoked.
	unhookGrants func()
	actionsKey   string                          // this config's hold on actionsPool (NATS storage)
	pruneKey     string                          // this config's hold on approvalPrunePool
	cimd         map[string]*upstreamauth.Client // host+path of a client_metadata_url -> its upstream's client
	ctx          caddy.Context                   // this config's: events, the http app
	events       *caddyevents.App                // the events app, if configured

	agentUsers map[string]*sessions.User // by agent name, for those with `user`
	own        []gatewayfiles.File       // this config's files that no agent may reach
	releaseOwn func()                    // this config's hold on agentDeny
	// rootsFor are the running session engines this config takes over,
	// which get its roots when it starts (see loadSessions).
	rootsFor []*sessions.Engine
	// sessionSites are this config's sessions sites, by the pooled state
	// they share, stored there when it starts.
	sessionSites map[*sessionsState][]mcpendpoint.Site
	// guardSites are this config's guard handlers by resource (see
	// claimGuardResource).
	guardSites *guardSites
	// auditCtx is this config's context, for the audit logger (see
	// auditConfig).
	auditCtx *caddy.Context
	// signin is this config's authorization server, with a signin block.
	signin *signin
}

// CaddyModule returns the Caddy module information.
func (App) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "zidane", New: func() caddy.Module { return new(App) }}
}

// Provision opens (or shares) the token store of the configured storage.
func (a *App) Provision(ctx caddy.Context) error {
	a.auditCtx = &ctx
	auditProvisioning.Store(a.auditCtx)
	if a.TokenSync == 0 {
		a.TokenSync = caddy.Duration(time.Second)
	}
	if a.LastUsedFlush == 0 {
		a.LastUsedFlush = caddy.Duration(30 * time.Second)
	}
	if a.TokenSync < 0 || a.LastUsedFlush < 0 {
		return fmt.Errorf("zidane: token_sync and last_used_flush must be positive durations")
	}
	if a.MCPSessionIdleTimeout == 0 {
		a.MCPSessionIdleTimeout = caddy.Duration(30 * time.Minute)
	}
	if a.MaxInflightResponse < 0 {
		return fmt.Errorf("zidane: max_inflight_response %d is negative; give a size such as 256MiB", a.MaxInflightResponse)
	}
	a.answerBudget = answerlimit.NewBudget(a.MaxInflightResponse)
	var err error
	if a.policy, err = compilePolicy("global policy", a.Policy); err != nil {
		return fmt.Errorf("zidane: %w", err)
	}
	a.guardSites = &guardSites{byResource: make(map[string][]string)}
	for _, r := range a.Roots {
		if !filepath.IsAbs(r) {
			return fmt.Errorf("zidane: root %q is not an absolute path; give it from /, such as /srv/projects", r)
		}
	}
	if err := a.checkWorktreeRoot(); err != nil {
		return err
	}
	// Once per process: an agent of Caddy's uid must not read its
	// environment (the upstreams' secrets) or memory through /proc.
	dumpableOnce.Do(func() {
		if err := setNonDumpable(); err != nil {
			ctx.Logger().Warn("could not make the caddy process non-dumpable; processes of its user can read its environment and memory", zap.Error(err))
		}
	})
	if err := a.checkSecrets(); err != nil {
		return err
	}
	st, err := a.provisionStorage(ctx)
	if err != nil {
		return err
	}
	a.storage = st
	if a.approvals, err = approvals.New(approvals.Options{Store: st, Audit: logApprovalAnswer,
		PendingLifetime: time.Duration(a.ApprovalPending), ApprovedLifetime: time.Duration(a.ApprovalApproved)}); err != nil {
		return fmt.Errorf("zidane approval_pending, approval_approved: %w", err)
	}
	if a.pruneKey, err = provisionApprovalPruner(st, approvalPruneEvery); err != nil {
		return fmt.Errorf("zidane: %w", err)
	}
	if err := a.provisionAgents(ctx); err != nil {
		return err
	}
	if err := markStorage(st); err != nil {
		ctx.Logger().Warn("could not record in the local storage which storage this server uses; the CLI's offline mode may not know", zap.Error(err))
	}
	if _, err := loadAdminKey(adminKeyStorage(st), true); err != nil {
		return err
	}
	ts, key, err := loadTokens(st, time.Duration(a.TokenSync), time.Duration(a.LastUsedFlush))
	if err != nil {
		return err
	}
	a.tokens, a.tokensKey = ts, key
	if a.pins, a.pinsKey, err = loadPins(st); err != nil {
		return err
	}
	a.ctx = ctx
	if a.actionsKey, err = provisionActions(st); err != nil {
		return err
	}
	if err := a.loadUpstreams(); err != nil {
		return err
	}
	// Checked here too, not only where a sessions site uses them, so that
	// `caddy validate` says so.
	for _, name := range a.SessionUpstreams {
		if _, ok := a.upstreams[name]; !ok {
			return fmt.Errorf("zidane: session_upstreams: no upstream %q is configured; configure it (upstream %s <url>) or remove it", name, name)
		}
	}
	if err := a.provisionOAuth(ctx); err != nil {
		return err
	}
	if err := a.provisionSignin(ctx); err != nil {
		return err
	}
	a.own = a.ownFiles(ctx.Logger())
	a.releaseOwn = agentDeny.Hold(a.own)
	return nil
}

// provisionStorage is the storage the app keeps its state in: Caddy's,
// which in cluster mode is the cluster's. `storage zidane_nats` with its
// settings is opened before the apps, as Caddy orders it, and the app
// takes its hold on that connection. A bare `storage zidane_nats` (the
// settings in this app's cluster block, the form before they moved to the
// storage) provisions this app from its own Provision to take the
// cluster's storage from it: so a storage still unset in ctx means that
// storage zidane_nats is Caddy's, and one already set means that it is not.
func (a *App) provisionStorage(ctx caddy.Context) (certmagic.Storage, error) {
	caddys := ctx.Storage()
	if cs, ok := caddys.(*cluster.Storage); ok {
		if a.Cluster != nil {
			return nil, errors.New("zidane cluster: the cluster's settings are given twice, in storage zidane_nats and in the zidane app's cluster block; keep those of storage zidane_nats { … } and remove the cluster block")
		}
		key, state := natsStateOf(cs)
		if state == nil {
			return nil, errors.New("zidane cluster: storage zidane_nats closed while this config was provisioned; load it again")
		}
		// The app's own reference: Caddy cleans a config's modules up in
		// no set order, and what the app's pools hold runs on this
		// connection until the app's Cleanup.
		if _, _, err := natsPool.LoadOrNew(key, func() (caddy.Destructor, error) {
			return nil, errors.New("storage zidane_nats closed while this config was provisioned; load it again")
		}); err != nil {
			return nil, fmt.Errorf("zidane cluster: %w", err)
		}
		a.cluster, a.clusterKey = cs, key
		if err := state.startNodes(); err != nil {
			return nil, fmt.Errorf("zidane cluster: %w", err)
		}
		return cs, nil
	}
	switch {
	case a.Cluster == nil && caddys == nil:
		return nil, errNoClusterBlock
	case a.Cluster == nil:
		return caddys, nil
	case caddys != nil:
		return nil, fmt.Errorf("zidane cluster: Caddy's storage is %s, not the cluster's: add `storage zidane_nats` to the global options, with the cluster's settings in its block (storage zidane_nats { url … }) in place of the zidane app's cluster block, so that TLS certificates and the state of every replica are kept in the cluster's NATS JetStream", storageName(caddys))
	}
	cs, key, err := a.Cluster.open(slog.New(zapslog.NewHandler(ctx.Logger().Core())))
	if err != nil {
		return nil, err
	}
	a.cluster, a.clusterKey = cs, key
	if _, state := natsStateOf(cs); state != nil {
		if err := state.startNodes(); err != nil {
			return nil, fmt.Errorf("zidane cluster: %w", err)
		}
	}
	return cs, nil
}

// storageName says what Caddy's storage is, for a refusal.
func storageName(st certmagic.Storage) string {
	if fs, ok := st.(*certmagic.FileStorage); ok {
		return "the file storage at " + fs.Path
	}
	return fmt.Sprintf("%T", st)
}

// checkWorktreeRoot refuses a worktree_root that is relative (to what
// would depend on caddy's working directory) or that names something other
// than a directory; one that does not exist yet is created when needed.
func (a *App) checkWorktreeRoot() error {
	if a.WorktreeRoot == "" {
		return nil
	}
	if !filepath.IsAbs(a.WorktreeRoot) {
		return fmt.Errorf("zidane: worktree_root %q is not an absolute path; give it from /, such as /srv/worktrees", a.WorktreeRoot)
	}
	if fi, err := os.Stat(a.WorktreeRoot); err == nil && !fi.IsDir() {
		return fmt.Errorf("zidane: worktree_root %s is not a directory; give a directory, or a path where one can be created", a.WorktreeRoot)
	}
	return nil
}

// Start implements caddy.App. The app's work runs in its pooled state; it
// refuses to start a config whose sessions endpoint cannot tell its agents
// where it is (checkAgentBases).
func (a *App) Start() error {
	if err := a.checkAgentBases(); err != nil {
		return err
	}
	// At Start, not Provision: Caddy provisions its apps in no set
	// order, and the handlers' files are held only once they are.
	if err := checkSandboxes(a.Agents, deniedFiles()); err != nil {
		return err
	}
	for _, e := range a.rootsFor {
		if err := e.SetRoots(a.Roots); err != nil {
			return err
		}
	}
	for st, sites := range a.sessionSites {
		st.sites.Store(&sites)
	}
	auditStarted.Store(a.auditCtx)
	return nil
}

// Stop implements caddy.App.
func (a *App) Stop() error { return nil }

// Cleanup releases this config's hold on the pooled state.
func (a *App) Cleanup() error {
	if a.releaseOwn != nil {
		a.releaseOwn()
	}
	auditProvisioning.CompareAndSwap(a.auditCtx, nil)
	a.cleanupOAuth()
	if a.actionsKey != "" {
		_, _ = actionsPool.Delete(a.actionsKey)
	}
	if a.pinsKey != "" {
		_, _ = pinsPool.Delete(a.pinsKey)
	}
	if a.pruneKey != "" {
		_, _ = approvalPrunePool.Delete(a.pruneKey)
	}
	var err error
	if a.tokensKey != "" {
		_, err = tokenPool.Delete(a.tokensKey)
	}
	// Last: what the pools above hold runs on this connection.
	if a.clusterKey != "" {
		_, _ = natsPool.Delete(a.clusterKey)
	}
	return err
}

// Tokens is the token store shared by every config over the same storage.
func (a *App) Tokens() *policy.TokenStore { return a.tokens.store }

// dumpableOnce makes the process non-dumpable at the first provision.
var dumpableOnce sync.Once

// tokenPool holds one token store per storage backend.
var tokenPool = caddy.NewUsagePool()

// tokenState is a pooled token store and the loop that keeps it in sync.
type tokenState struct {
	store  *policy.TokenStore
	cancel context.CancelFunc
	done   chan struct{}
}

// Destruct stops the sync loop; the loop flushes last-used times on its way out.
func (t *tokenState) Destruct() error {
	t.cancel()
	<-t.done
	return nil
}

// processGrantKey authenticates the access tokens of grants on a gateway
// that is not a cluster. It is random and lives as long as the process,
// never written anywhere (agents can read the gateway's files): after a
// restart, clients' access tokens are refused and the clients refresh,
// which needs no key since refresh tokens are stored hashed.
var processGrantKey = func() []byte {
	k := make([]byte, 32)
	rand.Read(k)
	return k
}()

// grantKey is the key of the grants' access tokens on storage st: on NATS
// storage, one derived from the cluster key, so that a token one replica
// made is accepted by every other; elsewhere processGrantKey.
func grantKey(st storage.Storage) ([]byte, error) {
	if cs, ok := st.(*cluster.Storage); ok {
		return cs.DeriveKey("grant tokens")
	}
	return processGrantKey, nil
}

// storageKey names a storage backend for pooling. certmagic storages print
// their location (FileStorage:/path).
func storageKey(st storage.Storage) string {
	if s, ok := st.(fmt.Stringer); ok {
		return fmt.Sprintf("%T:%s", st, s.String())
	}
	return fmt.Sprintf("%T:%p", st, st)
}

// loadTokens returns the pooled token store for st, opening it on first use.
// The caller must release it with tokenPool.Delete(key).
func loadTokens(st storage.Storage, syncEvery, flushEvery time.Duration) (*tokenState, string, error) {
	key := "tokens|" + storageKey(st)
	v, _, err := tokenPool.LoadOrNew(key, func() (caddy.Destructor, error) {
		openCtx, cancelOpen := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancelOpen()
		store, err := policy.OpenTokenStore(openCtx, st)
		if err != nil {
			return nil, fmt.Errorf("zidane: %w", err)
		}
		store.OnEvent(auditTokenEvent)
		key, err := grantKey(st)
		if err != nil {
			return nil, fmt.Errorf("zidane: the grant key: %w", err)
		}
		if err := store.SetGrantKey(key); err != nil {
			return nil, fmt.Errorf("zidane: %w", err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		// Every request the edge lets through is held in the store (see
		// Handler.serve), so ending the held ones ends every open stream
		// when the process exits: one hook per store, not one per request.
		// It stays registered after the store leaves the pool, for the
		// requests a stopped config still serves.
		context.AfterFunc(processExit(), store.CancelHolds)
		ts := &tokenState{store: store, cancel: cancel, done: make(chan struct{})}
		if cs, ok := st.(*cluster.Storage); ok {
			// Replicas on NATS storage hear of a change to the tokens
			// (one revoked on another replica) as it is written; the
			// sync every syncEvery stays, for a change the watch missed.
			go cs.Watch(ctx, policy.TokensKey, func() {
				if err := store.Sync(ctx); err != nil && ctx.Err() == nil {
					auditLogger().Error("token store", zap.Error(err))
				}
			})
		}
		go func() {
			defer close(ts.done)
			var mu sync.Mutex
			last := ""
			store.Run(ctx, syncEvery, flushEvery, func(err error) {
				// A corrupt file is reported when the error changes, not every second.
				mu.Lock()
				defer mu.Unlock()
				if err.Error() != last {
					last = err.Error()
					auditLogger().Error("token store", zap.Error(err))
				}
			})
		}()
		return ts, nil
	})
	if err != nil {
		return nil, "", err
	}
	return v.(*tokenState), key, nil
}

// Interface guards.
var (
	_ caddy.App          = (*App)(nil)
	_ caddy.Provisioner  = (*App)(nil)
	_ caddy.CleanerUpper = (*App)(nil)
)

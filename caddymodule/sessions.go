package caddymodule

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/broker/sessionid"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"
	"go.uber.org/zap/exp/zapslog"

	"github.com/Tahul/caddy-zidane-mcp/cluster"
	"github.com/Tahul/caddy-zidane-mcp/clustersessions"
	"github.com/Tahul/caddy-zidane-mcp/edge"
	"github.com/Tahul/caddy-zidane-mcp/mcpendpoint"
	"github.com/Tahul/caddy-zidane-mcp/policy"
	"github.com/Tahul/caddy-zidane-mcp/sessionpage"
	"github.com/Tahul/caddy-zidane-mcp/sessions"
	"github.com/Tahul/caddy-zidane-mcp/storage"
)

// AgentConfig is an ACP agent that sessions can run.
type AgentConfig struct {
	// Command is the program that speaks ACP on stdio, and its arguments,
	// such as ["claude-agent-acp"].
	Command []string `json:"command"`
	// Env is added to the agent's minimal environment: PATH and LANG from
	// the gateway, HOME and TMPDIR in a scratch directory of the
	// session's; nothing else of the gateway's passes. In a value, ${NAME}
	// is read from the gateway's environment when the agent starts, so a
	// secret stays out of the configuration: a variable whose name looks
	// secret (KEY, TOKEN, SECRET, PASSWORD, AUTH, CREDENTIAL) must be given
	// so.
	Env map[string]string `json:"env,omitempty"`
	// User is the account the agent runs as, looked up at start. Caddy must
	// be able to switch to it (root, or CAP_SETUID and CAP_SETGID).
	// Default: Caddy's own.
	User string `json:"user,omitempty"`
	// Sandbox says what the agent may reach. Default: confined (see
	// SandboxConfig).
	Sandbox *SandboxConfig `json:"sandbox,omitempty"`
}

// demoAgentName is the built-in agent that needs no API key.
const demoAgentName = "demo"

// sessionsState is what the sessions endpoint keeps across reloads: the
// engine with its agent processes, the MCP endpoint with its MCP sessions,
// and the key that signs session links.
type sessionsState struct {
	engine  *sessions.Engine
	cluster *clustersessions.Sessions // on a cluster's storage, else nil
	// node and poolKey, on a cluster's storage, hold this state's entry in
	// nodeEngines.
	node, poolKey string
	unserve       func() // takes the sessions service out of this node's registry entry
	endpoint      *mcpendpoint.Endpoint
	page          *sessionpage.Page
	signer        *sessionpage.Signer
	agentsHash    string
	unhook        func()
	// endpointPath is the MCP endpoint's path, which orchestrator agents
	// are given on their session's base.
	endpointPath string
	// egress are the upstreams offered to sessions, by name.
	egress map[string]*egressRoute
	// alive is the engine's Alive: whether a session can still take
	// prompts, and so keep the tokens minted for its agent.
	alive func(sessionID string) bool
	// sites are the running config's sessions sites. An orchestrator's
	// token, minted again at each launch of its agent, holds only the
	// verbs every one of them grants its creator now; another replica's
	// request about a session here is taken as one of them would take its
	// caller (rpcCaller).
	sites atomic.Pointer[[]mcpendpoint.Site]
}

func (s *sessionsState) Destruct() error {
	if s.node != "" {
		nodeEngines.CompareAndDelete(s.node, s.poolKey)
	}
	s.unhook()
	for _, r := range s.egress {
		r.pt.Close()
	}
	err := s.endpoint.Close()
	if s.cluster != nil {
		s.unserve()
		s.cluster.Close()
	}
	liveEngines.Delete(s.engine)
	if cerr := s.engine.Close(); err == nil {
		err = cerr
	}
	return err
}

var sessionsPool = caddy.NewUsagePool()

// nodeEngines holds, per node id, the pool key of the sessions state whose
// engine runs that node's sessions in this process.
var nodeEngines sync.Map

// build sets up the sessions endpoint and the egress routes of the
// upstreams offered to its sessions.
func (m *Sessions) build(ctx caddy.Context) error {
	s := m.site
	// The endpoint is shared by every site over this storage; each site's
	// requests carry its own scope map (what an orchestrator's creator may
	// call, and so give) and the app's share_sessions.
	access := mcpendpoint.Access{Scopes: s.scopes, ShareSessions: s.app.ShareSessions}
	var err error
	if m.state, m.stateKey, err = s.app.loadSessions(ctx, s.logger, s.resURL.Path, mcpendpoint.Site{Authn: s.authn, Access: access}); err != nil {
		return err
	}
	sess := m.state
	endpoint := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sess.endpoint.ServeHTTP(w, r.WithContext(mcpendpoint.WithAccess(r.Context(), access)))
	})
	route := &edge.Sessions{Scopes: s.scopes, Rules: s.policy, Endpoint: endpoint, Base: s.agentBase}
	m.out.route = route
	m.out.page = sess.page
	if cs, ok := ctx.Storage().(*cluster.Storage); ok {
		// The endpoint's 2025-11-25 MCP sessions name their node (see
		// sessionsMint); another replica forwards to it.
		ids, err := sessionsIDs(cs)
		if err != nil {
			return err
		}
		hk, err := cs.DeriveKey("aggregate hop v1")
		if err != nil {
			return err
		}
		m.out.route = &edge.ClusterSessions{Sessions: route, Fwd: newForward(ids, sessionsRoute, cs.Nodes(), sharedHopKey(hk), s.audit)}
	}
	m.out.egress = make(map[string]edge.Route, len(sess.egress))
	for name, e := range sess.egress {
		m.out.egress[name] = e.route
	}
	return nil
}

// agentSet is the configured agents plus the built-in demo agent.
func (a *App) agentSet() (map[string]sessions.AgentConfig, string, error) {
	agents := map[string]sessions.AgentConfig{}
	if _, ok := a.Agents[demoAgentName]; !ok {
		self, err := os.Executable()
		if err != nil {
			return nil, "", fmt.Errorf("finding this binary for the demo agent: %v", err)
		}
		agents[demoAgentName] = sessions.AgentConfig{Command: []string{self, "zidane", "demo-agent"}, Sandbox: &sessions.Sandbox{}}
	}
	for name, ac := range a.Agents {
		if ac == nil || len(ac.Command) == 0 {
			return nil, "", fmt.Errorf("agent %q: give the command that runs it, such as `command claude-agent-acp`", name)
		}
		agents[name] = sessions.AgentConfig{Command: ac.Command, Env: ac.Env, User: a.agentUsers[name], Sandbox: ac.Sandbox.engine()}
	}
	def := a.DefaultAgent
	if def == "" {
		def = demoAgentName
		if len(a.Agents) == 1 {
			for name := range a.Agents {
				def = name
			}
		}
	}
	if _, ok := agents[def]; !ok {
		return nil, "", fmt.Errorf("default_agent %q is not configured", def)
	}
	return agents, def, nil
}

// loadSessions returns the pooled sessions state for the app's storage,
// building it on first use. Release it with sessionsPool.Delete(key).
func (a *App) loadSessions(ctx caddy.Context, log *zap.Logger, endpointPath string, site mcpendpoint.Site) (*sessionsState, string, error) {
	// On a cluster's storage, each session runs on the node that created
	// it, which every other replica reaches through the node registry.
	b := sessionsBuild{storage: ctx.Storage(), endpointPath: endpointPath, site: site,
		logger: slog.New(zapslog.NewHandler(log.Named("sessions").Core()))}
	b.shared, _ = ctx.Storage().(*cluster.Storage)
	if b.shared != nil {
		nodes := b.shared.Nodes()
		if nodes == nil {
			return nil, "", errors.New("zidane_mcp sessions: in cluster mode, the sessions endpoint needs this replica's id and address: set `node` (such as gw-1) and `advertise` (where the other replicas reach it) in storage zidane_nats's block, so that each session runs on one replica and the others reach it there")
		}
		b.node = nodes.Self()
	}
	var err error
	if b.agents, b.def, err = a.agentSet(); err != nil {
		return nil, "", err
	}
	if b.confine, err = selfCommand("zidane", "confine"); err != nil {
		return nil, "", err
	}
	b.hash = fmt.Sprint(sortedAgents(b.agents), b.def, a.WorktreeRoot, a.MaxAgents, a.MaxSessions, a.AgentIdleTimeout, a.SessionUpstreams,
		a.MaxSessionsPerToken, a.MaxAgentsPerToken, a.MCPSessionIdleTimeout)
	b.key = "sessions|" + storageKey(ctx.Storage())
	v, loaded, err := sessionsPool.LoadOrNew(b.key, func() (caddy.Destructor, error) {
		if b.shared != nil {
			// One engine per node id: another over a storage block that
			// changed would resume this node's sessions while the running
			// config's engine still runs them.
			if other, busy := nodeEngines.LoadOrStore(b.node, b.key); busy && other != b.key {
				return nil, fmt.Errorf("the cluster's settings (storage zidane_nats) changed under the sessions endpoint of node %q, whose agent sessions run on the old NATS connection; a reload cannot move them: restart caddy to apply the new settings", b.node)
			}
		}
		return a.newSessionsState(b)
	})
	if err != nil {
		if b.shared != nil {
			nodeEngines.CompareAndDelete(b.node, b.key) // the state was not made
		}
		return nil, "", fmt.Errorf("sessions: %w", err)
	}
	st := v.(*sessionsState)
	// Roots apply at once to the engine this config shares, since a reload
	// that narrows them must not wait for a restart; but only once the
	// config has started (App.Start), so that a reload caddy refuses
	// cannot leave the running config with the new roots.
	if loaded {
		if _, err := sessions.CleanRoots(a.Roots); err != nil {
			sessionsPool.Delete(b.key)
			return nil, "", fmt.Errorf("sessions: %w", err)
		}
		a.rootsFor = append(a.rootsFor, st.engine)
	}
	if a.sessionSites == nil {
		a.sessionSites = map[*sessionsState][]mcpendpoint.Site{}
	}
	a.sessionSites[st] = append(a.sessionSites[st], site)
	if loaded && st.agentsHash != b.hash {
		log.Warn("the agents or session limits changed; the running session engine keeps the ones it started with until caddy restarts (roots apply at once)",
			zap.String("hint", "restart caddy to apply agent and limit changes"))
	}
	return st, b.key, nil
}

// sessionsBuild is what a sessions state is built of.
type sessionsBuild struct {
	storage storage.Storage
	shared  *cluster.Storage // the storage, when it is a cluster's
	// node is this replica's id on a cluster's storage, else empty; key,
	// the state's in sessionsPool.
	node, key    string
	endpointPath string
	site         mcpendpoint.Site // the site that builds the state
	agents       map[string]sessions.AgentConfig
	def          string   // the default agent
	confine      []string // the command that confines an agent
	hash         string   // of the agents and limits the engine starts with
	logger       *slog.Logger
}

// newSessionsState builds the sessions state: the engine, on a cluster's
// storage its view of every node's sessions, the MCP endpoint and the
// session pages.
func (a *App) newSessionsState(b sessionsBuild) (*sessionsState, error) {
	signer := sessionpage.NewSigner(time.Duration(a.LinkTTL))
	if b.shared != nil {
		// A link any replica signed opens on every other.
		k, err := b.shared.DeriveKey("session page links v1")
		if err == nil {
			signer, err = sessionpage.NewSignerKey(k, time.Duration(a.LinkTTL))
		}
		if err != nil {
			return nil, err
		}
	}
	st := &sessionsState{signer: signer, agentsHash: b.hash, endpointPath: b.endpointPath, node: b.node, poolKey: b.key}
	// Until this config starts (App.Start), the sessions resumed now are
	// held to the map of the site that built the engine, and other
	// replicas' requests are taken as it takes its callers.
	st.sites.Store(&[]mcpendpoint.Site{b.site})
	egress, err := a.buildEgress(b.logger)
	if err != nil {
		return nil, err
	}
	st.egress = egress
	openCtx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// Resumed sessions may launch while NewEngine runs; the hook that
	// needs the engine waits for it.
	ready := make(chan struct{})
	engine, err := a.newEngine(openCtx, b, st, ready)
	if err != nil {
		return nil, err
	}
	// What the endpoint and the page serve: this engine, or on a cluster
	// every node's sessions.
	var served sessions.Sessions = engine
	alive := engine.Alive
	var mint func() string
	if b.shared != nil {
		if served, alive, mint, err = st.joinCluster(openCtx, b, engine); err != nil {
			engine.Close()
			return nil, err
		}
	}
	names := slices.Sorted(maps.Keys(b.agents))
	endpoint, err := mcpendpoint.New(mcpendpoint.Options{Sessions: served, Agents: names, Logger: b.logger, OnRefusal: auditToolRefusal, Approvals: a.approvals,
		SessionTimeout: max(0, time.Duration(a.MCPSessionIdleTimeout)), NewSessionID: mint})
	if err != nil {
		if st.cluster != nil {
			st.cluster.Close()
		}
		engine.Close()
		return nil, err
	}
	st.engine, st.endpoint, st.alive = engine, endpoint, engine.Alive
	liveEngines.Store(engine, struct{}{})
	if st.cluster != nil {
		// The others ask this node about its sessions once its registry
		// entry says it serves them.
		st.unserve = b.shared.Nodes().Serve(sessionsService)
	}
	tokens := a.Tokens()
	// Before any agent gets a token: the tokens of sessions that ended
	// while the gateway was down, and those minted before tokens recorded
	// their session, have no use.
	pruneCtx, cancelPrune := context.WithTimeout(context.Background(), 30*time.Second)
	if gone, err := tokens.PruneDerived(pruneCtx, alive); err != nil {
		b.logger.Error("deleting the tokens of ended sessions failed; they are refused all the same once their parent goes", "error", err)
	} else if len(gone) > 0 {
		b.logger.Info("deleted the tokens of sessions that have ended", "tokens", len(gone))
	}
	cancelPrune()
	close(ready)
	st.page = &sessionpage.Page{Sessions: served, Signer: st.signer}
	// Revoking a token cancels what it started, wherever the revocation
	// came from (admin API, CLI offline, parent token).
	st.unhook = tokens.OnRevoke(func(t policy.Token) { engine.RevokeToken(t.ID) })
	return st, nil
}

// newEngine starts the session engine of st, which resumes the sessions
// the storage holds; their agents' MCP servers wait for ready.
func (a *App) newEngine(ctx context.Context, b sessionsBuild, st *sessionsState, ready <-chan struct{}) (*sessions.Engine, error) {
	tokens := a.Tokens()
	logger := b.logger
	return sessions.NewEngine(ctx, sessions.Config{
		Agents:       b.agents,
		DefaultAgent: b.def,
		Storage:      b.storage,
		Node:         b.node,
		WorktreeRoot: a.WorktreeRoot,
		Roots:        a.Roots,
		Confine:      b.confine,
		Deny:         deniedFiles,
		Denied:       auditLaunchDenied,
		Limits: sessions.Limits{
			MaxAgents:           a.MaxAgents,
			MaxSessions:         a.MaxSessions,
			MaxSessionsPerToken: a.MaxSessionsPerToken,
			MaxAgentsPerToken:   a.MaxAgentsPerToken,
			IdleTimeout:         time.Duration(a.AgentIdleTimeout),
		},
		LinkFor: func(id, base string) string { return st.signer.Link(base, id) },
		MCPServers: func(info sessions.SessionInfo) []sessions.McpServer {
			<-ready
			return append(st.orchestratorServers(tokens, info, logger), st.egressServers(tokens, info, logger)...)
		},
		// What was minted for a session's agent goes with the session.
		Ended: func(id string) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if _, err := tokens.DeleteSession(ctx, id); err != nil {
				logger.Error("deleting the tokens of an ended session failed; the next start deletes them", "session", id, "error", err)
			}
		},
		Logger: logger,
	})
}

// joinCluster sets st up on a cluster's storage: what its endpoint and
// pages serve (every node's sessions), which sessions' tokens stay (those
// alive here, and every other node's), and how its MCP sessions are named
// (by node, so that another replica forwards to this one).
func (st *sessionsState) joinCluster(ctx context.Context, b sessionsBuild, engine *sessions.Engine) (sessions.Sessions, func(string) bool, func() string, error) {
	shared, node := b.shared, b.node
	var err error
	st.cluster, err = clustersessions.New(ctx, clustersessions.Options{
		Local: engine, Listings: engine, Node: node, Storage: shared, Logger: b.logger, Relay: engine.RelayEvent, LastEvent: engine.LastEventSeq,
		Resolve: st.rpcCaller, OnRefusal: auditRPCRefusal,
		LinkFor: func(id, base string) string { return st.signer.Link(base, id) },
		Peers: func() []string {
			if n := shared.Nodes(); n != nil {
				return n.AliveServing(sessionsService)
			}
			return nil
		},
	})
	if err != nil {
		return nil, nil, nil, err
	}
	ids, err := sessionsIDs(shared)
	if err != nil {
		st.cluster.Close()
		return nil, nil, nil, err
	}
	// Another node's sessions are its to judge: their tokens stay. An id
	// with no node is no other node's either (a session of this host's
	// from before it joined a cluster): this engine judges it.
	alive := clustersessions.Alive(node, engine.Alive)
	mint := func() string { return ids.Seal(node+"/"+rand.Text(), "", sessionsRoute) }
	return st.cluster, alive, mint, nil
}

// sessionsRoute is the sessions endpoint's identity in the node ids its
// 2025-11-25 MCP session ids seal, and in its hops: one endpoint serves
// every sessions site over a storage.
const sessionsRoute = "sessions-node|v1"

// sessionsService is the RPC service of agent sessions
// (package clustersessions), as the node registry lists it.
const sessionsService = "sessions"

// sessionsIDs seals and opens the node ids in the sessions endpoint's MCP
// session ids, with a key derived from the cluster key.
func sessionsIDs(cs *cluster.Storage) (*sessionid.Sealer, error) {
	key, err := sessionIDKey(cs)
	if err != nil {
		return nil, err
	}
	return sessionid.New(key)
}

// orchestratorServers gives an orchestrator session (one created with
// `tools`) this endpoint as an MCP server, with a token derived from its
// creator's that grants only the listed verbs (which create checked its
// creator may call). With `subscribe`, the engine relays the events of the
// sessions that token creates into the orchestrator. It runs at each launch
// of the agent: a relaunch renews the session's one token.
func (s *sessionsState) orchestratorServers(tokens *policy.TokenStore, info sessions.SessionInfo, log *slog.Logger) []sessions.McpServer {
	if len(info.Tools) == 0 {
		return nil
	}
	if info.Base == "" {
		log.Error("an orchestrator session has no address of this gateway to reach it at; it runs without the endpoint", "session", info.SessionID)
		return nil
	}
	scopes, dropped, ok := mcpendpoint.OrchestratorScopes(tokens, s.runningSites(), info.Owner, info.Tools, time.Now())
	if !ok {
		log.Warn("the creator of an orchestrator session is gone; its agent runs without the endpoint", "session", info.SessionID)
		return nil
	}
	if len(dropped) > 0 {
		log.Warn("an orchestrator's creator may no longer call some of its tools; its agent gets the rest", "session", info.SessionID, "dropped", dropped)
	}
	if len(scopes) == 0 {
		log.Warn("an orchestrator session has no verb its creator may call; it gets no MCP server", "session", info.SessionID, "tools", info.Tools)
		return nil
	}
	secret, child, ok := s.mintChild(tokens, info, policy.PurposeOrchestrator, scopes, log)
	if !ok {
		return nil
	}
	if info.Subscribe {
		s.engine.Relay(child.ID, info.SessionID)
	}
	return []sessions.McpServer{{
		Name:    "zidane",
		URL:     info.Base + s.endpointPath,
		Headers: map[string]string{"Authorization": "Bearer " + secret},
	}}
}

// runningSites are the running config's sessions sites.
func (s *sessionsState) runningSites() []mcpendpoint.Site {
	if p := s.sites.Load(); p != nil {
		return *p
	}
	return nil
}

// rpcCaller establishes, on this node, whom another replica's request
// about a session here acts for (clustersessions.Resolver): a session
// page's reader by the capability it carries, any other caller as the
// running config's sessions sites take it (mcpendpoint.ForwardedOwner).
func (s *sessionsState) rpcCaller(ctx context.Context, c clustersessions.Caller, u clustersessions.Use) (sessions.Owner, error) {
	if c.TokenID == "" {
		return s.signer.ForwardedReader(c.Credential, u.ID, u.Tool, u.Verbs)
	}
	return mcpendpoint.ForwardedOwner(ctx, s.runningSites(), c.TokenID, c.Scopes, c.Credential, u.Tool, u.Verbs, time.Now())
}

// mintChild mints, or renews at a relaunch, the token of purpose for the
// agent of info's session (see policy.TokenStore.CreateChild): derived
// from the session's creator, with its owner, expiring with it. ok is
// false when none may be had; the log says why and the agent runs without.
func (s *sessionsState) mintChild(tokens *policy.TokenStore, info sessions.SessionInfo, purpose policy.Purpose, scopes []string, log *slog.Logger) (string, policy.Token, bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	o := info.Owner
	secret, tok, err := tokens.CreateChild(ctx, policy.ChildSpec{
		Parent:  policy.Principal{TokenID: o.TokenID, Name: o.TokenName, Owner: o.ID, Expires: o.Expires, Issued: o.Issued},
		Session: info.SessionID,
		Purpose: purpose,
		Scopes:  scopes,
	})
	if err != nil {
		log.Error("no "+string(purpose)+" token for the session's agent; it runs without", "session", info.SessionID, "error", err)
		return "", policy.Token{}, false
	}
	// A session that ended while its token was being minted, after its
	// Ended hook deleted what it had, must not keep this one.
	if !s.alive(info.SessionID) {
		if _, err := tokens.DeleteSession(ctx, info.SessionID); err != nil {
			log.Error("deleting the token of a session that ended at launch failed; the next start deletes it", "session", info.SessionID, "error", err)
		}
		return "", policy.Token{}, false
	}
	return secret, tok, true
}

func sortedAgents(m map[string]sessions.AgentConfig) []string {
	var out []string
	for name, a := range m {
		var user string
		if a.User != nil {
			user = a.User.Name
		}
		var sb sessions.Sandbox
		if a.Sandbox != nil {
			sb = *a.Sandbox
		}
		out = append(out, fmt.Sprint(name, a.Command, a.Env, user, a.Sandbox != nil, sb))
	}
	sort.Strings(out)
	return out
}

func sortStrings(s []string) { sort.Strings(s) }

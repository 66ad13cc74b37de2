package caddymodule

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/broker/aggregate"
	"github.com/Tahul/caddy-zidane-mcp/broker/connect"
	"github.com/Tahul/caddy-zidane-mcp/broker/passthrough"
	"github.com/Tahul/caddy-zidane-mcp/broker/sessionid"
	"github.com/Tahul/caddy-zidane-mcp/broker/taskid"
	"github.com/Tahul/caddy-zidane-mcp/broker/upstream"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"
	"go.uber.org/zap/exp/zapslog"

	"github.com/Tahul/caddy-zidane-mcp/cluster"
	"github.com/Tahul/caddy-zidane-mcp/edge"
	"github.com/Tahul/caddy-zidane-mcp/internal/configfile"
	"github.com/Tahul/caddy-zidane-mcp/pinnedfetch"
	"github.com/Tahul/caddy-zidane-mcp/pins"
	"github.com/Tahul/caddy-zidane-mcp/policy"
	"github.com/Tahul/caddy-zidane-mcp/storage"
)

// brokerSessionKey seals the session ids the broker gives clients. It lives
// as long as the process, so a reload keeps every client's session; after a
// restart clients get 404 and initialize again, as the spec has them do.
var brokerSessionKey = func() []byte {
	k := make([]byte, 32)
	rand.Read(k)
	return k
}()

// sessionIDKey is the key that seals session ids on storage st: on NATS
// storage, one derived from the cluster key, so an id one replica sealed
// opens on every other; elsewhere brokerSessionKey.
func sessionIDKey(st storage.Storage) ([]byte, error) {
	if cs, ok := st.(*cluster.Storage); ok {
		return cs.DeriveKey("session ids")
	}
	return brokerSessionKey, nil
}

// loadUpstreams reads the configured upstreams: inline ones first, then
// those of each upstreams_file, in order. Names must be unique.
func (a *App) loadUpstreams() error {
	lists := [][]upstream.Config{}
	var inline []upstream.Config
	for _, u := range a.Upstreams {
		if u.Source == "" {
			u.Source = "Caddyfile"
		}
		n, err := upstream.Normalize(u)
		if err != nil {
			return err // it names the upstream and where it is configured
		}
		inline = append(inline, n)
	}
	lists = append(lists, inline)
	for _, path := range a.UpstreamsFiles {
		raw, err := configfile.Read(path)
		if err != nil {
			return fmt.Errorf("upstreams_file: %w; give the path of an mcp.json file", err)
		}
		ups, warnings, err := upstream.LoadMCPJSON(raw, path)
		if err != nil {
			return fmt.Errorf("upstreams_file %s: %w", path, err)
		}
		for _, w := range warnings {
			caddy.Log().Named("zidane").Warn("upstreams_file", zap.String("file", path), zap.String("warning", w))
		}
		lists = append(lists, ups)
	}
	all, err := upstream.MergeUpstreams(lists...)
	if err != nil {
		return err
	}
	a.upstreams = map[string]upstream.Config{}
	for _, u := range all {
		a.upstreams[u.Name] = u
	}
	return nil
}

// Upstream returns the configured upstream called name.
func (a *App) Upstream(name string) (upstream.Config, bool) {
	u, ok := a.upstreams[name]
	return u, ok
}

// build sets up the pass-through route to the named upstream.
func (b *Broker) build(ctx caddy.Context) error {
	s := b.site
	u, ok := s.app.Upstream(b.Upstream)
	if !ok {
		return fmt.Errorf("broker %q: no such upstream; configure it in the global zidane option (upstream %s <url>) or an upstreams_file", b.Upstream, b.Upstream)
	}
	route := "broker:" + u.Name
	sessionKey, err := sessionIDKey(ctx.Storage())
	if err != nil {
		return err
	}
	pt, err := passthrough.New(u, passthrough.Options{
		SessionKey:   sessionKey,
		Route:        route,
		MaxBodyBytes: s.maxBody,
		AnswerBudget: s.app.answerBudget,
		OnDecision:   func(d pinnedfetch.Decision) { auditRedirect(s.audit, u.Name, d) },
		OnCall:       func(c upstream.CallRecord) { auditUpstreamCall(s.audit, c) },
		OnRefusal: func(r upstream.Refusal) {
			metricRefusals.WithLabelValues(r.Reason).Inc()
			auditBrokerRefusal(s.audit, r)
		},
		Logger:          slog.New(zapslog.NewHandler(s.logger.Named("broker").Core())),
		Credentials:     s.app.credentials(u.Name),
		ConnectRequired: s.app.connectRequired,
		Retry:           s.app.connectRetry(u.Name, route),
		Connected:       s.app.connectHold(u.Name),
		Elicitations:    s.app.connectElicitations(u.Name),
		Store:           ctx.Storage(),
	})
	if err != nil {
		return fmt.Errorf("broker %q: %w", b.Upstream, err)
	}
	b.pt = pt
	// The upstream's scope, and upstream:<name>, grant its every tool and
	// method on this route. The map is strict: a token that none of its
	// rules grant learns nothing of the upstream.
	grant := []policy.Rule{{Scope: policy.UpstreamScope(u.Name), Tools: []string{"*"}, Methods: []string{"*"}}}
	b.out.scopes = []string{policy.UpstreamScope(u.Name)}
	if u.Scope != "" {
		grant = append(grant, policy.Rule{Scope: u.Scope, Tools: []string{"*"}, Methods: []string{"*"}})
		b.out.scopes = append(b.out.scopes, u.Scope)
	}
	scopes, err := policy.NewScopeMap(append(grant, s.rules...), s.defaults)
	if err != nil {
		return err
	}
	tasks, err := taskid.New(sessionKey)
	if err != nil {
		return err
	}
	b.out.route = &edge.Upstream{Config: u, Scopes: scopes.Strict(), Rules: s.policy, Handler: pt,
		SharedParams: b.sharedParams(ctx, "params|broker|"+u.Name+"|"+u.URL), Pins: b.openPins(ctx, u.Name, u.PinPolicy()),
		Tasks: tasks, Route: route}
	b.out.urlElicitation = pt.URLElicitation
	return nil
}

// auditUpstreamCall records a call a route sent upstream when it ends: on
// the latency histogram, and as an audit line.
func auditUpstreamCall(l *zap.Logger, c upstream.CallRecord) {
	observeUpstreamCall(c)
	ce := l.Check(zap.InfoLevel, "upstream call")
	if ce == nil {
		return // the audit log is off at this level: build nothing
	}
	fields := []zap.Field{
		zap.String("event", "upstream_call"),
		zap.String("upstream", c.Upstream),
		zap.String("route", c.Route),
		zap.String("http_method", c.HTTPMethod),
		zap.String("token_id", c.TokenID),
		zap.String("token_name", c.TokenName),
		zap.String("client_ip", c.ClientIP),
		zap.String("outcome", c.Outcome),
		zap.Int("status", c.Status),
		zap.Duration("duration", c.Duration),
	}
	if c.Method != "" {
		fields = append(fields, zap.String("rpc_method", c.Method))
	}
	if c.Tool != "" {
		fields = append(fields, zap.String("tool", c.Tool))
	}
	if c.Detail != "" {
		fields = append(fields, zap.String("detail", c.Detail))
	}
	ce.Write(fields...)
}

func auditRedirect(l *zap.Logger, upstream string, d pinnedfetch.Decision) {
	if d.Action == pinnedfetch.ActionSend && d.Hop == 0 {
		return // the first hop of every request is no redirect decision
	}
	l.Info("upstream redirect", zap.String("event", "redirect"), zap.String("upstream", upstream),
		zap.Int("hop", d.Hop), zap.String("from", d.From), zap.String("to", d.To), zap.Int("status", d.Status),
		zap.String("action", string(d.Action)), zap.String("reason", d.Reason),
		zap.Bool("credentials", d.Credentials), zap.Strings("stripped_headers", d.StrippedHeaders))
}

func auditBrokerRefusal(l *zap.Logger, r upstream.Refusal) {
	l.Warn("request refused", zap.String("event", "refused"), zap.String("reason", r.Reason),
		zap.String("upstream", r.Upstream), zap.String("route", r.Route), zap.String("http_method", r.HTTPMethod),
		zap.String("token_id", r.TokenID), zap.String("token_name", r.TokenName), zap.Int("status", r.Status),
		zap.String("detail", r.Detail))
}

// build sets up the aggregated route over the named upstreams.
func (a *Aggregate) build(ctx caddy.Context) error {
	s := a.site
	var ups []upstream.Config
	for _, name := range a.Upstreams {
		u, ok := s.app.Upstream(name)
		if !ok {
			return fmt.Errorf("aggregate: no upstream %q; configure it in the global zidane option", name)
		}
		ups = append(ups, u)
	}
	byName := map[string]upstream.Config{}
	for _, u := range ups {
		byName[u.Name] = u
		// What allows below grants on.
		a.out.scopes = append(a.out.scopes, policy.UpstreamScope(u.Name))
		if u.Scope != "" && !slices.Contains(a.out.scopes, u.Scope) {
			a.out.scopes = append(a.out.scopes, u.Scope)
		}
	}
	allows := func(p policy.Principal, name string) bool {
		u := byName[name]
		return policy.UpstreamAllows(p, u.Name, u.Scope, s.defaults)
	}
	// The route's identity: the same on every replica of one config, and
	// another for another site or upstream list, so that no id, hop or
	// task handle of one aggregated route is taken by another.
	names := a.Prefix + "|" + strings.Join(a.Upstreams, ",")
	fwd, err := aggregateForward(ctx, "aggregate-node|"+s.resource+"|"+names, s.audit)
	if err != nil {
		return err
	}
	// The pins are open before the route starts: its catalogs connect in
	// the background, and their instructions are pinned as they come.
	var store *pins.Store
	for _, u := range ups {
		store = a.openPins(ctx, edge.AggregatePinNS(u.Name), u.PinPolicy())
	}
	opts := aggregate.Options{
		// Pid files of stdio upstreams: a gateway that crashed leaves them,
		// and the next start ends the processes they name.
		PIDDir:              filepath.Join(caddy.AppDataDir(), "zidane", "stdio"),
		Instructions:        edge.AggregateInstructions(store),
		Prefix:              a.Prefix,
		MaxRequestBodyBytes: s.maxBody,
		AnswerBudget:        s.app.answerBudget,
		OnDecision:          func(d pinnedfetch.Decision) { auditRedirect(s.audit, "aggregate", d) },
		OnCall:              func(c upstream.CallRecord) { auditUpstreamCall(s.audit, c) },
		Logger:              slog.New(zapslog.NewHandler(s.logger.Named("aggregate").Core())),
		ToolCache:           toolCache{s.app.storage},
		SessionTimeout:      max(0, time.Duration(s.app.MCPSessionIdleTimeout)),
		Credentials:         s.app.credentials,
		AuthRequired:        s.app.authRequired,
		MayUse:              allows,
		Tasks:               true,
		// Upstreams with credentials per_user: a session per person,
		// marked with that person, whose token callerOwner finds.
		PerUser:   s.app.perUser,
		Connected: s.app.personConnected,
	}
	if s.app.connects() != nil {
		opts.ConnectRequired = s.app.connectAnswer
		opts.Settle = s.app.connectSettle
		opts.AwaitConnect = s.app.connectWait
		opts.ConnectState = func(state string) bool { _, ok := connect.ElicitationOf(state); return ok }
	}
	if fwd != nil {
		opts.NewSessionID = fwd.Mint
		// A 2026-07-28 client's retry of a bridged call may reach any
		// replica: every one opens the requestState, which names the node
		// that holds the call, and forwards the retry there.
		key, err := bridgeKey(ctx.Storage().(*cluster.Storage), fwd)
		if err != nil {
			return err
		}
		opts.BridgeKey = key
		opts.Node = fwd.Self()
	}
	agg, err := aggregate.New(ups, opts)
	if err != nil {
		return fmt.Errorf("aggregate: %w", err)
	}
	a.agg = agg
	liveAggregates.add(agg)
	taskKey, err := sessionIDKey(ctx.Storage())
	if err != nil {
		return err
	}
	tasks, err := taskid.New(taskKey)
	if err != nil {
		return err
	}
	route := &edge.Aggregate{Catalog: agg, Handler: agg, Allows: allows, Rules: s.policy,
		SharedParams: a.sharedParams(ctx, "params|aggregate|"+names), Pins: store,
		Tasks: tasks, Route: "aggregate|" + s.resource + "|" + names}
	a.out.route = route
	a.out.urlElicitation = agg.URLElicitation
	if fwd != nil {
		a.out.route = &edge.ClusterAggregate{Aggregate: route, BridgeNode: agg.BridgeNode, Fwd: fwd}
	}
	return nil
}

// aggregateForward is, in cluster mode, how the aggregated route called
// route forwards its 2025-11-25 sessions: they name the node that holds
// them, and other replicas forward to it (see forward.go). Nil on a single
// node.
func aggregateForward(ctx caddy.Context, route string, audit *zap.Logger) (*edge.Forward, error) {
	cs, ok := ctx.Storage().(*cluster.Storage)
	if !ok {
		return nil, nil
	}
	nodes := cs.Nodes()
	if nodes == nil {
		return nil, errors.New("aggregate in cluster mode: set advertise (and node, unless the host name is this replica's id) in storage zidane_nats's block, so the other replicas can forward this route's 2025-11-25 sessions to the replica that holds them; see docs/cluster.md")
	}
	key, err := sessionIDKey(cs)
	if err != nil {
		return nil, err
	}
	ids, err := sessionid.New(key)
	if err != nil {
		return nil, err
	}
	hk, err := cs.DeriveKey("aggregate hop v1")
	if err != nil {
		return nil, err
	}
	return newForward(ids, route, nodes, sharedHopKey(hk), audit), nil
}

// liveAggregates are the aggregated routes of every loaded config, which
// the admin API reaches to restart an upstream. During a reload the old
// config's routes are here too, until their Cleanup.
var liveAggregates = &aggregateSet{m: map[*aggregate.Aggregate]struct{}{}}

type aggregateSet struct {
	mu sync.Mutex
	m  map[*aggregate.Aggregate]struct{}
}

func (s *aggregateSet) add(a *aggregate.Aggregate) {
	s.mu.Lock()
	s.m[a] = struct{}{}
	s.mu.Unlock()
}

func (s *aggregateSet) remove(a *aggregate.Aggregate) {
	s.mu.Lock()
	delete(s.m, a)
	s.mu.Unlock()
}

// reconnect has every live aggregated route with upstream name connect to
// it now (after a login).
func (s *aggregateSet) reconnect(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for a := range s.m {
		a.Reconnect(name)
	}
}

// restart restarts (or, with retire, retires) upstream name on every live
// aggregated route that has it, and says on how many.
func (s *aggregateSet) restart(ctx context.Context, name string, retire bool) (int, error) {
	s.mu.Lock()
	var with []*aggregate.Aggregate
	for a := range s.m {
		if slices.Contains(a.Upstreams(), name) {
			with = append(with, a)
		}
	}
	s.mu.Unlock()
	for _, a := range with {
		do := a.Restart
		if retire {
			do = a.Retire
		}
		if err := do(ctx, name); err != nil {
			return 0, err
		}
	}
	return len(with), nil
}

// toolCache keeps the aggregated route's tool listings in Caddy's storage,
// under zidane/upstream-tools/<upstream>.json: schemas and descriptions,
// no credential.
type toolCache struct{ st storage.Storage }

func (c toolCache) Load(ctx context.Context, upstream string) ([]byte, error) {
	if c.st == nil {
		return nil, errors.New("no storage")
	}
	return c.st.Load(ctx, "zidane/upstream-tools/"+upstream+".json")
}

func (c toolCache) Store(ctx context.Context, upstream string, data []byte) error {
	if c.st == nil {
		return errors.New("no storage")
	}
	return c.st.Store(ctx, "zidane/upstream-tools/"+upstream+".json", data)
}

package aggregate

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/broker/upstream"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// transport returns a client transport for one session to up, built by the
// code [upstream.Conn] uses: for stdio, its Connect starts a process of its own.
func (up *aggUpstream) transport() mcp.Transport {
	return up.tr.NewTransport()
}

// dialOn opens a session of client to up over transport t, the attempt
// bounded by up.timeout. The connection's context lasts as long as the
// session, since the SSE client reads its stream under it;
// Aggregate.Close cancels it.
func (a *Aggregate) dialOn(up *aggUpstream, client *mcp.Client, t mcp.Transport) (*mcp.ClientSession, error) {
	ctx, cancel := context.WithCancel(a.ctx)
	timer := time.AfterFunc(up.timeout, cancel)
	// No version asked for: go-sdk's client tries 2026-07-28 (server/discover)
	// first and falls back to initialize at 2025-11-25.
	cs, err := client.Connect(ctx, t, nil)
	expired := !timer.Stop()
	if err == nil && expired {
		cs.Close()
		err = context.DeadlineExceeded
	}
	if err != nil {
		cancel()
		return nil, up.connectErr(err)
	}
	go func() {
		cs.Wait()
		cancel()
	}()
	return cs, nil
}

// connectErr is the error of a failed connection to up: the origin guard's
// refusal when there was one (the SDK may report it as a closed
// connection), else err.
func (up *aggUpstream) connectErr(err error) error {
	if errors.Is(err, upstream.ErrOffOrigin) {
		return fmt.Errorf("connecting: %w", err)
	}
	if r := up.tr.Refusal(); r != nil {
		return fmt.Errorf("connecting: %w", r)
	}
	return fmt.Errorf("connecting: %w", err)
}

// superviseCatalog keeps up's catalog session: connect, list, register,
// wait for it to end, and again after a backoff (catalogBackoff, counted
// from the last session that opened).
// What an upstream registered stays listed while it is away, so calls get
// a tool error naming it; a new listing replaces it on reconnection.
func (a *Aggregate) superviseCatalog(up *aggUpstream) {
	defer a.wg.Done()
	first := true
	failures := 0 // rounds since a catalog session last opened
	if up.shared && up.fromCache {
		// Lazy connect: its cached listing is offered, and the process
		// starts with the first call.
		first = false
		a.firstRoundDone()
		select {
		case <-a.ctx.Done():
			return
		case <-up.wake:
		}
	}
	for a.ctx.Err() == nil {
		cs, err := a.connectCatalog(up)
		if err == nil {
			if up.shared {
				// A lease: the idle timer waits for the listing.
				up.mu.Lock()
				up.inflight++
				up.mu.Unlock()
			}
			err = a.refreshAll(up, cs)
			if up.shared {
				a.release(up)
			}
			if err != nil {
				cs.Close()
			}
		}
		if err != nil && a.authRequired != nil && a.authRequired(up.cfg.Name) {
			// Until an operator logs in, the upstream offers nothing: its
			// tools leave the aggregate rather than fail every call.
			a.withdraw(up)
		}
		if first {
			first = false
			a.firstRoundDone()
		}
		idle := false
		delay := catalogBackoff.Delay(failures)
		if err != nil {
			a.catalogFailed(up, err, delay)
		} else {
			failures, delay = 0, catalogBackoff.Delay(0)
			a.resubscribe(up, cs)
			// Close ends the session (and a stdio process) even if it
			// did not see this one.
			stop := context.AfterFunc(a.ctx, func() { cs.Close() })
			cs.Wait()
			stop()
			up.mu.Lock()
			closedIdle := up.idleClosed
			up.mu.Unlock()
			if !closedIdle {
				a.logger.Warn("aggregate: upstream catalog session ended", "upstream", up.cfg.Name)
			}
			// Its tools, prompts and resources stay listed until the
			// catalog reconnects and lists again: meanwhile a call gets a
			// tool error naming the upstream, not "unknown tool".
			up.mu.Lock()
			if up.catalog == cs {
				up.catalog = nil
				up.notifyLocked()
			}
			idle = up.idleClosed
			up.idleClosed = false
			up.mu.Unlock()
		}
		if idle {
			// Closed for idleness: start again on the next call.
			select {
			case <-a.ctx.Done():
				return
			case <-up.wake:
			}
			continue
		}
		// A waiting call (shared stdio) or [Aggregate.Reconnect] skips
		// the backoff.
		wake := up.wake
		select {
		case <-a.ctx.Done():
			return
		case <-time.After(delay):
		case <-wake:
		}
		failures++
	}
}

// catalogFailed notes that up's catalog round failed with err, and logs
// it with the delay before the next attempt.
func (a *Aggregate) catalogFailed(up *aggUpstream, err error, delay time.Duration) {
	up.mu.Lock()
	up.lastErr = upstream.SafeError(err)
	up.catalog = nil
	up.failures++
	up.notifyLocked()
	up.mu.Unlock()
	if errors.Is(err, upstream.ErrOffOrigin) {
		a.logger.Error("aggregate: upstream refused: its SSE endpoint is on another origin", "upstream", up.cfg.Name, "error", upstream.SafeError(err), "retry_in", delay)
	} else {
		a.logger.Warn("aggregate: upstream catalog unavailable", "upstream", up.cfg.Name, "error", upstream.SafeError(err), "retry_in", delay)
	}
}

// firstRoundDone counts one upstream's first catalog round as over; the
// last one makes the aggregate ready.
func (a *Aggregate) firstRoundDone() {
	a.mu.Lock()
	a.pending--
	if a.pending == 0 {
		close(a.ready)
	}
	a.mu.Unlock()
}

func (a *Aggregate) connectCatalog(up *aggUpstream) (*mcp.ClientSession, error) {
	opts := &mcp.ClientOptions{
		Capabilities: &mcp.ClientCapabilities{},
		ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) {
			a.listChanged(up, &up.relisting[0], a.refreshTools)
		},
		PromptListChangedHandler: func(context.Context, *mcp.PromptListChangedRequest) {
			a.listChanged(up, &up.relisting[1], a.refreshPrompts)
		},
		ResourceListChangedHandler: func(context.Context, *mcp.ResourceListChangedRequest) {
			a.listChanged(up, &up.relisting[2], a.refreshResources)
		},
		ResourceUpdatedHandler: func(ctx context.Context, req *mcp.ResourceUpdatedNotificationRequest) {
			a.mu.Lock()
			owner := a.resOwner[req.Params.URI]
			a.mu.Unlock()
			if owner == up.cfg.Name {
				_ = a.server.ResourceUpdated(ctx, req.Params)
			}
		},
	}
	if up.shared {
		a.sharedClientOptions(up, opts)
	}
	opts.MultiRoundTrip = &mcp.MultiRoundTripOptions{Disabled: true}
	client := mcp.NewClient(&mcp.Implementation{Name: "zidane-mcp-broker", Version: "1"}, opts)
	if up.shared {
		client.AddReceivingMiddleware(refuseSharedRequests(up))
	}
	// A 2026-07-28 upstream's list-changed stream ending ends the session
	// (see listenWatch); before the session exists, it fails the attempt.
	var (
		mu    sync.Mutex
		live  *mcp.ClientSession
		ended bool
	)
	onEnd := func() {
		mu.Lock()
		ended = true
		cs := live
		mu.Unlock()
		if cs != nil {
			a.logger.Warn("aggregate: the upstream's list-changed stream ended; reconnecting its catalog", "upstream", up.cfg.Name)
			go cs.Close()
		}
	}
	cs, err := a.dialOn(up, client, up.catalogTransport(onEnd))
	if err != nil {
		return nil, err
	}
	mu.Lock()
	live = cs
	gone := ended
	mu.Unlock()
	if gone {
		cs.Close()
		return nil, errors.New("connecting: the upstream's list-changed stream ended at once")
	}
	instructions := ""
	if ir := cs.InitializeResult(); ir != nil {
		instructions = ir.Instructions
	}
	if a.pinned != nil {
		// Pinned (or its change recorded) as soon as it is read, not
		// at the first client's initialize.
		a.pinned(up.cfg.Name, instructions)
	}
	up.mu.Lock()
	up.catalog = cs
	up.instructions, up.instructionsRead = instructions, true
	up.lastErr = ""
	up.notifyLocked()
	up.mu.Unlock()
	return cs, nil
}

// listChanged re-lists one kind of feature of up after the upstream said
// it changed, in the background. A re-listing that is scheduled but has not
// started yet covers every notification until it starts, so a flood of
// notifications runs at most one re-listing and queues one more, instead
// of a goroutine and a listing each. pending is the kind's flag in
// up.relisting.
func (a *Aggregate) listChanged(up *aggUpstream, pending *atomic.Bool, fn func(context.Context, *aggUpstream, *mcp.ClientSession) error) {
	if !pending.CompareAndSwap(false, true) {
		return
	}
	go a.refreshKind(up, pending, fn)
}

// refreshKind re-lists one kind of feature of up on its current catalog,
// clearing pending once it holds the re-listing lock: a notification from
// then on schedules another.
func (a *Aggregate) refreshKind(up *aggUpstream, pending *atomic.Bool, fn func(context.Context, *aggUpstream, *mcp.ClientSession) error) {
	up.refresh.Lock()
	defer up.refresh.Unlock()
	pending.Store(false)
	up.mu.Lock()
	cs := up.catalog
	up.mu.Unlock()
	if cs == nil {
		return
	}
	ctx, cancel := context.WithTimeout(a.ctx, up.timeout)
	defer cancel()
	if err := fn(ctx, up, cs); err != nil {
		a.logger.Warn("aggregate: re-listing upstream failed", "upstream", up.cfg.Name, "error", upstream.SafeError(err))
	}
}

func (a *Aggregate) refreshAll(up *aggUpstream, cs *mcp.ClientSession) error {
	up.refresh.Lock()
	defer up.refresh.Unlock()
	ctx, cancel := context.WithTimeout(a.ctx, up.timeout)
	defer cancel()
	caps := &mcp.ServerCapabilities{}
	if ir := cs.InitializeResult(); ir != nil && ir.Capabilities != nil {
		caps = ir.Capabilities
	}
	if caps.Tools != nil {
		if err := a.refreshTools(ctx, up, cs); err != nil {
			return err
		}
	}
	if caps.Prompts != nil {
		if err := a.refreshPrompts(ctx, up, cs); err != nil {
			return err
		}
	}
	if caps.Resources != nil {
		if err := a.refreshResources(ctx, up, cs); err != nil {
			return err
		}
	}
	return nil
}

// publicName is the name a tool or prompt of up is offered under.
func (a *Aggregate) publicName(up *aggUpstream, name string) string {
	if a.conditional {
		return name
	}
	return a.ns.Name(up.cfg.Name, name)
}

// register runs an SDK registration, which panics on a feature it refuses
// (a tool whose input schema is not an object, an invalid URI template).
func (a *Aggregate) register(up *aggUpstream, what, name string, fn func()) (ok bool) {
	defer func() {
		if r := recover(); r != nil {
			ok = false
			a.logger.Warn("aggregate: upstream feature refused", "upstream", up.cfg.Name, "kind", what, "name", name, "error", fmt.Sprint(r))
		}
	}()
	fn()
	return true
}

// maxListed bounds the items of one kind (tools, prompts, resources,
// resource templates) the aggregate takes from one upstream, over every
// page of its listing. Each page is bounded by max_response, but an
// upstream can page without end, and every item listed is kept and
// offered.
const maxListed = 10000

// listAll gathers the items of a paged listing of up, the first maxListed
// of them; past those (or past maxListed pages) it stops reading pages and
// logs that the rest is left out. On an error it returns what was gathered
// before it. ttl is the smallest ttlMs of the pages read, -1 when up
// speaks a protocol without ttlMs.
func listAll[T any](ctx context.Context, a *Aggregate, up *aggUpstream, cs *mcp.ClientSession, kind string, page func(ctx context.Context, cursor string) ([]T, string, int, error)) (out []T, ttl int, err error) {
	ttl = -1
	modern := false
	if ir := cs.InitializeResult(); ir != nil && ir.ProtocolVersion >= protocolModern {
		modern = true
	}
	cursor := ""
	for pages := 0; ; pages++ {
		if pages == maxListed {
			a.logger.Warn("aggregate: upstream lists more pages than the gateway reads; the rest is left out", "upstream", up.cfg.Name, "kind", kind, "max", maxListed)
			return out, ttl, nil
		}
		items, next, pageTTL, err := page(ctx, cursor)
		if err != nil {
			return out, ttl, err
		}
		if modern && (ttl < 0 || pageTTL < ttl) {
			ttl = max(pageTTL, 0)
		}
		for _, item := range items {
			if len(out) == maxListed {
				a.logger.Warn("aggregate: upstream lists more than the gateway takes; the rest is left out", "upstream", up.cfg.Name, "kind", kind, "max", maxListed)
				return out, ttl, nil
			}
			out = append(out, item)
		}
		if next == "" {
			return out, ttl, nil
		}
		cursor = next
	}
}

func toolPage(cs *mcp.ClientSession) func(context.Context, string) ([]*mcp.Tool, string, int, error) {
	return func(ctx context.Context, cursor string) ([]*mcp.Tool, string, int, error) {
		res, err := cs.ListTools(ctx, &mcp.ListToolsParams{Cursor: cursor})
		if err != nil {
			return nil, "", 0, err
		}
		return res.Tools, res.NextCursor, res.TTLMs, nil
	}
}

func promptPage(cs *mcp.ClientSession) func(context.Context, string) ([]*mcp.Prompt, string, int, error) {
	return func(ctx context.Context, cursor string) ([]*mcp.Prompt, string, int, error) {
		res, err := cs.ListPrompts(ctx, &mcp.ListPromptsParams{Cursor: cursor})
		if err != nil {
			return nil, "", 0, err
		}
		return res.Prompts, res.NextCursor, res.TTLMs, nil
	}
}

func resourcePage(cs *mcp.ClientSession) func(context.Context, string) ([]*mcp.Resource, string, int, error) {
	return func(ctx context.Context, cursor string) ([]*mcp.Resource, string, int, error) {
		res, err := cs.ListResources(ctx, &mcp.ListResourcesParams{Cursor: cursor})
		if err != nil {
			return nil, "", 0, err
		}
		return res.Resources, res.NextCursor, res.TTLMs, nil
	}
}

func templatePage(cs *mcp.ClientSession) func(context.Context, string) ([]*mcp.ResourceTemplate, string, int, error) {
	return func(ctx context.Context, cursor string) ([]*mcp.ResourceTemplate, string, int, error) {
		res, err := cs.ListResourceTemplates(ctx, &mcp.ListResourceTemplatesParams{Cursor: cursor})
		if err != nil {
			return nil, "", 0, err
		}
		return res.ResourceTemplates, res.NextCursor, res.TTLMs, nil
	}
}

func (a *Aggregate) refreshTools(ctx context.Context, up *aggUpstream, cs *mcp.ClientSession) error {
	listed, ttl, err := listAll(ctx, a, up, cs, "tools", toolPage(cs))
	up.setTTL(kindTools, ttl, err)
	if err != nil {
		return fmt.Errorf("listing tools: %w", err)
	}
	a.registerTools(up, listed)
	a.storeCachedTools(ctx, up, listed)
	return nil
}

// registerTools offers listed, up's tools, in place of what up offered.
func (a *Aggregate) registerTools(up *aggUpstream, listed []*mcp.Tool) {
	keep := map[string]bool{}
	var names []string
	for _, t := range listed {
		if t == nil || !up.cfg.AllowsTool(t.Name) {
			continue
		}
		name := a.publicName(up, t.Name)
		a.mu.Lock()
		q, taken := a.tools[name]
		a.mu.Unlock()
		if taken && q.Server != up.cfg.Name {
			continue
		}
		nt := *t
		nt.Name = name
		orig := t.Name
		if a.register(up, "tool", orig, func() { a.server.AddTool(&nt, a.toolHandler(up, orig)) }) {
			a.mu.Lock()
			a.tools[name] = upstream.Qualified{Server: up.cfg.Name, Name: orig}
			a.mu.Unlock()
			keep[name] = true
			names = append(names, name)
		}
	}
	a.mu.Lock()
	for n, owner := range a.withdrawn {
		if owner == up.cfg.Name {
			delete(a.withdrawn, n)
		}
	}
	a.mu.Unlock()
	a.replaceNames(up, &up.tools, a.tools, names, keep, a.server.RemoveTools)
}

func (a *Aggregate) refreshPrompts(ctx context.Context, up *aggUpstream, cs *mcp.ClientSession) error {
	listed, ttl, err := listAll(ctx, a, up, cs, "prompts", promptPage(cs))
	up.setTTL(kindPrompts, ttl, err)
	if err != nil {
		return fmt.Errorf("listing prompts: %w", err)
	}
	keep := map[string]bool{}
	var names []string
	for _, p := range listed {
		if p == nil {
			continue
		}
		name := p.Name
		if !a.conditional {
			name = a.ns.Name(up.cfg.Name, p.Name)
		}
		a.mu.Lock()
		q, taken := a.prompts[name]
		a.mu.Unlock()
		if taken && q.Server != up.cfg.Name {
			continue
		}
		np := *p
		np.Name = name
		orig := p.Name
		if a.register(up, "prompt", orig, func() { a.server.AddPrompt(&np, a.promptHandler(up, orig)) }) {
			a.mu.Lock()
			a.prompts[name] = upstream.Qualified{Server: up.cfg.Name, Name: orig}
			a.mu.Unlock()
			keep[name] = true
			names = append(names, name)
		}
	}
	a.replaceNames(up, &up.prompts, a.prompts, names, keep, a.server.RemovePrompts)
	return nil
}

// replaceNames makes names up's registrations of one kind (its slot), drops
// from table the earlier ones that were not kept, and removes them from the
// server, which tells the clients that the list changed.
func (a *Aggregate) replaceNames(up *aggUpstream, slot *[]string, table map[string]upstream.Qualified, names []string, keep map[string]bool, remove func(...string)) {
	up.mu.Lock()
	old := *slot
	*slot = names
	up.mu.Unlock()
	var gone []string
	a.mu.Lock()
	for _, n := range old {
		if !keep[n] {
			gone = append(gone, n)
			delete(table, n)
		}
	}
	a.mu.Unlock()
	if len(gone) > 0 {
		remove(gone...)
	}
}

func (a *Aggregate) refreshResources(ctx context.Context, up *aggUpstream, cs *mcp.ClientSession) error {
	resources, ttl, err := listAll(ctx, a, up, cs, "resources", resourcePage(cs))
	up.setTTL(kindResources, ttl, err)
	if err != nil {
		return fmt.Errorf("listing resources: %w", err)
	}
	templates, ttl, err := listAll(ctx, a, up, cs, "resource templates", templatePage(cs))
	up.setTTL(kindTemplates, ttl, err)
	if err != nil {
		// Some servers list resources without templates.
		a.logger.Warn("aggregate: listing resource templates failed", "upstream", up.cfg.Name, "error", upstream.SafeError(err))
	}
	name := up.cfg.Name
	keepR := map[string]bool{}
	var uris []string
	for _, r := range resources {
		if r == nil {
			continue
		}
		a.mu.Lock()
		owner, taken := a.resOwner[r.URI]
		a.mu.Unlock()
		if taken && owner != name {
			a.logger.Warn("aggregate: resource listed by two upstreams; the first keeps it", "uri_owner", owner, "upstream", name)
			continue
		}
		nr := *r
		if a.register(up, "resource", "", func() { a.server.AddResource(&nr, a.resourceHandler(up)) }) {
			a.mu.Lock()
			a.resOwner[r.URI] = name
			a.mu.Unlock()
			keepR[r.URI] = true
			uris = append(uris, r.URI)
		}
	}
	keepT := map[string]bool{}
	var tmpls []string
	for _, t := range templates {
		if t == nil {
			continue
		}
		a.mu.Lock()
		owner, taken := a.tmplOwner[t.URITemplate]
		a.mu.Unlock()
		if taken && owner != name {
			continue
		}
		nt := *t
		if a.register(up, "resource template", "", func() { a.server.AddResourceTemplate(&nt, a.resourceHandler(up)) }) {
			a.mu.Lock()
			a.tmplOwner[t.URITemplate] = name
			a.mu.Unlock()
			keepT[t.URITemplate] = true
			tmpls = append(tmpls, t.URITemplate)
		}
	}
	up.mu.Lock()
	oldR, oldT := up.resources, up.templates
	up.resources, up.templates = uris, tmpls
	up.mu.Unlock()
	var goneR, goneT []string
	a.mu.Lock()
	for _, u := range oldR {
		if !keepR[u] {
			goneR = append(goneR, u)
			delete(a.resOwner, u)
		}
	}
	for _, u := range oldT {
		if !keepT[u] {
			goneT = append(goneT, u)
			delete(a.tmplOwner, u)
			delete(a.tmplMatch, u)
		}
	}
	a.mu.Unlock()
	if len(goneR) > 0 {
		a.server.RemoveResources(goneR...)
	}
	if len(goneT) > 0 {
		a.server.RemoveResourceTemplates(goneT...)
	}
	return nil
}

// resubscribe renews, on a new catalog session, the upstream subscriptions
// that downstream sessions hold on up's resources.
func (a *Aggregate) resubscribe(up *aggUpstream, cs *mcp.ClientSession) {
	a.mu.Lock()
	var uris []string
	for uri, set := range a.subs {
		if len(set) > 0 && a.resOwner[uri] == up.cfg.Name {
			uris = append(uris, uri)
		}
	}
	a.mu.Unlock()
	for _, uri := range uris {
		ctx, cancel := context.WithTimeout(a.ctx, up.timeout)
		if err := cs.Subscribe(ctx, &mcp.SubscribeParams{URI: uri}); err != nil {
			a.logger.Warn("aggregate: renewing a resource subscription failed", "upstream", up.cfg.Name, "error", upstream.SafeError(err))
		}
		cancel()
	}
}

// withdraw removes every tool, prompt, resource and template up offers.
func (a *Aggregate) withdraw(up *aggUpstream) {
	up.mu.Lock()
	had := len(up.tools) + len(up.prompts) + len(up.resources) + len(up.templates)
	up.mu.Unlock()
	if had == 0 {
		return
	}
	up.mu.Lock()
	tools := slices.Clone(up.tools)
	up.mu.Unlock()
	a.mu.Lock()
	if a.withdrawn == nil {
		a.withdrawn = map[string]string{}
	}
	for _, n := range tools {
		a.withdrawn[n] = up.cfg.Name
	}
	a.mu.Unlock()
	a.replaceNames(up, &up.tools, a.tools, nil, nil, a.server.RemoveTools)
	a.replaceNames(up, &up.prompts, a.prompts, nil, nil, a.server.RemovePrompts)
	up.mu.Lock()
	res, tmpls := up.resources, up.templates
	up.resources, up.templates = nil, nil
	up.mu.Unlock()
	a.mu.Lock()
	for _, u := range res {
		delete(a.resOwner, u)
	}
	for _, u := range tmpls {
		delete(a.tmplOwner, u)
	}
	a.mu.Unlock()
	if len(res) > 0 {
		a.server.RemoveResources(res...)
	}
	if len(tmpls) > 0 {
		a.server.RemoveResourceTemplates(tmpls...)
	}
	a.logger.Warn("aggregate: upstream withdrawn until it is logged in", "upstream", up.cfg.Name)
}

// waitingForLogin returns the upstream of tool name when that upstream
// waits for an operator's OAuth login, else nil: a tool withdrawn for that
// reason, or one the route never listed because the upstream has not been
// logged in yet (its name resolves to the upstream).
func (a *Aggregate) waitingForLogin(name string) *aggUpstream {
	a.mu.Lock()
	owner, withdrawn := a.withdrawn[name]
	_, listed := a.tools[name]
	a.mu.Unlock()
	if withdrawn {
		return a.byName[owner]
	}
	if listed || a.authRequired == nil {
		return nil
	}
	server, _, ok := a.ns.Resolve(name)
	if a.conditional {
		server, ok = a.ups[0].cfg.Name, true
	}
	if ok && a.authRequired(server) {
		return a.byName[server]
	}
	return nil
}

// Reconnect asks upstream name's catalog to connect now if it is not
// connected, skipping its backoff: after a login, for example.
func (a *Aggregate) Reconnect(name string) {
	if up := a.byName[name]; up != nil {
		select {
		case up.wake <- struct{}{}:
		default:
		}
	}
}

package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// The session-engine run. One caddy serves the sessions endpoint with the
// built-in demo agent; a pool of go-sdk clients (MCP sessions) creates
// cfg.sessions sessions with the prompt "hello <i>", which the demo agent
// echoes in one turn. Each creating client listens for the pushed
// <session-event>s, so a session counts as finished when its "finished"
// event reaches a client, and create→finished runs from just before the
// create call that was admitted to the event's receipt. Between creates,
// each client reads a random finished session to time `read`.
//
// The harness keeps at most max_agents sessions unfinished. A finished
// session's agent still holds its slot until agent_idle_timeout stops it,
// so the engine refuses creates while max_agents agents live; those
// refusals are retried with backoff, within createPatience, and counted.
//
// Memory is caddy's own: RSS from /proc and the live heap after a GC from
// the admin API's pprof, both before the first create and after the last
// session finished and every agent process was stopped. Agent processes
// (children of caddy) are counted and measured from /proc by a sampler.
const (
	sessionCallTimeout = 30 * time.Second
	// createPatience bounds the retries of one create refused because
	// max_agents agents run.
	createPatience = 3 * time.Minute
	// finishPatience bounds the wait for one session's finished event.
	finishPatience = 2 * time.Minute
	// drainPatience bounds the wait, past agent_idle_timeout, for every
	// agent process to stop before memory is measured again.
	drainPatience = 20 * time.Second
	sampleEvery   = 100 * time.Millisecond
)

// sessionsResult is what the session-engine run measured.
type sessionsResult struct {
	n, clients, maxAgents, maxSessions int
	idle                               time.Duration

	created      int
	createErrors int
	firstError   string
	retries      int // creates refused because max_agents agents were busy (none idle to stop for room), and retried

	finished     int // a finished event reached a client
	finishedRead int // no finished event came, but read shows the turn done
	failed       int // an error event came instead
	timedOut     int // nothing within finishPatience, and read shows no finished turn

	delivered     int // finished events received by the client that created the session
	misdirected   int // finished events received by another client
	duplicates    int // more than one finished event for a session
	otherEvents   int // events other than finished, of tracked sessions
	unknownEvents int // events of sessions no create returned

	toFinished []time.Duration
	reads      []time.Duration
	readErrors int

	peakAgents     int // agent processes alive at once, sampled every sampleEvery
	peakZombies    int // ended agent processes not yet reaped, at most
	samples        int
	samplesOverCap int   // samples with more agents alive than max_agents
	agentsSeen     int   // distinct agent processes sampled
	agentRSS       int64 // median over agents of each one's largest sampled RSS

	rssBefore, rssAfter, rssPeak int64
	heapBefore, heapAfter        int64 // caddy's live heap after a GC; 0 when unknown

	wall  time.Duration // first create → last session settled
	total time.Duration // caddy start → caddy stopped
}

// settled is how a tracked session ended, as far as the harness knows.
type settled int

const (
	open settled = iota
	byEvent
	byError
	byTimeout
)

type trackedSession struct {
	client int
	start  time.Time
	state  settled
	events int
	timer  *time.Timer
}

// arrival is a <session-event> as a client received it.
type arrival struct {
	client       int
	at           time.Time
	status, kind string
}

type sessionClient struct {
	idx int
	cs  *mcp.ClientSession
}

// sessionsRun is the state the workers and the clients' event handlers
// share. res is guarded by mu.
type sessionsRun struct {
	cfg   config
	cwd   string
	slots chan struct{} // one per unfinished session
	next  atomic.Int64  // the next session index to create

	pending     sync.WaitGroup // created sessions not yet settled
	mu          sync.Mutex
	tracked     map[string]*trackedSession
	early       map[string][]arrival // events that came before their create returned
	finishedIDs []string
	firstCreate time.Time
	lastSettle  time.Time
	res         *sessionsResult
}

func runSessions(ctx context.Context, cfg config, work, caddyBin string) (*sessionsResult, error) {
	began := time.Now()
	dir := filepath.Join(work, "sessions")
	cwd := filepath.Join(work, "sessions-cwd")
	for _, d := range []string{dir, cwd} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, err
		}
	}
	res := &sessionsResult{n: cfg.sessions, clients: cfg.sessionClients, maxAgents: cfg.maxAgents,
		maxSessions: cfg.sessions + 100, idle: cfg.agentIdle}
	fmt.Fprintf(os.Stderr, "bench: session engine, %d demo-agent sessions from %d clients, max_agents %d…\n",
		cfg.sessions, cfg.sessionClients, cfg.maxAgents)
	gw, err := startSessionsGateway(ctx, caddyBin, dir, res.maxSessions, cfg.maxAgents, cfg.agentIdle, "")
	if err != nil {
		return nil, err
	}
	sampler := newAgentSampler(gw.pid(), cfg.maxAgents)
	err = measureSessions(ctx, cfg, gw, sampler, cwd, res)
	sampler.stop()
	gw.stop()
	// Agents run in process groups of their own: should caddy have been
	// killed rather than stopped, end the ones it left.
	for _, pid := range sampler.pids() {
		if runs(pid, caddyBin) {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	res.total = time.Since(began)
	if err != nil {
		return nil, fmt.Errorf("session engine: %w\n%s", err, tail(gw.p.logs.String(), 20))
	}
	return res, nil
}

func measureSessions(ctx context.Context, cfg config, gw *sessionsGateway, sampler *agentSampler, cwd string, res *sessionsResult) error {
	r := &sessionsRun{
		cfg:     cfg,
		cwd:     cwd,
		slots:   make(chan struct{}, cfg.maxAgents),
		tracked: map[string]*trackedSession{},
		early:   map[string][]arrival{},
		res:     res,
	}
	base := &http.Transport{MaxIdleConnsPerHost: 4 * cfg.sessionClients}
	defer base.CloseIdleConnections()
	hc := &http.Client{Transport: roundTripFunc(func(req *http.Request) (*http.Response, error) {
		req = req.Clone(req.Context())
		req.Header.Set("Authorization", "Bearer "+gw.token)
		return base.RoundTrip(req)
	})}
	clients := make([]*sessionClient, cfg.sessionClients)
	for i := range clients {
		c, err := r.connect(ctx, hc, gw.url, i)
		if err != nil {
			return fmt.Errorf("client %d: connect: %w", i, err)
		}
		defer c.cs.Close()
		clients[i] = c
	}

	sampler.start()
	res.rssBefore, _ = rss(gw.pid())
	res.heapBefore = liveHeap(ctx, gw.admin)

	var wg sync.WaitGroup
	for _, c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.work(ctx, c)
		}()
	}
	wg.Wait()
	settledAll := make(chan struct{})
	go func() { r.pending.Wait(); close(settledAll) }()
	select {
	case <-settledAll:
	case <-ctx.Done():
		return fmt.Errorf("waiting for the sessions to finish: %w", ctx.Err())
	}
	r.mu.Lock()
	res.wall = r.lastSettle.Sub(r.firstCreate)
	r.mu.Unlock()

	// As many reads as sessions: those not made between creates (before
	// any session had finished) are made now, against an idle engine.
	var reads atomic.Int64
	reads.Store(int64(len(res.reads)))
	for _, c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for reads.Add(1) <= int64(res.created) && ctx.Err() == nil {
				r.read(ctx, c)
			}
		}()
	}
	wg.Wait()
	r.reconcile(ctx, clients)

	// Memory after: once every agent stopped, what caddy keeps is the
	// sessions' state, not the agents' pipes and goroutines.
	deadline := time.Now().Add(cfg.agentIdle + drainPatience)
	for sampler.alive() > 0 && time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(sampleEvery)
	}
	res.rssAfter, _ = rss(gw.pid())
	res.heapAfter = liveHeap(ctx, gw.admin)
	sampler.figures(res)
	if res.created == 0 {
		return fmt.Errorf("no session was created: %s", res.firstError)
	}
	return ctx.Err()
}

func (r *sessionsRun) connect(ctx context.Context, hc *http.Client, url string, idx int) (*sessionClient, error) {
	client := mcp.NewClient(&mcp.Implementation{Name: "zidane-bench-sessions", Version: "1"}, &mcp.ClientOptions{
		//lint:ignore SA1019 the endpoint pushes <session-event>s as notifications/message (see mcpendpoint/doc.go).
		LoggingMessageHandler: func(_ context.Context, req *mcp.LoggingMessageRequest) {
			if req.Params.Logger == "session-event" {
				r.arrive(idx, time.Now(), req.Params.Data)
			}
		},
	})
	cctx, cancel := context.WithTimeout(ctx, sessionCallTimeout)
	defer cancel()
	// 2025-11-25: the version whose clients get the events pushed.
	cs, err := client.Connect(cctx, &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: hc},
		&mcp.ClientSessionOptions{ProtocolVersion: benchProtocolVersion})
	if err != nil {
		return nil, err
	}
	return &sessionClient{idx: idx, cs: cs}, nil
}

// work creates sessions until all cfg.sessions are taken, reading a
// finished one after each.
func (r *sessionsRun) work(ctx context.Context, c *sessionClient) {
	for ctx.Err() == nil {
		i := int(r.next.Add(1)) - 1
		if i >= r.cfg.sessions {
			return
		}
		select {
		case r.slots <- struct{}{}:
		case <-ctx.Done():
			return
		}
		r.create(ctx, c, i)
		r.read(ctx, c)
	}
}

// create creates session i, retrying while max_agents agents run. It
// releases the slot itself unless the session is created.
func (r *sessionsRun) create(ctx context.Context, c *sessionClient, i int) {
	args := map[string]any{"verb": "create", "cwd": r.cwd, "prompt": fmt.Sprintf("hello %d", i)}
	deadline := time.Now().Add(createPatience)
	backoff := 20 * time.Millisecond
	for {
		start := time.Now()
		r.mu.Lock()
		if r.firstCreate.IsZero() {
			r.firstCreate = start
		}
		r.mu.Unlock()
		cctx, cancel := context.WithTimeout(ctx, sessionCallTimeout)
		res, err := c.cs.CallTool(cctx, &mcp.CallToolParams{Name: "sessions", Arguments: args})
		cancel()
		if err == nil && res.IsError && errorCodeOf(res) == "busy" && time.Now().Before(deadline) {
			r.mu.Lock()
			r.res.retries++
			r.mu.Unlock()
			select {
			case <-time.After(backoff/2 + rand.N(backoff/2)):
			case <-ctx.Done():
				r.createFailed(ctx.Err())
				return
			}
			backoff = min(2*backoff, 500*time.Millisecond)
			continue
		}
		var created struct {
			SessionID string `json:"sessionId"`
		}
		switch {
		case err != nil:
		case res.IsError:
			err = fmt.Errorf("create refused: %s", toolText(res))
		default:
			raw, _ := json.Marshal(res.StructuredContent)
			_ = json.Unmarshal(raw, &created)
			if created.SessionID == "" {
				err = fmt.Errorf("create answered no sessionId: %s", toolText(res))
			}
		}
		if err != nil {
			r.createFailed(err)
			return
		}
		r.track(created.SessionID, c.idx, start)
		return
	}
}

func (r *sessionsRun) createFailed(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.res.createErrors++
	if r.res.firstError == "" {
		r.res.firstError = err.Error()
	}
	<-r.slots
}

func (r *sessionsRun) track(id string, client int, start time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.res.created++
	s := &trackedSession{client: client, start: start}
	r.tracked[id] = s
	r.pending.Add(1)
	s.timer = time.AfterFunc(finishPatience, func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		if s.state == open {
			s.state = byTimeout
			r.res.timedOut++
			r.settleLocked(s)
		}
	})
	for _, a := range r.early[id] {
		r.applyLocked(id, s, a)
	}
	delete(r.early, id)
}

// arrive is a client's LoggingMessageHandler for session events.
func (r *sessionsRun) arrive(client int, at time.Time, data any) {
	var ev struct {
		SessionID string `json:"sessionId"`
		Status    string `json:"status"`
		Kind      string `json:"kind"`
	}
	raw, _ := json.Marshal(data)
	json.Unmarshal(raw, &ev)
	a := arrival{client: client, at: at, status: ev.Status, kind: ev.Kind}
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.tracked[ev.SessionID]
	if s == nil {
		r.early[ev.SessionID] = append(r.early[ev.SessionID], a)
		return
	}
	r.applyLocked(ev.SessionID, s, a)
}

func (r *sessionsRun) applyLocked(id string, s *trackedSession, a arrival) {
	if a.status != "done" || a.kind != "finished" {
		r.res.otherEvents++
		if a.status == "error" && s.state == open {
			s.state = byError
			r.res.failed++
			r.settleLocked(s)
		}
		return
	}
	if s.events++; s.events > 1 {
		r.res.duplicates++
		return
	}
	if a.client == s.client {
		r.res.delivered++
	} else {
		r.res.misdirected++
	}
	switch s.state {
	case byTimeout: // late, but it came
		r.res.timedOut--
	case byError:
		return
	}
	s.state = byEvent
	r.res.finished++
	r.res.toFinished = append(r.res.toFinished, a.at.Sub(s.start))
	r.finishedIDs = append(r.finishedIDs, id)
	r.settleLocked(s)
}

// settleLocked releases a session's slot, once.
func (r *sessionsRun) settleLocked(s *trackedSession) {
	if s.timer == nil {
		return
	}
	s.timer.Stop()
	s.timer = nil
	r.lastSettle = time.Now()
	<-r.slots
	r.pending.Done()
}

// read reads a random finished session, timed.
func (r *sessionsRun) read(ctx context.Context, c *sessionClient) {
	r.mu.Lock()
	if len(r.finishedIDs) == 0 {
		r.mu.Unlock()
		return
	}
	id := r.finishedIDs[rand.IntN(len(r.finishedIDs))]
	r.mu.Unlock()
	cctx, cancel := context.WithTimeout(ctx, sessionCallTimeout)
	defer cancel()
	t0 := time.Now()
	res, err := c.cs.CallTool(cctx, &mcp.CallToolParams{Name: "sessions", Arguments: map[string]any{"verb": "read", "sessionId": id}})
	d := time.Since(t0)
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil || res.IsError {
		r.res.readErrors++
		return
	}
	r.res.reads = append(r.res.reads, d)
}

// reconcile reads the sessions whose finished event never came, to tell a
// lost event from a session that did not finish.
func (r *sessionsRun) reconcile(ctx context.Context, clients []*sessionClient) {
	r.mu.Lock()
	var missing []string
	for id, s := range r.tracked {
		if s.state == byTimeout {
			missing = append(missing, id)
		}
	}
	for _, as := range r.early {
		r.res.unknownEvents += len(as)
	}
	r.mu.Unlock()
	for _, id := range missing {
		cctx, cancel := context.WithTimeout(ctx, sessionCallTimeout)
		res, err := clients[0].cs.CallTool(cctx, &mcp.CallToolParams{Name: "sessions", Arguments: map[string]any{"verb": "read", "sessionId": id}})
		cancel()
		var v struct {
			State string `json:"state"`
			Turns int    `json:"turns"`
		}
		if err == nil && !res.IsError {
			raw, _ := json.Marshal(res.StructuredContent)
			json.Unmarshal(raw, &v)
		}
		if v.State == "idle" && v.Turns >= 1 {
			r.mu.Lock()
			r.res.timedOut--
			r.res.finishedRead++
			r.mu.Unlock()
		}
	}
}

func toolText(res *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

// liveHeap is caddy's heap in use after a forced GC, from the admin API's
// heap profile; 0 when it cannot be had.
func liveHeap(ctx context.Context, admin string) int64 {
	cctx, cancel := context.WithTimeout(ctx, sessionCallTimeout)
	defer cancel()
	resp, err := adminGet(cctx, admin, "/debug/pprof/heap?debug=1&gc=1")
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "# HeapAlloc = "); ok {
			n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return n
		}
	}
	return 0
}

// agentSampler watches caddy's child processes, the agents, from /proc.
type agentSampler struct {
	parent    int
	maxAgents int
	quit      chan struct{}
	done      chan struct{}
	once      sync.Once

	mu         sync.Mutex
	started    bool
	now        int // live agents at the last sample
	peak       int // live agents at once, at most
	peakZombie int // ended agents not yet reaped, at most
	samples    int
	overCap    int           // samples with more live agents than maxAgents
	rss        map[int]int64 // each agent's largest sampled RSS
	caddyRSS   int64
}

func newAgentSampler(parent, maxAgents int) *agentSampler {
	return &agentSampler{parent: parent, maxAgents: maxAgents, quit: make(chan struct{}), done: make(chan struct{}), rss: map[int]int64{}}
}

func (s *agentSampler) start() {
	s.mu.Lock()
	s.started = true
	s.mu.Unlock()
	go s.run()
}

func (s *agentSampler) run() {
	defer close(s.done)
	t := time.NewTicker(sampleEvery)
	defer t.Stop()
	for {
		s.sample()
		select {
		case <-s.quit:
			return
		case <-t.C:
		}
	}
}

func (s *agentSampler) sample() {
	kids := children(s.parent)
	sizes := make(map[int]int64, len(kids))
	live, zombies := 0, 0
	for pid, state := range kids {
		if state == 'Z' {
			zombies++
			continue
		}
		live++
		if n, err := rss(pid); err == nil {
			sizes[pid] = n
		}
	}
	own, _ := rss(s.parent)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.now = live
	s.samples++
	if live > s.maxAgents {
		s.overCap++
	}
	s.peak = max(s.peak, live)
	s.peakZombie = max(s.peakZombie, zombies)
	for pid, n := range sizes {
		s.rss[pid] = max(s.rss[pid], n)
	}
	s.caddyRSS = max(s.caddyRSS, own)
}

func (s *agentSampler) stop() {
	s.once.Do(func() { close(s.quit) })
	s.mu.Lock()
	started := s.started
	s.mu.Unlock()
	if started {
		<-s.done
	}
}

// alive is the number of agents at the last sample.
func (s *agentSampler) alive() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.now
}

func (s *agentSampler) pids() []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	var pids []int
	for pid := range s.rss {
		pids = append(pids, pid)
	}
	return pids
}

// figures are what the sampler saw (see sessionsResult).
func (s *agentSampler) figures(r *sessionsResult) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var sizes []int64
	for _, n := range s.rss {
		sizes = append(sizes, n)
	}
	slices.Sort(sizes)
	if len(sizes) > 0 {
		r.agentRSS = sizes[len(sizes)/2]
	}
	r.peakAgents, r.peakZombies, r.agentsSeen, r.rssPeak = s.peak, s.peakZombie, len(s.rss), s.caddyRSS
	r.samples, r.samplesOverCap = s.samples, s.overCap
}

func printSessions(out io.Writer, r *sessionsResult) {
	fmt.Fprintf(out, "session engine: %d demo-agent sessions (prompt \"hello <i>\") from %d MCP clients; max_agents %d, max_sessions %d, agent_idle_timeout %s\n\n",
		r.n, r.clients, r.maxAgents, r.maxSessions, r.idle)
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	row := func(label, format string, args ...any) {
		fmt.Fprintf(tw, "%s\t%s\n", label, fmt.Sprintf(format, args...))
	}
	errs := ""
	if r.createErrors > 0 {
		errs = fmt.Sprintf("; first: %s", r.firstError)
	}
	row("sessions created", "%d of %d (%d create errors%s)", r.created, r.n, r.createErrors, errs)
	row("finished: event / read only / failed / not finished", "%d / %d / %d / %d", r.finished, r.finishedRead, r.failed, r.timedOut)
	p50, p99 := percentiles(r.toFinished)
	row("create→finished p50, p99", "%s, %s (%d sessions)", p50, p99, len(r.toFinished))
	p50, p99 = percentiles(r.reads)
	row("read p50, p99", "%s, %s (%d reads, %d errors)", p50, p99, len(r.reads), r.readErrors)
	row("finished events delivered / expected", "%d / %d (%d to another client, %d duplicates, %d other events, %d of unknown sessions)",
		r.delivered, r.created, r.misdirected, r.duplicates, r.otherEvents, r.unknownEvents)
	row("create retries (max_agents refusals, all agents busy)", "%d", r.retries)
	row("agent processes at peak", "%d alive, %d zombies (sampled every %s; over max_agents in %d of %d samples; %d distinct seen)",
		r.peakAgents, r.peakZombies, sampleEvery, r.samplesOverCap, r.samples, r.agentsSeen)
	row("one demo agent's RSS", "%s (median of %d agents' largest sample)", mib(r.agentRSS), r.agentsSeen)
	row("caddy RSS before → after", "%s → %s (peak %s)", mib(r.rssBefore), mib(r.rssAfter), mib(r.rssPeak))
	if r.created > 0 {
		row("gateway memory per session (RSS)", "%s", kib((r.rssAfter-r.rssBefore)/int64(r.created)))
		if r.heapBefore > 0 && r.heapAfter > 0 {
			row("caddy live heap before → after (after GC)", "%s → %s, %s per session", mib(r.heapBefore), mib(r.heapAfter),
				kib((r.heapAfter-r.heapBefore)/int64(r.created)))
		}
	}
	rate := 0.0
	if r.wall > 0 {
		rate = float64(r.finished+r.finishedRead) / r.wall.Seconds()
	}
	row("wall time, first create → last finished", "%s (%.1f sessions/s)", r.wall.Round(10*time.Millisecond), rate)
	row("wall time, whole section", "%s (caddy start to stop)", r.total.Round(10*time.Millisecond))
	tw.Flush()
}

// percentiles are the median and the 99th percentile of ds, or "-".
func percentiles(ds []time.Duration) (string, string) {
	if len(ds) == 0 {
		return "-", "-"
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return round(s[len(s)/2]), round(s[min(len(s)-1, len(s)*99/100)])
}

func mib(b int64) string { return fmt.Sprintf("%.1fMiB", float64(b)/(1<<20)) }
func kib(b int64) string { return fmt.Sprintf("%.1fKiB", float64(b)/(1<<10)) }

// tail is the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// errorCodeOf is the stable error code of a tool error ("busy" when the
// gateway runs max_agents agents).
func errorCodeOf(res *mcp.CallToolResult) string {
	m, _ := res.StructuredContent.(map[string]any)
	code, _ := m["error"].(string)
	return code
}

// adminGet sends GET path to caddy's admin API at admin.
func adminGet(ctx context.Context, admin, path string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+admin+path, nil)
	if err != nil {
		return nil, err
	}
	return http.DefaultClient.Do(req)
}

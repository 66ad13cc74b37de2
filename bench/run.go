package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// benchProtocolVersion is the MCP version the load's clients speak, but on
// the rows of modernProtocolVersion.
const benchProtocolVersion = "2025-11-25"

// modernProtocolVersion is the stateless MCP version: its rows run in
// front of the stateless upstream, with clients pinned at it.
const modernProtocolVersion = "2026-07-28"

// route is one way to reach the upstream.
type route struct {
	name   string
	url    string
	token  string
	pid    int    // the gateway process whose CPU and RSS are measured (caddy's, a peer's); 0: none
	admin  string // the gateway's admin API (caddy's), whose Go memory statistics give its allocations per call; "": none
	prefix string // put before the tool's name: the aggregated route's namespace
	// version is the protocol version its clients ask for; "" is
	// benchProtocolVersion. Its ratios are to the reverse_proxy row of the
	// same version, unless base names another row.
	version string
	base    string // the row its ratios are to, when not reverse_proxy's (the NATS rows: the single-node guard's)
	// noDirect says no direct row stands for its upstream: "vs direct"
	// is left out (the OAuth rows, whose upstream is another server).
	noDirect bool
	// tool, when set, is the tool called instead of the run's -tool, and
	// want the text its every answer must be (the OAuth rows: whoami,
	// which says whose token reached the upstream).
	tool, want string
}

// baseline is the name of the row a route's ratios are to: base, or the
// reverse_proxy row of its version.
func (r route) baseline() string {
	if r.base != "" {
		return r.base
	}
	if r.version == "" {
		return "reverse_proxy"
	}
	return "reverse_proxy " + r.version
}

// sample is one route at one concurrency in one round.
type sample struct {
	version string // the protocol version the sessions negotiated
	calls   int
	elapsed time.Duration
	lat     []time.Duration
	cpu     time.Duration
	rss     int64
	// The gateway's heap allocations over the run, as its Go runtime
	// counts them (objects and bytes); zero when not measured.
	mallocs, allocBytes uint64
}

// result is the figures for one route at one concurrency over all rounds.
type result struct {
	route       string
	baseline    string // the row its ratios are to
	asked       string // the protocol version its clients asked for: route.version
	noDirect    bool   // route.noDirect: no "vs direct"
	version     string // the protocol version negotiated (the rounds' versions, if they differ)
	concurrency int
	callsPerSec float64
	p50, p99    time.Duration
	cpuPerCall  time.Duration // 0 when no gateway process is measured
	rss         int64
	// The gateway's heap allocations per call, objects and bytes; 0 when
	// not measured.
	allocsPerCall, bytesPerCall float64

	// Each run's throughput and p50, in order.
	roundRates []float64
	roundP50s  []time.Duration
	// The route's runs beside its baseline and the baseline's beside
	// them, round by round, for the ratios: the two run back to back, so
	// a ratio taken within the pair leaves out the load that drifts on
	// shared cores. And the CPU per call of each over those runs;
	// nil for a route without a baseline. (A route that is also another's
	// baseline runs more often than its pairs: its row pools all.)
	pairRates      []float64
	pairP50s       []time.Duration
	pairCPUPerCall time.Duration
	baseRates      []float64
	baseP50s       []time.Duration
	baseCPUPerCall time.Duration
	// The allocations per call of the route and of its baseline over
	// those runs.
	pairAllocsPerCall, baseAllocsPerCall float64
}

// report is what a run measured, for tests; run prints it.
type report struct {
	calls    []result
	sessions *sessionsResult
	idle     *idleResult
}

func run(ctx context.Context, cfg config, out io.Writer) (*report, error) {
	root, err := moduleRoot(ctx)
	if err != nil {
		return nil, err
	}
	work, err := os.MkdirTemp("", "zidane-bench-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(work)

	fmt.Fprintln(os.Stderr, "bench: building caddy…")
	caddyBin, err := build(ctx, root, work, "caddy", "./cmd/caddy")
	if err != nil {
		return nil, err
	}
	var upstreamBin string
	if cfg.callsOn() || cfg.idleOn() {
		fmt.Fprintln(os.Stderr, "bench: building the upstream…")
		if upstreamBin, err = build(ctx, root, work, "upstream", "./bench/upstream"); err != nil {
			return nil, err
		}
	}
	rep := &report{}
	if cfg.callsOn() {
		if rep.calls, err = runCalls(ctx, cfg, work, caddyBin, upstreamBin); err != nil {
			return nil, err
		}
	}
	if cfg.sessionsOn() {
		if rep.sessions, err = runSessions(ctx, cfg, work, caddyBin); err != nil {
			return nil, err
		}
	}
	if cfg.idleOn() {
		if rep.idle, err = runIdle(ctx, cfg, work, caddyBin, upstreamBin); err != nil {
			return nil, err
		}
	}
	sep := func() {}
	next := func() { sep = func() { fmt.Fprintln(out) } }
	if rep.calls != nil {
		printTable(out, cfg, rep.calls)
		next()
	}
	if rep.sessions != nil {
		sep()
		printSessions(out, rep.sessions)
		next()
	}
	if rep.idle != nil {
		sep()
		printIdle(out, rep.idle)
	}
	return rep, nil
}

// runCalls is the tools/call section: every route at every concurrency, in
// interleaved rounds. Its caddy and upstream are stopped when it returns.
func runCalls(ctx context.Context, cfg config, work, caddyBin, upstreamBin string) ([]result, error) {
	up, upAddr, err := startUpstream(ctx, upstreamBin)
	if err != nil {
		return nil, err
	}
	defer up.stop()

	// A second upstream, for the aggregated route over two.
	up2, up2Addr, err := startUpstream(ctx, upstreamBin)
	if err != nil {
		return nil, err
	}
	defer up2.stop()

	// Two stateless upstreams (the same program), for the 2026-07-28 rows:
	// the stateful one speaks 2025-11-25 only.
	mup, mupAddr, err := startUpstream(ctx, upstreamBin, "-stateless")
	if err != nil {
		return nil, err
	}
	defer mup.stop()
	mup2, mup2Addr, err := startUpstream(ctx, upstreamBin, "-stateless")
	if err != nil {
		return nil, err
	}
	defer mup2.stop()

	gw, err := startGateway(ctx, caddyBin, work, upAddr, up2Addr, mupAddr, mup2Addr, "", cfg.rules)
	if err != nil {
		return nil, err
	}
	defer gw.stop()

	var clusterRoutes []route
	if cfg.cluster {
		root, err := moduleRoot(ctx)
		if err != nil {
			return nil, err
		}
		fmt.Fprintln(os.Stderr, "bench: building nats-server, starting a caddy on NATS storage…")
		cg, err := startClusterGateway(ctx, root, work, caddyBin, upAddr, mupAddr)
		if err != nil {
			return nil, err
		}
		defer cg.stop()
		clusterRoutes = cg.routes
	}
	// The direct rows have no baseline: they are what "vs direct" is to.
	routes := append([]route{{name: "direct", url: "http://" + upAddr + "/mcp", base: "direct"},
		{name: "direct " + modernProtocolVersion, url: "http://" + mupAddr + "/mcp", version: modernProtocolVersion, base: "direct " + modernProtocolVersion}}, gw.routes...)
	if cfg.peerMCPGo {
		peer, r, err := startMCPGoPeer(ctx, work, upAddr, up2Addr)
		if err != nil {
			return nil, err
		}
		defer peer.stop()
		routes = append(routes, r)
	}
	routes = append(routes, clusterRoutes...)
	if cfg.selects(sharedRoute, perUserRoute) {
		fmt.Fprintln(os.Stderr, "bench: starting a caddy with an OAuth upstream, shared and per_user…")
		pg, err := startPerUserGateway(ctx, work, caddyBin)
		if err != nil {
			return nil, err
		}
		defer pg.stop()
		routes = append(routes, pg.routes...)
	}
	for i, p := range cfg.peers {
		routes = append(routes, route{name: fmt.Sprintf("peer%d", i+1), url: p})
	}
	if routes, err = selectRoutes(routes, cfg.routes, cfg.versions); err != nil {
		return nil, err
	}

	cs, err := driveRounds(ctx, cfg, routes)
	if err != nil {
		return nil, err
	}

	if cfg.cpuProfile != "" {
		if err := profileCaddy(ctx, cfg, gw, routes); err != nil {
			return nil, err
		}
	}

	return callResults(cfg, routes, cs), nil
}

// callSamples are the samples of the calls table: each route's runs, all
// of them; its runs in its pairs; and the baseline's run beside each of
// those.
type callSamples struct {
	samples, self, paired map[string]map[int][]sample
}

// driveRounds drives every route at every concurrency, cfg.rounds times.
// Each route runs right beside its baseline, in turn before and after it,
// so that the pair sees the same machine: its ratios come from that pair
// alone. A baseline's own row pools all its runs.
func driveRounds(ctx context.Context, cfg config, routes []route) (callSamples, error) {
	samples := map[string]map[int][]sample{} // a route's runs, all of them
	self := map[string]map[int][]sample{}    // a route's runs in its pairs
	paired := map[string]map[int][]sample{}  // the baseline's run beside each of those
	add := func(m map[string]map[int][]sample, name string, conc int, s sample) {
		if m[name] == nil {
			m[name] = map[int][]sample{}
		}
		m[name][conc] = append(m[name][conc], s)
	}
	units := pairUnits(routes)
	for round := 0; round < cfg.rounds; round++ {
		for _, conc := range cfg.concurrency {
			// Rotate the order each round so no route always goes first.
			order := slices.Clone(units)
			for i := 0; i < round%len(order); i++ {
				order = append(order[1:], order[0])
			}
			for _, u := range order {
				run := u
				if len(u) == 2 && round%2 == 1 {
					run = []route{u[1], u[0]}
				}
				got := map[string]sample{}
				if cfg.interleave && conc == 1 && len(run) == 2 {
					fmt.Fprintf(os.Stderr, "bench: round %d/%d, 1 session each, %s and %s call by call\n", round+1, cfg.rounds, run[0].name, run[1].name)
					s0, s1, err := driveInterleaved(ctx, run[0], run[1], cfg.callsPer(conc), cfg.tool)
					if err != nil {
						return callSamples{}, fmt.Errorf("at 1 session, interleaved: %w", err)
					}
					got[run[0].name], got[run[1].name] = s0, s1
					add(samples, run[0].name, conc, s0)
					add(samples, run[1].name, conc, s1)
					add(self, u[1].name, conc, got[u[1].name])
					add(paired, u[1].name, conc, got[u[0].name])
					continue
				}
				for _, r := range run {
					fmt.Fprintf(os.Stderr, "bench: round %d/%d, %d sessions, %s\n", round+1, cfg.rounds, conc, r.name)
					s, err := drive(ctx, r, conc, cfg.callsPer(conc), cfg.tool)
					if err != nil {
						return callSamples{}, fmt.Errorf("%s at %d sessions: %w", r.name, conc, err)
					}
					got[r.name] = s
					add(samples, r.name, conc, s)
				}
				if len(u) == 2 {
					add(self, u[1].name, conc, got[u[1].name])
					add(paired, u[1].name, conc, got[u[0].name])
				}
			}
		}
	}
	return callSamples{samples, self, paired}, nil
}

// callResults summarizes the samples of each route at each concurrency,
// with its ratios to its baseline from their pairs.
func callResults(cfg config, routes []route, cs callSamples) []result {
	samples, self, paired := cs.samples, cs.self, cs.paired
	var results []result
	for _, r := range routes {
		for _, conc := range cfg.concurrency {
			res := summarize(r.name, conc, samples[r.name][conc], r.pid != 0)
			if ps := paired[r.name][conc]; len(ps) > 0 {
				mine := summarize(r.name, conc, self[r.name][conc], r.pid != 0)
				base := summarize(r.baseline(), conc, ps, r.pid != 0)
				res.pairRates, res.pairP50s, res.pairCPUPerCall = mine.roundRates, mine.roundP50s, mine.cpuPerCall
				res.baseRates, res.baseP50s, res.baseCPUPerCall = base.roundRates, base.roundP50s, base.cpuPerCall
				res.pairAllocsPerCall, res.baseAllocsPerCall = mine.allocsPerCall, base.allocsPerCall
			}
			res.baseline, res.asked, res.noDirect = r.baseline(), r.version, r.noDirect
			results = append(results, res)
		}
	}
	return results
}

// selects reports whether -routes and -versions keep one of the routes
// named, which speak benchProtocolVersion: their set-up is skipped when
// not.
func (c config) selects(names ...string) bool {
	if len(c.versions) > 0 && !slices.Contains(c.versions, benchProtocolVersion) {
		return false
	}
	return len(c.routes) == 0 || slices.ContainsFunc(names, func(n string) bool {
		return slices.ContainsFunc(c.routes, func(p string) bool { return strings.HasPrefix(n, p) })
	})
}

// selectRoutes keeps the routes whose names start with one of prefixes and
// whose clients speak one of versions (every route when either is empty),
// with the baselines their ratios are to, in their order.
func selectRoutes(routes []route, prefixes, versions []string) ([]route, error) {
	if len(prefixes) == 0 && len(versions) == 0 {
		return routes, nil
	}
	byName := map[string]route{}
	for _, r := range routes {
		byName[r.name] = r
	}
	keep := map[string]bool{}
	var add func(r route)
	add = func(r route) {
		if keep[r.name] {
			return
		}
		keep[r.name] = true
		if b, ok := byName[r.baseline()]; ok && b.name != r.name {
			add(b)
		}
	}
	for _, r := range routes {
		nameOK := len(prefixes) == 0 || slices.ContainsFunc(prefixes, func(p string) bool { return strings.HasPrefix(r.name, p) })
		versionOK := len(versions) == 0 || slices.Contains(versions, cmp.Or(r.version, benchProtocolVersion))
		if nameOK && versionOK {
			add(r)
		}
	}
	var kept []route
	for _, r := range routes {
		if keep[r.name] {
			kept = append(kept, r)
		}
	}
	if len(kept) == 0 {
		names := make([]string, len(routes))
		for i, r := range routes {
			names[i] = fmt.Sprintf("%q (%s)", r.name, cmp.Or(r.version, benchProtocolVersion))
		}
		return nil, fmt.Errorf("-routes %q -versions %q select no route; the routes are %s",
			strings.Join(prefixes, ","), strings.Join(versions, ","), strings.Join(names, ", "))
	}
	return kept, nil
}

// connect opens conc initialized MCP sessions on r, and says which
// protocol version they negotiated. Call close when done with them.
func connect(ctx context.Context, r route, conc int) (sessions []*mcp.ClientSession, negotiated string, close func(), err error) {
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: conc * 2}}
	if r.token != "" {
		base := hc.Transport
		hc.Transport = roundTripFunc(func(req *http.Request) (*http.Response, error) {
			req = req.Clone(req.Context())
			req.Header.Set("Authorization", "Bearer "+r.token)
			return base.RoundTrip(req)
		})
	}
	close = func() {
		for _, cs := range sessions {
			cs.Close()
		}
		hc.CloseIdleConnections()
	}
	version := cmp.Or(r.version, benchProtocolVersion)
	for range conc {
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		client := mcp.NewClient(&mcp.Implementation{Name: "zidane-bench", Version: "1"}, nil)
		// The stateful routes speak 2025-11-25, the newest they serve:
		// left to choose, go-sdk's client would speak the stateless
		// 2026-07-28 protocol to a peer that offers it, whose per-request
		// _meta a proxy that re-sends it passes to the stateful upstream.
		// The 2026-07-28 rows ask for it; a route that does not serve it
		// falls back, and its row says so.
		cs, err := client.Connect(cctx, &mcp.StreamableClientTransport{Endpoint: r.url, HTTPClient: hc, MaxRetries: -1, DisableStandaloneSSE: true},
			&mcp.ClientSessionOptions{ProtocolVersion: version})
		cancel()
		if err != nil {
			close()
			return nil, "", nil, fmt.Errorf("connect: %w", err)
		}
		sessions = append(sessions, cs)
		if v := cs.InitializeResult().ProtocolVersion; negotiated == "" {
			negotiated = v
		} else if v != negotiated {
			negotiated = "mixed"
		}
	}
	return sessions, negotiated, close, nil
}

// callArgs are the arguments of the bench's call of tool.
func callArgs(tool string) map[string]any {
	args := map[string]any{}
	if tool == "echo" {
		args["message"] = "hello"
	}
	return args
}

// call makes one timed tools/call of tool on cs.
func call(ctx context.Context, cs *mcp.ClientSession, r route, tool string, args map[string]any) (time.Duration, error) {
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	t0 := time.Now()
	res, err := cs.CallTool(cctx, &mcp.CallToolParams{Name: r.prefix + tool, Arguments: args})
	took := time.Since(t0)
	if err == nil && res.IsError {
		err = fmt.Errorf("tool error: %v", res.Content)
	}
	if err == nil && r.want != "" {
		if len(res.Content) != 1 {
			err = fmt.Errorf("%d contents, want the text %q", len(res.Content), r.want)
		} else if tc, ok := res.Content[0].(*mcp.TextContent); !ok || tc.Text != r.want {
			err = fmt.Errorf("the tool answered %+v, want %q", res.Content[0], r.want)
		}
	}
	return took, err
}

// driveInterleaved makes calls tools/call on one session of a and one of
// b from one loop, alternating between them call by call (a b, b a, a b,
// …), so that each call of a has a call of b right beside it on the
// shared machine: the steadiest ratio of one route's latency to its
// baseline's at one session. One call is in flight at a time, as at one
// session of drive. The gateway's CPU and allocations cannot be told apart
// between the two, so the samples carry none; each one's elapsed time is
// the time spent in its own calls.
func driveInterleaved(ctx context.Context, a, b route, calls int, tool string) (sample, sample, error) {
	sa, va, closeA, err := connect(ctx, a, 1)
	if err != nil {
		return sample{}, sample{}, fmt.Errorf("%s: %w", a.name, err)
	}
	defer closeA()
	sb, vb, closeB, err := connect(ctx, b, 1)
	if err != nil {
		return sample{}, sample{}, fmt.Errorf("%s: %w", b.name, err)
	}
	defer closeB()
	out := [2]sample{{version: va, lat: make([]time.Duration, 0, calls)}, {version: vb, lat: make([]time.Duration, 0, calls)}}
	sessions, routes := [2]*mcp.ClientSession{sa[0], sb[0]}, [2]route{a, b}
	tools := [2]string{cmp.Or(a.tool, tool), cmp.Or(b.tool, tool)}
	args := [2]map[string]any{callArgs(tools[0]), callArgs(tools[1])}
	for i := 0; i < calls; i++ {
		for j := range 2 {
			k := j ^ (i & 1) // a b, then b a: neither always goes first
			took, err := call(ctx, sessions[k], routes[k], tools[k], args[k])
			if err != nil {
				return sample{}, sample{}, fmt.Errorf("%s: %w", routes[k].name, err)
			}
			out[k].lat = append(out[k].lat, took)
			out[k].elapsed += took
			out[k].calls++
		}
	}
	return out[0], out[1], nil
}

// drive opens conc initialized MCP sessions on r and makes calls tools/call
// on each, all at once. Session set-up is not timed.
func drive(ctx context.Context, r route, conc, calls int, tool string) (sample, error) {
	sessions, negotiated, closeAll, err := connect(ctx, r, conc)
	if err != nil {
		return sample{}, err
	}
	defer closeAll()
	tool = cmp.Or(r.tool, tool)
	args := callArgs(tool)

	var cpu0 time.Duration
	if r.pid != 0 {
		cpu0, _ = cpuTime(r.pid)
	}
	var mem0 memStats
	if r.admin != "" {
		var err error
		if mem0, err = readMemStats(ctx, r.admin); err != nil {
			return sample{}, err
		}
	}
	var (
		mu      sync.Mutex
		lat     = make([]time.Duration, 0, conc*calls)
		firstEr error
		wg      sync.WaitGroup
	)
	start := time.Now()
	for _, cs := range sessions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			mine := make([]time.Duration, 0, calls)
			for i := 0; i < calls; i++ {
				took, err := call(ctx, cs, r, tool, args)
				mine = append(mine, took)
				if err != nil {
					mu.Lock()
					if firstEr == nil {
						firstEr = err
					}
					mu.Unlock()
					return
				}
			}
			mu.Lock()
			lat = append(lat, mine...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	s := sample{version: negotiated, calls: len(lat), elapsed: time.Since(start), lat: lat}
	if firstEr != nil {
		return s, firstEr
	}
	if r.pid != 0 {
		cpu1, _ := cpuTime(r.pid)
		s.cpu = cpu1 - cpu0
		s.rss, _ = rss(r.pid)
	}
	if r.admin != "" {
		mem1, err := readMemStats(ctx, r.admin)
		if err != nil {
			return s, err
		}
		s.mallocs, s.allocBytes = mem1.Mallocs-mem0.Mallocs, mem1.TotalAlloc-mem0.TotalAlloc
	}
	return s, nil
}

func summarize(name string, conc int, ss []sample, measured bool) result {
	r := result{route: name, concurrency: conc}
	var rates []float64
	var all []time.Duration
	var cpu time.Duration
	var mallocs, allocBytes uint64
	calls := 0
	for _, s := range ss {
		if r.version == "" {
			r.version = s.version
		} else if s.version != r.version {
			r.version = "mixed"
		}
		rates = append(rates, float64(s.calls)/s.elapsed.Seconds())
		r.roundP50s = append(r.roundP50s, p50(s.lat))
		all = append(all, s.lat...)
		cpu += s.cpu
		mallocs += s.mallocs
		allocBytes += s.allocBytes
		calls += s.calls
		r.rss = max(r.rss, s.rss)
	}
	r.roundRates = slices.Clone(rates)
	sort.Float64s(rates)
	r.callsPerSec = rates[len(rates)/2]
	slices.Sort(all)
	r.p50 = all[len(all)/2]
	r.p99 = all[min(len(all)-1, len(all)*99/100)]
	if measured && calls > 0 {
		r.cpuPerCall = cpu / time.Duration(calls)
	}
	if calls > 0 {
		r.allocsPerCall, r.bytesPerCall = float64(mallocs)/float64(calls), float64(allocBytes)/float64(calls)
	}
	return r
}

// p50 is the median of lat, which it leaves unsorted.
func p50(lat []time.Duration) time.Duration {
	if len(lat) == 0 {
		return 0
	}
	s := slices.Clone(lat)
	slices.Sort(s)
	return s[len(s)/2]
}

// pairUnits are what a round runs, in order: each route with a baseline
// among routes as a pair, the baseline first, and each other route alone,
// but for a baseline of some pair, which runs in its pairs.
func pairUnits(routes []route) [][]route {
	byName := map[string]route{}
	for _, r := range routes {
		byName[r.name] = r
	}
	isBase := map[string]bool{}
	for _, r := range routes {
		if b, ok := byName[r.baseline()]; ok && b.name != r.name {
			isBase[b.name] = true
		}
	}
	var units [][]route
	for _, r := range routes {
		if b, ok := byName[r.baseline()]; ok && b.name != r.name {
			units = append(units, []route{b, r})
		} else if !isBase[r.name] {
			units = append(units, []route{r})
		}
	}
	return units
}

// pairedRatios are a route's figure over reverse_proxy's in each round,
// and their median.
func pairedRatios(r, rp []float64) (median float64, each []float64) {
	for i := range min(len(r), len(rp)) {
		if rp[i] > 0 {
			each = append(each, r[i]/rp[i])
		}
	}
	if len(each) == 0 {
		return 0, nil
	}
	s := slices.Clone(each)
	sort.Float64s(s)
	if n := len(s); n%2 == 0 {
		return (s[n/2-1] + s[n/2]) / 2, each
	}
	return s[len(s)/2], each
}

func seconds(ds []time.Duration) []float64 {
	f := make([]float64, len(ds))
	for i, d := range ds {
		f[i] = d.Seconds()
	}
	return f
}

func printTable(out io.Writer, cfg config, results []result) {
	find := func(route string, conc int) *result {
		for i := range results {
			if results[i].route == route && results[i].concurrency == conc {
				return &results[i]
			}
		}
		return nil
	}
	perSession := fmt.Sprintf("%d calls per session per round", cfg.calls)
	if cfg.roundCalls > 0 {
		perSession = fmt.Sprintf("at least %d calls per session and %d per route per round", cfg.calls, cfg.roundCalls)
	}
	beside := "each route run right beside a run of its baseline"
	if cfg.interleave {
		beside += " (at 1 session, both from one loop, call by call: -interleave)"
	}
	fmt.Fprintf(out, "tools/call %q (the OAuth rows: whoami, whose answer names the upstream user whose token went out, checked on every call), %s, %d round(s); calls/s is the median over rounds, p50 and p99 pool them; ratios to the baseline (reverse_proxy of the same protocol; for rows on NATS storage, the single-node guard; for the per_user row, the shared row) are medians of each round's ratio, %s\n\n", cfg.tool, perSession, cfg.rounds, beside)
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "route\tprotocol\tsessions\tcalls/s\tp50\tp99\tgateway CPU/call\tgateway RSS\tvs direct\tvs baseline (calls/s, p50, CPU)\tbaseline\t")
	for _, r := range results {
		cpu, mem := "-", "-"
		if r.cpuPerCall > 0 || r.rss > 0 {
			cpu = fmt.Sprintf("%.0fµs", float64(r.cpuPerCall.Nanoseconds())/1e3)
			mem = fmt.Sprintf("%.1fMiB", float64(r.rss)/(1<<20))
		}
		vsDirect, vsRP, base := "-", "-", "-"
		direct := "direct"
		if r.asked != "" {
			direct += " " + r.asked
		}
		if d := find(direct, r.concurrency); d != nil && !r.noDirect {
			vsDirect = fmt.Sprintf("%.2f×", r.callsPerSec/d.callsPerSec)
		}
		if r.baseRates != nil {
			rate, _ := pairedRatios(r.pairRates, r.baseRates)
			lat, _ := pairedRatios(seconds(r.pairP50s), seconds(r.baseP50s))
			vsRP, base = fmt.Sprintf("%.2f×, %.2f×", rate, lat), r.baseline
			if r.pairCPUPerCall > 0 && r.baseCPUPerCall > 0 {
				vsRP += fmt.Sprintf(", %.2f×", float64(r.pairCPUPerCall)/float64(r.baseCPUPerCall))
			}
		} else if r.route == r.baseline && !strings.HasPrefix(r.route, "direct") {
			vsRP, base = "1.00×, 1.00×, 1.00×", r.baseline
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%.0f\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", r.route, r.version, r.concurrency, r.callsPerSec,
			round(r.p50), round(r.p99), cpu, mem, vsDirect, vsRP, base)
	}
	tw.Flush()

	// Allocations do not drift with the load on shared cores as CPU time
	// does: the steadiest measure of what a route adds.
	if slices.ContainsFunc(results, func(r result) bool { return r.allocsPerCall > 0 }) {
		fmt.Fprintf(out, "\nthe gateway's heap allocations per call (its Go runtime's counts over each run, background work included):\n\n")
		tw = tabwriter.NewWriter(out, 0, 4, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "route\tsessions\tallocs/call\tKiB/call\tallocs vs baseline\t")
		for _, r := range results {
			if r.allocsPerCall == 0 {
				continue
			}
			vs := "-"
			if r.pairAllocsPerCall > 0 && r.baseAllocsPerCall > 0 {
				vs = fmt.Sprintf("%.2f× (%+.0f)", r.pairAllocsPerCall/r.baseAllocsPerCall, r.pairAllocsPerCall-r.baseAllocsPerCall)
			}
			fmt.Fprintf(tw, "%s\t%d\t%.0f\t%.1f\t%s\t\n", r.route, r.concurrency, r.allocsPerCall, r.bytesPerCall/1024, vs)
		}
		tw.Flush()
	}

	// The spread behind the p50 ratios, so that a reader sees how much of
	// a ratio is the machine's noise.
	fmt.Fprintf(out, "\np50 over the baseline's, round by round (the column above is their median):\n\n")
	tw = tabwriter.NewWriter(out, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "route\tsessions\tby round\t")
	for _, r := range results {
		if r.baseRates == nil {
			continue
		}
		_, each := pairedRatios(seconds(r.pairP50s), seconds(r.baseP50s))
		parts := make([]string, len(each))
		for i, x := range each {
			parts[i] = fmt.Sprintf("%.2f", x)
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t\n", r.route, r.concurrency, strings.Join(parts, " "))
	}
	tw.Flush()
}

func round(d time.Duration) string {
	switch {
	case d >= 10*time.Millisecond:
		return d.Round(time.Millisecond).String()
	case d >= 10*time.Microsecond:
		return d.Round(10 * time.Microsecond).String()
	}
	return d.String()
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

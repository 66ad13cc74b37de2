package main

import (
	"bytes"
	"context"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestSmoke runs the harness in its short mode so that it cannot rot: every
// route must answer every call and appear in the table, and every session of
// the session-engine run must finish with its event delivered to the client
// that created it, and every idle session must open and the sampled ones
// answer a ping. It asserts no timing and no memory figure.
func TestSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("builds caddy and drives real MCP sessions")
	}
	// Four agents at most for 20 sessions: the limit is reached, and the
	// engine makes room by stopping idle agents (a create is refused, and
	// retried, only while all four are busy).
	cfg, rep, table := runBench(t, "-smoke", "-max-agents", "4", "-agent-idle", "500ms")
	s := rep.sessions
	switch {
	case s == nil:
		t.Errorf("the smoke run has no session-engine section")
	case s.created != cfg.sessions || s.createErrors != 0:
		t.Errorf("created %d of %d sessions, %d create errors (first: %s)", s.created, cfg.sessions, s.createErrors, s.firstError)
	case s.finished != s.created:
		t.Errorf("%d of %d sessions finished with an event (%d without one, %d failed, %d not finished)",
			s.finished, s.created, s.finishedRead, s.failed, s.timedOut)
	case s.delivered != s.created || s.misdirected != 0 || s.duplicates != 0:
		t.Errorf("finished events delivered to their creating client: %d, expected %d (%d to another client, %d duplicates)",
			s.delivered, s.created, s.misdirected, s.duplicates)
	case s.readErrors != 0 || len(s.reads) == 0:
		t.Errorf("%d reads, %d read errors", len(s.reads), s.readErrors)
	case s.peakAgents < cfg.maxAgents:
		t.Errorf("max_agents %d was never reached (peak %d agents) with %d sessions: the run did not exercise the limit", cfg.maxAgents, s.peakAgents, s.created)
	}
	switch {
	case rep.idle == nil:
		t.Errorf("the smoke run has no idle-sessions section")
	case len(rep.idle.routes) != 4:
		t.Errorf("the idle-sessions section has %d routes, want the sessions endpoint at each version, broker pass-through and the aggregated route", len(rep.idle.routes))
	}
	if rep.idle != nil {
		for _, r := range rep.idle.routes {
			if r.opened != cfg.idle || r.failures != 0 {
				t.Errorf("idle sessions, %s: opened %d of %d, %d failures (first: %s)", r.name, r.opened, cfg.idle, r.failures, r.firstError)
			}
			if r.pingsSampled == 0 || r.pingsOK != r.pingsSampled {
				t.Errorf("idle sessions, %s: %d of %d sampled pings succeeded (first failure: %s)", r.name, r.pingsOK, r.pingsSampled, r.firstPingError)
			}
			// The sessions endpoint and the aggregated route close idle
			// sessions: after the timeout every sampled one gets 404.
			if r.expire > 0 && r.closed != r.pingsSampled {
				t.Errorf("idle sessions, %s: %d of %d sampled sessions closed after the %s idle timeout", r.name, r.closed, r.pingsSampled, r.expire)
			}
		}
	}
	// The 2026-07-28 rows: each route in front of the stateless upstream,
	// with the version each negotiated.
	for _, r := range rep.calls {
		if strings.HasSuffix(r.route, " "+modernProtocolVersion) && r.version != modernProtocolVersion && !strings.HasPrefix(r.route, "aggregated") {
			t.Errorf("%s negotiated %q", r.route, r.version)
		}
		// Every route through caddy has its allocations counted; the
		// direct rows, which no gateway serves, have none.
		if through := !strings.HasPrefix(r.route, "direct"); through != (r.allocsPerCall > 0 && r.bytesPerCall > 0) {
			t.Errorf("%s at %d sessions: %.1f allocations and %.0f bytes per call", r.route, r.concurrency, r.allocsPerCall, r.bytesPerCall)
		}
	}
	for _, want := range []string{"direct", "reverse_proxy", "guard+reverse_proxy", "guard upstream", "broker pass-through", "aggregated (2 upstreams)", "vs baseline",
		"direct 2026-07-28", "reverse_proxy 2026-07-28", "guard+reverse_proxy 2026-07-28", "guard upstream 2026-07-28", "broker pass-through 2026-07-28",
		"aggregated (2 upstreams) 2026-07-28", "protocol", sharedRoute, perUserRoute,
		"session engine", "create→finished", "finished events delivered / expected", "agent processes at peak",
		"heap allocations per call", "allocs vs baseline", "idle MCP sessions", "sessions endpoint", "caddy RSS/session", "upstream RSS/session",
		"after mcp_session_idle_timeout 3s", "heap kept", "sampled sessions closed (404)",
		"sessions endpoint, 2026-07-28: 200 clients each sent server/discover and a tools/call"} {
		if !strings.Contains(table, want) {
			t.Errorf("table lacks %q:\n%s", want, table)
		}
	}
	t.Logf("\n%s", table)
}

// With -interleave, a route and its baseline at one session are driven
// from one loop: each makes every call of the round, and their ratio comes
// from that one pair of samples, which measure no gateway CPU.
func TestInterleaved(t *testing.T) {
	if testing.Short() {
		t.Skip("builds caddy and drives real MCP sessions")
	}
	_, rep, table := runBench(t, "-only", "calls", "-routes", "guard+", "-versions", "2025-11-25", "-rounds", "2", "-calls", "15", "-concurrency", "1", "-interleave")
	rows := map[string]result{}
	for _, r := range rep.calls {
		rows[r.route] = r
	}
	guard, rp := rows["guard+reverse_proxy"], rows["reverse_proxy"]
	switch {
	case len(rep.calls) != 2:
		t.Errorf("%d rows, want the guard's and its baseline's", len(rep.calls))
	case len(guard.pairRates) != 2 || len(guard.baseRates) != 2 || len(rp.roundRates) != 2:
		t.Errorf("guard: %d paired runs and %d of its baseline beside them; reverse_proxy: %d runs; want 2 of each",
			len(guard.pairRates), len(guard.baseRates), len(rp.roundRates))
	case guard.cpuPerCall != 0 || guard.allocsPerCall != 0 || rp.cpuPerCall != 0:
		t.Errorf("interleaved runs measured the gateway: guard %v and %.0f allocations per call, reverse_proxy %v", guard.cpuPerCall, guard.allocsPerCall, rp.cpuPerCall)
	case guard.version != benchProtocolVersion || rp.version != benchProtocolVersion:
		t.Errorf("negotiated %q and %q", guard.version, rp.version)
	}
	for _, r := range []result{guard, rp} {
		for _, rate := range r.roundRates {
			if rate <= 0 {
				t.Errorf("%s: a round of %v calls/s", r.route, r.roundRates)
			}
		}
	}
	t.Logf("\n%s", table)
}

// The per_user row runs beside the shared row of the same OAuth-protected
// upstream, its ratios are to that row, and every call of each ran
// upstream with the token it should: the person's own on per_user, the
// operator's on shared (whoami names the upstream user; a call that
// names another fails the run). -routes "broker per_user" starts nothing
// else.
func TestPerUserRows(t *testing.T) {
	if testing.Short() {
		t.Skip("builds caddy and drives real MCP sessions")
	}
	_, rep, table := runBench(t, "-only", "calls", "-routes", "broker per_user", "-rounds", "2", "-calls", "15", "-concurrency", "1,4", "-interleave")
	rows := map[string]map[int]result{}
	for _, r := range rep.calls {
		if rows[r.route] == nil {
			rows[r.route] = map[int]result{}
		}
		rows[r.route][r.concurrency] = r
	}
	if len(rows) != 2 || rows[sharedRoute] == nil || rows[perUserRoute] == nil {
		t.Fatalf("rows %v, want the shared and per_user rows alone:\n%s", rep.calls, table)
	}
	for _, conc := range []int{1, 4} {
		per := rows[perUserRoute][conc]
		if per.baseline != sharedRoute || len(per.pairRates) != 2 || len(per.baseRates) != 2 {
			t.Errorf("per_user at %d sessions: baseline %q, %d paired runs and %d of its baseline", conc, per.baseline, len(per.pairRates), len(per.baseRates))
		}
	}
	// Past one session the runs are not interleaved: the gateway's
	// allocations are counted.
	if r := rows[perUserRoute][4]; r.pairAllocsPerCall <= 0 || r.baseAllocsPerCall <= 0 {
		t.Errorf("per_user at 4 sessions: %.0f allocations per call beside the shared row's %.0f", r.pairAllocsPerCall, r.baseAllocsPerCall)
	}
	if !strings.Contains(table, "for the per_user row, the shared row") {
		t.Errorf("the table does not say what the per_user row is compared with:\n%s", table)
	}
	t.Logf("\n%s", table)
}

// runBench runs the harness with args, as `go run ./bench` would, and
// returns its config, its report and the tables it printed.
func runBench(t *testing.T, args ...string) (config, *report, string) {
	t.Helper()
	cfg, err := parseFlags(args)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var out bytes.Buffer
	rep, err := run(ctx, cfg, &out)
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	return cfg, rep, out.String()
}

func TestFlags(t *testing.T) {
	for _, bad := range [][]string{{"-concurrency", "0"}, {"-concurrency", "x"}, {"-tool", "nope"}, {"-calls", "0"},
		{"-only", "nope"}, {"-only", "sessions", "-sessions", "0"}, {"-sessions", "-1"}, {"-session-clients", "0"},
		{"-max-agents", "0"}, {"-agent-idle", "0s"}, {"-idle", "-1"}, {"-only", "idle", "-idle", "0"}, {"-mcp-idle-timeout", "-1s"}, {"-versions", "2024-11-05"}, {"-round-calls", "-1"},
		{"-only", "calls", "-cpuprofile", "p.pb.gz", "-profile-kind", "heap"}} {
		if _, err := parseFlags(bad); err == nil {
			t.Errorf("parseFlags(%v) accepted", bad)
		}
	}
	if cfg, err := parseFlags([]string{"-only", "calls", "-cpuprofile", "p.pb.gz", "-profile-kind", "allocs"}); err != nil || cfg.profileKind != "allocs" {
		t.Errorf("-profile-kind allocs: %q, %v", cfg.profileKind, err)
	}
	cfg, err := parseFlags([]string{"-concurrency", "2,4", "-peer", "http://127.0.0.1:1/mcp", "-peer", "http://127.0.0.1:2/mcp"})
	if err != nil || len(cfg.concurrency) != 2 || len(cfg.peers) != 2 {
		t.Fatalf("%+v %v", cfg, err)
	}
	if cfg, err := parseFlags([]string{"-calls", "50", "-round-calls", "1600"}); err != nil || cfg.callsPer(1) != 1600 || cfg.callsPer(8) != 200 ||
		cfg.callsPer(32) != 50 || cfg.callsPer(128) != 50 || cfg.callsPer(3) != 534 {
		t.Errorf("-round-calls 1600 -calls 50: %d %d %d %d %d per session at 1, 8, 32, 128, 3 sessions; %v", cfg.callsPer(1), cfg.callsPer(8),
			cfg.callsPer(32), cfg.callsPer(128), cfg.callsPer(3), err)
	}
	for _, c := range []struct {
		args                        []string
		calls, sessionsRun, idleRun bool
		sessions, idle              int
	}{
		{nil, true, true, true, 1000, 10000},
		{[]string{"-smoke"}, true, true, true, 20, 200},
		{[]string{"-smoke", "-sessions", "0"}, true, false, true, 0, 200},
		{[]string{"-smoke", "-idle", "0"}, true, true, false, 20, 0},
		{[]string{"-only", "sessions", "-sessions", "300"}, false, true, false, 300, 10000},
		{[]string{"-only", "calls"}, true, false, false, 1000, 10000},
		{[]string{"-only", "idle", "-idle", "50"}, false, false, true, 1000, 50},
	} {
		cfg, err := parseFlags(c.args)
		if err != nil || cfg.callsOn() != c.calls || cfg.sessionsOn() != c.sessionsRun || cfg.idleOn() != c.idleRun ||
			cfg.sessions != c.sessions || cfg.idle != c.idle {
			t.Errorf("parseFlags(%v) = calls %v, sessions %v (%d), idle %v (%d), %v", c.args, cfg.callsOn(), cfg.sessionsOn(), cfg.sessions,
				cfg.idleOn(), cfg.idle, err)
		}
	}
}

// -routes keeps the routes named and the baselines of their ratios, in
// their order; -versions keeps a protocol's; a choice of nothing says what
// there is.
func TestSelectRoutes(t *testing.T) {
	routes := []route{{name: "direct"}, {name: "reverse_proxy"}, {name: "guard+reverse_proxy"},
		{name: "reverse_proxy 2026-07-28", version: modernProtocolVersion},
		{name: "guard+reverse_proxy 2026-07-28", version: modernProtocolVersion},
		{name: "broker pass-through 2026-07-28", version: modernProtocolVersion},
		{name: "guard+reverse_proxy on NATS storage", base: "guard+reverse_proxy"}}
	names := func(rs []route) []string {
		var n []string
		for _, r := range rs {
			n = append(n, r.name)
		}
		return n
	}
	for _, c := range []struct {
		prefixes, versions, want []string
	}{
		{nil, nil, names(routes)},
		{[]string{"broker"}, nil, []string{"reverse_proxy 2026-07-28", "broker pass-through 2026-07-28"}},
		{[]string{"guard"}, []string{"2025-11-25"}, []string{"reverse_proxy", "guard+reverse_proxy", "guard+reverse_proxy on NATS storage"}},
		{[]string{"guard+reverse_proxy on"}, nil, []string{"reverse_proxy", "guard+reverse_proxy", "guard+reverse_proxy on NATS storage"}},
		{nil, []string{"2026-07-28"}, []string{"reverse_proxy 2026-07-28", "guard+reverse_proxy 2026-07-28", "broker pass-through 2026-07-28"}},
	} {
		got, err := selectRoutes(routes, c.prefixes, c.versions)
		if err != nil || !slices.Equal(names(got), c.want) {
			t.Errorf("selectRoutes(%q, %q) = %q, %v; want %q", c.prefixes, c.versions, names(got), err, c.want)
		}
	}
	if _, err := selectRoutes(routes, []string{"nope"}, nil); err == nil || !strings.Contains(err.Error(), `"broker pass-through 2026-07-28" (2026-07-28)`) {
		t.Errorf("a choice of no route gives %v; want the routes listed", err)
	}
}

// A round runs each route beside its baseline, and a baseline only in its
// pairs; a route without one (direct, a lone baseline) alone.
func TestPairUnits(t *testing.T) {
	routes := []route{{name: "direct", base: "direct"}, {name: "reverse_proxy"}, {name: "guard+reverse_proxy"},
		{name: "broker pass-through"}, {name: "reverse_proxy 2026-07-28", version: modernProtocolVersion},
		{name: "guard+reverse_proxy on NATS storage", base: "guard+reverse_proxy"}}
	var got []string
	for _, u := range pairUnits(routes) {
		var names []string
		for _, r := range u {
			names = append(names, r.name)
		}
		got = append(got, strings.Join(names, " + "))
	}
	want := []string{"direct", "reverse_proxy + guard+reverse_proxy", "reverse_proxy + broker pass-through", "reverse_proxy 2026-07-28",
		"guard+reverse_proxy + guard+reverse_proxy on NATS storage"}
	if !slices.Equal(got, want) {
		t.Errorf("pairUnits = %q, want %q", got, want)
	}
}

// A route's ratio to reverse_proxy is taken within each round, then the
// median of those: a round where the machine was slow for both routes
// weighs on neither.
func TestPairedRatios(t *testing.T) {
	med, each := pairedRatios([]float64{2, 40, 6}, []float64{1, 20, 2})
	if med != 2 || !slices.Equal(each, []float64{2, 2, 3}) {
		t.Errorf("pairedRatios = %v, %v; want 2, [2 2 3]", med, each)
	}
	if med, _ := pairedRatios([]float64{1, 3, 2, 4}, []float64{1, 1, 1, 1}); med != 2.5 {
		t.Errorf("median of an even count = %v, want 2.5", med)
	}
	if med, each := pairedRatios([]float64{1}, []float64{0}); med != 0 || each != nil {
		t.Errorf("a zero baseline gives %v, %v; want no ratio", med, each)
	}
	if got := p50([]time.Duration{5, 1, 3}); got != 3 {
		t.Errorf("p50 = %v, want 3", got)
	}
}

// The idle probe takes a call's answer from an event stream as a client
// reads it: past the notifications before it, whatever its line ends, and
// with data over several lines joined by LF.
func TestSSEData(t *testing.T) {
	const answer = `{"jsonrpc":"2.0","id":1,"result":{}}`
	for stream, want := range map[string]string{
		"event: message\ndata: " + answer + "\n\n": answer,
		`data: {"jsonrpc":"2.0","method":"notifications/message","params":{"result":1}}` + "\n\ndata: " + answer + "\n\n": answer,
		"data: " + answer + "\r\n\r\n":                                   answer,
		"data: " + answer + "\r\r":                                       answer,
		"data: {\"jsonrpc\":\"2.0\",\ndata: \"id\":1,\"result\":{}}\n\n": "{\"jsonrpc\":\"2.0\",\n\"id\":1,\"result\":{}}",
		"data: " + answer + "\n":                                         "",
	} {
		if got := string(sseData([]byte(stream))); got != want {
			t.Errorf("sseData(%q) = %q; want %q", stream, got, want)
		}
	}
}

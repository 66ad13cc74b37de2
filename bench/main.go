// Command bench measures what the edge costs: the same MCP tools/call load,
// from real go-sdk clients, against the upstream directly and through each
// route of one caddy process, in interleaved rounds so that a noisy machine
// weighs on every route alike. It prints one table with throughput, latency,
// caddy's CPU time per call and RSS, and ratios against direct and against
// plain reverse_proxy measured in the same run. Each route is measured
// twice: with clients pinned at MCP 2025-11-25 in front of the stateful
// upstream, and (the rows named "… 2026-07-28") with clients pinned at
// 2026-07-28 in front of the same upstream program run statelessly, each
// against the reverse_proxy row of its version; the protocol column is the
// version the route negotiated. Two more rows put one OAuth-protected
// upstream (the project's internal/oauthtest server, in this process) on
// two broker routes of a third caddy: credentials shared (the operator's
// token) and credentials per_user (the calling person's own, warm), the
// per_user row's ratios being to the shared row's (see peruser.go).
//
// A second section scales the session engine: a caddy serving the sessions
// endpoint, and a pool of go-sdk clients that create -sessions sessions of
// the built-in demo agent, each run to its finished <session-event>. It
// reports create→finished and read latency, events delivered against
// events expected, the agent processes alive at peak and caddy's memory per
// session (see sessions.go).
//
// A third section opens -idle initialized MCP sessions on the sessions
// endpoint, on broker pass-through and on the aggregated route, leaves them
// open, and reports the RSS and live heap they cost per session, caddy's
// and, for broker pass-through, the upstream's, where their state lives;
// then it waits out -mcp-idle-timeout and reports what is left once the
// sessions endpoint and the aggregated route have closed them (see
// idle.go).
//
//	go run ./bench                       # full run
//	go run ./bench -smoke                # a few hundred calls per route, 20 sessions, 200 idle sessions (CI)
//	go run ./bench -only sessions -sessions 1000     # the session engine only
//	go run ./bench -only idle -idle 10000            # idle MCP sessions only
//	go run ./bench -peer http://127.0.0.1:9000/mcp   # add another gateway
//	go run ./bench -only calls -peer-mcpgo           # add the mcp-go aggregator stand-in (bench/peer/mcpgoproxy)
//	go run ./bench -only calls -cluster              # add guard rows from a caddy on NATS storage
//	go run ./bench -only calls -rules -routes guard+reverse_proxy   # the guard with five rules against the guard without
//	go run ./bench -only calls -routes "broker per_user" -interleave   # per_user against shared alone
//	go run ./bench -only calls -routes guard -versions 2026-07-28 -rounds 15   # one route and its baseline, more rounds
//	go run ./bench -only calls -round-calls 1600     # rounds at 1 session as long as at 32: 1600 calls each
//	go run ./bench -only calls -cpuprofile agg.pprof # then profile caddy while the aggregated route is driven
//	go run ./bench -only calls -cpuprofile a.pprof -profile-kind allocs # its heap allocations instead
//
// Everything listens on loopback and every loop is bounded.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

type config struct {
	calls       int   // tools/call per session per round
	roundCalls  int   // at least this many tools/call per route per round, in all (more per session at low concurrency)
	concurrency []int // MCP sessions driven at once
	rounds      int
	tool        string
	peers       []string
	peerMCPGo   bool     // run the mcp-go aggregator stand-in as one more route
	cluster     bool     // add guard rows from a second caddy on NATS storage
	rules       bool     // add the guard route with five rules, against the guard without
	routes      []string // when set, only the routes whose names start with one of these, and their baselines
	versions    []string // when set, only the routes whose clients speak one of these protocol versions, and their baselines
	timeout     time.Duration

	only string // "", "calls", "sessions" or "idle": run that section alone

	sessions       int // demo-agent sessions in the session-engine run; 0 skips it
	sessionClients int // MCP sessions that create them
	maxAgents      int // the gateway's max_agents
	agentIdle      time.Duration

	idle        int           // idle MCP sessions opened on each route in the idle-sessions run; 0 skips it
	idleTimeout time.Duration // the idle run's mcp_session_idle_timeout, waited out and measured after; 0: not measured

	cpuProfile      string        // when set, a CPU profile of caddy is written here (see profileRoute)
	profileRoute    string        // the route driven while it is taken: a prefix of its name
	profileSessions int           // MCP sessions driving it meanwhile
	profileFor      time.Duration // how long the profile runs
	profileKind     string        // cpu, or allocs: the heap allocations made while it runs
	interleave      bool          // at 1 session, a route and its baseline are driven call by call from one loop
}

// callsPer is the tools/call each of conc sessions makes in a round.
func (c config) callsPer(conc int) int { return max(c.calls, (c.roundCalls+conc-1)/conc) }

// callsOn and sessionsOn say which sections run.
func (c config) callsOn() bool    { return c.only == "" || c.only == "calls" }
func (c config) sessionsOn() bool { return (c.only == "" || c.only == "sessions") && c.sessions > 0 }
func (c config) idleOn() bool     { return (c.only == "" || c.only == "idle") && c.idle > 0 }

func main() {
	cfg, err := parseFlags(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), cfg.timeout)
	defer cancel()
	if _, err := run(ctx, cfg, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func parseFlags(args []string) (config, error) {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	calls := fs.Int("calls", 100, "tools/call per session per round")
	roundCalls := fs.Int("round-calls", 0, "at least this many tools/call per route and round in all: sessions make more than -calls each when few run at once, so that a round at 1 session lasts as long as one at 32 (0: -calls per session)")
	conc := fs.String("concurrency", "1,8,32,128", "comma-separated numbers of concurrent MCP sessions")
	rounds := fs.Int("rounds", 3, "interleaved rounds; figures are medians over rounds")
	tool := fs.String("tool", "echo", "tool to call: echo, or payload (4 KiB result)")
	smoke := fs.Bool("smoke", false, "a short run that only checks the harness works: 1 round, 1 and 8 sessions, 20 calls; 20 demo-agent sessions")
	timeout := fs.Duration("timeout", 30*time.Minute, "bound on the whole run")
	only := fs.String("only", "", "run one section: calls (the tools/call table), sessions (the session-engine run) or idle (the idle-sessions run)")
	nSessions := fs.Int("sessions", 1000, "demo-agent sessions to create and run to completion in the session-engine run; 0 skips it")
	sessionClients := fs.Int("session-clients", 16, "MCP client sessions that create the demo-agent sessions")
	maxAgents := fs.Int("max-agents", 32, "the gateway's max_agents in the session-engine run: agent processes alive at once")
	agentIdle := fs.Duration("agent-idle", 2*time.Second, "the gateway's agent_idle_timeout in the session-engine run")
	idle := fs.Int("idle", 10000, "initialized MCP sessions to open and leave idle on the sessions endpoint, broker pass-through and the aggregated route, for memory per session; 0 skips it")
	idleTimeout := fs.Duration("mcp-idle-timeout", 30*time.Second, "the idle run's mcp_session_idle_timeout: the run waits it out and measures memory again, to show the sessions' memory is given back; 0 skips that (smoke: 3s)")
	cpuProfile := fs.String("cpuprofile", "", "after the calls table, write a CPU profile of caddy to this file, taken from its admin API while -profile-route is driven")
	profileRoute := fs.String("profile-route", "aggregated", "the route driven while -cpuprofile is taken: the start of its name in the table")
	profileSessions := fs.Int("profile-sessions", 32, "concurrent MCP sessions driving -profile-route while -cpuprofile is taken")
	profileFor := fs.Duration("profile-for", 15*time.Second, "how long the -cpuprofile profile runs")
	profileKind := fs.String("profile-kind", "cpu", "what -cpuprofile records: cpu, or allocs (the heap allocations caddy makes while it runs; go tool pprof -sample_index=alloc_space)")
	peerMCPGo := fs.Bool("peer-mcpgo", false, "build and run bench/peer/mcpgoproxy, a stand-in for TBXark/mcp-proxy on mark3labs/mcp-go, over the same two upstreams, as one more route")
	cluster := fs.Bool("cluster", false, "add guard rows from a second caddy whose storage is on NATS JetStream (storage zidane_nats over a nats-server built from go.mod), in the same rounds, to compare cluster mode with one node")
	rules := fs.Bool("rules", false, "add a row of the guard route with five rules over each call (its tool, the token's scopes, an argument), whose ratios are to the guard route without rules")
	routesFlag := fs.String("routes", "", "comma-separated starts of route names (direct, reverse_proxy, guard, broker, aggregated, …): measure only those routes and the baselines their ratios are to, so more rounds fit in the same time")
	versionsFlag := fs.String("versions", "", "comma-separated protocol versions (2025-11-25, 2026-07-28): measure only the routes whose clients speak one, and their baselines")
	interleave := fs.Bool("interleave", false, "at 1 session, drive each route and its baseline from one loop, call by call, instead of one run after the other: their p50 ratio then compares calls made side by side on the shared machine (those runs measure no gateway CPU or allocations, since one caddy serves both)")
	var peers stringList
	fs.Var(&peers, "peer", "URL of another MCP gateway's endpoint to measure as one more route (repeatable)")
	if err := fs.Parse(args); err != nil {
		return config{}, err
	}
	cfg := config{calls: *calls, roundCalls: *roundCalls, rounds: *rounds, tool: *tool, peers: peers, peerMCPGo: *peerMCPGo, cluster: *cluster, rules: *rules, timeout: *timeout, only: *only,
		sessions: *nSessions, sessionClients: *sessionClients, maxAgents: *maxAgents, agentIdle: *agentIdle, idle: *idle, idleTimeout: *idleTimeout,
		cpuProfile: *cpuProfile, profileRoute: *profileRoute, profileSessions: *profileSessions, profileFor: *profileFor, profileKind: *profileKind, interleave: *interleave}
	if err := cfg.parseLists(*routesFlag, *versionsFlag, *conc); err != nil {
		return config{}, err
	}
	if *smoke {
		cfg.calls, cfg.rounds, cfg.concurrency = 20, 1, []int{1, 8}
		explicit := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { explicit[f.Name] = true })
		if !explicit["sessions"] {
			cfg.sessions = 20
		}
		if !explicit["idle"] {
			cfg.idle = 200
		}
		if !explicit["mcp-idle-timeout"] {
			cfg.idleTimeout = 3 * time.Second
		}
	}
	if err := cfg.validate(); err != nil {
		return config{}, err
	}
	return cfg, nil
}

// parseLists reads the comma-separated flags -routes, -versions and
// -concurrency into cfg.
func (c *config) parseLists(routes, versions, conc string) error {
	for _, s := range strings.Split(routes, ",") {
		if s = strings.TrimSpace(s); s != "" {
			c.routes = append(c.routes, s)
		}
	}
	for _, s := range strings.Split(versions, ",") {
		switch s = strings.TrimSpace(s); s {
		case "":
		case benchProtocolVersion, modernProtocolVersion:
			c.versions = append(c.versions, s)
		default:
			return fmt.Errorf("-versions %q: give %s, %s or both", versions, benchProtocolVersion, modernProtocolVersion)
		}
	}
	for _, s := range strings.Split(conc, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 || n > 1024 {
			return fmt.Errorf("-concurrency %q: give numbers from 1 to 1024", conc)
		}
		c.concurrency = append(c.concurrency, n)
	}
	return nil
}

// validate checks the flags' values once read, and says which to change.
func (c *config) validate() error {
	if c.calls < 1 || c.rounds < 1 {
		return fmt.Errorf("-calls and -rounds must be at least 1")
	}
	if c.roundCalls < 0 || c.roundCalls > 1_000_000 {
		return fmt.Errorf("-round-calls %d: give 0 (off) to 1000000", c.roundCalls)
	}
	if c.tool != "echo" && c.tool != "payload" {
		return fmt.Errorf("-tool %q: use echo or payload", c.tool)
	}
	switch c.only {
	case "", "calls":
	case "sessions":
		if c.sessions < 1 {
			return fmt.Errorf("-only sessions needs -sessions of at least 1")
		}
	case "idle":
		if c.idle < 1 {
			return fmt.Errorf("-only idle needs -idle of at least 1")
		}
	default:
		return fmt.Errorf("-only %q: use calls, sessions or idle, or leave it out for all", c.only)
	}
	if c.cpuProfile != "" {
		if !c.callsOn() {
			return fmt.Errorf("-cpuprofile is taken in the calls section: leave out -only or give -only calls")
		}
		if c.profileSessions < 1 || c.profileSessions > 1024 {
			return fmt.Errorf("-profile-sessions %d: give 1 to 1024", c.profileSessions)
		}
		if c.profileFor < time.Second || c.profileFor > 5*time.Minute {
			return fmt.Errorf("-profile-for %s: give 1s to 5m", c.profileFor)
		}
		if c.profileKind != "cpu" && c.profileKind != "allocs" {
			return fmt.Errorf("-profile-kind %q: give cpu or allocs", c.profileKind)
		}
	}
	if c.idleTimeout < 0 {
		return fmt.Errorf("-mcp-idle-timeout %s: give 0 (not measured) or a positive duration such as 30s", c.idleTimeout)
	}
	if c.idle < 0 || c.idle > 100000 {
		return fmt.Errorf("-idle %d: give 0 (skip) to 100000", c.idle)
	}
	if c.sessions < 0 || c.sessions > 100000 {
		return fmt.Errorf("-sessions %d: give 0 (skip) to 100000", c.sessions)
	}
	if c.sessionClients < 1 || c.sessionClients > 256 {
		return fmt.Errorf("-session-clients %d: give 1 to 256", c.sessionClients)
	}
	if c.maxAgents < 1 || c.maxAgents > 1024 {
		return fmt.Errorf("-max-agents %d: give 1 to 1024", c.maxAgents)
	}
	if c.agentIdle <= 0 {
		return fmt.Errorf("-agent-idle %s: give a positive duration such as 2s", c.agentIdle)
	}
	return nil
}

type stringList []string

func (l *stringList) String() string     { return strings.Join(*l, ",") }
func (l *stringList) Set(s string) error { *l = append(*l, s); return nil }

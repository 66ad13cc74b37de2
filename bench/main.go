// Command bench measures what the edge costs: the same MCP tools/call load,
// from real go-sdk clients, against the upstream directly and through each
// route of one caddy process, in interleaved rounds so that a noisy machine
// weighs on every route alike. It prints one table with throughput, latency,
// caddy's CPU time per call and RSS, and ratios against direct and against
// plain reverse_proxy measured in the same run.
//
//	go run ./bench                       # full run
//	go run ./bench -smoke                # a few hundred calls per route (CI)
//	go run ./bench -peer http://127.0.0.1:9000/mcp   # add another gateway
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
	concurrency []int // MCP sessions driven at once
	rounds      int
	tool        string
	peers       []string
	timeout     time.Duration
}

func main() {
	cfg, err := parseFlags(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), cfg.timeout)
	defer cancel()
	if err := run(ctx, cfg, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func parseFlags(args []string) (config, error) {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	calls := fs.Int("calls", 100, "tools/call per session per round")
	conc := fs.String("concurrency", "1,8,32,128", "comma-separated numbers of concurrent MCP sessions")
	rounds := fs.Int("rounds", 3, "interleaved rounds; figures are medians over rounds")
	tool := fs.String("tool", "echo", "tool to call: echo, or payload (4 KiB result)")
	smoke := fs.Bool("smoke", false, "a short run that only checks the harness works: 1 round, 1 and 8 sessions, 20 calls")
	timeout := fs.Duration("timeout", 30*time.Minute, "bound on the whole run")
	var peers stringList
	fs.Var(&peers, "peer", "URL of another MCP gateway's endpoint to measure as one more route (repeatable)")
	if err := fs.Parse(args); err != nil {
		return config{}, err
	}
	cfg := config{calls: *calls, rounds: *rounds, tool: *tool, peers: peers, timeout: *timeout}
	for _, s := range strings.Split(*conc, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 || n > 1024 {
			return config{}, fmt.Errorf("-concurrency %q: give numbers from 1 to 1024", *conc)
		}
		cfg.concurrency = append(cfg.concurrency, n)
	}
	if *smoke {
		cfg.calls, cfg.rounds, cfg.concurrency = 20, 1, []int{1, 8}
	}
	if cfg.calls < 1 || cfg.rounds < 1 {
		return config{}, fmt.Errorf("-calls and -rounds must be at least 1")
	}
	if cfg.tool != "echo" && cfg.tool != "payload" {
		return config{}, fmt.Errorf("-tool %q: use echo or payload", cfg.tool)
	}
	return cfg, nil
}

type stringList []string

func (l *stringList) String() string     { return strings.Join(*l, ",") }
func (l *stringList) Set(s string) error { *l = append(*l, s); return nil }

package e2e

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// BenchmarkGuardOverhead measures tools/call through `zidane_mcp guard` +
// reverse_proxy against reverse_proxy alone, in the same caddy process and
// the same run, in interleaved rounds so that machine noise hits both. It
// reports each route's median latency and caddy CPU time per call, and the
// ratios guard/reverse_proxy. b.N is the number of calls per route.
//
//	go test ./e2e -run x -bench GuardOverhead -benchtime 6000x
func BenchmarkGuardOverhead(b *testing.B) {
	const sessionsPerRoute = 8
	const rounds = 3
	upstream := startEverythingServer(b)
	up := strings.TrimSuffix(strings.TrimPrefix(upstream, "http://"), "/mcp")
	rpSite := fmt.Sprintf("127.0.0.1:%d", freePort(b))
	guardSite := fmt.Sprintf("127.0.0.1:%d", freePort(b))
	c := startCaddy(b, fmt.Sprintf(`{
	admin %s
}

http://%s {
	reverse_proxy %s
}

http://%s {
	zidane_mcp {
		guard
		rate_limit {
			per_token 1000000/s 1000000
		}
	}
	reverse_proxy %s
}
`, AdminPlaceholder, rpSite, up, guardSite, up))
	stdout, stderr, err := c.Run(b, "zidane", "token", "create", "--name", "bench", "--scope", "mcp")
	if err != nil {
		b.Fatalf("%v %s", err, stderr)
	}
	token := strings.TrimSpace(stdout)

	type route struct {
		name     string
		sessions []*mcp.ClientSession
		lat      []time.Duration
		cpu      time.Duration
	}
	connect := func(url string, hcToken string) []*mcp.ClientSession {
		var out []*mcp.ClientSession
		for i := 0; i < sessionsPerRoute; i++ {
			client := mcp.NewClient(&mcp.Implementation{Name: "bench", Version: "1"}, nil)
			tr := &mcp.StreamableClientTransport{Endpoint: url, MaxRetries: -1, DisableStandaloneSSE: true}
			if hcToken != "" {
				tr.HTTPClient = bearerClient(hcToken, nil)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			cs, err := client.Connect(ctx, tr, nil)
			cancel()
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { cs.Close() })
			out = append(out, cs)
		}
		return out
	}
	routes := []*route{
		{name: "reverse_proxy", sessions: connect("http://"+rpSite+"/mcp", "")},
		{name: "guard", sessions: connect("http://"+guardSite+"/mcp", token)},
	}
	pid := c.proc.cmd.Process.Pid

	run := func(r *route, calls int) {
		per := max(1, calls/len(r.sessions))
		var mu sync.Mutex
		var wg sync.WaitGroup
		cpu0 := processCPU(b, pid)
		for _, cs := range r.sessions {
			wg.Add(1)
			go func() {
				defer wg.Done()
				lat := make([]time.Duration, 0, per)
				for i := 0; i < per; i++ {
					ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
					start := time.Now()
					res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "test_simple_text"})
					lat = append(lat, time.Since(start))
					cancel()
					if err != nil || res.IsError {
						b.Errorf("%s: %v", r.name, err)
						return
					}
				}
				mu.Lock()
				r.lat = append(r.lat, lat...)
				mu.Unlock()
			}()
		}
		wg.Wait()
		r.cpu += processCPU(b, pid) - cpu0
	}

	for _, r := range routes { // warm up connections and caches
		run(r, 10*sessionsPerRoute)
		r.lat, r.cpu = nil, 0
	}
	b.ResetTimer()
	for round := 0; round < rounds; round++ {
		order := routes
		if round%2 == 1 {
			order = []*route{routes[1], routes[0]}
		}
		for _, r := range order {
			run(r, b.N/rounds)
		}
	}
	b.StopTimer()

	p50 := func(r *route) float64 {
		s := slices.Clone(r.lat)
		slices.Sort(s)
		return float64(s[len(s)/2].Microseconds())
	}
	cpuPerCall := func(r *route) float64 { return float64(r.cpu.Microseconds()) / float64(len(r.lat)) }
	rp, g := routes[0], routes[1]
	b.ReportMetric(p50(rp), "rp-p50-µs")
	b.ReportMetric(p50(g), "guard-p50-µs")
	b.ReportMetric(p50(g)/p50(rp), "p50-ratio")
	b.ReportMetric(cpuPerCall(rp), "rp-cpu-µs/call")
	b.ReportMetric(cpuPerCall(g), "guard-cpu-µs/call")
	b.ReportMetric(cpuPerCall(g)/cpuPerCall(rp), "cpu-ratio")
}

// processCPU is the user+system CPU time pid has used, from /proc.
func processCPU(tb testing.TB, pid int) time.Duration {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		tb.Fatal(err)
	}
	// Fields after the command name, which is in parentheses and may hold spaces.
	fields := strings.Fields(string(raw[strings.LastIndexByte(string(raw), ')')+2:]))
	utime, _ := strconv.ParseInt(fields[11], 10, 64)
	stime, _ := strconv.ParseInt(fields[12], 10, 64)
	const clockTicks = 100 // USER_HZ on Linux
	return time.Duration(utime+stime) * time.Second / clockTicks
}

package e2e

import (
	"context"
	"fmt"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/Tahul/caddy-zidane-mcp/internal/hostile"
)

// hostileRSSBound is what caddy's resident memory must stay under while a
// hostile upstream tries every way it has to make it hold an answer,
// through every route, with the default max_response (16 MiB) and
// max_inflight_response (256 MiB). Before answers were bounded, one endless
// event took caddy from 67 MB to a 954 MB peak.
const hostileRSSBound = 400 << 20

// TestHostileUpstream puts an upstream that answers tools/call with
// endless events, huge lines, huge JSON, floods of small events and
// never-ending bodies behind the aggregated route (first call, on go-sdk,
// and later calls, on the fast path), the pass-through route and guard
// mode (with reverse_proxy, and with an upstream of its own). Every hostile call fails with an error that names the limit; caddy's
// RSS stays under hostileRSSBound throughout; and another client's calls
// keep succeeding all along.
func TestHostileUpstream(t *testing.T) {
	hu := hostile.NewUpstream()
	hu.Max = 256 << 20
	up := httptest.NewServer(hu)
	t.Cleanup(up.Close)
	aggPort, brokerPort, guardPort, guardUpPort := freePort(t), freePort(t), freePort(t), freePort(t)
	c := startCaddy(t, fmt.Sprintf(`{
	admin %s
	zidane {
		upstream evil %s
	}
}

http://:%d {
	bind 127.0.0.1
	zidane_mcp {
		aggregate evil
		rate_limit {
			per_token 1000/s 1000
		}
	}
}

http://:%d {
	bind 127.0.0.1
	zidane_mcp {
		broker evil
		rate_limit {
			per_token 1000/s 1000
		}
	}
}

http://:%d {
	bind 127.0.0.1
	zidane_mcp {
		guard
		rate_limit {
			per_token 1000/s 1000
		}
	}
	reverse_proxy %s
}

http://:%d {
	bind 127.0.0.1
	zidane_mcp {
		guard {
			upstream %s
		}
		rate_limit {
			per_token 1000/s 1000
		}
	}
}
`, AdminPlaceholder, up.URL, aggPort, brokerPort, guardPort, strings.TrimPrefix(up.URL, "http://"), guardUpPort, up.URL))
	token := createToken(t, c, "attacker", "--scope", "upstream:evil", "--scope", "mcp")
	bystander := createToken(t, c, "bystander", "--scope", "upstream:evil")
	pid := c.proc.cmd.Process.Pid
	baseline := rss(t, pid)

	// RSS, sampled until the test ends.
	var peak atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				if v, err := rssOf(pid); err == nil && v > peak.Load() {
					peak.Store(v)
				}
			}
		}
	}()
	// The bystander calls the well-behaved tool all along, on a session of
	// its own.
	var served, failed atomic.Int64
	var firstFailure atomic.Value
	bs, err := connectGo(t, fmt.Sprintf("http://127.0.0.1:%d/mcp", aggPort), bearerClient(bystander, nil))
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			text := "call " + strconv.Itoa(i)
			res, err := bs.CallTool(ctx, &mcp.CallToolParams{Name: "mcp_evil_ok", Arguments: map[string]any{"text": text}})
			cancel()
			if err != nil || res.IsError || len(res.Content) == 0 || res.Content[0].(*mcp.TextContent).Text != text {
				failed.Add(1)
				firstFailure.CompareAndSwap(nil, fmt.Sprintf("%v %+v", err, res))
				continue
			}
			served.Add(1)
		}
	}()

	routes := []struct {
		name, url, prefix string
		warm              bool
	}{
		{"aggregate, first call", fmt.Sprintf("http://127.0.0.1:%d/mcp", aggPort), "mcp_evil_", false},
		{"aggregate, fast path", fmt.Sprintf("http://127.0.0.1:%d/mcp", aggPort), "mcp_evil_", true},
		{"pass-through", fmt.Sprintf("http://127.0.0.1:%d/mcp", brokerPort), "", false},
		{"guard", fmt.Sprintf("http://127.0.0.1:%d/mcp", guardPort), "", false},
		{"guard upstream", fmt.Sprintf("http://127.0.0.1:%d/mcp", guardUpPort), "", false},
	}
	for _, rt := range routes {
		for _, attack := range hostile.Attacks {
			t.Run(rt.name+"/"+attack, func(t *testing.T) {
				before := served.Load()
				cs, err := connectGo(t, rt.url, bearerClient(token, nil))
				if err != nil {
					t.Fatal(err)
				}
				ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
				defer cancel()
				if rt.warm {
					if _, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: rt.prefix + hostile.OKTool, Arguments: map[string]any{"text": "warm"}}); err != nil {
						t.Fatal(err)
					}
				}
				res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: rt.prefix + attack})
				var what string
				switch {
				case err != nil:
					what = err.Error()
				case res.IsError:
					for _, ct := range res.Content {
						if tc, ok := ct.(*mcp.TextContent); ok {
							what += tc.Text
						}
					}
				default:
					t.Fatalf("%s through %s: the call succeeded", attack, rt.name)
				}
				if !strings.Contains(what, "max_response") {
					t.Errorf("%s through %s failed with %q; want the error naming max_response", attack, rt.name, what)
				}
				if ctx.Err() != nil {
					t.Fatalf("%s through %s: the call hung", attack, rt.name)
				}
				// The bystander was served while the attack ran, or is now.
				waitFor(t, 20*time.Second, func() bool { return served.Load() > before })
			})
		}
	}
	close(stop)
	wg.Wait()
	t.Logf("caddy RSS: %d MiB before, %d MiB peak during the attacks (bound %d MiB); hostile bytes sent %d MiB; bystander calls: %d served, %d failed",
		baseline>>20, peak.Load()>>20, hostileRSSBound>>20, hu.Sent.Load()>>20, served.Load(), failed.Load())
	if p := peak.Load(); p > hostileRSSBound {
		t.Errorf("caddy's RSS peaked at %d MiB, over the bound of %d MiB", p>>20, hostileRSSBound>>20)
	}
	if n := failed.Load(); n > 0 {
		t.Errorf("%d of the bystander's calls failed during the attacks; first: %v", n, firstFailure.Load())
	}
}

func rss(t *testing.T, pid int) int64 {
	t.Helper()
	v, err := rssOf(pid)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// rssOf reads a process's resident set size from /proc.
func rssOf(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no VmRSS for pid %d", pid)
}

// waitFor polls cond until it holds, failing the test after timeout.
func waitFor(t *testing.T, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within %v", timeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

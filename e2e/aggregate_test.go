package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// aggregateCaddyfile serves `aggregate` over the go-sdk everything-server
// (as go) and the TypeScript reference server (as ts_ref: its name has an
// underscore), on site port. (One upstream in conditional prefix mode is
// run through the conformance suite by TestConformanceServerRoutes.)
func aggregateCaddyfile(port int, goURL, tsURL string) string {
	return fmt.Sprintf(`{
	admin %s
	zidane {
		upstream go %s
		upstream ts_ref %s
	}
}

http://:%d {
	bind 127.0.0.1
	zidane_mcp {
		aggregate go ts_ref
		rate_limit {
			per_token 1000/s 1000
		}
	}
}
`, AdminPlaceholder, goURL, tsURL, port)
}

func TestAggregatedRoute(t *testing.T) {
	goURL := startEverythingServer(t)
	tsURL := startNodeEverythingServer(t)
	port := freePort(t)
	c := startCaddy(t, aggregateCaddyfile(port, goURL, tsURL))
	both := createToken(t, c, "both", "--scope", "upstream:go", "--scope", "upstream:ts_ref")
	goOnly := createToken(t, c, "go-only", "--scope", "upstream:go")
	url := fmt.Sprintf("http://127.0.0.1:%d/mcp", port)

	t.Run("tools of both upstreams, namespaced, and calls routed", func(t *testing.T) {
		cs, err := connectGo(t, url, bearerClient(both, nil))
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		tools, err := cs.ListTools(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		names := toolNamesOf(tools)
		if !slices.Contains(names, "mcp_go_test_simple_text") || !slices.Contains(names, "mcp_ts_ref_echo") {
			t.Fatalf("aggregated tools = %v", names)
		}
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "mcp_go_test_simple_text"})
		if err != nil || res.IsError {
			t.Fatalf("go tool: %+v %v", res, err)
		}
		res, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: "mcp_ts_ref_echo", Arguments: map[string]any{"message": "through the aggregate"}})
		if err != nil || res.IsError || !strings.Contains(fmt.Sprint(res.Content[0].(*mcp.TextContent).Text), "through the aggregate") {
			t.Fatalf("ts tool: %+v %v", res, err)
		}
	})

	t.Run("scopes choose upstreams", func(t *testing.T) {
		cs, err := connectGo(t, url, bearerClient(goOnly, nil))
		if err != nil {
			t.Fatal(err)
		}
		tools, err := cs.ListTools(context.Background(), nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range toolNamesOf(tools) {
			if strings.HasPrefix(n, "mcp_ts_ref_") {
				t.Fatalf("a token without upstream:ts_ref lists %s", n)
			}
		}
		a := post(t, url, goOnly, toolCallBody("mcp_ts_ref_echo"))
		if a.status != http.StatusForbidden || !strings.Contains(a.header.Get("WWW-Authenticate"), `scope="upstream:ts_ref"`) {
			t.Fatalf("%d %q %s", a.status, a.header.Get("WWW-Authenticate"), a.body)
		}
	})

	t.Run("calls are audited", func(t *testing.T) {
		found := false
		for _, l := range auditLines(c) {
			found = found || (l["event"] == "upstream_call" && l["route"] == "aggregate")
		}
		if !found {
			t.Fatal("no upstream_call audit line for the aggregated route")
		}
	})
}

// A stdio upstream (the go-sdk everything-server on stdin/stdout) beside an
// HTTP one on the aggregated route, through the built binary.
func TestAggregatedRouteWithAStdioUpstream(t *testing.T) {
	goURL := startEverythingServer(t)
	port := freePort(t)
	c := startCaddy(t, fmt.Sprintf(`{
	admin %s
	zidane {
		upstream remote %s
		upstream local {
			command %s
		}
	}
}

http://:%d {
	bind 127.0.0.1
	zidane_mcp {
		aggregate remote local
		rate_limit {
			per_token 1000/s 1000
		}
	}
}
`, AdminPlaceholder, goURL, everythingServerBin, port))
	token := createToken(t, c, "agent", "--scope", "mcp")
	cs, err := connectGo(t, fmt.Sprintf("http://127.0.0.1:%d/mcp", port), bearerClient(token, nil))
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"mcp_remote_test_simple_text", "mcp_local_test_simple_text"} {
		res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: name})
		if err != nil || res.IsError {
			t.Fatalf("%s: %+v %v", name, res, err)
		}
	}
	// A second client shares the one pooled stdio process.
	cs2, err := connectGo(t, fmt.Sprintf("http://127.0.0.1:%d/mcp", port), bearerClient(token, nil))
	if err != nil {
		t.Fatal(err)
	}
	if res, err := cs2.CallTool(context.Background(), &mcp.CallToolParams{Name: "mcp_local_test_simple_text"}); err != nil || res.IsError {
		t.Fatalf("second client: %+v %v", res, err)
	}
	stdio := 0
	for _, pid := range childPIDs(t, c) {
		if exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid)); err == nil && exe == everythingServerBin {
			stdio++
		}
	}
	if stdio != 1 {
		t.Fatalf("%d stdio server processes for two clients, want one shared process", stdio)
	}
	pidFiles, _ := filepath.Glob(filepath.Join(c.DataDir, "zidane", "stdio", "local-*.pid"))
	if len(pidFiles) != 1 {
		t.Fatalf("pid files of the stdio upstream: %v, want one under the data dir", pidFiles)
	}
	// Restarting the upstream gives it a new process; clients keep calling.
	before := pidFiles[0]
	if out, stderr, err := c.Run(t, "zidane", "upstream", "restart", "local"); err != nil || !strings.Contains(out, "Restarted upstream") {
		t.Fatalf("upstream restart: %v %s\n%s", err, stderr, out)
	}
	if res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "mcp_local_test_simple_text"}); err != nil || res.IsError {
		t.Fatalf("after restart: %+v %v", res, err)
	}
	after, _ := filepath.Glob(filepath.Join(c.DataDir, "zidane", "stdio", "local-*.pid"))
	if len(after) != 1 || after[0] == before {
		t.Fatalf("pid files before %s, after %v: want one new process", before, after)
	}
	if _, _, err := c.Run(t, "zidane", "upstream", "restart", "nosuch"); err == nil {
		t.Fatal("restarting an unknown upstream succeeded")
	}
	// Retiring it ends the process and its pid file; the next call starts
	// one again.
	if out, stderr, err := c.Run(t, "zidane", "upstream", "retire", "local"); err != nil || !strings.Contains(out, "Retired upstream") {
		t.Fatalf("upstream retire: %v %s\n%s", err, stderr, out)
	}
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		left, _ := filepath.Glob(filepath.Join(c.DataDir, "zidane", "stdio", "local-*.pid"))
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pid files after retire: %v, want none", left)
		}
	}
	if res, err := cs2.CallTool(context.Background(), &mcp.CallToolParams{Name: "mcp_local_test_simple_text"}); err != nil || res.IsError {
		t.Fatalf("after retire: %+v %v", res, err)
	}
	if again, _ := filepath.Glob(filepath.Join(c.DataDir, "zidane", "stdio", "local-*.pid")); len(again) != 1 {
		t.Fatalf("pid files after a call on the retired upstream: %v, want one", again)
	}
	// The listing shows the stdio upstream's transport.
	if out, _, err := c.Run(t, "zidane", "upstream", "list"); err != nil || !strings.Contains(out, "stdio") {
		t.Fatalf("upstream list: %v\n%s", err, out)
	}
}

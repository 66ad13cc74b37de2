package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// The server runs of the MCP conformance suite (0.2.0-alpha.12) that every
// route must pass as the upstream passes them directly, each against the
// upstream that passes it.
var conformanceRuns = []struct {
	name     string   // what the run checks
	args     []string // the suite's arguments
	upstream string   // a key of conformanceUpstreams
}{
	// Exactly what MCP 2026-07-28 requires, and the extensions (tasks-*)
	// the suite runs with it unscored. go-sdk v1.8.0's server has no
	// Tasks extension, so those fail directly and are not compared here.
	{"2026-07-28", []string{"--requirements", "2026-07-28"}, "stateless"},
	// The same against e2e/tasksserver, which speaks the Tasks extension
	// (SEP-2663): every tasks-* scenario must pass directly (see
	// tasksScenarios), and so through every route.
	{"2026-07-28, Tasks", []string{"--requirements", "2026-07-28"}, "tasks"},
	// 2025-11-25's scenarios, whose sampling and elicitation need a
	// session to carry the server's requests.
	{"2025-11-25", []string{"--spec-version", "2025-11-25"}, "stateful"},
}

// conformanceUpstreams are the servers behind the routes: go-sdk's
// everything-server in its two modes, and the Tasks server.
var conformanceUpstreams = map[string]func(testing.TB) string{
	"stateless": startStatelessEverythingServer,
	"stateful":  startEverythingServer,
	"tasks":     func(t testing.TB) string { return startTasksServer(t) },
}

// conformanceRoute is one way the gateway serves an upstream.
type conformanceRoute struct {
	name  string
	ports map[string]int // upstream -> site port; the egress route's site serves both
	path  func(up string) string
	token string
}

// TestConformanceServerRoutes runs the conformance suite's server
// scenarios directly against go-sdk's everything-server and, in the same
// run, through every route of the gateway: guard in front of
// reverse_proxy, guard { upstream }, broker pass-through, aggregate (one
// upstream, prefix conditional) and a session's egress (its agent's own
// token, on the sessions endpoint's /zidane/upstream/<name>/mcp). The suite
// sends no token: the harness's authProxy adds each route's. A scenario
// that passes directly must pass through every route; the test prints,
// route by route, each scenario that does not, with its failed checks.
// The harness's proxy alone in front of the upstream is compared too, so a
// failure of the proxy is not taken for the gateway's.
func TestConformanceServerRoutes(t *testing.T) {
	upstreams := map[string]string{}
	var names []string
	for _, run := range conformanceRuns {
		if _, ok := upstreams[run.upstream]; !ok {
			upstreams[run.upstream] = conformanceUpstreams[run.upstream](t)
			names = append(names, run.upstream)
		}
	}
	slices.Sort(names)

	routes := []*conformanceRoute{
		{name: "guard + reverse_proxy"},
		{name: "guard { upstream }"},
		{name: "broker"},
		{name: "aggregate (prefix conditional)"},
	}
	for _, r := range routes {
		r.ports = map[string]int{}
		for _, up := range names {
			r.ports[up] = freePort(t)
		}
		r.path = func(string) string { return "/mcp" }
	}
	egress := &conformanceRoute{name: "session egress", ports: map[string]int{}, path: func(up string) string { return "/zidane/upstream/" + up + "/mcp" }}
	sessionsPort := freePort(t)
	for _, up := range names {
		egress.ports[up] = sessionsPort
	}

	var sites, ups strings.Builder
	const limit = "\t\trate_limit {\n\t\t\tper_token 1000/s 1000\n\t\t}\n"
	for _, up := range names {
		addr := strings.TrimSuffix(strings.TrimPrefix(upstreams[up], "http://"), "/mcp")
		fmt.Fprintf(&ups, "\t\tupstream %s %s\n", up, upstreams[up])
		// Each guard site keeps what it learns of its server under its own
		// resource.
		fmt.Fprintf(&sites, "http://:%[1]d {\n\tbind 127.0.0.1\n\tzidane_mcp {\n\t\tguard\n\t\tresource http://127.0.0.1:%[1]d/mcp\n%s\t}\n\treverse_proxy %s\n}\n", routes[0].ports[up], limit, addr)
		fmt.Fprintf(&sites, "http://:%[1]d {\n\tbind 127.0.0.1\n\tzidane_mcp {\n\t\tguard {\n\t\t\tupstream %[2]s\n\t\t}\n\t\tresource http://127.0.0.1:%[1]d/mcp\n%[3]s\t}\n}\n", routes[1].ports[up], upstreams[up], limit)
		fmt.Fprintf(&sites, "http://:%d {\n\tbind 127.0.0.1\n\tzidane_mcp {\n\t\tbroker %s\n%s\t}\n}\n", routes[2].ports[up], up, limit)
		fmt.Fprintf(&sites, "http://:%d {\n\tbind 127.0.0.1\n\tzidane_mcp {\n\t\taggregate %s\n\t\tprefix conditional\n%s\t}\n}\n", routes[3].ports[up], up, limit)
	}
	// The session's agent is the demo agent behind a tee that keeps what
	// the gateway tells it over ACP in the session's directory, where the
	// test reads the egress token its session/new carries.
	agent := fmt.Sprintf(`		agent tapped {
			command /bin/sh -c "tee acp-in.jsonl | exec %s zidane demo-agent"
			sandbox {
				read %s
			}
		}
		default_agent tapped
		session_upstreams %s
`, caddyBin, filepath.Dir(caddyBin), strings.Join(names, " "))
	fmt.Fprintf(&sites, "http://:%d {\n\tbind 127.0.0.1\n\tzidane_mcp {\n\t\tsessions\n%s\t}\n}\n", sessionsPort, limit)
	c := startCaddy(t, fmt.Sprintf("{\n\tadmin %s\n\tzidane {\n%s%s\t}\n}\n\n%s", AdminPlaceholder, ups.String(), agent, sites.String()))

	routes[0].token = createToken(t, c, "guard", "--scope", "mcp")
	routes[1].token = routes[0].token
	scopes := []string{}
	for _, up := range names {
		scopes = append(scopes, "--scope", "upstream:"+up)
	}
	routes[2].token = createToken(t, c, "broker", scopes...)
	routes[3].token = routes[2].token
	egress.token = sessionEgressToken(t, c, sessionsPort)
	routes = append(routes, egress)

	for _, run := range conformanceRuns {
		t.Run(run.name, func(t *testing.T) {
			start := time.Now()
			direct := runConformance(t, upstreams[run.upstream], run.args...)
			t.Logf("%s direct: %d scenarios pass (%d checks passed, %d failed) in %s",
				run.name, countPassed(direct), direct.passed, direct.failed, time.Since(start).Round(time.Millisecond))
			if countPassed(direct) == 0 {
				t.Fatalf("no scenario passes directly:\n%s", tail(direct.output, logDumpLimit))
			}
			if run.upstream == "tasks" {
				// A fixture that broke would pass nothing to compare.
				for _, s := range tasksScenarios {
					if _, ran := direct.scenarios[s]; ran && !direct.scenarios[s] {
						t.Fatalf("%s fails directly against e2e/tasksserver:\n%s", s, strings.Join(direct.failedChecks(s), "\n"))
					}
				}
			}
			compared := append([]*conformanceRoute{{name: "the harness's proxy alone"}}, routes...)
			for _, r := range compared {
				url := upstreams[run.upstream]
				if r.ports != nil {
					url = fmt.Sprintf("http://127.0.0.1:%d%s", r.ports[run.upstream], r.path(run.upstream))
				}
				header := http.Header{}
				if r.token != "" {
					header.Set("Authorization", "Bearer "+r.token)
				}
				start := time.Now()
				got := runConformance(t, authProxy(t, url, header), run.args...)
				var lost []string
				for scenario, ok := range direct.scenarios {
					if ok && !got.scenarios[scenario] {
						lost = append(lost, scenario)
					}
				}
				slices.Sort(lost)
				t.Logf("%s through %s: %d scenarios pass (%d checks passed, %d failed) in %s",
					run.name, r.name, countPassed(got), got.passed, got.failed, time.Since(start).Round(time.Millisecond))
				if len(lost) > 0 {
					var b strings.Builder
					for _, scenario := range lost {
						fmt.Fprintf(&b, "  %s\n", scenario)
						for _, check := range got.failedChecks(scenario) {
							fmt.Fprintf(&b, "    %s\n", check)
						}
					}
					t.Errorf("%s: %d scenarios pass directly but not through %s:\n%s", run.name, len(lost), r.name, b.String())
				}
			}
		})
	}
}

// countPassed is how many scenarios of r passed.
func countPassed(r conformanceResult) int {
	n := 0
	for _, ok := range r.scenarios {
		if ok {
			n++
		}
	}
	return n
}

// sessionEgressToken creates a session on the sessions endpoint at port
// (whose agent tees its ACP input to acp-in.jsonl in the session's
// directory) and returns the egress token the gateway gave its agent for
// its upstreams.
func sessionEgressToken(t *testing.T, c *Caddy, port int) string {
	t.Helper()
	token := createToken(t, c, "session-owner", "--scope", "chat")
	g := connectGoSessions(t, fmt.Sprintf("http://127.0.0.1:%d/mcp", port), token, "go-sdk")
	cwd := t.TempDir()
	createSession(t, g, cwd, "hello")
	deadline := time.Now().Add(startTimeout)
	for {
		if secret := egressTokenIn(t, filepath.Join(cwd, "acp-in.jsonl")); secret != "" {
			return secret
		}
		if time.Now().After(deadline) {
			t.Fatalf("the agent's session/new carried no egress token within %s", startTimeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// egressTokenIn reads the bearer token of the MCP servers a session/new in
// the ACP messages of file gives the agent; "" while there is none.
func egressTokenIn(t *testing.T, file string) string {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var msg struct {
			Method string `json:"method"`
			Params struct {
				McpServers []struct {
					Headers []struct{ Name, Value string } `json:"headers"`
				} `json:"mcpServers"`
			} `json:"params"`
		}
		if json.Unmarshal(sc.Bytes(), &msg) != nil || msg.Method != "session/new" {
			continue
		}
		for _, s := range msg.Params.McpServers {
			for _, h := range s.Headers {
				if secret, ok := strings.CutPrefix(h.Value, "Bearer "); ok && h.Name == "Authorization" {
					return secret
				}
			}
		}
	}
	return ""
}

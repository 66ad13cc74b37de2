package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// scrapeMetrics reads the admin API's /metrics as series name{labels} ->
// value, and returns the raw text too.
func scrapeMetrics(t *testing.T, c *Caddy) (map[string]float64, string) {
	t.Helper()
	resp, err := shortClient.Get(c.AdminURL("/metrics"))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	series := map[string]float64{}
	for line := range strings.Lines(string(b)) {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("metrics line %q: %v", line, err)
		}
		series[line[:i]] = v
	}
	return series, string(b)
}

// accessLines reads the JSON lines of an access log file.
func accessLines(t *testing.T, path string) []map[string]any {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []map[string]any
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var l map[string]any
		if json.Unmarshal(sc.Bytes(), &l) == nil {
			out = append(out, l)
		}
	}
	return out
}

// The metrics are named as Caddy names its own (caddy_zidane_*), carry
// only labels of bounded sets (never a token's name or id), time the calls
// sent upstream by upstream, route and outcome, and count open sessions
// and running agents; Caddy's access log names who each request acted
// for.
func TestMetricsAndAccessLog(t *testing.T) {
	upstream := startEverythingServer(t)
	brokerPort, sessionsPort := freePort(t), freePort(t)
	accessLog := filepath.Join(t.TempDir(), "access.log")
	c := startCaddy(t, fmt.Sprintf(`{
	admin %s
	zidane {
		upstream everything %s
	}
}

http://127.0.0.1:%d {
	log {
		output file %s
		format json
	}
	zidane_mcp {
		broker everything
	}
}

http://127.0.0.1:%d {
	zidane_mcp {
		sessions
	}
}
`, AdminPlaceholder, upstream, brokerPort, accessLog, sessionsPort))

	// Names and owners no metric may carry.
	const brokerName, machineName, sessionsName, owner = "metrics-name-5c1e", "metrics-name-e4d2", "metrics-name-9a07", "owner-3b6d@example.com"
	brokerToken := createToken(t, c, brokerName, "--scope", "upstream:everything", "--owner", owner)
	machineToken := createToken(t, c, machineName, "--scope", "upstream:everything", "--machine")
	sessionsToken := createToken(t, c, sessionsName, "--scope", "chat")
	brokerURL := fmt.Sprintf("http://127.0.0.1:%d/mcp", brokerPort)

	cs, err := connectGo(t, brokerURL, bearerClient(brokerToken, nil))
	if err != nil {
		t.Fatal(err)
	}
	if res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "test_simple_text"}); err != nil || res.IsError {
		t.Fatalf("call through the broker: %+v %v", res, err)
	}
	if a := post(t, brokerURL, machineToken, initializeBody); a.status != 200 {
		t.Fatalf("machine token: %d %s", a.status, a.body)
	}
	if a := post(t, brokerURL, "", initializeBody); a.status != 401 {
		t.Fatalf("no token: %d %s", a.status, a.body)
	}
	g := connectGoSessions(t, fmt.Sprintf("http://127.0.0.1:%d/mcp", sessionsPort), sessionsToken, "metrics")
	created := createSession(t, g, t.TempDir(), "hello")

	// The session's agent is launched in the background: wait until the
	// gauges see it, as a dashboard would.
	var series map[string]float64
	var text string
	deadline := time.Now().Add(30 * time.Second)
	for {
		series, text = scrapeMetrics(t, c)
		if series["caddy_zidane_agents_running"] >= 1 || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	for name, min := range map[string]float64{
		`caddy_zidane_requests_total{decision="allowed"}`:                                                      1,
		`caddy_zidane_requests_total{decision="refused"}`:                                                      1,
		`caddy_zidane_refusals_total{reason="no_token"}`:                                                       1,
		`caddy_zidane_credential_requests_total{credential="token",kind="user"}`:                               1,
		`caddy_zidane_credential_requests_total{credential="token",kind="machine"}`:                            1,
		`caddy_zidane_upstream_call_duration_seconds_count{outcome="ok",route="broker",upstream="everything"}`: 1,
		`caddy_zidane_sessions_open`:                                                                           1,
		`caddy_zidane_agents_running`:                                                                          1,
	} {
		if got, ok := series[name]; !ok || got < min {
			t.Errorf("metrics: %s = %v (present %v), want at least %v", name, got, ok, min)
		}
	}
	if _, ok := series[`caddy_zidane_upstream_call_duration_seconds_bucket{outcome="ok",route="broker",upstream="everything",le="+Inf"}`]; !ok {
		t.Errorf("metrics: the upstream call histogram has no +Inf bucket for everything")
	}
	for name := range series {
		if strings.HasPrefix(name, "zidane_mcp_") {
			t.Errorf("metrics: old name %s is still served", name)
		}
	}
	ids := tokenIDs(t, c)
	for _, never := range append([]string{brokerName, machineName, sessionsName, owner, brokerToken, machineToken, sessionsToken, created.SessionID}, ids...) {
		if strings.Contains(text, never) {
			t.Errorf("metrics name %q, a token's name, id, owner, secret or a session id", never)
		}
	}

	// Caddy writes the access log line as the request ends.
	// A token with no --owner is its own owner: its id names it.
	allowed := map[string]bool{owner: true, "": true}
	for _, id := range ids {
		allowed[id] = true
	}
	want := map[string]bool{owner: false, "": false}
	deadline = time.Now().Add(10 * time.Second)
	for (!want[owner] || !want[""]) && time.Now().Before(deadline) {
		for _, l := range accessLines(t, accessLog) {
			id, ok := l["user_id"].(string)
			if !ok {
				t.Fatalf("access log line without user_id: %v", l)
			}
			if !allowed[id] {
				t.Fatalf("access log user_id %q: want a token's owner (%q, or a token id), or none for a refused request", id, owner)
			}
			if _, tracked := want[id]; tracked {
				want[id] = true
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	if !want[owner] {
		t.Errorf("no access log line names the owner %q in user_id:\n%s", owner, readFileString(accessLog))
	}
	if !want[""] {
		t.Errorf("no access log line for the request without a token (user_id empty):\n%s", readFileString(accessLog))
	}
}

// tokenIDs lists the ids of the tokens in c's store.
func tokenIDs(t *testing.T, c *Caddy) []string {
	t.Helper()
	stdout, stderr, err := c.Run(t, "zidane", "token", "list", "--json")
	if err != nil {
		t.Fatalf("token list: %v\n%s", err, stderr)
	}
	var tokens []struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal([]byte(stdout), &tokens); err != nil {
		t.Fatalf("token list --json: %v\n%s", err, stdout)
	}
	var ids []string
	for _, tk := range tokens {
		if tk.ID == "" {
			t.Fatalf("token list --json gave a token without an id:\n%s", stdout)
		}
		ids = append(ids, tk.ID)
	}
	return ids
}

func readFileString(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	return string(b)
}

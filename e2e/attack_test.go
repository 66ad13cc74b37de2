package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/Tahul/caddy-zidane-mcp/internal/hostile"
)

// TestAttackOneReading sends the hostile bodies of internal/hostile to
// every route of the built binary, each with a token that may make the
// target's Allowed call and none of its Forbidden ones, and checks the
// edge's answer, its audit line, and what ran behind it:
//
//   - the sessions endpoint with a `read` token, where create must never
//     start a session;
//   - guard mode in front of the go-sdk conformance everything-server and of
//     the TypeScript server-everything, with a token for one tool; a proxy
//     between the guard and each server reads every forwarded body as the
//     server's SDK does and records the calls in it;
//   - the pass-through route (`broker a`) and the aggregated route
//     (`aggregate a b`) over two go-sdk servers in this process that count
//     every call they run, with a token for upstream b only.
//
// Afterwards legitimate calls still work through the SDK clients, and the
// observers are shown to see a call when one does run.
func TestAttackOneReading(t *testing.T) {
	goServer := startCallRecorder(t, startEverythingServer(t), false)
	tsServer := startCallRecorder(t, startNodeEverythingServer(t), true)
	upA, upB := startCountingUpstream(t, "a"), startCountingUpstream(t, "b")
	ports := attackPorts{sessions: freePort(t), guardGo: freePort(t), guardTS: freePort(t), broker: freePort(t), aggregate: freePort(t),
		guardGoUp: freePort(t), guardTSUp: freePort(t), guardRules: freePort(t)}
	c := startCaddy(t, attackCaddyfile(ports, goServer, tsServer, upA, upB))
	reader := createToken(t, c, "reader", "--scope", "read")
	owner := createToken(t, c, "owner", "--scope", "chat")
	simple := createToken(t, c, "simple", "--scope", "simple")
	onlyB := createToken(t, c, "only-b", "--scope", "upstream:b")
	onlyA := createToken(t, c, "only-a", "--scope", "upstream:a")
	full := createToken(t, c, "full", "--scope", "mcp")
	cwd := t.TempDir()
	aggURL := ports.url(ports.aggregate)
	waitForAggregate(t, aggURL, full, "mcp_a_tool_a", "mcp_b_tool_b")

	targets := attackTargets(ports, cwd, reader, simple, onlyB, goServer, tsServer)
	want := map[string]int{} // refusals the cases expect, by reason
	before := refusalsByReason(c)
	for _, tg := range targets {
		t.Run(tg.name, func(t *testing.T) {
			for reason, n := range tg.attack(t) {
				want[reason] += n
			}
		})
	}

	t.Run("every refusal is audited once", func(t *testing.T) {
		var got map[string]int
		deadline := time.Now().Add(5 * time.Second)
		for {
			got = subtractCounts(refusalsByReason(c), before)
			if mapsEqual(got, want) || time.Now().After(deadline) {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		for _, reason := range unionKeys(got, want) {
			if got[reason] != want[reason] {
				t.Errorf("audit lines with event refused and reason %q: %d, want %d (one per case)", reason, got[reason], want[reason])
			}
		}
	})

	t.Run("ids are compared as values", func(t *testing.T) {
		for _, tg := range targets {
			if tg.lists == "" {
				continue
			}
			sid := tg.openSession(t)
			defer tg.closeSession(sid)
			list := func(id string) rawAnswer {
				return tg.send(t, hostile.Case{Body: hostile.Request(id, hostile.Call{Method: "tools/list"})}, sid)
			}
			a := list("7")
			if tg.listForbidden {
				if a.status != http.StatusForbidden {
					t.Errorf("%s: tools/list without the upstream's scope: %d %s", tg.name, a.status, clip(a.body))
				}
			} else if a.status != http.StatusOK || !strings.Contains(a.body, tg.lists) {
				t.Errorf("%s: tools/list with id 7: %d %s, want the token's own tool %s", tg.name, a.status, clip(a.body), tg.lists)
			}
			tg.assertHidden(t, "tools/list with id 7", a)
			for _, id := range []string{"7.0", "1e0"} {
				a := list(id)
				if a.status != http.StatusBadRequest {
					t.Errorf("%s: tools/list with id %s: %d, want 400", tg.name, id, a.status)
				}
				for _, name := range tg.hidden {
					if strings.Contains(a.body, name) {
						t.Errorf("BYPASS: %s: tools/list with id %s returned the unfiltered list (%q)", tg.name, id, name)
						break
					}
				}
			}
		}
	})

	t.Run("legitimate calls still work", func(t *testing.T) {
		legitimateCalls(t, ports, reader, simple, onlyB)
	})

	t.Run("nothing forbidden ran", func(t *testing.T) {
		var list listView
		sessionsCall(t, connectGoSessions(t, ports.url(ports.sessions), owner, "owner"), "list", nil).decode(t, &list)
		if len(list.Sessions) != 0 {
			var titles []string
			for _, s := range list.Sessions {
				titles = append(titles, fmt.Sprintf("%s %q", s.SessionID, s.Title))
			}
			t.Errorf("BYPASS: %d sessions exist after the attacks, started with the read token: %v", len(list.Sessions), titles)
		}
		if strings.Contains(c.Logs(), "agent running") {
			t.Error("BYPASS: an agent ran: caddy logged \"agent running\"")
		}
		if entries, _ := os.ReadDir(filepath.Join(c.DataDir, "zidane", "sessions")); len(entries) != 0 {
			t.Errorf("BYPASS: storage holds %d sessions", len(entries))
		}
		for _, tg := range targets {
			if tg.recorder == nil {
				continue
			}
			for _, f := range tg.target.Forbidden {
				if n, body := tg.recorder.count(f.Method, subjectOf(f)); n > 0 {
					t.Errorf("BYPASS: %s: the server was sent %s %s %d times, read as its SDK reads a body; the first: %s",
						tg.name, f.Method, subjectOf(f), n, clip(body))
				}
			}
		}
		if ran := upA.snapshot(); len(ran) != 0 {
			t.Errorf("BYPASS: upstream a, which the token may not use, ran %v", ran)
		}
	})

	t.Run("the observers see a call that runs", func(t *testing.T) {
		o := connectGoSessions(t, ports.url(ports.sessions), owner, "owner")
		id := createSession(t, o, cwd, "ready").SessionID
		settleIn(t, o, id, "idle")
		var list listView
		sessionsCall(t, o, "list", nil).decode(t, &list)
		if !slices.ContainsFunc(list.Sessions, func(s sessionView) bool { return s.SessionID == id }) {
			t.Errorf("the owner's session %s is not listed", id)
		}
		c.WaitForLog(t, "agent running", 30*time.Second)
		for _, tg := range targets {
			if tg.recorder == nil {
				continue
			}
			if n, _ := tg.recorder.count(tg.target.Allowed.Method, subjectOf(tg.target.Allowed)); n == 0 {
				t.Errorf("%s: the recorder saw no %s %s, which the legitimate clients made", tg.name, tg.target.Allowed.Method, subjectOf(tg.target.Allowed))
			}
		}
		cs, err := connectGo(t, aggURL, bearerClient(onlyA, nil))
		if err != nil {
			t.Fatal(err)
		}
		ranBefore := upA.snapshot()["tools/call tool_a"]
		if _, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "mcp_a_tool_a", Arguments: map[string]any{"text": "hi"}}); err != nil {
			t.Fatal(err)
		}
		if got := upA.snapshot()["tools/call tool_a"]; got != ranBefore+1 {
			t.Errorf("upstream a counted %d calls of tool_a, %d before one more", got, ranBefore)
		}
		if got := upB.snapshot(); got["tools/call tool_b"] == 0 {
			t.Errorf("upstream b counted %v, after the legitimate calls of tool_b", got)
		}
	})
}

// attackPorts are the sites of the caddy under attack, one per route.
type attackPorts struct {
	sessions, guardGo, guardTS, broker, aggregate int
	guardGoUp, guardTSUp                          int // guard { upstream URL }, without reverse_proxy
	guardRules                                    int // guard { upstream URL } with a rule over an argument
}

func (p attackPorts) url(port int) string { return fmt.Sprintf("http://127.0.0.1:%d/mcp", port) }

func attackCaddyfile(p attackPorts, goServer, tsServer *callRecorder, a, b *countingUpstream) string {
	limits := "rate_limit {\n\t\t\tper_token 1000/s 1000\n\t\t}"
	return fmt.Sprintf(`{
	admin %s
	zidane {
		upstream a %s
		upstream b %s
	}
}

http://127.0.0.1:%d {
	zidane_mcp {
		sessions
		%s
	}
}

http://127.0.0.1:%d {
	zidane_mcp {
		guard
		resource http://127.0.0.1:%d/mcp
		scope simple tools test_simple_text
		%s
	}
	reverse_proxy %s
}

http://127.0.0.1:%d {
	zidane_mcp {
		guard
		resource http://127.0.0.1:%d/mcp
		scope simple tools echo
		%s
	}
	reverse_proxy %s
}

http://127.0.0.1:%d {
	zidane_mcp {
		guard {
			upstream http://%s/mcp
		}
		resource http://127.0.0.1:%d/mcp
		scope simple tools test_simple_text
		%s
	}
}

http://127.0.0.1:%d {
	zidane_mcp {
		guard {
			upstream http://%s/mcp
		}
		resource http://127.0.0.1:%d/mcp
		scope simple tools echo
		%s
	}
}

http://127.0.0.1:%d {
	zidane_mcp {
		guard {
			upstream http://%s/mcp
		}
		resource http://127.0.0.1:%d/mcp
		scope simple tools json_schema_2020_12_tool
		policy {
			deny "tool.name == 'json_schema_2020_12_tool' && args.name == 'production'" "the production name is off limits"
		}
		%s
	}
}

http://127.0.0.1:%d {
	zidane_mcp {
		broker a
		%s
	}
}

http://127.0.0.1:%d {
	zidane_mcp {
		aggregate a b
		%s
	}
}
`, AdminPlaceholder, a.url, b.url,
		p.sessions, limits,
		p.guardGo, p.guardGo, limits, goServer.addr,
		p.guardTS, p.guardTS, limits, tsServer.addr,
		p.guardGoUp, goServer.addr, p.guardGoUp, limits,
		p.guardTSUp, tsServer.addr, p.guardTSUp, limits,
		p.guardRules, goServer.addr, p.guardRules, limits,
		p.broker, limits,
		p.aggregate, limits)
}

// attackTarget is one route under attack.
type attackTarget struct {
	name   string
	url    string
	token  string
	target hostile.Target
	// markers are what the forbidden calls answer: never in any answer.
	markers []string
	// hidden are names of what the token may not use: never in an answer
	// that passed (a refusal may name what it refuses).
	hidden []string
	// lists is a tool the token's tools/list shows, "" where the id test
	// does not apply; listForbidden when tools/list is refused.
	lists         string
	listForbidden bool
	// recorder, when set, saw every body forwarded to the server.
	recorder *callRecorder
}

func attackTargets(p attackPorts, cwd, reader, simple, onlyB string, goServer, tsServer *callRecorder) []*attackTarget {
	create, _ := json.Marshal(map[string]any{"name": "sessions", "arguments": map[string]any{"verb": "create", "prompt": "hi", "cwd": cwd}})
	tool := func(name, args string) hostile.Call {
		return hostile.Call{Method: "tools/call", Params: fmt.Sprintf(`{"name":%q,"arguments":%s}`, name, args)}
	}
	read := func(uri string) hostile.Call {
		return hostile.Call{Method: "resources/read", Params: fmt.Sprintf(`{"uri":%q}`, uri)}
	}
	prompt := func(name string) hostile.Call {
		return hostile.Call{Method: "prompts/get", Params: fmt.Sprintf(`{"name":%q,"arguments":{"topic":"x"}}`, name)}
	}
	complete := func(promptName string) hostile.Call {
		return hostile.Call{Method: "completion/complete", Params: fmt.Sprintf(`{"ref":{"type":"ref/prompt","name":%q},"argument":{"name":"topic","value":"x"}}`, promptName)}
	}
	subscribe := func(uri string) hostile.Call {
		return hostile.Call{Method: "resources/subscribe", Params: fmt.Sprintf(`{"uri":%q}`, uri)}
	}
	upstreamA := []string{"RAN-TOOL-A", "CONTENT-OF-A", "PROMPT-OF-A", "COMPLETION-OF-A"}
	hiddenA := []string{"tool_a", "prompt_a", "test://a/"}
	targets := []*attackTarget{{
		name:  "sessions endpoint, read token",
		url:   p.url(p.sessions),
		token: reader,
		target: hostile.Target{
			Allowed:   tool("sessions", `{"verb":"list"}`),
			Forbidden: []hostile.Call{{Method: "tools/call", Params: string(create)}},
		},
		markers: []string{"Started session"},
	}, {
		name:  "guard, go-sdk everything-server",
		url:   p.url(p.guardGo),
		token: simple,
		target: hostile.Target{
			Allowed: tool("test_simple_text", "{}"),
			Forbidden: []hostile.Call{
				tool("test_embedded_resource", "{}"),
				tool("test_image_content", "{}"),
				read("test://static-text"),
				{Method: "prompts/get", Params: `{"name":"test_simple_prompt"}`},
			},
		},
		markers: []string{"This is an embedded resource", "iVBORw0KGgoAAAANSUhEUg",
			"This is the content of the static text resource.", "This is a simple prompt for testing."},
		hidden:   []string{"test_embedded_resource", "test_image_content", "test_audio_content"},
		lists:    "test_simple_text",
		recorder: goServer,
	}, {
		name:  "guard, TypeScript server-everything",
		url:   p.url(p.guardTS),
		token: simple,
		target: hostile.Target{
			Allowed: tool("echo", `{"message":"hi"}`),
			Forbidden: []hostile.Call{
				tool("get-sum", `{"a":40,"b":2}`),
				tool("get-env", "{}"),
				read("demo://resource/dynamic/text/1"),
				{Method: "prompts/get", Params: `{"name":"simple-prompt"}`},
			},
		},
		markers: []string{"The sum of 40 and 2 is 42", "NODE_PATH", "Resource 1: This is a plaintext resource",
			"This is a simple prompt without arguments."},
		hidden:   []string{"get-sum", "get-env"},
		lists:    "echo",
		recorder: tsServer,
	}, {
		name:  "pass-through route, token without the upstream",
		url:   p.url(p.broker),
		token: onlyB,
		target: hostile.Target{
			Allowed: hostile.Call{Method: "ping"},
			Forbidden: []hostile.Call{
				tool("tool_a", `{"text":"hi"}`),
				read("test://a/doc"),
				prompt("prompt_a"),
				complete("prompt_a"),
				subscribe("test://a/doc"),
				{Method: "tools/list"},
				{Method: "prompts/list"},
				{Method: "resources/list"},
				{Method: "resources/templates/list"},
			},
		},
		markers:       upstreamA,
		hidden:        hiddenA,
		lists:         "tool_a",
		listForbidden: true,
	}, {
		name:  "aggregated route, token for upstream b",
		url:   p.url(p.aggregate),
		token: onlyB,
		target: hostile.Target{
			Allowed: tool("mcp_b_tool_b", `{"text":"hi"}`),
			AlsoAllowed: []hostile.Call{
				read("test://b/doc"), prompt("mcp_b_prompt_b"), complete("mcp_b_prompt_b"), subscribe("test://b/doc"),
			},
			Forbidden: []hostile.Call{
				tool("mcp_a_tool_a", `{"text":"hi"}`),
				read("test://a/doc"),
				read("test://a/items/1"),
				prompt("mcp_a_prompt_a"),
				complete("mcp_a_prompt_a"),
				subscribe("test://a/doc"),
			},
		},
		markers: upstreamA,
		hidden:  hiddenA,
		lists:   "mcp_b_tool_b",
	}, {
		// A rule over an argument: the allowed call is the same tool
		// with another value, so every case smuggles the argument.
		name:  "guard rules, go-sdk everything-server",
		url:   p.url(p.guardRules),
		token: simple,
		target: hostile.Target{
			Allowed:         tool("json_schema_2020_12_tool", `{"name":"staging","email":"ops@example.com"}`),
			Forbidden:       []hostile.Call{tool("json_schema_2020_12_tool", `{"name":"production","email":"ops@example.com"}`)},
			ForbiddenReason: hostile.ReasonRule,
		},
		markers: []string{`\"name\":\"production\"`},
	}}
	// The guard with an upstream of its own, in front of the same two
	// servers: the same cases, through the broker's pass-through instead
	// of reverse_proxy.
	for i, port := range []int{p.guardGoUp, p.guardTSUp} {
		up := *targets[1+i]
		up.name = strings.Replace(up.name, "guard,", "guard upstream,", 1)
		up.url = p.url(port)
		targets = append(targets, &up)
	}
	return targets
}

// attack sends every case of tg and checks each answer. It returns the
// refusals the cases expect, by reason, for the audit check.
func (tg *attackTarget) attack(t *testing.T) map[string]int {
	cases := hostile.Cases(tg.target)
	t.Logf("%d cases", len(cases))
	want := map[string]int{}
	for _, c := range cases {
		if c.Reason != "" {
			want[c.Reason]++
		}
		t.Run(c.Name, func(t *testing.T) {
			sid := ""
			if !c.Standalone {
				sid = tg.openSession(t)
				defer tg.closeSession(sid)
			}
			a := tg.send(t, c, sid)
			for _, m := range tg.markers {
				if strings.Contains(a.body, m) {
					t.Errorf("BYPASS: the answer carries %q, what a forbidden call returns: %d %s", m, a.status, clip(a.body))
				}
			}
			tg.assertHidden(t, "the answer", a)
			if c.Status/100 == 2 {
				// The edge must pass the case on; what the server then
				// answers is its own business (go-sdk refuses a batch
				// under 2025-11-25, the TypeScript SDK an envelope with a
				// member it does not know).
				if a.rpc.Error.Data.Reason != "" {
					t.Errorf("the edge refused it (%d %s), want it passed on; answer %s", a.status, a.rpc.Error.Data.Reason, clip(a.body))
				} else if a.status/100 != 2 {
					t.Logf("passed on; the server answered %d %s", a.status, clip(a.body))
				}
				return
			}
			if a.status != c.Status {
				t.Errorf("status %d, want %d (%s); answer %s", a.status, c.Status, c.Reason, clip(a.body))
				return
			}
			if c.Reason != "" && a.rpc.Error.Data.Reason != c.Reason {
				t.Errorf("reason %q, want %q; answer %s", a.rpc.Error.Data.Reason, c.Reason, clip(a.body))
			}
			if c.Code != 0 && a.rpc.Error.Code != c.Code {
				t.Errorf("JSON-RPC code %d, want %d; answer %s", a.rpc.Error.Code, c.Code, clip(a.body))
			}
		})
	}
	return want
}

// assertHidden fails the test if an answer that passed names what the
// token may not use.
func (tg *attackTarget) assertHidden(t *testing.T, what string, a rawAnswer) {
	t.Helper()
	if a.status < 200 || a.status > 299 {
		return
	}
	for _, name := range tg.hidden {
		if strings.Contains(a.body, name) {
			t.Errorf("BYPASS: %s (%d) names %q, which the token may not use: %s", what, a.status, name, clip(a.body))
			return
		}
	}
}

// openSession initializes an MCP session on the route, as a client does
// before its first call, and returns its id.
func (tg *attackTarget) openSession(t *testing.T) string {
	t.Helper()
	a := post(t, tg.url, tg.token, initializeBody)
	sid := a.header.Get("Mcp-Session-Id")
	if a.status != http.StatusOK || sid == "" {
		t.Fatalf("initialize on %s: %d, session %q: %s", tg.name, a.status, sid, clip(a.body))
	}
	if a := post(t, tg.url, tg.token, `{"jsonrpc":"2.0","method":"notifications/initialized"}`,
		"Mcp-Session-Id", sid, "Mcp-Protocol-Version", "2025-11-25"); a.status/100 != 2 {
		t.Fatalf("notifications/initialized on %s: %d %s", tg.name, a.status, clip(a.body))
	}
	return sid
}

func (tg *attackTarget) closeSession(sid string) {
	req, err := http.NewRequest(http.MethodDelete, tg.url, nil)
	if err != nil {
		return
	}
	req.Header.Set("Authorization", "Bearer "+tg.token)
	req.Header.Set("Mcp-Session-Id", sid)
	req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
	if resp, err := shortClient.Do(req); err == nil {
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
}

// send sends case c raw, inside session sid unless sid is "".
func (tg *attackTarget) send(t *testing.T, c hostile.Case, sid string) rawAnswer {
	t.Helper()
	req, err := http.NewRequest(c.HTTPMethod(), tg.url, bytes.NewReader(c.Body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Authorization", "Bearer "+tg.token)
	if sid != "" {
		req.Header.Set("Mcp-Session-Id", sid)
		req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
	}
	for k, vs := range c.Header {
		req.Header[k] = vs
	}
	resp, err := shortClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", c.HTTPMethod(), tg.url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	a := rawAnswer{status: resp.StatusCode, header: resp.Header, body: string(b)}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		json.Unmarshal(b, &a.rpc)
	}
	return a
}

// clip shortens an answer for a failure message.
func clip(s string) string {
	const n = 300
	s = strings.TrimSpace(s)
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

// refusalsByReason counts the audit lines of refusals, by reason.
func refusalsByReason(c *Caddy) map[string]int {
	out := map[string]int{}
	for _, l := range auditLines(c) {
		if l["event"] == "refused" {
			out[fmt.Sprint(l["reason"])]++
		}
	}
	return out
}

func subtractCounts(a, b map[string]int) map[string]int {
	out := map[string]int{}
	for k, v := range a {
		if d := v - b[k]; d != 0 {
			out[k] = d
		}
	}
	return out
}

func mapsEqual(a, b map[string]int) bool {
	for _, k := range unionKeys(a, b) {
		if a[k] != b[k] {
			return false
		}
	}
	return true
}

func unionKeys(a, b map[string]int) []string {
	var keys []string
	for k := range a {
		keys = append(keys, k)
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	return keys
}

// waitForAggregate waits until the aggregated route lists every tool in
// names, for a token that may see them all: its catalog sessions connect
// in the background.
func waitForAggregate(t *testing.T, url, token string, names ...string) {
	t.Helper()
	cs, err := connectGo(t, url, bearerClient(token, nil))
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		tools, err := cs.ListTools(context.Background(), nil)
		if err == nil && !slices.ContainsFunc(names, func(n string) bool { return !slices.Contains(toolNamesOf(tools), n) }) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the aggregated route does not list %v within 20s: %v %v", names, tools, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// legitimateCalls makes, through the SDK clients, the calls the attackers'
// tokens may make, after the attacks.
func legitimateCalls(t *testing.T, p attackPorts, reader, simple, onlyB string) {
	ctx := context.Background()
	t.Run("sessions endpoint", func(t *testing.T) {
		url := p.url(p.sessions)
		sessionsCall(t, connectGoSessions(t, url, reader, "reader"), "list", nil)
		if out, err := tsClient(t, url, reader, "call", "sessions", `{"verb":"list"}`); err != nil || !strings.Contains(out, "sessions") {
			t.Errorf("TS client, sessions list: %v %s", err, out)
		}
	})
	for _, g := range []struct {
		name, url, tool, args, want string
	}{
		{"guard, go-sdk everything-server", p.url(p.guardGo), "test_simple_text", `{}`, "This is a simple text response"},
		{"guard, TypeScript server-everything", p.url(p.guardTS), "echo", `{"message":"legit"}`, "Echo: legit"},
		{"guard upstream, go-sdk everything-server", p.url(p.guardGoUp), "test_simple_text", `{}`, "This is a simple text response"},
		{"guard upstream, TypeScript server-everything", p.url(p.guardTSUp), "echo", `{"message":"legit"}`, "Echo: legit"},
	} {
		t.Run(g.name, func(t *testing.T) {
			cs, err := connectGo(t, g.url, bearerClient(simple, nil))
			if err != nil {
				t.Fatal(err)
			}
			var args map[string]any
			json.Unmarshal([]byte(g.args), &args)
			res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: g.tool, Arguments: args})
			if err != nil || res.IsError || !strings.Contains(textOf(res.Content), g.want) {
				t.Errorf("go-sdk client, %s: %+v %v", g.tool, res, err)
			}
			if tools, err := cs.ListTools(ctx, nil); err != nil || !slices.Equal(toolNamesOf(tools), []string{g.tool}) {
				t.Errorf("go-sdk client, tools/list: %v %v", toolNamesOf(tools), err)
			}
			if out, err := tsClient(t, g.url, simple, "call", g.tool, g.args); err != nil || !strings.Contains(out, g.want) {
				t.Errorf("TS client, %s: %v %s", g.tool, err, out)
			}
		})
	}
	t.Run("pass-through route", func(t *testing.T) {
		cs, err := connectGo(t, p.url(p.broker), bearerClient(onlyB, nil))
		if err != nil {
			t.Fatal(err)
		}
		if err := cs.Ping(ctx, nil); err != nil {
			t.Errorf("ping: %v", err)
		}
		if tools, err := cs.ListTools(ctx, nil); err == nil {
			t.Errorf("a token without upstream a lists its tools: %v", toolNamesOf(tools))
		}
	})
	t.Run("aggregated route", func(t *testing.T) {
		url := p.url(p.aggregate)
		cs, err := connectGo(t, url, bearerClient(onlyB, nil))
		if err != nil {
			t.Fatal(err)
		}
		onlyOfB := func(what string, names []string, err error) {
			t.Helper()
			if err != nil || len(names) == 0 {
				t.Errorf("%s: %v %v", what, names, err)
			}
			for _, n := range names {
				if !strings.Contains(n, "_b") && !strings.Contains(n, "/b/") {
					t.Errorf("%s shows %q to a token for upstream b only", what, n)
				}
			}
		}
		tools, err := cs.ListTools(ctx, nil)
		onlyOfB("tools/list", toolNamesOf(tools), err)
		var names []string
		prompts, err := cs.ListPrompts(ctx, nil)
		if err == nil {
			for _, p := range prompts.Prompts {
				names = append(names, p.Name)
			}
		}
		onlyOfB("prompts/list", names, err)
		names = nil
		resources, err := cs.ListResources(ctx, nil)
		if err == nil {
			for _, r := range resources.Resources {
				names = append(names, r.URI)
			}
		}
		onlyOfB("resources/list", names, err)
		names = nil
		templates, err := cs.ListResourceTemplates(ctx, nil)
		if err == nil {
			for _, r := range templates.ResourceTemplates {
				names = append(names, r.URITemplate)
			}
		}
		onlyOfB("resources/templates/list", names, err)

		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "mcp_b_tool_b", Arguments: map[string]any{"text": "hi"}})
		if err != nil || !strings.Contains(textOf(res.Content), "RAN-TOOL-B") {
			t.Errorf("tools/call of b's tool: %+v %v", res, err)
		}
		if r, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: "test://b/doc"}); err != nil || len(r.Contents) == 0 || !strings.Contains(r.Contents[0].Text, "CONTENT-OF-B") {
			t.Errorf("resources/read of b's resource: %+v %v", r, err)
		}
		if g, err := cs.GetPrompt(ctx, &mcp.GetPromptParams{Name: "mcp_b_prompt_b", Arguments: map[string]string{"topic": "x"}}); err != nil || len(g.Messages) == 0 ||
			!strings.Contains(textOf([]mcp.Content{g.Messages[0].Content}), "PROMPT-OF-B") {
			t.Errorf("prompts/get of b's prompt: %+v %v", g, err)
		}
		tg := &attackTarget{name: "aggregated route", url: url, token: onlyB}
		sid := tg.openSession(t)
		defer tg.closeSession(sid)
		for _, body := range []string{
			`{"jsonrpc":"2.0","id":3,"method":"resources/read","params":{"uri":"test://a/doc"}}`,
			`{"jsonrpc":"2.0","id":4,"method":"prompts/get","params":{"name":"mcp_a_prompt_a","arguments":{"topic":"x"}}}`,
		} {
			if a := tg.send(t, hostile.Case{Body: []byte(body)}, sid); a.status != http.StatusForbidden || a.rpc.Error.Data.Reason != hostile.ReasonScope {
				t.Errorf("%s: %d %s, want 403 insufficient_scope", body, a.status, clip(a.body))
			}
		}
		if out, err := tsClient(t, url, onlyB, "call", "mcp_b_tool_b", `{"text":"hi"}`); err != nil || !strings.Contains(out, "RAN-TOOL-B") {
			t.Errorf("TS client, b's tool: %v %s", err, out)
		}
	})
}

func textOf(content []mcp.Content) string {
	var b strings.Builder
	for _, c := range content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

// countingUpstream is a go-sdk MCP server in this process with one tool,
// resource, resource template and prompt (with completion), each named for
// the upstream, that counts every call it runs: "tools/call tool_a",
// "resources/read test://a/doc", "resources/subscribe …", "prompts/get
// prompt_a", "completion/complete prompt_a".
type countingUpstream struct {
	name string
	url  string

	mu  sync.Mutex
	ran map[string]int
}

func startCountingUpstream(t *testing.T, name string) *countingUpstream {
	t.Helper()
	u := &countingUpstream{name: name, ran: map[string]int{}}
	tag := strings.ToUpper(name)
	server := mcp.NewServer(&mcp.Implementation{Name: "upstream-" + name, Version: "1"}, &mcp.ServerOptions{
		CompletionHandler: func(_ context.Context, req *mcp.CompleteRequest) (*mcp.CompleteResult, error) {
			u.count("completion/complete " + req.Params.Ref.Name + req.Params.Ref.URI)
			return &mcp.CompleteResult{Completion: mcp.CompletionResultDetails{Values: []string{"COMPLETION-OF-" + tag}}}, nil
		},
		SubscribeHandler: func(_ context.Context, req *mcp.SubscribeRequest) error {
			u.count("resources/subscribe " + req.Params.URI)
			return nil
		},
		UnsubscribeHandler: func(context.Context, *mcp.UnsubscribeRequest) error { return nil },
	})
	type toolIn struct {
		Text string `json:"text,omitempty"`
	}
	mcp.AddTool(server, &mcp.Tool{Name: "tool_" + name, Description: "upstream " + name + "'s tool"},
		func(_ context.Context, _ *mcp.CallToolRequest, in toolIn) (*mcp.CallToolResult, any, error) {
			u.count("tools/call tool_" + name)
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "RAN-TOOL-" + tag + " " + in.Text}}}, nil, nil
		})
	read := func(_ context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
		u.count("resources/read " + req.Params.URI)
		return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{{URI: req.Params.URI, MIMEType: "text/plain", Text: "CONTENT-OF-" + tag}}}, nil
	}
	server.AddResource(&mcp.Resource{URI: "test://" + name + "/doc", Name: "doc_" + name, MIMEType: "text/plain"}, read)
	server.AddResourceTemplate(&mcp.ResourceTemplate{URITemplate: "test://" + name + "/items/{id}", Name: "items_" + name, MIMEType: "text/plain"}, read)
	server.AddPrompt(&mcp.Prompt{Name: "prompt_" + name, Arguments: []*mcp.PromptArgument{{Name: "topic"}}},
		func(_ context.Context, req *mcp.GetPromptRequest) (*mcp.GetPromptResult, error) {
			u.count("prompts/get prompt_" + name)
			return &mcp.GetPromptResult{Messages: []*mcp.PromptMessage{{Role: "user", Content: &mcp.TextContent{Text: "PROMPT-OF-" + tag}}}}, nil
		})
	srv := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server }, nil))
	t.Cleanup(func() {
		srv.CloseClientConnections()
		srv.Close()
	})
	u.url = srv.URL + "/mcp"
	return u
}

func (u *countingUpstream) count(call string) {
	u.mu.Lock()
	u.ran[call]++
	u.mu.Unlock()
}

func (u *countingUpstream) snapshot() map[string]int {
	u.mu.Lock()
	defer u.mu.Unlock()
	out := map[string]int{}
	for k, v := range u.ran {
		out[k] = v
	}
	return out
}

// callRecorder is a proxy between the guard and an MCP server that reads
// every POST body it forwards the way the server's SDK does and records
// each request's method and subject. Both SDKs match keys exactly, the last
// of a repeated key winning (go-sdk's decoder, JSON.parse). go-sdk reads a
// batch only under a protocol version before 2025-06-18; the TypeScript SDK
// reads batches, and refuses an envelope with any member but jsonrpc, id,
// method and params (its JSONRPCRequestSchema is strict).
type callRecorder struct {
	addr       string // host:port for reverse_proxy
	typescript bool   // the TypeScript SDK's reading, else go-sdk's

	mu      sync.Mutex
	seen    map[string]int    // "method subject"
	example map[string]string // the first body that carried each
}

func startCallRecorder(t *testing.T, target string, typescript bool) *callRecorder {
	t.Helper()
	u, err := parseHTTPURL(target)
	if err != nil {
		t.Fatal(err)
	}
	r := &callRecorder{typescript: typescript, seen: map[string]int{}, example: map[string]string{}}
	transport := http.DefaultTransport.(*http.Transport).Clone()
	proxy := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme, pr.Out.URL.Host, pr.Out.Host = u.Scheme, u.Host, u.Host
			if pr.Out.Body == nil || pr.Out.Method != http.MethodPost {
				return // both SDKs read the body of a POST only
			}
			b, _ := io.ReadAll(io.LimitReader(pr.Out.Body, 8<<20))
			pr.Out.Body.Close()
			pr.Out.Body = io.NopCloser(bytes.NewReader(b))
			pr.Out.ContentLength = int64(len(b))
			r.record(b, pr.Out.Header.Get("Mcp-Protocol-Version"))
		},
		Transport:     transport,
		FlushInterval: -1,
		ErrorLog:      log.New(io.Discard, "", 0),
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		_ = http.NewResponseController(w).EnableFullDuplex() // see authProxy
		proxy.ServeHTTP(w, req)
	}))
	t.Cleanup(func() {
		srv.CloseClientConnections()
		srv.Close()
		transport.CloseIdleConnections()
	})
	r.addr = srv.Listener.Addr().String()
	return r
}

func (r *callRecorder) record(body []byte, version string) {
	var raws []json.RawMessage
	if json.Unmarshal(body, &raws) == nil {
		if !r.typescript && version >= "2025-06-18" {
			return // go-sdk answers 400
		}
	} else {
		raws = []json.RawMessage{body}
	}
	for _, raw := range raws {
		msg, err := jsonrpc.DecodeMessage(raw)
		if err != nil {
			continue
		}
		req, ok := msg.(*jsonrpc.Request)
		if !ok || (r.typescript && !plainEnvelope(raw)) {
			continue
		}
		k := req.Method + " " + serverSubject(req.Method, req.Params)
		r.mu.Lock()
		r.seen[k]++
		if _, ok := r.example[k]; !ok {
			r.example[k] = string(body)
		}
		r.mu.Unlock()
	}
}

// plainEnvelope reports whether the request raw has no member but jsonrpc,
// id, method and params.
func plainEnvelope(raw []byte) bool {
	var members map[string]json.RawMessage
	if json.Unmarshal(raw, &members) != nil {
		return false
	}
	for k := range members {
		if k != "jsonrpc" && k != "id" && k != "method" && k != "params" {
			return false
		}
	}
	return true
}

// count returns how many requests for method and subject the server was
// sent, and the first body that carried one.
func (r *callRecorder) count(method, subject string) (int, string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.seen[method+" "+subject], r.example[method+" "+subject]
}

// serverSubject is what a server reads as the name of a call: a tool's or
// prompt's name, a resource's URI, a completion's reference.
func serverSubject(method string, params json.RawMessage) string {
	var p map[string]json.RawMessage
	if json.Unmarshal(params, &p) != nil {
		return ""
	}
	field := func(m map[string]json.RawMessage, k string) string {
		var s string
		json.Unmarshal(m[k], &s)
		return s
	}
	switch method {
	case "tools/call", "prompts/get":
		return field(p, "name")
	case "resources/read", "resources/subscribe":
		return field(p, "uri")
	case "completion/complete":
		var ref map[string]json.RawMessage
		json.Unmarshal(p["ref"], &ref)
		return field(ref, "name") + field(ref, "uri")
	}
	return ""
}

// subjectOf is serverSubject of a call as the test means it.
func subjectOf(c hostile.Call) string { return serverSubject(c.Method, json.RawMessage(c.Params)) }

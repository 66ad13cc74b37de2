package e2e

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/cluster"
	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// multiRound is the everything-server's tool that asks its caller twice
// (SEP-2322): its first answer is input_required with requestState
// "round=1", its second with "round=2;name=<name>", its third the result.
const multiRound = "test_input_required_result_multi_round"

// roundsRule holds every multi-round tool of the everything-server.
const roundsRule = `policy {
			approve "tool.name.contains('test_input_required_result_')" "asking tools need a second person"
		}`

// roundsGateway is the gateway of the multi-round tests: guard, broker and
// aggregate sites in front of the stateless everything-server, through a
// tap that records what reaches it, each site with roundsRule.
func roundsGateway(t *testing.T) (c *Caddy, tp *tap, ports map[string]int) {
	t.Helper()
	tp = startTap(t, startStatelessEverythingServer(t))
	c, ports = ruledGateway(t, tp.url(), roundsRule)
	return c, tp, ports
}

// ruledGateway runs guard, broker and aggregate sites (ports by those
// names) in front of the MCP server at upstream (named ev), each with
// the zidane_mcp option rule.
func ruledGateway(t *testing.T, upstream, rule string) (*Caddy, map[string]int) {
	t.Helper()
	ports := map[string]int{"guard": freePort(t), "broker": freePort(t), "aggregate": freePort(t)}
	c := startCaddy(t, fmt.Sprintf(`{
	admin %s
	zidane {
		upstream ev %s
	}
}

http://127.0.0.1:%d {
	zidane_mcp {
		guard
		resource http://127.0.0.1:%d/mcp
		%s
	}
	reverse_proxy %s
}

http://127.0.0.1:%d {
	zidane_mcp {
		broker ev
		%s
	}
}

http://127.0.0.1:%d {
	zidane_mcp {
		aggregate ev
		prefix conditional
		%s
	}
}
`, AdminPlaceholder, upstream, ports["guard"], ports["guard"], rule, strings.TrimSuffix(strings.TrimPrefix(upstream, "http://"), "/mcp"),
		ports["broker"], rule, ports["aggregate"], rule))
	return c, ports
}

// backendRounds are the requestStates of the calls of tool that reached
// the backend, in order ("" for none), and whether any carried the
// gateway's own state, once at least n have (the tap records an exchange
// once its answer is read through, which can be after the client has
// it), or after 10 seconds.
func backendRounds(tp *tap, tool string, n int) (states []string, gatewayState bool) {
	for range 100 {
		if states, gatewayState = tapRounds(tp, tool); len(states) >= n {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	return states, gatewayState
}

func tapRounds(tp *tap, tool string) (states []string, gatewayState bool) {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	for _, ex := range tp.log {
		var m struct {
			Method string `json:"method"`
			Params struct {
				Name         string `json:"name"`
				RequestState string `json:"requestState"`
			} `json:"params"`
		}
		if json.Unmarshal([]byte(ex.body), &m) != nil || m.Method != "tools/call" || m.Params.Name != tool {
			continue
		}
		states = append(states, m.Params.RequestState)
		gatewayState = gatewayState || strings.Contains(ex.body, "zidane-approval")
	}
	return states, gatewayState
}

// TestApprovedCallAsksForInput: an approved 2026-07-28 call whose backend
// answers input_required, twice, completes with what the client gave, on
// guard, broker and aggregate: go-sdk's client follows the approval's
// input_required, then the backend's two, and the backend gets each of its
// rounds once, with its own requestState and never the gateway's. Before,
// the client's answer to the backend's first question was held as a new
// call, for a new approval, and the backend never got its requestState.
func TestApprovedCallAsksForInput(t *testing.T) {
	c, tp, ports := roundsGateway(t)
	alice := createToken(t, c, "alice", "--scope", "mcp", "--owner", "alice")
	for _, route := range []string{"guard", "broker", "aggregate"} {
		t.Run(route, func(t *testing.T) {
			tp.reset()
			asked, proceed := make(chan string, 8), make(chan struct{})
			name := "ada-" + route
			cs, err := mcp.NewClient(&mcp.Implementation{Name: "e2e-rounds", Version: "1"}, &mcp.ClientOptions{
				ElicitationHandler: func(ctx context.Context, r *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
					select {
					case asked <- r.Params.Message:
					default:
					}
					switch {
					case strings.HasPrefix(r.Params.Message, "Step 1"):
						return &mcp.ElicitResult{Action: "accept", Content: map[string]any{"name": name}}, nil
					case strings.HasPrefix(r.Params.Message, "Step 2"):
						return &mcp.ElicitResult{Action: "accept", Content: map[string]any{"color": "teal"}}, nil
					}
					select {
					case <-proceed:
						return &mcp.ElicitResult{Action: "accept"}, nil
					case <-ctx.Done():
						return nil, ctx.Err()
					}
				},
			}).Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: fmt.Sprintf("http://127.0.0.1:%d/mcp", ports[route]),
				HTTPClient: bearerClient(alice, nil), MaxRetries: -1}, &mcp.ClientSessionOptions{ProtocolVersion: modernVersion})
			if err != nil {
				t.Fatalf("connect: %v", err)
			}
			t.Cleanup(func() { cs.Close() })
			done := make(chan string, 1)
			go func() {
				res, err := callRouteTool(cs, multiRound, nil)
				done <- outcome(res, err)
			}()
			var id string
			select {
			case msg := <-asked:
				if id = approvalID.FindString(msg); id == "" {
					t.Fatalf("the first question is not the approval's: %q", msg)
				}
			case out := <-done:
				t.Fatalf("the held call ended without asking: %s", out)
			case <-time.After(30 * time.Second):
				t.Fatal("the held call asked nothing within 30s")
			}
			if out, errOut, err := c.Run(t, "zidane", "approvals", "approve", id); err != nil {
				t.Fatalf("approve: %v %s %s", err, out, errOut)
			}
			close(proceed)
			out := waitChan(t, done, "the approved call's end", 30*time.Second)
			if want := "Multi-round complete: " + name + " likes teal"; !strings.Contains(out, want) || strings.Contains(out, "isError=true") {
				t.Fatalf("the approved call that asks twice: %s, want %q", out, want)
			}
			states, gw := backendRounds(tp, multiRound, 3)
			if want := []string{"", "round=1", "round=2;name=" + name}; fmt.Sprint(states) != fmt.Sprint(want) || gw {
				t.Fatalf("the backend got the rounds %q (the gateway's state among them: %v), want %q each once", states, gw, want)
			}
		})
	}
}

// roundsMeta is the _meta of a raw 2026-07-28 request whose client declares
// form elicitation.
const roundsMeta = `"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{"elicitation":{}},"io.modelcontextprotocol/clientInfo":{"name":"raw","version":"1"}}`

// roundRetry is the params of a 2026-07-28 call's retry: its arguments
// (args, ending in a comma), requestState state, and inputResponses
// answering key with accept and content.
func roundRetry(args, state, key, content string) string {
	return args + `"requestState":"` + state + `","inputResponses":{"` + key + `":{"action":"accept","content":` + content + `}},`
}

// rawRound posts one 2026-07-28 tools/call of tool and returns the status,
// the last JSON-RPC message of the answer, and its result read.
func rawRound(t *testing.T, url, token, tool, params string) (int, string, roundResult) {
	t.Helper()
	a := post(t, url, token, `{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"`+tool+`",`+params+roundsMeta+`}}`,
		"Mcp-Protocol-Version", modernVersion, "Mcp-Method", "tools/call", "Mcp-Name", tool)
	msgs := sseMessages(a.body)
	if len(msgs) == 0 {
		return a.status, a.body, roundResult{}
	}
	last := msgs[len(msgs)-1]
	var m struct {
		Result roundResult `json:"result"`
	}
	json.Unmarshal(last, &m)
	return a.status, string(last), m.Result
}

type roundResult struct {
	ResultType    string                     `json:"resultType"`
	RequestState  string                     `json:"requestState"`
	InputRequests map[string]json.RawMessage `json:"inputRequests"`
	IsError       bool                       `json:"isError"`
	Content       []struct {
		Text string `json:"text"`
	} `json:"content"`
}

// TestApprovedRoundsAttacks drives an approved multi-round call raw
// through guard, broker and aggregate, and between its rounds sends what an
// attacker would with the state the gateway gave for the backend's round:
// each is refused, with a word of why, and none reaches the backend.
func TestApprovedRoundsAttacks(t *testing.T) {
	c, tp, ports := roundsGateway(t)
	alice := createToken(t, c, "alice", "--scope", "mcp", "--owner", "alice")
	alice2 := createToken(t, c, "alice-laptop", "--scope", "mcp", "--owner", "alice")
	mallory := createToken(t, c, "mallory", "--scope", "mcp", "--owner", "mallory")
	for _, route := range []string{"guard", "broker", "aggregate"} {
		t.Run(route, func(t *testing.T) {
			tp.reset()
			url := fmt.Sprintf("http://127.0.0.1:%d/mcp", ports[route])
			args := `"arguments":{"team":"` + route + `"},`
			st, raw, res := rawRound(t, url, alice, multiRound, args)
			id := strings.TrimPrefix(res.RequestState, "zidane-approval.")
			if st != http.StatusOK || res.ResultType != "input_required" || !approvalID.MatchString(id) {
				t.Fatalf("the held call: %d %s", st, raw)
			}
			if out, errOut, err := c.Run(t, "zidane", "approvals", "approve", id); err != nil {
				t.Fatalf("approve: %v %s %s", err, out, errOut)
			}
			retry := func(state, key, content string) string { return roundRetry(args, state, key, content) }
			st, raw, res = rawRound(t, url, alice, multiRound, retry(res.RequestState, id, `{}`))
			round1 := res.RequestState
			if _, asks := res.InputRequests["step1"]; st != http.StatusOK || res.ResultType != "input_required" || !asks ||
				!strings.HasPrefix(round1, "zidane-approval.") || strings.Contains(raw, "round=1") {
				t.Fatalf("the approved call's first round: %d %s, want the backend's question under the gateway's state", st, raw)
			}
			before, _ := backendRounds(tp, multiRound, 1)

			for _, a := range []struct {
				name, token, tool, params string
				status                    int
				word                      string
			}{
				{"the round's state with a changed argument", alice, multiRound,
					`"arguments":{"team":"evil"},"requestState":"` + round1 + `","inputResponses":{"step1":{"action":"accept","content":{"name":"x"}}},`,
					http.StatusForbidden, "not the call that was approved"},
				{"another principal's use of the round", mallory, multiRound, retry(round1, "step1", `{"name":"x"}`), http.StatusForbidden, "not issued to you"},
				{"the same owner's other credential", alice2, multiRound, retry(round1, "step1", `{"name":"x"}`), http.StatusForbidden, "not issued to you"},
				{"a made-up round", alice, multiRound, retry("zidane-approval.apr_AAAAAAAAAAAAAAAAAAAAAA", "step1", `{"name":"x"}`), http.StatusForbidden, "not issued to you"},
				{"a tampered round", alice, multiRound, retry(round1[:len(round1)-2]+"AA", "step1", `{"name":"x"}`), http.StatusForbidden, "not issued to you"},
				{"the round on another held tool", alice, "test_input_required_result_request_state", retry(round1, "step1", `{"name":"x"}`), http.StatusForbidden, "not the call that was approved"},
			} {
				st, raw, _ := rawRound(t, url, a.token, a.tool, a.params)
				if st != a.status || !strings.Contains(raw, a.word) {
					t.Errorf("%s: %d %s, want %d saying %q", a.name, st, raw, a.status, a.word)
				}
			}
			// The backend's own state, without the gateway's: a new call,
			// held for a new approval.
			st, raw, res = rawRound(t, url, alice, multiRound, retry("round=1", "step1", `{"name":"x"}`))
			if again := strings.TrimPrefix(res.RequestState, "zidane-approval."); st != http.StatusOK || !approvalID.MatchString(again) || again == id {
				t.Errorf("the backend's raw state: %d %s, want a new approval", st, raw)
			}
			if after, _ := tapRounds(tp, multiRound); len(after) != len(before) {
				t.Fatalf("the attacks reached the backend: %q then %q", before, after)
			}

			st, raw, res = rawRound(t, url, alice, multiRound, retry(round1, "step1", `{"name":"grace"}`))
			round2 := res.RequestState
			if _, asks := res.InputRequests["step2"]; st != http.StatusOK || !asks || !strings.HasPrefix(round2, "zidane-approval.") || round2 == round1 {
				t.Fatalf("the second round: %d %s", st, raw)
			}
			st, raw, _ = rawRound(t, url, alice, multiRound, retry(round1, "step1", `{"name":"grace"}`))
			if st != http.StatusForbidden || !strings.Contains(raw, "used already") {
				t.Errorf("the first round replayed: %d %s, want 403 saying used already", st, raw)
			}
			st, raw, res = rawRound(t, url, alice, multiRound, retry(round2, "step2", `{"color":"teal"}`))
			if st != http.StatusOK || res.ResultType == "input_required" || res.IsError || len(res.Content) == 0 ||
				res.Content[0].Text != "Multi-round complete: grace likes teal" {
				t.Fatalf("the last round: %d %s", st, raw)
			}
			if states, gw := backendRounds(tp, multiRound, 3); fmt.Sprint(states) != fmt.Sprint([]string{"", "round=1", "round=2;name=grace"}) || gw {
				t.Fatalf("the backend got %q (the gateway's state among them: %v)", states, gw)
			}
			var allowed, refused int
			for _, l := range auditLines(c) {
				if l["approval"] != id {
					continue
				}
				switch l["event"] {
				case "approval_round":
					allowed++
				case "approval_round_refused":
					refused++
				}
			}
			if allowed < 2 || refused < 5 {
				t.Errorf("audit lines naming %s: %d rounds allowed, %d refused; want 2 and at least 5", id, allowed, refused)
			}
		})
	}
}

// TestApprovedCallAsksForInputBridged: the aggregated route in front of a
// 2025-11-25 upstream (the stateful everything-server) turns its tool's
// elicitation/create into an input_required answer with a state of its own
// (the bridge); an approved call of that tool by go-sdk's 2026-07-28
// client completes with what the client gave, on the approval alone, and
// the upstream gets the call once.
func TestApprovedCallAsksForInputBridged(t *testing.T) {
	tp := startTap(t, startEverythingServer(t))
	port := freePort(t)
	c := startCaddy(t, fmt.Sprintf(`{
	admin %s
	zidane {
		upstream ef %s
	}
}

http://127.0.0.1:%d {
	zidane_mcp {
		aggregate ef
		prefix conditional
		%s
	}
}
`, AdminPlaceholder, tp.url(), port, roundsRule))
	alice := createToken(t, c, "alice", "--scope", "mcp", "--owner", "alice")
	endpoint := fmt.Sprintf("http://127.0.0.1:%d/mcp", port)
	waitForAggregate(t, endpoint, alice, multiRound)
	approvals, proceed := make(chan string, 8), make(chan struct{})
	var asked []string
	var mu sync.Mutex
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "e2e-rounds", Version: "1"}, &mcp.ClientOptions{
		ElicitationHandler: func(ctx context.Context, r *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			mu.Lock()
			asked = append(asked, r.Params.Message)
			mu.Unlock()
			switch {
			case strings.HasPrefix(r.Params.Message, "Step 1"):
				return &mcp.ElicitResult{Action: "accept", Content: map[string]any{"name": "ada"}}, nil
			case strings.HasPrefix(r.Params.Message, "Step 2"):
				return &mcp.ElicitResult{Action: "accept", Content: map[string]any{"color": "teal"}}, nil
			}
			id := approvalID.FindString(r.Params.Message)
			select {
			case approvals <- id:
			default:
			}
			select {
			case <-proceed: // the operator approved it
				return &mcp.ElicitResult{Action: "accept"}, nil
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		},
	}).Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: endpoint, HTTPClient: bearerClient(alice, nil), MaxRetries: -1},
		&mcp.ClientSessionOptions{ProtocolVersion: modernVersion})
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { cs.Close() })
	done := make(chan string, 1)
	go func() {
		res, err := callRouteTool(cs, multiRound, nil)
		done <- outcome(res, err)
	}()
	var id string
	select {
	case id = <-approvals:
	case out := <-done:
		t.Fatalf("the held call ended without asking: %s", out)
	case <-time.After(30 * time.Second):
		t.Fatal("the held call asked nothing within 30s")
	}
	if out, errOut, err := c.Run(t, "zidane", "approvals", "approve", id); err != nil {
		t.Fatalf("approve %q: %v %s %s", id, err, out, errOut)
	}
	close(proceed)
	out := waitChan(t, done, "the approved call's end", 40*time.Second)
	mu.Lock()
	defer mu.Unlock()
	if !strings.Contains(out, "Multi-round complete: ada likes teal") || strings.Contains(out, "isError=true") {
		t.Fatalf("the approved call through the bridge: %s (asked %q)", out, asked)
	}
	if n := len(asked); n != 3 || approvalID.FindAllString(strings.Join(asked, " "), -1) == nil {
		t.Fatalf("the client was asked %q, want the approval once, then the upstream's two questions", asked)
	}
	// The upstream (go-sdk at 2025-11-25) asks its first question as an
	// elicitation/create on the call's stream and its second as an
	// input_required result, whose retry the aggregated route makes with
	// the upstream's own state: the call once, then that round once.
	if states, gw := backendRounds(tp, multiRound, 2); fmt.Sprint(states) != fmt.Sprint([]string{"", "round=2;name=ada"}) || gw {
		t.Fatalf("the upstream got the rounds %q (the gateway's state among them: %v), want the call once and its second round once", states, gw)
	}
}

// TestApprovedRoundsAcrossReplicas: two replicas on one NATS storage
// serving the same guard site in front of the stateless everything-server:
// an approved call's rounds are kept in storage, so each retry works on
// either replica, a round used on one is used on the other, and of its
// retries sent at once to both, one runs.
func TestApprovedRoundsAcrossReplicas(t *testing.T) {
	tp := startTap(t, startStatelessEverythingServer(t))
	a, b, urlA, urlB := guardReplicas(t, tp.url(), roundsRule)
	stdout, stderr, err := a.Run(t, "zidane", "token", "create", "--name", "alice", "--scope", "mcp", "--owner", "alice")
	if err != nil {
		t.Fatalf("token create on A: %v %s", err, stderr)
	}
	alice := strings.TrimSpace(stdout)
	waitStatus(t, urlB, alice, http.StatusOK, 20*time.Second)

	const args = `"arguments":{"team":"cluster"},`
	retry := func(state, key, content string) string { return roundRetry(args, state, key, content) }
	st, raw, res := rawRound(t, urlA, alice, multiRound, args)
	id := strings.TrimPrefix(res.RequestState, "zidane-approval.")
	if st != http.StatusOK || !approvalID.MatchString(id) {
		t.Fatalf("the held call on A: %d %s", st, raw)
	}
	if out, errOut, err := b.Run(t, "zidane", "approvals", "approve", id); err != nil {
		t.Fatalf("approve through B: %v %s %s", err, out, errOut)
	}
	st, raw, res = rawRound(t, urlB, alice, multiRound, retry(res.RequestState, id, `{}`))
	round1 := res.RequestState
	if _, asks := res.InputRequests["step1"]; st != http.StatusOK || !asks || !strings.HasPrefix(round1, "zidane-approval.apr_") {
		t.Fatalf("the approved retry on B: %d %s", st, raw)
	}
	// The round's retry sent at once twice to each replica: one runs,
	// the others find the round used.
	type answer struct {
		st  int
		raw string
		res roundResult
	}
	answers := make(chan answer, 4)
	for i := range 4 {
		go func() {
			url := urlA
			if i%2 == 1 {
				url = urlB
			}
			st, raw, res := rawRound(t, url, alice, multiRound, retry(round1, "step1", `{"name":"lin"}`))
			answers <- answer{st, raw, res}
		}()
	}
	var round2 string
	used := 0
	for range 4 {
		a := waitChan(t, answers, "a racing retry of the round", 30*time.Second)
		switch _, asks := a.res.InputRequests["step2"]; {
		case a.st == http.StatusOK && asks && strings.HasPrefix(a.res.RequestState, "zidane-approval.apr_") && round2 == "":
			round2 = a.res.RequestState
		case a.st == http.StatusForbidden && strings.Contains(a.raw, "used already"):
			used++
		default:
			t.Fatalf("a racing retry of B's round: %d %s", a.st, a.raw)
		}
	}
	if round2 == "" || used != 3 {
		t.Fatalf("four retries of one round on two replicas at once: %d found it used, want one run and three used already", used)
	}
	if st, raw, _ := rawRound(t, urlB, alice, multiRound, retry(round1, "step1", `{"name":"lin"}`)); st != http.StatusForbidden || !strings.Contains(raw, "used already") {
		t.Fatalf("the round used on A, replayed on B: %d %s", st, raw)
	}
	st, raw, res = rawRound(t, urlB, alice, multiRound, retry(round2, "step2", `{"color":"teal"}`))
	if st != http.StatusOK || len(res.Content) == 0 || res.Content[0].Text != "Multi-round complete: lin likes teal" {
		t.Fatalf("A's round retried on B: %d %s", st, raw)
	}
	if states, gw := backendRounds(tp, multiRound, 3); fmt.Sprint(states) != fmt.Sprint([]string{"", "round=1", "round=2;name=lin"}) || gw {
		t.Fatalf("the backend got %q (the gateway's state among them: %v)", states, gw)
	}
}

// TestApprovedBridgedRoundsAcrossReplicas: two replicas of an aggregated
// route over a 2025-11-25 upstream, on NATS. The approved call runs on A,
// whose bridge holds the upstream's pending call; the round's retry
// reaches B, which consumes the round, marks it in storage for A and
// forwards the call, with the bridge's state back, to A over the hop. A
// checks the mark in storage and takes it (once), serves the call, and the
// next round, retried on A, completes it. Hops that a holder of the
// cluster key signs for the same call, naming a settlement storage does not
// hold for it, are refused.
func TestApprovedBridgedRoundsAcrossReplicas(t *testing.T) {
	natsURL := startNATSServer(t)
	upstream := startEverythingServer(t)
	clusterRaw := []byte(randomHex(16))
	clusterKey := "ZIDANE_CLUSTER_KEY=" + base64.StdEncoding.EncodeToString(clusterRaw)
	replica := func(node string) (*Caddy, string) {
		host := fmt.Sprintf("127.0.0.1:%d", freePort(t))
		c := startCaddy(t, fmt.Sprintf(`{
	admin %s
	storage zidane_nats
	zidane {
		cluster {
			url %s
			node %s
			advertise http://%s
		}
		upstream ev %s
	}
}

http://%s {
	zidane_mcp {
		aggregate ev
		%s
	}
}
`, AdminPlaceholder, natsURL, node, host, upstream, host, roundsRule), clusterKey)
		return c, "http://" + host + "/mcp"
	}
	a, urlA := replica("gw-a")
	_, urlB := replica("gw-b")
	alice := createToken(t, a, "alice", "--scope", "mcp", "--owner", "alice")
	const tool = "mcp_ev_" + multiRound
	for _, u := range []string{urlA, urlB} {
		waitStatus(t, u, alice, http.StatusOK, 20*time.Second)
		waitForAggregate(t, u, alice, tool)
	}
	const args = `"arguments":{"team":"bridge"},`
	retry := func(state, key, content string) string { return roundRetry(args, state, key, content) }
	st, raw, res := rawRound(t, urlA, alice, tool, args)
	id := strings.TrimPrefix(res.RequestState, "zidane-approval.")
	if st != http.StatusOK || !approvalID.MatchString(id) {
		t.Fatalf("the held call on A: %d %s", st, raw)
	}
	if out, errOut, err := a.Run(t, "zidane", "approvals", "approve", id); err != nil {
		t.Fatalf("approve: %v %s %s", err, out, errOut)
	}
	st, raw, res = rawRound(t, urlA, alice, tool, retry(res.RequestState, id, `{}`))
	round1 := res.RequestState
	if st != http.StatusOK || len(res.InputRequests) != 1 || !strings.HasPrefix(round1, "zidane-approval.apr_") || strings.Contains(raw, "zidane-mrtr") {
		t.Fatalf("the approved call on A: %d %s, want the upstream's question under a round", st, raw)
	}
	var key string
	for k := range res.InputRequests {
		key = k
	}
	st, raw, res = rawRound(t, urlB, alice, tool, retry(round1, key, `{"name":"hopper"}`))
	round2 := res.RequestState
	if st != http.StatusOK || len(res.InputRequests) != 1 || !strings.HasPrefix(round2, "zidane-approval.apr_") || round2 == round1 {
		t.Fatalf("A's round retried on B: %d %s, want the upstream's next question under a round", st, raw)
	}
	for k := range res.InputRequests {
		key = k
	}
	st, raw, res = rawRound(t, urlA, alice, tool, retry(round2, key, `{"color":"teal"}`))
	if st != http.StatusOK || len(res.Content) == 0 || res.Content[0].Text != "Multi-round complete: hopper likes teal" {
		t.Fatalf("the last round on A: %d %s", st, raw)
	}

	// A holder of the cluster key signs hops to A for Alice's approved
	// call, each naming a settlement that storage does not hold for it.
	hk, err := cluster.Derive(clusterRaw, "aggregate hop v1")
	if err != nil {
		t.Fatal(err)
	}
	hop := testHop{key: hk, route: "aggregate-node|/mcp||ev"}
	aliceID := tokenIDOf(t, a, "alice")
	body := `{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"` + tool + `",` + args + roundsMeta + `}}`
	for _, f := range []struct{ name, settled string }{
		{"a round A took already", strings.TrimPrefix(round1, "zidane-approval.")},
		{"the approval, consumed on A and never sent", id},
		{"a made-up round", "apr_AAAAAAAAAAAAAAAAAAAAAA"},
	} {
		req, _ := http.NewRequest(http.MethodPost, urlA, strings.NewReader(body))
		for k, v := range map[string]string{"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
			"Mcp-Protocol-Version": modernVersion, "Mcp-Method": "tools/call", "Mcp-Name": tool, "Zidane-Hop-Settled": f.settled} {
			req.Header.Set(k, v)
		}
		hop.sign(t, req, body, "gw-b", "gw-a", time.Now(), randomHex(16), hopPrincipal(aliceID, "mcp"), "")
		resp, err := shortClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden || !strings.Contains(string(b), "did not settle it for this replica") {
			t.Errorf("a signed hop naming %s: %d %s, want 403 saying the settlement does not hold", f.name, resp.StatusCode, b)
		}
	}
}

// TestApprovedCallAsksForInputJSON: behind guard, a go-sdk 2026-07-28
// server that answers with JSON bodies (not an event stream), whose deploy
// tool asks which region before it runs: the approved call completes with
// the region the client gave, the tool runs once, and the backend gets its
// own requestState back.
func TestApprovedCallAsksForInputJSON(t *testing.T) {
	s := mcp.NewServer(&mcp.Implementation{Name: "deployer", Version: "1"}, nil)
	type args struct {
		Version string `json:"version"`
	}
	var mu sync.Mutex
	var ran, states []string
	mcp.AddTool(s, &mcp.Tool{Name: "deploy", Description: "deploys"}, func(_ context.Context, req *mcp.CallToolRequest, a args) (*mcp.CallToolResult, any, error) {
		mu.Lock()
		defer mu.Unlock()
		states = append(states, req.Params.RequestState)
		if res, ok := req.Params.InputResponses["region"].(*mcp.ElicitResult); ok && res.Action == "accept" && req.Params.RequestState == "asked-region" {
			region, _ := res.Content["region"].(string)
			ran = append(ran, a.Version+" to "+region)
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "deployed " + a.Version + " to " + region}}}, nil, nil
		}
		return &mcp.CallToolResult{
			InputRequests: mcp.InputRequestMap{"region": &mcp.ElicitParams{Message: "Which region?",
				RequestedSchema: &jsonschema.Schema{Type: "object", Properties: map[string]*jsonschema.Schema{"region": {Type: "string"}}}}},
			RequestState: "asked-region",
		}, nil, nil
	})
	up := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, &mcp.StreamableHTTPOptions{JSONResponse: true, Stateless: true}))
	t.Cleanup(up.Close)
	port := freePort(t)
	c := startCaddy(t, fmt.Sprintf(`{
	admin %s
}

http://127.0.0.1:%d {
	zidane_mcp {
		guard
		resource http://127.0.0.1:%d/mcp
		policy {
			approve "tool.name == 'deploy'" "deploys need a second person"
		}
	}
	reverse_proxy %s
}
`, AdminPlaceholder, port, port, strings.TrimPrefix(up.URL, "http://")))
	alice := createToken(t, c, "alice", "--scope", "mcp", "--owner", "alice")
	approvals, proceed := make(chan string, 8), make(chan struct{})
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "e2e-rounds", Version: "1"}, &mcp.ClientOptions{
		ElicitationHandler: func(ctx context.Context, r *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			if r.Params.Message == "Which region?" {
				return &mcp.ElicitResult{Action: "accept", Content: map[string]any{"region": "eu-west"}}, nil
			}
			select {
			case approvals <- approvalID.FindString(r.Params.Message):
			default:
			}
			select {
			case <-proceed:
				return &mcp.ElicitResult{Action: "accept"}, nil
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		},
	}).Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: fmt.Sprintf("http://127.0.0.1:%d/mcp", port), HTTPClient: bearerClient(alice, nil), MaxRetries: -1},
		&mcp.ClientSessionOptions{ProtocolVersion: modernVersion})
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { cs.Close() })
	done := make(chan string, 1)
	go func() {
		res, err := callRouteTool(cs, "deploy", map[string]any{"version": "2.0.0"})
		done <- outcome(res, err)
	}()
	id := waitChan(t, approvals, "the approval's question", 30*time.Second)
	if out, errOut, err := c.Run(t, "zidane", "approvals", "approve", id); err != nil {
		t.Fatalf("approve %q: %v %s %s", id, err, out, errOut)
	}
	close(proceed)
	if out := waitChan(t, done, "the approved call's end", 30*time.Second); !strings.Contains(out, "deployed 2.0.0 to eu-west") || strings.Contains(out, "isError=true") {
		t.Fatalf("the approved call that asks: %s", out)
	}
	mu.Lock()
	defer mu.Unlock()
	if fmt.Sprint(ran) != "[2.0.0 to eu-west]" || fmt.Sprint(states) != fmt.Sprint([]string{"", "asked-region"}) {
		t.Fatalf("the tool ran %q with the states %q, want once, after its own state came back", ran, states)
	}
}

// TestApprovedRoundsClientSettledHeader: Zidane-Hop-Settled is the
// replicas' own, read only on a hop the cluster key signs. A client that
// sends it, naming its own approval consumed already or a round of it
// used already, on another call an approve rule holds, is held for a new
// approval like any caller, on guard, broker and aggregate, and the
// backend never gets that call.
func TestApprovedRoundsClientSettledHeader(t *testing.T) {
	c, tp, ports := roundsGateway(t)
	alice := createToken(t, c, "alice", "--scope", "mcp", "--owner", "alice")
	for _, route := range []string{"guard", "broker", "aggregate"} {
		t.Run(route, func(t *testing.T) {
			tp.reset()
			url := fmt.Sprintf("http://127.0.0.1:%d/mcp", ports[route])
			args := `"arguments":{"team":"` + route + `"},`
			st, raw, res := rawRound(t, url, alice, multiRound, args)
			id := strings.TrimPrefix(res.RequestState, "zidane-approval.")
			if st != http.StatusOK || !approvalID.MatchString(id) {
				t.Fatalf("the held call: %d %s", st, raw)
			}
			if out, errOut, err := c.Run(t, "zidane", "approvals", "approve", id); err != nil {
				t.Fatalf("approve: %v %s %s", err, out, errOut)
			}
			st, raw, res = rawRound(t, url, alice, multiRound, args+`"requestState":"zidane-approval.`+id+`","inputResponses":{"`+id+`":{"action":"accept"}},`)
			round1 := strings.TrimPrefix(res.RequestState, "zidane-approval.")
			if st != http.StatusOK || !strings.HasPrefix(round1, "apr_") {
				t.Fatalf("the approved call: %d %s", st, raw)
			}
			if st, raw, _ = rawRound(t, url, alice, multiRound, args+`"requestState":"zidane-approval.`+round1+`","inputResponses":{"step1":{"action":"accept","content":{"name":"x"}}},`); st != http.StatusOK {
				t.Fatalf("the round: %d %s", st, raw)
			}
			before, _ := backendRounds(tp, multiRound, 2)
			other := `{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"` + multiRound + `","arguments":{"team":"` + route + `-other"},` + roundsMeta + `}}`
			for _, settled := range []string{id, round1} {
				a := post(t, url, alice, other, "Mcp-Protocol-Version", modernVersion, "Mcp-Method", "tools/call", "Mcp-Name", multiRound, "Zidane-Hop-Settled", settled)
				msgs := sseMessages(a.body)
				var m struct {
					Result roundResult `json:"result"`
				}
				if len(msgs) > 0 {
					json.Unmarshal(msgs[len(msgs)-1], &m)
				}
				again := strings.TrimPrefix(m.Result.RequestState, "zidane-approval.")
				if a.status != http.StatusOK || m.Result.ResultType != "input_required" || !approvalID.MatchString(again) || again == id {
					t.Errorf("another held call naming %s in Zidane-Hop-Settled: %d %s, want it held for a new approval", settled, a.status, a.body)
				}
			}
			if after, _ := tapRounds(tp, multiRound); len(after) != len(before) {
				t.Fatalf("a call claiming a settlement reached the backend: %q then %q", before, after)
			}
		})
	}
}

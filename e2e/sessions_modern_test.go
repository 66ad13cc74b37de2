package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// The sessions endpoint at MCP 2026-07-28, beside 2025-11-25 on one URL,
// through the built binary with the demo agent.

// modernSessions is the go-sdk client at 2026-07-28. Nothing is pushed to
// it: it follows each session it creates as a 2026-07-28 client does, by
// subscribing to the session's events resource through subscriptions/listen
// and reading the resource when notifications/resources/updated says it
// changed; each event read goes into its push log, so that the tests of
// pushes run unchanged on it.
type modernSessions struct {
	label string
	cs    *mcp.ClientSession
	log   *pushLog

	mu      sync.Mutex
	seen    map[int64]bool      // event seqs already logged
	acked   map[string]bool     // resources a listen stream acknowledged
	ackedCh chan struct{}       // closed and replaced at every ack
	updates map[string]int      // notifications/resources/updated per uri
	readErr map[string]error    // the last failed read per uri
	follow  map[string]struct{} // uris subscribed to
}

func connectModernSessions(t testing.TB, url, token, label string) *modernSessions {
	t.Helper()
	m := &modernSessions{label: label, log: newPushLog(), seen: map[int64]bool{}, acked: map[string]bool{},
		ackedCh: make(chan struct{}), updates: map[string]int{}, readErr: map[string]error{}, follow: map[string]struct{}{}}
	client := mcp.NewClient(&mcp.Implementation{Name: "e2e-modern-" + label, Version: "1"}, &mcp.ClientOptions{
		ResourceUpdatedHandler: func(_ context.Context, req *mcp.ResourceUpdatedNotificationRequest) {
			m.mu.Lock()
			m.updates[req.Params.URI]++
			m.mu.Unlock()
			go m.read(req.Params.URI)
		},
	})
	// The acknowledgement that opens a listen stream says the server holds
	// the subscription: from then on no event is missed.
	client.AddReceivingMiddleware(func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			if method == "notifications/subscriptions/acknowledged" {
				if p, ok := req.GetParams().(*mcp.SubscriptionsAcknowledgedParams); ok {
					m.mu.Lock()
					for _, uri := range p.Notifications.ResourceSubscriptions {
						m.acked[uri] = true
					}
					close(m.ackedCh)
					m.ackedCh = make(chan struct{})
					m.mu.Unlock()
				}
			}
			return next(ctx, method, req)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: bearerClient(token, nil)}, nil)
	if err != nil {
		t.Fatalf("go-sdk client %s at %s: connect: %v", label, modernVersion, err)
	}
	t.Cleanup(func() { cs.Close() })
	if v := cs.InitializeResult().ProtocolVersion; v != modernVersion || cs.ID() != "" {
		t.Fatalf("go-sdk client %s left to choose: version %q, MCP session %q; want %s without a session", label, v, cs.ID(), modernVersion)
	}
	m.cs = cs
	return m
}

func (m *modernSessions) name() string     { return m.label }
func (m *modernSessions) pushes() *pushLog { return m.log }

// tryCall calls tool; after a create it follows the new session.
func (m *modernSessions) tryCall(t testing.TB, tool string, args map[string]any) (toolAnswer, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), sessionCallTimeout)
	defer cancel()
	g := goSessions{label: m.label, cs: m.cs}
	a, err := g.callCtx(ctx, tool, args)
	if err == nil && !a.IsError && tool == "sessions" && args["verb"] == "create" {
		var cr struct {
			SessionID      string `json:"sessionId"`
			EventsResource string `json:"eventsResource"`
		}
		a.decode(t, &cr)
		if cr.EventsResource != "zidane://sessions/"+cr.SessionID+"/events" {
			t.Fatalf("%s: create answered events resource %q for %s", m.label, cr.EventsResource, cr.SessionID)
		}
		m.subscribe(t, cr.EventsResource)
	}
	return a, err
}

// subscribe opens a listen stream for uri, waits for its acknowledgement,
// then reads what happened before it.
func (m *modernSessions) subscribe(t testing.TB, uri string) {
	t.Helper()
	m.mu.Lock()
	m.follow[uri] = struct{}{}
	m.mu.Unlock()
	if err := m.cs.Subscribe(context.Background(), &mcp.SubscribeParams{URI: uri}); err != nil {
		t.Fatalf("%s: subscribe %s: %v", m.label, uri, err)
	}
	deadline := time.After(pushTimeout)
	for {
		m.mu.Lock()
		ok, ch := m.acked[uri], m.ackedCh
		m.mu.Unlock()
		if ok {
			break
		}
		select {
		case <-ch:
		case <-deadline:
			t.Fatalf("%s: no subscriptions/listen acknowledgement for %s", m.label, uri)
		}
	}
	m.read(uri)
}

// read reads uri and logs the events not seen yet, oldest first.
func (m *modernSessions) read(uri string) {
	ctx, cancel := context.WithTimeout(context.Background(), sessionCallTimeout)
	defer cancel()
	rr, err := m.cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: uri})
	if err != nil || len(rr.Contents) != 1 {
		m.mu.Lock()
		m.readErr[uri] = err
		m.mu.Unlock()
		return
	}
	var evs struct {
		Events []json.RawMessage `json:"events"`
	}
	json.Unmarshal([]byte(rr.Contents[0].Text), &evs)
	m.mu.Lock()
	defer m.mu.Unlock()
	for i := len(evs.Events) - 1; i >= 0; i-- {
		var ev eventView
		json.Unmarshal(evs.Events[i], &ev)
		if m.seen[ev.Seq] {
			continue
		}
		m.seen[ev.Seq] = true
		level := "info"
		if ev.Status == "error" || ev.Status == "needs-attention" {
			level = "warning"
		}
		var data any
		json.Unmarshal(evs.Events[i], &data)
		m.log.add("session-event", level, data)
	}
}

// TestSessionsModern: a go-sdk client at 2026-07-28 and one at 2025-11-25
// on the same URL each drive a session through every verb, the first
// following it through subscriptions/listen, the second through pushes.
func TestSessionsModern(t *testing.T) {
	gw := startSessionsGateway(t, "", "")
	token := createToken(t, gw.c, "modern", "--scope", "chat")
	modern := connectModernSessions(t, gw.url, token, "go-sdk-2026-07-28")
	legacy := connectGoSessions(t, gw.url, token, "go-sdk-2025-11-25")
	if v := legacy.cs.InitializeResult().ProtocolVersion; v != legacyVersion || legacy.cs.ID() == "" {
		t.Fatalf("legacy client: version %q, MCP session %q", v, legacy.cs.ID())
	}

	t.Run("server/discover lists both versions", func(t *testing.T) {
		a := post(t, gw.url, token, `{"jsonrpc":"2.0","id":1,"method":"server/discover","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{},"io.modelcontextprotocol/clientInfo":{"name":"raw","version":"1"}}}}`,
			"Mcp-Protocol-Version", modernVersion, "Mcp-Method", "server/discover")
		msgs := sseMessages(a.body)
		var r struct {
			Result struct {
				SupportedVersions []string `json:"supportedVersions"`
			} `json:"result"`
		}
		if a.status != http.StatusOK || len(msgs) != 1 || json.Unmarshal(msgs[0], &r) != nil ||
			!slices.Contains(r.Result.SupportedVersions, modernVersion) || !slices.Contains(r.Result.SupportedVersions, legacyVersion) {
			t.Fatalf("discover: %d %s", a.status, a.body)
		}
	})

	for _, c := range []sessionsClient{modern, legacy} {
		t.Run("every verb with the "+c.name()+" client", func(t *testing.T) {
			verbCycle(t, gw, c)
		})
	}

	t.Run("the 2026-07-28 client was told through subscriptions/listen", func(t *testing.T) {
		modern.mu.Lock()
		defer modern.mu.Unlock()
		for uri := range modern.follow {
			if modern.updates[uri] == 0 {
				t.Errorf("no notifications/resources/updated for %s", uri)
			}
			if err := modern.readErr[uri]; err != nil {
				t.Errorf("reading %s: %v", uri, err)
			}
		}
	})

	t.Run("wait, for a 2026-07-28 client that listens to nothing", func(t *testing.T) {
		quiet := connectModernSessions(t, gw.url, token, "quiet")
		g := &goSessions{label: "quiet", cs: quiet.cs, log: newPushLog()} // subscribes to nothing
		var cr createdView
		sessionsCall(t, g, "create", map[string]any{"cwd": t.TempDir(), "prompt": "sleep: 2s"}).decode(t, &cr)
		var w waitView
		sessionsCall(t, g, "wait", map[string]any{"sessionId": cr.SessionID, "timeout": 50}).decode(t, &w)
		if !w.Settled || w.State != "idle" || !strings.Contains(w.LastMessage, "Done sleeping.") {
			t.Fatalf("wait: %+v", w)
		}
	})

	t.Run("one session, driven at both versions", func(t *testing.T) {
		// Created by the legacy client, sent to by the modern one (same
		// token): the legacy client still gets the pushes, and the modern
		// one reads the same events.
		id := createSession(t, legacy, t.TempDir(), "shared").SessionID
		legacy.pushes().await(t, "done for "+id, eventFor(id, "done"))
		settleIn(t, modern, id, "idle")
		sendPrompt(t, modern, id, "from the other version")
		p := legacy.pushes().await(t, "the second done for "+id, func(p pushedEvent) bool {
			return p.Event.SessionID == id && p.Event.Status == "done" && strings.Contains(p.Event.Summary, "from the other version")
		})
		modern.subscribe(t, "zidane://sessions/"+id+"/events")
		modern.pushes().await(t, "the same event read by the modern client", func(q pushedEvent) bool { return q.Event.Seq == p.Event.Seq })
	})
}

// sseMessages are the data of an event stream's events, or the body itself
// when it is one JSON message.
func sseMessages(body string) []json.RawMessage {
	var out []json.RawMessage
	sc := bufio.NewScanner(strings.NewReader(body))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if data, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			out = append(out, json.RawMessage(data))
		}
	}
	if len(out) == 0 && strings.HasPrefix(strings.TrimSpace(body), "{") {
		out = append(out, json.RawMessage(body))
	}
	return out
}

// modernMeta is the _meta of a raw 2026-07-28 request.
const modernMeta = `"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{},"io.modelcontextprotocol/clientInfo":{"name":"raw","version":"1"}}`

// rawModern posts one 2026-07-28 request with its headers and returns the
// status and the last JSON-RPC message of the answer.
func rawModern(t *testing.T, url, token, method, name, params string) (int, json.RawMessage, string) {
	t.Helper()
	headers := []string{"Mcp-Protocol-Version", modernVersion, "Mcp-Method", method}
	if name != "" {
		headers = append(headers, "Mcp-Name", name)
	}
	a := post(t, url, token, `{"jsonrpc":"2.0","id":9,"method":"`+method+`","params":{`+params+modernMeta+`}}`, headers...)
	msgs := sseMessages(a.body)
	if len(msgs) == 0 {
		return a.status, nil, a.body
	}
	return a.status, msgs[len(msgs)-1], a.body
}

// TestSessionsModernAccess: a session's events resource is refused to
// every token that may not read the session, on resources/read and on
// subscriptions/listen, at the edge or at the endpoint; a crafted URI
// reaches nothing; a read token still cannot start an agent.
func TestSessionsModernAccess(t *testing.T) {
	gw := startSessionsGateway(t, "", "")
	alice := createToken(t, gw.c, "alice", "--scope", "chat", "--owner", "alice")
	reader := createToken(t, gw.c, "alice-reader", "--scope", "read", "--owner", "alice")
	bob := createToken(t, gw.c, "bob", "--scope", "chat")
	nobody := createToken(t, gw.c, "nobody", "--scope", "other")
	anyOwner := createToken(t, gw.c, "any-owner", "--scope", "sessions:any")

	a := connectModernSessions(t, gw.url, alice, "alice")
	g := &goSessions{label: "alice", cs: a.cs, log: newPushLog()}
	var cr createdView
	sessionsCall(t, g, "create", map[string]any{"cwd": t.TempDir(), "prompt": "the secret plan"}).decode(t, &cr)
	settleIn(t, g, cr.SessionID, "idle")
	uri := "zidane://sessions/" + cr.SessionID + "/events"
	uriJSON, _ := json.Marshal(uri)
	readParams := `"uri":` + string(uriJSON) + `,`
	listenParams := func(uris ...string) string {
		raw, _ := json.Marshal(uris)
		return `"notifications":{"resourceSubscriptions":` + string(raw) + `},`
	}

	// alice's own reader token (same owner, scope read) reads the events.
	st, msg, body := rawModern(t, gw.url, reader, "resources/read", uri, readParams)
	if st != http.StatusOK || !strings.Contains(string(msg), "the secret plan") {
		t.Fatalf("alice's reader: %d %s", st, body)
	}

	for _, tc := range []struct {
		who, token string
		status     int // of resources/read: 403 at the edge, 200 with an error from the endpoint
		code       int
		reason     string
	}{
		{"another owner", bob, http.StatusOK, -32003, "not_owner"},
		{"a token without sessions scopes", nobody, http.StatusForbidden, -32003, "insufficient_scope"},
		{"a token with only sessions:any", anyOwner, http.StatusForbidden, -32003, "insufficient_scope"},
	} {
		st, msg, body := rawModern(t, gw.url, tc.token, "resources/read", uri, readParams)
		if st != tc.status || strings.Contains(body, "the secret plan") || rpcErrorOf(msg).Code != tc.code || rpcErrorOf(msg).reason() != tc.reason {
			t.Errorf("%s, resources/read: %d %s", tc.who, st, body)
		}
		// Listen is open at the edge; the endpoint refuses the resource.
		st, msg, body = rawModern(t, gw.url, tc.token, "subscriptions/listen", "", listenParams(uri))
		if st != http.StatusOK || rpcErrorOf(msg).Code != -32003 || rpcErrorOf(msg).reason() != tc.reason {
			t.Errorf("%s, subscriptions/listen: %d %s", tc.who, st, body)
		}
	}

	// Crafted spellings of alice's URI name no session, for bob or anyone.
	for _, crafted := range []string{
		"zidane://sessions/" + strings.ToUpper(cr.SessionID) + "/events",
		"zidane://sessions/" + cr.SessionID + "/events/",
		"zidane://sessions/" + cr.SessionID + "/events?x",
		"zidane://sessions/%73" + cr.SessionID[1:] + "/events",
		"zidane://sessions/x/../" + cr.SessionID + "/events",
		"ZIDANE://sessions/" + cr.SessionID + "/events",
	} {
		cj, _ := json.Marshal(crafted)
		for _, tok := range []string{bob, alice} {
			_, _, body := rawModern(t, gw.url, tok, "resources/read", crafted, `"uri":`+string(cj)+`,`)
			if strings.Contains(body, "the secret plan") || !strings.Contains(body, `"error"`) {
				t.Errorf("read %s: %s", crafted, body)
			}
			_, _, body = rawModern(t, gw.url, tok, "subscriptions/listen", "", listenParams(crafted))
			if !strings.Contains(body, `"error"`) || strings.Contains(body, "acknowledged") {
				t.Errorf("listen %s: %s", crafted, body)
			}
		}
	}

	// The events template is listed to whoever may read events, to nobody
	// else.
	for _, tc := range []struct {
		token string
		want  bool
	}{{alice, true}, {reader, true}, {nobody, false}, {anyOwner, false}} {
		st, msg, body := rawModern(t, gw.url, tc.token, "resources/templates/list", "", "")
		if st != http.StatusOK || strings.Contains(string(msg), "zidane://sessions/{sessionId}/events") != tc.want {
			t.Errorf("resources/templates/list: %d %s (want the template listed: %v)", st, body, tc.want)
		}
	}

	// A read token cannot start or drive an agent at 2026-07-28 either.
	for _, verb := range []string{"create", "send", "steer", "cancel"} {
		st, _, body := rawModern(t, gw.url, reader, "tools/call", "sessions",
			`"name":"sessions","arguments":{"verb":"`+verb+`","sessionId":"`+cr.SessionID+`","cwd":"/tmp","prompt":"x","text":"x"},`)
		if st != http.StatusForbidden || !strings.Contains(body, "insufficient_scope") {
			t.Errorf("a read token's %s: %d %s", verb, st, body)
		}
	}
	// The resources/subscribe that 2026-07-28 replaced is refused.
	st, msg, body = rawModern(t, gw.url, alice, "resources/subscribe", "", readParams)
	if rpcErrorOf(msg).Code == 0 {
		t.Errorf("resources/subscribe: %d %s", st, body)
	}
}

type rpcErr struct {
	Code    int             `json:"code"`
	Message string          `json:"message"`
	Data    json.RawMessage `json:"data"`
}

func (e rpcErr) reason() string {
	var d struct {
		Reason string `json:"reason"`
	}
	json.Unmarshal(e.Data, &d)
	return d.Reason
}

func rpcErrorOf(msg json.RawMessage) rpcErr {
	var r struct {
		Error rpcErr `json:"error"`
	}
	json.Unmarshal(msg, &r)
	return r.Error
}

// TestSessionsModernListenRevoked: a raw subscriptions/listen stream gets
// notifications/resources/updated at a session's new event, and ends when
// its token is revoked (the edge ends a revoked token's open requests).
func TestSessionsModernListenRevoked(t *testing.T) {
	gw := startSessionsGateway(t, "", "")
	token := createToken(t, gw.c, "listener", "--scope", "chat")
	g := &goSessions{label: "listener", cs: connectModernSessions(t, gw.url, token, "listener").cs, log: newPushLog()}
	var cr createdView
	sessionsCall(t, g, "create", map[string]any{"cwd": t.TempDir(), "prompt": "first"}).decode(t, &cr)
	settleIn(t, g, cr.SessionID, "idle")
	uri := "zidane://sessions/" + cr.SessionID + "/events"
	uris, _ := json.Marshal([]string{uri})

	ctx, cancel := context.WithTimeout(context.Background(), 2*pushTimeout)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, gw.url, strings.NewReader(
		`{"jsonrpc":"2.0","id":1,"method":"subscriptions/listen","params":{"notifications":{"resourceSubscriptions":`+string(uris)+`},`+modernMeta+`}}`))
	for k, v := range map[string]string{"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
		"Authorization": "Bearer " + token, "Mcp-Protocol-Version": modernVersion, "Mcp-Method": "subscriptions/listen"} {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("listen: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	msgs := make(chan string, 16)
	go func() {
		defer close(msgs)
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			if data, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
				msgs <- data
			}
		}
	}()
	next := func(what string) (string, bool) {
		t.Helper()
		select {
		case m, ok := <-msgs:
			return m, ok
		case <-ctx.Done():
			t.Fatalf("nothing on the listen stream: %s", what)
			return "", false
		}
	}
	if m, _ := next("the acknowledgement"); !strings.Contains(m, "notifications/subscriptions/acknowledged") || !strings.Contains(m, uri) {
		t.Fatalf("first message: %s", m)
	}
	sendPrompt(t, g, cr.SessionID, "second")
	if m, _ := next("an update"); !strings.Contains(m, `"notifications/resources/updated"`) || !strings.Contains(m, uri) {
		t.Fatalf("update: %s", m)
	}
	if _, stderr, err := gw.c.Run(t, "zidane", "token", "revoke", "listener"); err != nil {
		t.Fatalf("revoke: %v\n%s", err, stderr)
	}
	for {
		m, ok := next("the end of the stream after the revocation")
		if !ok {
			break
		}
		if strings.Contains(m, `"notifications/resources/updated"`) {
			continue // the second turn's other events
		}
	}
}

//lint:file-ignore SA1019 session events travel as notifications/message (mcpendpoint/doc.go), so the client reads them with LoggingMessageHandler, deprecated only from protocol 2026-07-28.

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// The end-to-end tests of the sessions endpoint: `zidane_mcp { sessions }`
// on the built binary, reached through the edge with tokens, driving the
// built-in demo agent (`caddy zidane demo-agent`, a real ACP agent whose
// prompts script each turn). This file holds the helpers they share and
// the tests of every verb; sessions_*_test.go hold the rest.

// Bounds of the waits on sessions. The demo agent answers at once, so
// these only matter when something is broken.
const (
	sessionCallTimeout = 90 * time.Second // one tool call; wait may take 50s
	sessionSettle      = 60 * time.Second // a session reaching idle, blocked, ended or error
	pushTimeout        = 30 * time.Second // a <session-event> reaching a connected client
)

// sessionsCaddyfile serves the sessions endpoint on http://127.0.0.1:port.
// Besides the built-in demo agent it configures `nosteer`, the demo agent
// without the steering extension. zidane adds lines to the global zidane
// option; extra adds sites.
func sessionsCaddyfile(port int, zidane, extra string) string {
	return fmt.Sprintf(`{
	admin %s
	zidane {
		agent nosteer {
			command %s zidane demo-agent
			env ZIDANE_DEMO_AGENT_STEERING 0
		}
		default_agent demo
%s
	}
}

http://127.0.0.1:%d {
	zidane_mcp {
		sessions
		rate_limit {
			per_token 500/s 1000
			per_ip 50/s 100
		}
	}
}
%s`, AdminPlaceholder, caddyBin, zidane, port, extra)
}

// sessionsGateway is a caddy serving the sessions endpoint.
type sessionsGateway struct {
	c    *Caddy
	port int
	base string // http://127.0.0.1:PORT
	url  string // the MCP endpoint, base + /mcp
}

func startSessionsGateway(t *testing.T, zidane, extra string) *sessionsGateway {
	t.Helper()
	port := freePort(t)
	c := startCaddy(t, sessionsCaddyfile(port, zidane, extra))
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	return &sessionsGateway{c: c, port: port, base: base, url: base + "/mcp"}
}

// What the tools answer, as structured content. The JSON shapes are the
// contract with clients, so the tests read them rather than the Go types.

type sessionView struct {
	SessionID   string `json:"sessionId"`
	Title       string `json:"title"`
	Cwd         string `json:"cwd"`
	Agent       string `json:"agent"`
	State       string `json:"state"`
	LastMessage string `json:"lastMessage"`
	Truncated   bool   `json:"truncated"`
	Turns       int    `json:"turns"`
	Queued      int    `json:"queued"`
	Error       string `json:"error"`
	Link        string `json:"link"`
	Worker      bool   `json:"worker"`
	Unreachable bool   `json:"unreachable"`
}

type createdView struct {
	SessionID string `json:"sessionId"`
	Link      string `json:"link"`
}

type waitView struct {
	sessionView
	Settled        bool     `json:"settled"`
	TimeoutSeconds int      `json:"timeoutSeconds"`
	Notes          []string `json:"notes"`
}

type listView struct {
	Sessions []sessionView `json:"sessions"`
	Partial  bool          `json:"partial"`
	Limit    int           `json:"limit"`
	Notes    []string      `json:"notes"`
}

type turnView struct {
	Index      int    `json:"index"`
	Prompt     string `json:"prompt"`
	Answer     string `json:"answer"`
	StopReason string `json:"stopReason"`
	Truncated  bool   `json:"truncated"`
}

type transcriptView struct {
	SessionID string     `json:"sessionId"`
	Turns     []turnView `json:"turns"`
	Truncated bool       `json:"truncated"`
	Notes     []string   `json:"notes"`
}

type eventView struct {
	Seq       int64  `json:"seq"`
	SessionID string `json:"sessionId"`
	Status    string `json:"status"`
	Kind      string `json:"kind"`
	Summary   string `json:"summary"`
	RequestID string `json:"requestId"`
	Text      string `json:"text"` // pushed events only: what a model reads
}

type eventsView struct {
	Events []eventView `json:"events"`
	Limit  int         `json:"limit"`
	Notes  []string    `json:"notes"`
}

type interactionView struct {
	RequestID string          `json:"requestId"`
	SessionID string          `json:"sessionId"`
	Kind      string          `json:"kind"`
	Summary   string          `json:"summary"`
	Payload   json.RawMessage `json:"payload"`
}

type pendingView struct {
	Interactions []interactionView `json:"interactions"`
}

// toolAnswer is a tools/call result: the text a model reads, the error
// flag, and the structured content.
type toolAnswer struct {
	Text    string
	IsError bool
	Data    json.RawMessage
}

func (a toolAnswer) decode(t testing.TB, v any) {
	t.Helper()
	if err := json.Unmarshal(a.Data, v); err != nil {
		t.Fatalf("structured content %s: %v", a.Data, err)
	}
}

// errorCode is the stable name of a tool error (structuredContent.error).
func (a toolAnswer) errorCode() string {
	var e struct {
		Error string `json:"error"`
	}
	json.Unmarshal(a.Data, &e)
	return e.Error
}

// pushedEvent is a notifications/message a client received.
type pushedEvent struct {
	Logger string
	Level  string
	Event  eventView // Data, when it is a session event
	Raw    string    // Data as JSON
}

// pushLog collects what the server pushed to one client.
type pushLog struct {
	mu     sync.Mutex
	events []pushedEvent
	added  chan struct{} // closed and replaced at every add
}

func newPushLog() *pushLog { return &pushLog{added: make(chan struct{})} }

func (l *pushLog) add(logger, level string, data any) {
	raw, _ := json.Marshal(data)
	p := pushedEvent{Logger: logger, Level: level, Raw: string(raw)}
	json.Unmarshal(raw, &p.Event)
	l.mu.Lock()
	l.events = append(l.events, p)
	close(l.added)
	l.added = make(chan struct{})
	l.mu.Unlock()
}

// await returns the first pushed event that match accepts, waiting up to
// pushTimeout for it.
func (l *pushLog) await(t testing.TB, what string, match func(pushedEvent) bool) pushedEvent {
	t.Helper()
	deadline := time.After(pushTimeout)
	for {
		l.mu.Lock()
		for _, p := range l.events {
			if match(p) {
				l.mu.Unlock()
				return p
			}
		}
		added := l.added
		seen := len(l.events)
		l.mu.Unlock()
		select {
		case <-added:
		case <-deadline:
			l.mu.Lock()
			defer l.mu.Unlock()
			var got []string
			for _, p := range l.events {
				got = append(got, p.Logger+": "+p.Raw)
			}
			t.Fatalf("no pushed event %s within %s; the client received %d:\n%s", what, pushTimeout, seen, strings.Join(got, "\n"))
		}
	}
}

// sessionsClient is an MCP client of the sessions endpoint: the go-sdk
// client or the TypeScript SDK client (tsclient.mjs).
type sessionsClient interface {
	name() string
	// tryCall calls tool; err is set when the call failed below the tool
	// (an HTTP refusal, a protocol error).
	tryCall(t testing.TB, tool string, args map[string]any) (toolAnswer, error)
	pushes() *pushLog
}

// goSessions is the go-sdk client.
type goSessions struct {
	label string
	cs    *mcp.ClientSession
	log   *pushLog
}

// connectGoSessions connects the go-sdk client with token, logging every
// notifications/message it receives.
func connectGoSessions(t testing.TB, url, token, label string) *goSessions {
	t.Helper()
	g, err := tryConnectGoSessions(t, url, token, label)
	if err != nil {
		t.Fatalf("go-sdk client %s: connect to %s: %v", label, url, err)
	}
	return g
}

func tryConnectGoSessions(t testing.TB, url, token, label string) (*goSessions, error) {
	t.Helper()
	return tryConnectGoSessionsAt(t, url, token, label, legacyVersion)
}

// tryConnectGoSessionsAt connects the go-sdk client pinned to protocol
// version ("" lets it choose, and it tries 2026-07-28 first).
func tryConnectGoSessionsAt(t testing.TB, url, token, label, version string) (*goSessions, error) {
	t.Helper()
	g := &goSessions{label: label, log: newPushLog()}
	client := mcp.NewClient(&mcp.Implementation{Name: "e2e-sessions-" + label, Version: "1"}, &mcp.ClientOptions{
		LoggingMessageHandler: func(_ context.Context, req *mcp.LoggingMessageRequest) {
			g.log.add(req.Params.Logger, string(req.Params.Level), req.Params.Data)
		},
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: bearerClient(token, nil)},
		&mcp.ClientSessionOptions{ProtocolVersion: version})
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { cs.Close() })
	g.cs = cs
	return g, nil
}

func (g *goSessions) name() string     { return g.label }
func (g *goSessions) pushes() *pushLog { return g.log }

func (g *goSessions) tryCall(t testing.TB, tool string, args map[string]any) (toolAnswer, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), sessionCallTimeout)
	defer cancel()
	return g.callCtx(ctx, tool, args)
}

func (g *goSessions) callCtx(ctx context.Context, tool string, args map[string]any) (toolAnswer, error) {
	res, err := g.cs.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		return toolAnswer{}, err
	}
	var a toolAnswer
	a.IsError = res.IsError
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			a.Text += tc.Text
		}
	}
	a.Data, _ = json.Marshal(res.StructuredContent)
	return a, nil
}

// tsSessions is the TypeScript SDK client, one MCP session held open by
// tsclient.mjs.
type tsSessions struct {
	label string
	s     *tsSession
	log   *pushLog
}

func connectTSSessions(t testing.TB, url, token, label string) *tsSessions {
	t.Helper()
	ts := &tsSessions{label: label, s: startTSSession(t, url, token), log: newPushLog()}
	quit := make(chan struct{})
	t.Cleanup(func() { close(quit) })
	go func() {
		for {
			select {
			case raw := <-ts.s.Notifications():
				var n struct {
					Method string `json:"method"`
					Params struct {
						Level  string `json:"level"`
						Logger string `json:"logger"`
						Data   any    `json:"data"`
					} `json:"params"`
				}
				if json.Unmarshal(raw, &n) == nil && n.Method == "notifications/message" {
					ts.log.add(n.Params.Logger, n.Params.Level, n.Params.Data)
				}
			case <-quit:
				return
			}
		}
	}()
	return ts
}

func (c *tsSessions) name() string     { return c.label }
func (c *tsSessions) pushes() *pushLog { return c.log }

func (c *tsSessions) tryCall(t testing.TB, tool string, args map[string]any) (toolAnswer, error) {
	t.Helper()
	res, failure := c.s.Do(t, map[string]any{"op": "call", "name": tool, "arguments": args})
	if failure != nil {
		return toolAnswer{}, fmt.Errorf("%s (HTTP status %d, JSON-RPC code %d)", failure.Error, failure.Status, failure.RPCCode)
	}
	var r struct {
		Content []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		} `json:"content"`
		StructuredContent json.RawMessage `json:"structuredContent"`
		IsError           bool            `json:"isError"`
	}
	if err := json.Unmarshal(res, &r); err != nil {
		t.Fatalf("TS client: unreadable CallToolResult %s: %v", res, err)
	}
	a := toolAnswer{IsError: r.IsError, Data: r.StructuredContent}
	for _, c := range r.Content {
		if c.Type == "text" {
			a.Text += c.Text
		}
	}
	return a, nil
}

// call calls tool and fails the test if the call itself failed.
func callTool(t testing.TB, c sessionsClient, tool string, args map[string]any) toolAnswer {
	t.Helper()
	a, err := c.tryCall(t, tool, args)
	if err != nil {
		t.Fatalf("%s: %s %v: %v", c.name(), tool, args, err)
	}
	return a
}

// ok calls tool and fails the test unless it succeeded.
func callOK(t testing.TB, c sessionsClient, tool string, args map[string]any) toolAnswer {
	t.Helper()
	a := callTool(t, c, tool, args)
	if a.IsError {
		t.Fatalf("%s: %s %v answered an error: %s", c.name(), tool, args, a.Text)
	}
	return a
}

// refused calls tool and fails the test unless it answered a tool error
// with code; it returns the error text.
func callRefused(t testing.TB, c sessionsClient, tool string, args map[string]any, code string) string {
	t.Helper()
	a := callTool(t, c, tool, args)
	if !a.IsError || a.errorCode() != code {
		t.Fatalf("%s: %s %v answered (isError %v, code %q) %s; want error %q", c.name(), tool, args, a.IsError, a.errorCode(), a.Text, code)
	}
	return a.Text
}

func sessionsCall(t testing.TB, c sessionsClient, verb string, args map[string]any) toolAnswer {
	t.Helper()
	full := map[string]any{"verb": verb}
	for k, v := range args {
		full[k] = v
	}
	return callOK(t, c, "sessions", full)
}

func createSession(t testing.TB, c sessionsClient, cwd, prompt string, more ...any) createdView {
	t.Helper()
	args := map[string]any{"cwd": cwd, "prompt": prompt}
	for i := 0; i+1 < len(more); i += 2 {
		args[more[i].(string)] = more[i+1]
	}
	var cr createdView
	sessionsCall(t, c, "create", args).decode(t, &cr)
	if !strings.HasPrefix(cr.SessionID, "ses_") {
		t.Fatalf("create answered session id %q", cr.SessionID)
	}
	return cr
}

func sendPrompt(t testing.TB, c sessionsClient, id, prompt string) (queued bool) {
	t.Helper()
	var r struct {
		Queued bool `json:"queued"`
	}
	sessionsCall(t, c, "send", map[string]any{"sessionId": id, "prompt": prompt}).decode(t, &r)
	return r.Queued
}

func readSession(t testing.TB, c sessionsClient, id string, full bool) sessionView {
	t.Helper()
	var v sessionView
	sessionsCall(t, c, "read", map[string]any{"sessionId": id, "full": full}).decode(t, &v)
	return v
}

func transcriptOf(t testing.TB, c sessionsClient, id string, args map[string]any) transcriptView {
	t.Helper()
	all := map[string]any{"sessionId": id}
	for k, v := range args {
		all[k] = v
	}
	var tr transcriptView
	sessionsCall(t, c, "transcript", all).decode(t, &tr)
	return tr
}

func eventsOf(t testing.TB, c sessionsClient, filter map[string]any) eventsView {
	t.Helper()
	var ev eventsView
	sessionsCall(t, c, "events", filter).decode(t, &ev)
	return ev
}

func pendingOf(t testing.TB, c sessionsClient, id string) []interactionView {
	t.Helper()
	args := map[string]any{"verb": "pending"}
	if id != "" {
		args["sessionId"] = id
	}
	var p pendingView
	callOK(t, c, "interactions", args).decode(t, &p)
	return p.Interactions
}

// settle calls wait (a few seconds at a time) until the session is idle,
// blocked, ended or errored, and returns its view then. It fails the test
// after sessionSettle.
func settle(t testing.TB, c sessionsClient, id string) sessionView {
	t.Helper()
	deadline := time.Now().Add(sessionSettle)
	for {
		var w waitView
		sessionsCall(t, c, "wait", map[string]any{"sessionId": id, "timeout": 5}).decode(t, &w)
		if w.Settled {
			return w.sessionView
		}
		if time.Now().After(deadline) {
			t.Fatalf("session %s still %s after %s: %+v", id, w.State, sessionSettle, w.sessionView)
		}
	}
}

// settleIn settles the session and fails unless it is then in state want.
func settleIn(t testing.TB, c sessionsClient, id, want string) sessionView {
	t.Helper()
	v := settle(t, c, id)
	if v.State != want {
		t.Fatalf("session %s settled %s, want %s: %+v", id, v.State, want, v)
	}
	return v
}

// awaitMessage reads the session until its last message contains want,
// for a turn that is still running (a sleep that has started).
func awaitMessage(t testing.TB, c sessionsClient, id, want string) sessionView {
	t.Helper()
	deadline := time.Now().Add(sessionSettle)
	for {
		v := readSession(t, c, id, true)
		if strings.Contains(v.LastMessage, want) {
			return v
		}
		if time.Now().After(deadline) {
			t.Fatalf("session %s: last message never contained %q: %+v", id, want, v)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// onlyPending returns the one pending interaction of the session.
func onlyPending(t testing.TB, c sessionsClient, id string) interactionView {
	t.Helper()
	list := pendingOf(t, c, id)
	if len(list) != 1 {
		t.Fatalf("session %s has %d pending interactions, want 1: %+v", id, len(list), list)
	}
	return list[0]
}

func answerInteraction(t testing.TB, c sessionsClient, requestID string, how map[string]any) toolAnswer {
	t.Helper()
	args := map[string]any{"verb": "answer", "requestId": requestID}
	for k, v := range how {
		args[k] = v
	}
	return callTool(t, c, "interactions", args)
}

func lastTurn(t testing.TB, tr transcriptView) turnView {
	t.Helper()
	if len(tr.Turns) == 0 {
		t.Fatalf("transcript of %s has no turns", tr.SessionID)
	}
	return tr.Turns[len(tr.Turns)-1]
}

func eventFor(id, status string) func(pushedEvent) bool {
	return func(p pushedEvent) bool {
		return p.Logger == "session-event" && p.Event.SessionID == id && p.Event.Status == status
	}
}

// gitRepo makes a git repository with one commit in a new directory.
func gitRepo(t *testing.T) string {
	t.Helper()
	if _, err := exec.LookPath("git"); err != nil {
		requireOrSkip(t, "git is not installed")
	}
	dir := filepath.Join(t.TempDir(), "app")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "login.go"), []byte("package app\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"init", "-q", "-b", "main"},
		{"add", "."},
		{"-c", "user.name=e2e", "-c", "user.email=e2e@example.invalid", "commit", "-q", "-m", "initial"},
	} {
		gitIn(t, dir, args...)
	}
	return dir
}

func gitIn(t *testing.T, dir string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), commandTimeout)
	defer cancel()
	cmd := boundedCommand(ctx, "git", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GIT_TERMINAL_PROMPT=0", "LC_ALL=C")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// TestSessionsEveryVerb drives one session through every verb of both
// tools, once with the go-sdk client and once with the TypeScript SDK
// client, and checks what each answer tells a user.
func TestSessionsEveryVerb(t *testing.T) {
	gw := startSessionsGateway(t, "", "")
	token := createToken(t, gw.c, "verbs", "--scope", "chat")

	clients := []sessionsClient{
		connectGoSessions(t, gw.url, token, "go-sdk"),
		connectTSSessions(t, gw.url, token, "typescript"),
	}

	t.Run("tools/list offers both tools to a chat token", func(t *testing.T) {
		g := clients[0].(*goSessions)
		tools, err := g.cs.ListTools(context.Background(), nil)
		if err != nil {
			t.Fatal(err)
		}
		if got := toolNamesOf(tools); !slices.Equal(got, []string{"sessions", "interactions"}) && !slices.Equal(got, []string{"interactions", "sessions"}) {
			t.Fatalf("tools = %v", got)
		}
		out, err := tsClient(t, gw.url, token, "list-tools")
		if err != nil || !strings.Contains(out, `"sessions"`) || !strings.Contains(out, `"interactions"`) {
			t.Fatalf("TS list-tools: %v %s", err, out)
		}
	})

	for _, c := range clients {
		t.Run("every verb with the "+c.name()+" client", func(t *testing.T) {
			verbCycle(t, gw, c)
		})
	}
}

// verbCycle is one session driven through every verb by c.
func verbCycle(t *testing.T, gw *sessionsGateway, c sessionsClient) {
	dir := t.TempDir()
	greeting := "hello from the " + c.name() + " client"
	cr := createSession(t, c, dir, greeting)
	id := cr.SessionID
	if want := gw.base + "/zidane/session/" + id + "?cap="; !strings.HasPrefix(cr.Link, want) {
		t.Errorf("create link = %q, want it to start with %q", cr.Link, want)
	}

	// create: the first turn runs in the background and its end is pushed.
	p := c.pushes().await(t, "done for "+id, eventFor(id, "done"))
	wantTag := fmt.Sprintf(`<session-event session="%s" status="done" seq="%d">`, id, p.Event.Seq)
	if !strings.HasPrefix(p.Event.Text, wantTag) || !strings.Contains(p.Event.Text, "You said: "+greeting) || p.Level != "info" {
		t.Errorf("pushed event = %s (level %s), want %s… carrying the answer", p.Raw, p.Level, wantTag)
	}

	t.Run("read", func(t *testing.T) {
		v := settleIn(t, c, id, "idle")
		if v.Title != greeting || v.Cwd != dir || v.Agent != "demo" || v.Turns != 1 || v.LastMessage != "You said: "+greeting || v.Link == "" {
			t.Fatalf("read = %+v", v)
		}
	})

	t.Run("send runs at once, then queues behind the running turn", func(t *testing.T) {
		if queued := sendPrompt(t, c, id, "sleep: 5m"); queued {
			t.Fatal("send to an idle session said it was queued")
		}
		awaitMessage(t, c, id, "Sleeping for 5m0s")
		a := sessionsCall(t, c, "send", map[string]any{"sessionId": id, "prompt": "after the nap"})
		var r struct {
			Queued bool `json:"queued"`
		}
		a.decode(t, &r)
		if !r.Queued || !strings.Contains(a.Text, "queued behind the running turn") {
			t.Fatalf("send to a running session: %s %s", a.Data, a.Text)
		}
		if v := readSession(t, c, id, false); v.State != "running" || v.Queued != 1 {
			t.Fatalf("read while sleeping = %+v, want running with 1 queued", v)
		}
	})

	t.Run("wait with a short timeout reports the session still running", func(t *testing.T) {
		var w waitView
		a := sessionsCall(t, c, "wait", map[string]any{"sessionId": id, "timeout": 1})
		a.decode(t, &w)
		if w.Settled || w.State != "running" || w.TimeoutSeconds != 1 || !strings.Contains(a.Text, "still running after 1 seconds") {
			t.Fatalf("wait = %s\n%s", a.Data, a.Text)
		}
	})

	t.Run("steer reaches the running turn through the steering extension", func(t *testing.T) {
		var s struct {
			Mode string `json:"mode"`
		}
		a := sessionsCall(t, c, "steer", map[string]any{"sessionId": id, "text": "wrap up now"})
		a.decode(t, &s)
		if s.Mode != "steering" || !strings.Contains(a.Text, "as steering") {
			t.Fatalf("steer = %s %s", a.Data, a.Text)
		}
		v := settleIn(t, c, id, "idle")
		if v.Turns != 3 || v.LastMessage != "You said: after the nap" {
			t.Fatalf("after steering and the queued prompt: %+v", v)
		}
		tr := transcriptOf(t, c, id, nil)
		if len(tr.Turns) != 3 {
			t.Fatalf("transcript has %d turns: %+v", len(tr.Turns), tr)
		}
		nap := tr.Turns[1]
		if nap.Index != 2 || !strings.HasPrefix(nap.Prompt, "sleep: 5m") || !strings.Contains(nap.Answer, "Woken early by steering") ||
			!strings.Contains(nap.Answer, "Steered: wrap up now") || nap.StopReason != "end_turn" {
			t.Fatalf("the steered turn = %+v", nap)
		}
		if q := tr.Turns[2]; q.Index != 3 || q.Prompt != "after the nap" || q.Answer != "You said: after the nap" {
			t.Fatalf("the queued turn = %+v", q)
		}
	})

	t.Run("a question blocks the session until answered", func(t *testing.T) {
		sendPrompt(t, c, id, "ask: what is your favourite colour?")
		if v := settle(t, c, id); v.State != "blocked" {
			t.Fatalf("session with a question is %s", v.State)
		}
		p := c.pushes().await(t, "needs-attention for "+id, eventFor(id, "needs-attention"))
		it := onlyPending(t, c, id)
		if it.Kind != "question" || it.Summary != "Question: what is your favourite colour?" || p.Event.RequestID != it.RequestID || p.Level != "warning" ||
			!strings.Contains(p.Event.Text, `request="`+it.RequestID+`"`) {
			t.Fatalf("pending = %+v, pushed = %s", it, p.Raw)
		}
		all := pendingOf(t, c, "")
		if !slices.ContainsFunc(all, func(x interactionView) bool { return x.RequestID == it.RequestID }) {
			t.Fatalf("pending for all sessions lacks %s: %+v", it.RequestID, all)
		}
		// An answer of the wrong shape leaves it pending.
		if a := answerInteraction(t, c, it.RequestID, map[string]any{"decision": "allow"}); !a.IsError {
			t.Fatalf("a decision for a question was accepted: %s", a.Text)
		}
		if a := answerInteraction(t, c, it.RequestID, map[string]any{"action": "accept", "content": map[string]any{"answer": "blue"}}); a.IsError ||
			!strings.Contains(a.Text, "Answered "+it.RequestID) {
			t.Fatalf("answer: %s", a.Text)
		}
		if v := settleIn(t, c, id, "idle"); v.LastMessage != "You answered: blue" {
			t.Fatalf("after the answer: %+v", v)
		}
	})

	t.Run("an approval is answered by decision", func(t *testing.T) {
		sendPrompt(t, c, id, "approve: rm -rf build")
		settleIn(t, c, id, "blocked")
		it := onlyPending(t, c, id)
		var payload struct {
			ToolCall struct {
				Title string         `json:"title"`
				Kind  string         `json:"kind"`
				Input map[string]any `json:"input"`
			} `json:"toolCall"`
			Options []struct {
				OptionID string `json:"optionId"`
				Kind     string `json:"kind"`
			} `json:"options"`
		}
		json.Unmarshal(it.Payload, &payload)
		var ids []string
		for _, o := range payload.Options {
			ids = append(ids, o.OptionID)
		}
		if it.Kind != "approval" || payload.ToolCall.Title != "rm -rf build" || payload.ToolCall.Kind != "execute" ||
			payload.ToolCall.Input["command"] != "rm -rf build" || !slices.Equal(ids, []string{"allow_always", "allow", "reject"}) {
			t.Fatalf("approval = %+v payload %s", it, it.Payload)
		}
		if a := answerInteraction(t, c, it.RequestID, map[string]any{"decision": "reject"}); a.IsError {
			t.Fatalf("answer: %s", a.Text)
		}
		if v := settleIn(t, c, id, "idle"); v.LastMessage != "Rejected: rm -rf build" {
			t.Fatalf("after rejecting: %+v", v)
		}
	})

	t.Run("a plan is answered by option id", func(t *testing.T) {
		sendPrompt(t, c, id, "plan: 1. write the test\n2. fix the bug")
		settleIn(t, c, id, "blocked")
		it := onlyPending(t, c, id)
		var payload struct {
			Plan string `json:"plan"`
		}
		json.Unmarshal(it.Payload, &payload)
		if it.Kind != "plan" || it.Summary != "Plan approval: 1. write the test" || payload.Plan != "1. write the test\n2. fix the bug" {
			t.Fatalf("plan = %+v payload %s", it, it.Payload)
		}
		if a := answerInteraction(t, c, it.RequestID, map[string]any{"optionId": "not-offered"}); !a.IsError || !strings.Contains(a.Text, "default") {
			t.Fatalf("an option that was not offered: %s", a.Text)
		}
		if a := answerInteraction(t, c, it.RequestID, map[string]any{"optionId": "default"}); a.IsError {
			t.Fatalf("answer: %s", a.Text)
		}
		if v := settleIn(t, c, id, "idle"); v.LastMessage != "Plan approved." {
			t.Fatalf("after approving the plan: %+v", v)
		}
	})

	t.Run("cancel during a pending approval ends it as cancelled", func(t *testing.T) {
		sendPrompt(t, c, id, "approve: deploy to production")
		settleIn(t, c, id, "blocked")
		it := onlyPending(t, c, id)
		a := sessionsCall(t, c, "cancel", map[string]any{"sessionId": id})
		if !strings.Contains(a.Text, "Cancelled the running turn") {
			t.Fatalf("cancel: %s", a.Text)
		}
		v := settleIn(t, c, id, "idle")
		if got := pendingOf(t, c, id); len(got) != 0 {
			t.Fatalf("pending after cancel: %+v", got)
		}
		if msg := callRefused(t, c, "interactions", map[string]any{"verb": "answer", "requestId": it.RequestID, "decision": "allow"}, "no_interaction"); !strings.Contains(msg, "cancelled") {
			t.Fatalf("answering the cancelled interaction: %s", msg)
		}
		if last := lastTurn(t, transcriptOf(t, c, id, nil)); last.Prompt != "approve: deploy to production" || last.StopReason != "cancelled" {
			t.Fatalf("the cancelled turn = %+v (session %+v)", last, v)
		}
		c.pushes().await(t, "cancelled for "+id, eventFor(id, "cancelled"))
		// Nothing runs now: cancel says so.
		if msg := callRefused(t, c, "sessions", map[string]any{"verb": "cancel", "sessionId": id}, "not_running"); !strings.Contains(msg, "not running") {
			t.Fatalf("cancel of an idle session: %s", msg)
		}
	})

	t.Run("a failed turn is an error event and the session goes on", func(t *testing.T) {
		sendPrompt(t, c, id, "fail")
		v := settleIn(t, c, id, "idle")
		if !strings.Contains(v.Error, "fails on purpose") {
			t.Fatalf("after a failed turn: %+v", v)
		}
		p := c.pushes().await(t, "error for "+id, eventFor(id, "error"))
		if !strings.Contains(p.Event.Summary, "fails on purpose") || p.Level != "warning" {
			t.Fatalf("pushed error event = %s", p.Raw)
		}
		sendPrompt(t, c, id, "still there?")
		if v := settleIn(t, c, id, "idle"); v.LastMessage != "You said: still there?" || v.Error != "" {
			t.Fatalf("the turn after a failed one: %+v", v)
		}
	})

	t.Run("list shows the session as the caller's worker", func(t *testing.T) {
		var l listView
		sessionsCall(t, c, "list", nil).decode(t, &l)
		i := slices.IndexFunc(l.Sessions, func(v sessionView) bool { return v.SessionID == id })
		if i < 0 || !l.Sessions[i].Worker || l.Sessions[i].State != "idle" || l.Limit != 30 {
			t.Fatalf("list = %+v", l)
		}
	})

	t.Run("transcript holds every turn in order", func(t *testing.T) {
		tr := transcriptOf(t, c, id, nil)
		var prompts []string
		for i, turn := range tr.Turns {
			if turn.Index != i+1 {
				t.Errorf("turn %d has index %d", i+1, turn.Index)
			}
			prompts = append(prompts, strings.SplitN(turn.Prompt, "\n", 2)[0])
		}
		want := []string{greeting, "sleep: 5m", "after the nap", "ask: what is your favourite colour?", "approve: rm -rf build",
			"plan: 1. write the test", "approve: deploy to production", "fail", "still there?"}
		if !slices.Equal(prompts, want) {
			t.Fatalf("transcript prompts = %q, want %q", prompts, want)
		}
	})

	t.Run("events finds what happened, newest first", func(t *testing.T) {
		all := eventsOf(t, c, map[string]any{"sessionId": id, "limit": 100}).Events
		var statuses []string
		for i, ev := range all {
			if ev.SessionID != id {
				t.Fatalf("events for %s returned one of %s", id, ev.SessionID)
			}
			if i > 0 && ev.Seq >= all[i-1].Seq {
				t.Fatalf("events not newest first: %+v", all)
			}
			statuses = append(statuses, ev.Status)
		}
		slices.Reverse(statuses)
		want := []string{"done", "done", "done", "needs-attention", "done", "needs-attention", "done", "needs-attention", "done",
			"needs-attention", "cancelled", "error", "done"}
		if !slices.Equal(statuses, want) {
			t.Fatalf("event statuses oldest first = %q, want %q", statuses, want)
		}
	})
}

// TestSessionsEvents checks event delivery to the connected client that
// created a session, and the filters of the events verb.
func TestSessionsEvents(t *testing.T) {
	gw := startSessionsGateway(t, "", "")
	token := createToken(t, gw.c, "events", "--scope", "chat")
	g := connectGoSessions(t, gw.url, token, "go-sdk")
	other := connectGoSessions(t, gw.url, token, "other")
	dir := t.TempDir()

	a := createSession(t, g, dir, "first session").SessionID
	b := createSession(t, g, dir, "second session").SessionID
	for _, id := range []string{a, b} {
		settleIn(t, g, id, "idle")
	}

	t.Run("the creating client receives a session-event log message", func(t *testing.T) {
		for _, id := range []string{a, b} {
			p := g.pushes().await(t, "done for "+id, eventFor(id, "done"))
			if !strings.Contains(p.Event.Text, `<session-event session="`+id+`" status="done"`) || p.Event.Kind != "finished" {
				t.Fatalf("pushed = %s", p.Raw)
			}
		}
		// Another MCP session of the same token created nothing: it gets no push.
		createSession(t, other, dir, "the other client's session")
		other.pushes().await(t, "done for the other client's session", func(p pushedEvent) bool { return p.Event.Status == "done" })
		g.pushes().mu.Lock()
		defer g.pushes().mu.Unlock()
		for _, p := range g.pushes().events {
			if p.Event.SessionID != a && p.Event.SessionID != b {
				t.Errorf("the go-sdk client received an event of a session it did not create: %s", p.Raw)
			}
		}
	})

	sendPrompt(t, g, a, "ask: which branch?")
	settleIn(t, g, a, "blocked")
	asked := g.pushes().await(t, "needs-attention for "+a, eventFor(a, "needs-attention"))
	it := onlyPending(t, g, a)
	answerInteraction(t, g, it.RequestID, map[string]any{"action": "decline"})
	if v := settleIn(t, g, a, "idle"); v.LastMessage != "You declined to answer." {
		t.Fatalf("after declining: %+v", v)
	}
	sendPrompt(t, g, b, "fail")
	settleIn(t, g, b, "idle")
	g.pushes().await(t, "error for "+b, eventFor(b, "error"))

	seqs := func(evs []eventView) []int64 {
		var out []int64
		for _, e := range evs {
			out = append(out, e.Seq)
		}
		return out
	}
	for _, tc := range []struct {
		name   string
		filter map[string]any
		check  func(t *testing.T, evs []eventView)
	}{
		{"sessionId", map[string]any{"sessionId": a}, func(t *testing.T, evs []eventView) {
			// a: done (first), needs-attention, done (declined)
			if len(evs) != 3 || evs[0].Status != "done" || evs[1].Status != "needs-attention" || evs[2].Status != "done" {
				t.Fatalf("events of %s: %+v", a, evs)
			}
		}},
		{"status", map[string]any{"status": "error"}, func(t *testing.T, evs []eventView) {
			if len(evs) != 1 || evs[0].SessionID != b || !strings.Contains(evs[0].Summary, "fails on purpose") {
				t.Fatalf("error events: %+v", evs)
			}
		}},
		{"status needs-attention with text", map[string]any{"status": "needs-attention", "text": "WHICH BRANCH"}, func(t *testing.T, evs []eventView) {
			if len(evs) != 1 || evs[0].RequestID != it.RequestID || evs[0].Seq != asked.Event.Seq {
				t.Fatalf("needs-attention events about the branch: %+v", evs)
			}
		}},
		{"text", map[string]any{"text": "second session"}, func(t *testing.T, evs []eventView) {
			if len(evs) != 2 || evs[0].SessionID != b || evs[1].SessionID != b {
				t.Fatalf("events whose summary names the second session: %+v", evs)
			}
		}},
		{"since", map[string]any{"since": asked.Event.Seq}, func(t *testing.T, evs []eventView) {
			for _, e := range evs {
				if e.Seq <= asked.Event.Seq {
					t.Fatalf("since %d returned seq %d", asked.Event.Seq, e.Seq)
				}
			}
			if len(evs) != 2 { // a declined (done), b failed (error)
				t.Fatalf("events since the question: %+v", evs)
			}
		}},
		{"limit", map[string]any{"limit": 2}, func(t *testing.T, evs []eventView) {
			if len(evs) != 2 || evs[0].Seq <= evs[1].Seq {
				t.Fatalf("limit 2: %v", seqs(evs))
			}
		}},
		{"sessionId and status together", map[string]any{"sessionId": b, "status": "done"}, func(t *testing.T, evs []eventView) {
			if len(evs) != 1 || evs[0].SessionID != b || evs[0].Status != "done" {
				t.Fatalf("done events of %s: %+v", b, evs)
			}
		}},
	} {
		t.Run("filter by "+tc.name, func(t *testing.T) {
			f := map[string]any{}
			for k, v := range tc.filter {
				f[k] = v
			}
			tc.check(t, eventsOf(t, g, f).Events)
		})
	}

	t.Run("a bad status is refused with the valid ones", func(t *testing.T) {
		msg := callRefused(t, g, "sessions", map[string]any{"verb": "events", "status": "finished"}, "bad_input")
		if !strings.Contains(msg, "needs-attention") {
			t.Fatalf("bad status: %s", msg)
		}
	})
}

// TestSessionsSteeringWithoutTheExtension runs the demo agent with
// ZIDANE_DEMO_AGENT_STEERING=0 (agent `nosteer`): steering then goes to
// the head of the prompt queue, ahead of prompts sent before it.
func TestSessionsSteeringWithoutTheExtension(t *testing.T) {
	gw := startSessionsGateway(t, "", "")
	token := createToken(t, gw.c, "nosteer", "--scope", "chat")
	g := connectGoSessions(t, gw.url, token, "go-sdk")

	// A short sleep that nothing can cut short (no steering; cancel would
	// drop the queue): long enough to queue two prompts behind it.
	id := createSession(t, g, t.TempDir(), "sleep: 6s", "agent", "nosteer").SessionID
	awaitMessage(t, g, id, "Sleeping for 6s")
	if !sendPrompt(t, g, id, "queued before the guidance") {
		t.Fatal("the prompt sent during the sleep was not queued")
	}
	var s struct {
		Mode string `json:"mode"`
	}
	a := sessionsCall(t, g, "steer", map[string]any{"sessionId": id, "text": "guidance goes first"})
	a.decode(t, &s)
	if s.Mode != "queued-first" || !strings.Contains(a.Text, "head of the prompt queue") {
		t.Fatalf("steer without the extension = %s %s", a.Data, a.Text)
	}
	if v := readSession(t, g, id, false); v.Queued != 2 || v.Agent != "nosteer" {
		t.Fatalf("while sleeping: %+v", v)
	}
	settleIn(t, g, id, "idle")
	tr := transcriptOf(t, g, id, nil)
	var prompts []string
	for _, turn := range tr.Turns {
		prompts = append(prompts, turn.Prompt)
	}
	if want := []string{"sleep: 6s", "guidance goes first", "queued before the guidance"}; !slices.Equal(prompts, want) {
		t.Fatalf("turns ran in the order %q, want %q", prompts, want)
	}
	if sleep := tr.Turns[0]; !strings.Contains(sleep.Answer, "Done sleeping") || strings.Contains(sleep.Answer, "Steered") {
		t.Fatalf("the sleep turn was steered although the agent has no steering: %+v", sleep)
	}
}

// TestSessionsWorktree creates a session in a new git worktree of a
// repository.
func TestSessionsWorktree(t *testing.T) {
	gw := startSessionsGateway(t, "", "")
	token := createToken(t, gw.c, "worktree", "--scope", "chat")
	g := connectGoSessions(t, gw.url, token, "go-sdk")
	repo := gitRepo(t)

	id := createSession(t, g, repo, "pwd", "environment", map[string]any{"kind": "worktree", "branch": "fix/login"}).SessionID
	v := settleIn(t, g, id, "idle")
	wantDir := filepath.Join(filepath.Dir(repo), ".worktrees", "app-fix-login")
	if v.LastMessage != wantDir || v.Cwd != wantDir {
		t.Fatalf("the agent works in %q (cwd %q), want the worktree %s", v.LastMessage, v.Cwd, wantDir)
	}
	list := gitIn(t, repo, "worktree", "list", "--porcelain")
	if !strings.Contains(list, "worktree "+wantDir+"\n") || !strings.Contains(list, "branch refs/heads/fix/login") {
		t.Fatalf("git worktree list:\n%s", list)
	}
	if _, err := os.Stat(filepath.Join(wantDir, "login.go")); err != nil {
		t.Fatalf("the worktree lacks the committed file: %v", err)
	}

	t.Run("the same branch again is refused with what to do", func(t *testing.T) {
		msg := callRefused(t, g, "sessions", map[string]any{"verb": "create", "cwd": repo, "prompt": "pwd",
			"environment": map[string]any{"kind": "worktree", "branch": "fix/login"}}, "bad_request")
		if !strings.Contains(msg, "already exists") {
			t.Fatalf("second worktree on fix/login: %s", msg)
		}
	})
	t.Run("a directory that is no repository is refused", func(t *testing.T) {
		msg := callRefused(t, g, "sessions", map[string]any{"verb": "create", "cwd": t.TempDir(), "prompt": "pwd",
			"environment": map[string]any{"kind": "worktree", "branch": "x"}}, "bad_request")
		if !strings.Contains(msg, "not inside a git repository") {
			t.Fatalf("worktree outside a repository: %s", msg)
		}
	})
}

// TestSessionsAgentCrash makes the demo agent exit mid-turn: the session
// goes to state error with a message that says what happened, an error
// event is pushed, and the gateway goes on serving.
func TestSessionsAgentCrash(t *testing.T) {
	gw := startSessionsGateway(t, "", "")
	token := createToken(t, gw.c, "crash", "--scope", "chat")
	g := connectGoSessions(t, gw.url, token, "go-sdk")
	dir := t.TempDir()

	id := createSession(t, g, dir, "crash").SessionID
	v := settleIn(t, g, id, "error")
	if !strings.Contains(v.Error, `agent "demo" failed`) || !strings.Contains(v.Error, "exit status 3") ||
		!strings.Contains(v.Error, "create a new session") {
		t.Fatalf("error of the crashed session = %q", v.Error)
	}
	p := g.pushes().await(t, "error for "+id, eventFor(id, "error"))
	if p.Event.Kind != "failed" || !strings.Contains(p.Event.Summary, "exit status 3") {
		t.Fatalf("pushed error event = %s", p.Raw)
	}
	if evs := eventsOf(t, g, map[string]any{"sessionId": id, "status": "error"}).Events; len(evs) != 1 {
		t.Fatalf("error events of the crashed session: %+v", evs)
	}
	if last := lastTurn(t, transcriptOf(t, g, id, nil)); last.StopReason != "error" || !strings.Contains(last.Answer, "Crashing on purpose") {
		t.Fatalf("the crashed turn = %+v", last)
	}
	if msg := callRefused(t, g, "sessions", map[string]any{"verb": "send", "sessionId": id, "prompt": "hello?"}, "ended"); !strings.Contains(msg, "create a new session") {
		t.Fatalf("send to the crashed session: %s", msg)
	}

	next := createSession(t, g, dir, "are you still serving?").SessionID
	if v := settleIn(t, g, next, "idle"); v.LastMessage != "You said: are you still serving?" {
		t.Fatalf("a session after the crash: %+v", v)
	}
	if resp, err := shortClient.Get(gw.c.AdminURL("/config/")); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("admin endpoint after the crash: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
}

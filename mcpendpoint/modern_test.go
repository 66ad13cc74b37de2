package mcpendpoint

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/Tahul/caddy-zidane-mcp/message"
	"github.com/Tahul/caddy-zidane-mcp/policy"
	"github.com/Tahul/caddy-zidane-mcp/sessions"
)

// The endpoint at MCP 2026-07-28: stateless, beside 2025-11-25 on one URL.

func init() {
	// Tokens for the attack tests: one without any sessions scope, one
	// whose only scope reaches other owners' sessions but grants no verb,
	// one that may create and send but not read events.
	principals["nobody-token"] = policy.Principal{TokenID: "tok-nobody", Name: "nobody", Kind: policy.KindUser, Scopes: []string{"other"}, Source: "token"}
	principals["any-token"] = policy.Principal{TokenID: "tok-any", Name: "any", Kind: policy.KindUser, Scopes: []string{"sessions:any"}, Source: "token"}
	principals["creator-token"] = policy.Principal{TokenID: "tok-creator", Name: "creator", Kind: policy.KindUser, Scopes: []string{"sessions:create", "sessions:send"}, Source: "token", Owner: "tok-alice"}
}

// negotiated is the protocol version a client session settled on.
func negotiated(cs *mcp.ClientSession) string {
	if r := cs.InitializeResult(); r != nil {
		return r.ProtocolVersion
	}
	return ""
}

// modernClient connects the go-sdk client, left to choose its version, and
// checks that it chose 2026-07-28.
func (h *harness) modernClient(token string, opts *mcp.ClientOptions) *mcp.ClientSession {
	h.t.Helper()
	cs := h.connectAt("", token, opts, nil)
	if v := negotiated(cs); v != ModernVersion {
		h.t.Fatalf("the go-sdk client left to choose settled on %q, want %s", v, ModernVersion)
	}
	if cs.ID() != "" {
		h.t.Fatalf("a 2026-07-28 client got MCP session id %q", cs.ID())
	}
	return cs
}

// heldNothing fails unless the endpoint holds nothing for MCP clients but
// legacy sessions (each a 2025-11-25 client's).
func heldNothing(t *testing.T, h *harness, legacy int) {
	t.Helper()
	want := Held{LegacySessions: legacy, Peers: legacy}
	if h.ep.idle != nil {
		want.IdleTracked = legacy
	}
	// A POST's temporary session closes just after its answer is written.
	h.awaitHeld(want)
}

func TestModernClientEveryVerb(t *testing.T) {
	h := newHarness(t)
	cs := h.modernClient("alice-token", nil)

	var c createdModern
	res := call(t, cs, "sessions", map[string]any{"verb": "create", "cwd": "/repo", "prompt": "go"})
	ok(t, res, &c)
	if c.EventsResource != EventsURI(c.SessionID) || !strings.Contains(text(res), "subscriptions/listen") {
		t.Errorf("create answered a 2026-07-28 client %+v: %s", c, text(res))
	}
	id := c.SessionID
	// No MCP session: nothing is pushed to this caller, and nothing is held.
	h.engine.mu.Lock()
	target := h.engine.sessions[id].target
	h.engine.mu.Unlock()
	if target != "" {
		t.Errorf("a 2026-07-28 create set the push target %q", target)
	}
	heldNothing(t, h, 0)

	ok(t, call(t, cs, "sessions", map[string]any{"verb": "send", "sessionId": id, "prompt": "more"}), nil)
	ok(t, call(t, cs, "sessions", map[string]any{"verb": "steer", "sessionId": id, "text": "faster"}), nil)
	ok(t, call(t, cs, "sessions", map[string]any{"verb": "cancel", "sessionId": id}), nil)
	var v sessions.SessionView
	ok(t, call(t, cs, "sessions", map[string]any{"verb": "read", "sessionId": id}), &v)
	if v.SessionID != id {
		t.Errorf("read: %+v", v)
	}
	var l listResult
	ok(t, call(t, cs, "sessions", map[string]any{"verb": "list"}), &l)
	if len(l.Sessions) != 1 || l.Sessions[0].SessionID != id {
		t.Errorf("list: %+v", l)
	}
	ok(t, call(t, cs, "sessions", map[string]any{"verb": "transcript", "sessionId": id}), nil)
	var evs eventsResult
	ok(t, call(t, cs, "sessions", map[string]any{"verb": "events", "sessionId": id}), &evs)
	if len(evs.Events) == 0 {
		t.Errorf("events: none after a cancel")
	}

	// wait, with nothing listening: it returns when the turn ends.
	// On a session of its own, with no prompt queued.
	var c2 sessions.Created
	ok(t, call(t, cs, "sessions", map[string]any{"verb": "create", "cwd": "/repo", "prompt": "to wait for"}), &c2)
	h.engine.mu.Lock()
	h.engine.lastWait = 0
	h.engine.mu.Unlock()
	waited := make(chan waitResult, 1)
	go func() {
		var w waitResult
		res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "sessions", Arguments: map[string]any{"verb": "wait", "sessionId": c2.SessionID, "timeout": 50}})
		if err == nil && !res.IsError {
			raw, _ := json.Marshal(res.StructuredContent)
			json.Unmarshal(raw, &w)
		}
		waited <- w
	}()
	h.engine.awaitWaiter(t, 50*time.Second)
	h.engine.finish(c2.SessionID, "finished while waited for")
	if w := <-waited; !w.Settled || w.LastMessage != "finished while waited for" {
		t.Errorf("wait: %+v", w)
	}

	// interactions pending and answer.
	h.engine.Send(t.Context(), harnessOwner, id, "ask me")
	rid, _ := h.engine.ask(id, sessions.KindQuestion, "which database?", map[string]any{"message": "which database?"})
	var p pendingResult
	ok(t, call(t, cs, "interactions", map[string]any{"verb": "pending"}), &p)
	if len(p.Interactions) != 1 || p.Interactions[0].RequestID != rid {
		t.Fatalf("pending: %+v", p)
	}
	var a answerResult
	ok(t, call(t, cs, "interactions", map[string]any{"verb": "answer", "requestId": rid, "action": "accept", "content": map[string]any{"db": "pg"}}), &a)
	if !a.Answered {
		t.Errorf("answer: %+v", a)
	}
	heldNothing(t, h, 0)
}

// Both versions on one URL: each client is served at its own, and the
// legacy one keeps its pushes.
func TestBothVersionsOnOneURL(t *testing.T) {
	h := newHarness(t)
	opts, pushed := logs()
	legacy := h.connect("alice-token", opts, nil)
	if v := negotiated(legacy); v != legacyVersion || legacy.ID() == "" {
		t.Fatalf("legacy client: version %q, session %q", v, legacy.ID())
	}
	modern := h.modernClient("phone-token", nil)

	var c sessions.Created
	ok(t, call(t, legacy, "sessions", map[string]any{"verb": "create", "cwd": "/repo", "prompt": "go"}), &c)
	// alice's phone, at 2026-07-28, drives the session: the events still go
	// to the MCP session that created it.
	ok(t, call(t, modern, "sessions", map[string]any{"verb": "send", "sessionId": c.SessionID, "prompt": "queued"}), nil)
	ev := h.engine.finish(c.SessionID, "first done")
	if d := eventOf(t, next(t, pushed)); d.Seq != ev.Seq {
		t.Errorf("legacy push %+v, want seq %d", d, ev.Seq)
	}
	// The legacy session offers no resources: its capabilities are today's.
	//lint:ignore SA1019 the test checks that a 2025-11-25 session keeps the logging capability, which SEP-2577 deprecates but that version has
	if caps := legacy.InitializeResult().Capabilities; caps.Resources != nil || caps.Logging == nil {
		t.Errorf("legacy capabilities: %+v", caps)
	}
	if caps := modern.InitializeResult().Capabilities; caps.Resources == nil || !caps.Resources.Subscribe {
		t.Errorf("modern capabilities: %+v", caps)
	}
	// Each is told how its events reach it.
	for _, tc := range []struct {
		cs        *mcp.ClientSession
		want, not string
	}{
		{legacy, "You will receive a <session-event>", "eventsResource"},
		{modern, "subscribe to it with subscriptions/listen", "You will receive a <session-event>"},
	} {
		tl, err := tc.cs.ListTools(t.Context(), nil)
		if err != nil {
			t.Fatal(err)
		}
		i := slices.IndexFunc(tl.Tools, func(tool *mcp.Tool) bool { return tool.Name == "sessions" })
		if i < 0 || !strings.Contains(tl.Tools[i].Description, tc.want) || strings.Contains(tl.Tools[i].Description, tc.not) {
			t.Errorf("%s: sessions tool description lacks %q or has %q", negotiated(tc.cs), tc.want, tc.not)
		}
	}
	res := call(t, modern, "sessions", map[string]any{"verb": "send", "sessionId": c.SessionID, "prompt": "and more"})
	if !strings.Contains(text(res), EventsURI(c.SessionID)) || strings.Contains(text(res), "<session-event>") {
		t.Errorf("send told a 2026-07-28 client: %s", text(res))
	}
	heldNothing(t, h, 1)
}

func TestDiscoverListsBothVersions(t *testing.T) {
	h := newHarness(t)
	st, msgs := h.post("alice-token", ModernVersion, `{"jsonrpc":"2.0","id":1,"method":"server/discover","params":{`+metaModern+`}}`)
	if st != http.StatusOK || len(msgs) != 1 {
		t.Fatalf("discover: %d %s", st, msgs)
	}
	var r struct {
		Result struct {
			SupportedVersions []string `json:"supportedVersions"`
		} `json:"result"`
	}
	json.Unmarshal(msgs[0], &r)
	if !slices.Contains(r.Result.SupportedVersions, ModernVersion) || !slices.Contains(r.Result.SupportedVersions, legacyVersion) {
		t.Errorf("discover lists %v, want both %s and %s", r.Result.SupportedVersions, ModernVersion, legacyVersion)
	}
	// A discover that names no 2026-07-28 version is no 2026-07-28
	// request: the stateful side answers method-not-found, on which a
	// client falls back to initialize.
	st, msgs = h.post("alice-token", legacyVersion, `{"jsonrpc":"2.0","id":1,"method":"server/discover"}`)
	if code, _, msg := rpcError(t, msgs); code != -32601 {
		t.Errorf("a 2025-11-25 discover: %d %d %s", st, code, msg)
	}
}

// post sends one JSON-RPC message to the endpoint and returns the status and
// the messages of the answer (JSON or an event stream).
func (h *harness) post(token, version, body string) (int, []json.RawMessage) {
	h.t.Helper()
	resp := h.open(h.t.Context(), token, version, body)
	defer resp.Body.Close()
	var msgs []json.RawMessage
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if data, ok := strings.CutPrefix(line, "data: "); ok {
			msgs = append(msgs, json.RawMessage(data))
		} else if strings.HasPrefix(line, "{") {
			msgs = append(msgs, json.RawMessage(line))
		}
	}
	return resp.StatusCode, msgs
}

// open sends one POST and returns the response, to be read and closed.
func (h *harness) open(ctx context.Context, token, version, body string) *http.Response {
	h.t.Helper()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, h.srv.URL, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Authorization", "Bearer "+token)
	if version != "" {
		req.Header.Set("Mcp-Protocol-Version", version)
	}
	if version >= ModernVersion {
		// The headers a 2026-07-28 request must carry, from its body.
		var m struct {
			Method string `json:"method"`
			Params struct {
				URI string `json:"uri"`
			} `json:"params"`
		}
		json.Unmarshal([]byte(body), &m)
		req.Header.Set("Mcp-Method", m.Method)
		if m.Method == "resources/read" {
			req.Header.Set("Mcp-Name", m.Params.URI)
		}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	return resp
}

// rpcError is the error of a JSON-RPC answer.
func rpcError(t *testing.T, msgs []json.RawMessage) (code int, reason, message string) {
	t.Helper()
	if len(msgs) == 0 {
		t.Fatal("no JSON-RPC answer")
	}
	var r struct {
		Error *struct {
			Code    int             `json:"code"`
			Message string          `json:"message"`
			Data    json.RawMessage `json:"data"`
		} `json:"error"`
	}
	json.Unmarshal(msgs[len(msgs)-1], &r)
	if r.Error == nil {
		t.Fatalf("want an error, got %s", msgs[len(msgs)-1])
	}
	var d struct {
		Reason string `json:"reason"`
	}
	json.Unmarshal(r.Error.Data, &d)
	return r.Error.Code, d.Reason, r.Error.Message
}

const metaModern = `"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{},"io.modelcontextprotocol/clientInfo":{"name":"raw","version":"1"}}`

func listenBody(uris ...string) string {
	raw, _ := json.Marshal(uris)
	return `{"jsonrpc":"2.0","id":7,"method":"subscriptions/listen","params":{"notifications":{"resourceSubscriptions":` + string(raw) + `},` + metaModern + `}}`
}

func readBody(uri string) string {
	raw, _ := json.Marshal(uri)
	return `{"jsonrpc":"2.0","id":3,"method":"resources/read","params":{"uri":` + string(raw) + `,` + metaModern + `}}`
}

// listenStream is an open subscriptions/listen stream.
type listenStream struct {
	cancel context.CancelFunc
	msgs   chan json.RawMessage
}

// listenTo opens a stream subscribed to uris and waits for its
// acknowledgement.
func (h *harness) listenTo(token string, uris ...string) *listenStream {
	h.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	resp := h.open(ctx, token, ModernVersion, listenBody(uris...))
	if resp.StatusCode != http.StatusOK {
		cancel()
		h.t.Fatalf("listen: status %d", resp.StatusCode)
	}
	ls := &listenStream{cancel: cancel, msgs: make(chan json.RawMessage, 64)}
	h.t.Cleanup(cancel)
	go func() {
		defer resp.Body.Close()
		defer close(ls.msgs)
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			if data, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
				ls.msgs <- json.RawMessage(data)
			}
		}
	}()
	if m := ls.next(h.t); !bytes.Contains(m, []byte(`"notifications/subscriptions/acknowledged"`)) {
		h.t.Fatalf("the first message of a listen stream is %s", m)
	}
	return ls
}

func (ls *listenStream) next(t *testing.T) json.RawMessage {
	t.Helper()
	select {
	case m, ok := <-ls.msgs:
		if !ok {
			t.Fatal("the listen stream ended")
		}
		return m
	case <-time.After(10 * time.Second):
		t.Fatal("nothing arrived on the listen stream")
		return nil
	}
}

func TestModernEventsThroughListen(t *testing.T) {
	h := newHarness(t)
	updated := make(chan string, 16)
	cs := h.modernClient("alice-token", &mcp.ClientOptions{
		ResourceUpdatedHandler: func(_ context.Context, req *mcp.ResourceUpdatedNotificationRequest) { updated <- req.Params.URI },
	})
	var c sessions.Created
	ok(t, call(t, cs, "sessions", map[string]any{"verb": "create", "cwd": "/repo", "prompt": "go"}), &c)
	uri := EventsURI(c.SessionID)

	// The template is listed; go-sdk's Subscribe at 2026-07-28 opens a
	// subscriptions/listen stream.
	tl, err := cs.ListResourceTemplates(t.Context(), nil)
	if err != nil || len(tl.ResourceTemplates) != 1 || tl.ResourceTemplates[0].URITemplate != EventsURITemplate {
		t.Fatalf("templates: %+v %v", tl, err)
	}
	if err := cs.Subscribe(t.Context(), &mcp.SubscribeParams{URI: uri}); err != nil {
		t.Fatal(err)
	}
	h.awaitListened(c.SessionID)
	h.awaitHeld(Held{Listens: 1, ModernSessions: 1}) // the stream's temporary session

	ev := h.engine.finish(c.SessionID, "done <b>")
	select {
	case got := <-updated:
		if got != uri {
			t.Errorf("updated %q, want %q", got, uri)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no notifications/resources/updated arrived")
	}
	rr, err := cs.ReadResource(t.Context(), &mcp.ReadResourceParams{URI: uri})
	if err != nil {
		t.Fatal(err)
	}
	var evs eventsResult
	if len(rr.Contents) != 1 || rr.Contents[0].MIMEType != "application/json" || json.Unmarshal([]byte(rr.Contents[0].Text), &evs) != nil {
		t.Fatalf("read: %+v", rr.Contents)
	}
	if len(evs.Events) == 0 || evs.Events[0].Seq != ev.Seq || evs.Events[0].Summary != ev.Summary {
		t.Errorf("read %+v, want the event %+v first", evs.Events, ev)
	}
	var withText resourceEvents
	json.Unmarshal([]byte(rr.Contents[0].Text), &withText)
	if len(withText.Events) == 0 || withText.Events[0].Text != ev.Render() || !strings.Contains(withText.Events[0].Text, "done &lt;b&gt;") {
		t.Errorf("read %s, want each event with its <session-event> text", rr.Contents[0].Text)
	}

	// Unsubscribing ends the stream and frees what it held.
	if err := cs.Unsubscribe(t.Context(), &mcp.UnsubscribeParams{URI: uri}); err != nil {
		t.Fatal(err)
	}
	h.awaitHeld(Held{})
}

// awaitListened waits until a listen stream subscribed to session id's
// events is registered.
func (h *harness) awaitListened(id string) {
	h.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !h.ep.listening.listened(id) {
		if time.Now().After(deadline) {
			h.t.Fatalf("no listen stream for %s", id)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// awaitHeld waits until the endpoint holds want.
func (h *harness) awaitHeld(want Held) {
	h.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for h.ep.Held() != want {
		if time.Now().After(deadline) {
			h.t.Fatalf("the endpoint holds %+v, want %+v", h.ep.Held(), want)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func TestModernResourceAccess(t *testing.T) {
	var refusals []Refusal
	var mu sync.Mutex
	h := newHarness(t, func(o *Options) {
		o.OnRefusal = func(r Refusal) { mu.Lock(); refusals = append(refusals, r); mu.Unlock() }
	})
	alice := h.modernClient("alice-token", nil)
	var c sessions.Created
	ok(t, call(t, alice, "sessions", map[string]any{"verb": "create", "cwd": "/repo", "prompt": "go"}), &c)
	h.engine.finish(c.SessionID, "secret answer")
	uri := EventsURI(c.SessionID)

	// alice and her phone (same owner) read and listen.
	for _, tok := range []string{"alice-token", "phone-token"} {
		st, msgs := h.post(tok, ModernVersion, readBody(uri))
		if st != http.StatusOK || len(msgs) != 1 || !bytes.Contains(msgs[0], []byte("secret answer")) {
			t.Errorf("%s read: %d %s", tok, st, msgs)
		}
		ls := h.listenTo(tok, uri)
		ls.cancel()
	}

	// Another owner, a token that reaches other owners but holds no verb,
	// one without any sessions scope, and one that may create but not read
	// events: refused on read and on listen, and never shown the events.
	for _, tc := range []struct{ token, reason string }{
		{"bob-token", "not_owner"},
		{"any-token", "insufficient_scope"},
		{"nobody-token", "insufficient_scope"},
		{"creator-token", "insufficient_scope"},
	} {
		for _, body := range []string{readBody(uri), listenBody(uri), listenBody(uri, EventsURI("s-none"))} {
			st, msgs := h.post(tc.token, ModernVersion, body)
			code, reason, msg := rpcError(t, msgs)
			if code != message.CodeForbidden || reason != tc.reason || strings.Contains(string(msgs[len(msgs)-1]), "secret answer") {
				t.Errorf("%s %s: %d %d %q %s", tc.token, body, st, code, reason, msg)
			}
		}
	}
	mu.Lock()
	if len(refusals) == 0 || refusals[0].Reason != "not_owner" || refusals[0].Target != c.SessionID {
		t.Errorf("refusals reported: %+v", refusals)
	}
	mu.Unlock()

	// Crafted spellings of alice's URI reach nothing for bob, nor for alice:
	// only EventsURI's spelling names a session.
	for _, crafted := range []string{
		"zidane://sessions/" + strings.ToUpper(c.SessionID) + "/events",
		"ZIDANE://sessions/" + c.SessionID + "/events",
		"zidane://sessions/" + c.SessionID + "/events/",
		"zidane://sessions/" + c.SessionID + "/events?x=1",
		"zidane://sessions/" + c.SessionID + "/events#x",
		"zidane://sessions/" + c.SessionID + "%2Fevents",
		"zidane://sessions/%73" + c.SessionID[1:] + "/events",
		"zidane://sessions/./" + c.SessionID + "/events",
		"zidane://sessions/x/../" + c.SessionID + "/events",
		"zidane://sessions//events",
		"zidane://sessions/" + c.SessionID + "/transcript",
		"zidane://Sessions/" + c.SessionID + "/events",
	} {
		for _, tok := range []string{"bob-token", "alice-token"} {
			for _, body := range []string{readBody(crafted), listenBody(crafted)} {
				_, msgs := h.post(tok, ModernVersion, body)
				if len(msgs) == 0 {
					t.Errorf("%s %s: no answer", tok, body)
					continue
				}
				if bytes.Contains(msgs[len(msgs)-1], []byte("secret answer")) || !bytes.Contains(msgs[len(msgs)-1], []byte(`"error"`)) {
					t.Errorf("%s %s: %s", tok, body, msgs[len(msgs)-1])
				}
			}
		}
	}
	heldNothing(t, h, 0)

	// The legacy resources/subscribe is refused at 2026-07-28 (listen
	// replaces it), and a 2025-11-25 session has no resources at all.
	_, msgs := h.post("alice-token", ModernVersion, `{"jsonrpc":"2.0","id":4,"method":"resources/subscribe","params":{"uri":"`+uri+`",`+metaModern+`}}`)
	if code, _, _ := rpcError(t, msgs); code == 0 {
		t.Errorf("resources/subscribe: %s", msgs)
	}
	legacy := h.connect("alice-token", nil, nil)
	if _, err := legacy.ReadResource(t.Context(), &mcp.ReadResourceParams{URI: uri}); err == nil {
		t.Error("a 2025-11-25 session read a resource")
	}
	if err := legacy.Subscribe(t.Context(), &mcp.SubscribeParams{URI: uri}); err == nil {
		t.Error("a 2025-11-25 session subscribed to a resource")
	}
}

func TestModernListenBounds(t *testing.T) {
	h := newHarness(t)
	ids := h.engine.seed(1, "tok-alice")
	uri := EventsURI(ids[0])
	var streams []*listenStream
	for range MaxListensPerToken {
		streams = append(streams, h.listenTo("alice-token", uri))
	}
	// One more, by that token or by another token of its owner's that has
	// its own count: the token's is refused, the phone's is not.
	_, msgs := h.post("alice-token", ModernVersion, listenBody(uri))
	if code, reason, msg := rpcError(t, msgs); code != message.CodeRateLimited || reason != "listen_limit" || !strings.Contains(msg, "close one") {
		t.Errorf("listen over the bound: %d %q %s", code, reason, msg)
	}
	h.listenTo("phone-token", uri).cancel()

	// A stream that ends gives its slot back.
	streams[0].cancel()
	h.awaitHeld(Held{Listens: MaxListensPerToken - 1, ModernSessions: MaxListensPerToken - 1})
	streams[0] = h.listenTo("alice-token", uri)

	// One stream subscribes to at most MaxURIsPerListen resources.
	many := make([]string, MaxURIsPerListen+1)
	for i := range many {
		many[i] = EventsURI(fmt.Sprintf("s%d", i))
	}
	_, msgs = h.post("phone-token", ModernVersion, listenBody(many...))
	if code, reason, _ := rpcError(t, msgs); code != message.CodeRateLimited || reason != "listen_limit" {
		t.Errorf("listen to %d resources: %d %q", len(many), code, reason)
	}

	// Close ends every stream.
	if err := h.ep.Close(); err != nil {
		t.Fatal(err)
	}
	for _, s := range streams {
		for range s.msgs {
		}
	}
	if n := h.ep.listening.count(); n != 0 {
		t.Errorf("%d listen streams after Close", n)
	}
}

// Many 2026-07-28 clients that made calls and went idle hold nothing.
func TestModernIdleClientsHoldNothing(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.SessionTimeout = time.Hour })
	ids := h.engine.seed(1, "tok-alice")
	for range 20 {
		cs := h.modernClient("alice-token", nil)
		ok(t, call(t, cs, "sessions", map[string]any{"verb": "read", "sessionId": ids[0]}), nil)
		ok(t, call(t, cs, "sessions", map[string]any{"verb": "list"}), nil)
	}
	heldNothing(t, h, 0)
	h.connect("alice-token", nil, nil)
	heldNothing(t, h, 1)
}

// awaitWaiter waits until a Wait with timeout d reached the engine.
func (m *memSessions) awaitWaiter(t *testing.T, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		m.mu.Lock()
		got := m.lastWait
		m.mu.Unlock()
		if got == d {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no wait of %s reached the engine", d)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// An events URI names a session in one spelling: a cluster's ids (which
// end in ".<node>") are taken, and no other dot.
func TestSessionOfEventsURI(t *testing.T) {
	for id, want := range map[string]bool{
		"ses_abcdefghijklmnop":          true,
		"ses_abcdefghijklmnop.gw-1":     true,
		"ses_abcdefghijklmnop.a.b":      true,
		"ses_abcdefghijklmnop..":        false,
		"..":                            false,
		"ses.x":                         false,
		"ses_abcdefghijklmnop.":         false,
		"ses_abcdefghijklmnop.-gw":      false,
		"ses_abcdefghijklmnop.gw%2F..":  false,
		"ses_abcdefghijklmnop.gw/../x":  false,
		"ses_abcdefghijklmnop.GW-1?x=1": false,
	} {
		got, ok := sessionOfEventsURI(EventsURI(id))
		if ok != want || (ok && got != id) {
			t.Errorf("%q: %q %v, want %v", id, got, ok, want)
		}
	}
}

// A zidane:// resource that is not a session's events is MCP's "resource
// not found", which is Invalid Params since SEP-2164, and stays so under
// go-sdk's MCPGODEBUG=customresnotfounderrcode=1: that setting turns the
// SDK's own CodeResourceNotFound back into -32002, and is the SDK's to
// follow, not this endpoint's.
func TestModernUnknownResourceIsInvalidParams(t *testing.T) {
	h := newHarness(t)
	for _, uri := range []string{"zidane://sessions//events", "zidane://sessions/ses.x/events"} {
		_, msgs := h.post("alice-token", ModernVersion, readBody(uri))
		if code, reason, msg := rpcError(t, msgs); code != message.CodeInvalidParams || reason != "no_resource" {
			t.Errorf("read %s: code %d, reason %q (%s), want %d no_resource", uri, code, reason, msg, message.CodeInvalidParams)
		}
	}
	if os.Getenv("MCPGODEBUG") != "" {
		return
	}
	// go-sdk reads MCPGODEBUG once, when the process starts: run this test
	// again in a process that has it.
	cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^"+t.Name()+"$", "-test.count=1")
	cmd.Env = append(os.Environ(), "MCPGODEBUG=customresnotfounderrcode=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("with MCPGODEBUG=customresnotfounderrcode=1: %v\n%s", err, out)
	}
}

package connect

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/Tahul/caddy-zidane-mcp/message"
)

// gate stands where the per_user refusal will: in front of a real go-sdk
// server whose tool says who called it, it answers alice's tools/call
// with [Answer] until alice has connected github through a link.
type gate struct {
	f        *fixture
	inner    http.Handler
	mu       sync.Mutex
	initCaps []byte   // the 2025-11-25 session's capabilities, from initialize
	states   []string // requestStates the retries carried
	declined int
	issued   chan string // the elicitation ids answered, for the GET stream
}

func (g *gate) connected() bool {
	for _, c := range g.f.auth.finishedFor() {
		if c == [2]string{"alice", "github"} {
			return true
		}
	}
	return false
}

func (g *gate) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodGet {
		g.stream(w, r)
		return
	}
	if r.Method == http.MethodPost {
		raw, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(raw))
		if body, err := message.Read(raw); err == nil && len(body.Calls) == 1 {
			c := body.Calls[0]
			if c.Method == "initialize" {
				caps, _ := message.Lookup(c.Params, []string{"capabilities"})
				g.mu.Lock()
				g.initCaps = append([]byte(nil), caps...)
				g.mu.Unlock()
			}
			if c.IsToolCall() && c.Tool == "whoami" {
				if g.answer(w, r, c) {
					return
				}
			}
		}
	}
	g.inner.ServeHTTP(w, r)
}

// answer answers a call of alice's that needs github, and reports whether
// it did, as the per_user refusal does: a retry waits for the connection
// it followed (Settle), and a call still without one gets Refuse's answer.
func (g *gate) answer(w http.ResponseWriter, r *http.Request, c message.Call) bool {
	if id, ok := ElicitationOf(c.RequestState); ok {
		g.mu.Lock()
		g.states = append(g.states, id)
		g.mu.Unlock()
	}
	declined := errors.Is(g.f.svc.Settle(r.Context(), "alice", "github", c), ErrDeclined)
	if declined {
		g.mu.Lock()
		g.declined++
		g.mu.Unlock()
	}
	if !declined && g.connected() {
		return false
	}
	g.mu.Lock()
	caps := g.initCaps
	g.mu.Unlock()
	b, err := g.f.svc.Refuse(r.Context(), "alice", "github", c, caps)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return true
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(b)
	var answered struct {
		Error struct {
			Data struct {
				Elicitations []struct {
					ID string `json:"elicitationId"`
				} `json:"elicitations"`
			} `json:"data"`
		} `json:"error"`
	}
	if json.Unmarshal(b, &answered) == nil && len(answered.Error.Data.Elicitations) == 1 {
		select {
		case g.issued <- answered.Error.Data.Elicitations[0].ID:
		default:
		}
	}
	return true
}

// stream is the client's GET stream (2025-11-25): when an elicitation it
// was answered with completes, it carries notifications/elicitation/
// complete, as the route's stream will.
func (g *gate) stream(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	_ = http.NewResponseController(w).Flush()
	for {
		select {
		case <-r.Context().Done():
			return
		case id := <-g.issued:
			if g.f.svc.Wait(r.Context(), "alice", id) {
				fmt.Fprintf(w, "event: message\ndata: %s\n\n", CompleteNotification(id))
				_ = http.NewResponseController(w).Flush()
			}
		}
	}
}

func newGate(t *testing.T) (*gate, string) {
	t.Helper()
	srv := mcp.NewServer(&mcp.Implementation{Name: "upstream", Version: "1"}, nil)
	srv.AddTool(&mcp.Tool{Name: "whoami", InputSchema: json.RawMessage(`{"type":"object"}`)}, func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "alice at github"}}}, nil
	})
	g := &gate{f: newFixture(t), issued: make(chan string, 16), inner: mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, &mcp.StreamableHTTPOptions{Stateless: true})}
	hs := httptest.NewServer(g)
	t.Cleanup(hs.Close)
	return g, hs.URL
}

// connectInBrowser is the person following the link in their browser,
// signed in as alice: the page, the button, the upstream's callback.
func (g *gate) connectInBrowser(t *testing.T, b browser, linkURL string) {
	t.Helper()
	if err := g.follow(b, linkURL); err != nil {
		t.Fatal(err)
	}
}

func (g *gate) follow(b browser, linkURL string) error {
	path, ok := strings.CutPrefix(linkURL, site)
	if !ok {
		return fmt.Errorf("the elicitation's URL %q is not a link of the site", linkURL)
	}
	if resp := g.f.get(b, path); resp.StatusCode != http.StatusOK {
		return fmt.Errorf("the link's page: %d", resp.StatusCode)
	}
	resp := g.f.post(b, path, nil)
	loc, err := url.Parse(resp.Header.Get("Location"))
	if resp.StatusCode != http.StatusSeeOther || err != nil {
		return fmt.Errorf("connect: %d", resp.StatusCode)
	}
	callback := CallbackPath + "?" + url.Values{"code": {"c0de"}, "state": {loc.Query().Get("state")}}.Encode()
	if resp := g.f.get(b, callback); resp.StatusCode != http.StatusOK {
		return fmt.Errorf("the callback: %d %s", resp.StatusCode, readBody(resp))
	}
	return nil
}

func connectClient(t *testing.T, endpoint, version string, opts *mcp.ClientOptions) *mcp.ClientSession {
	return connectClientStream(t, endpoint, version, opts, false)
}

func connectClientStream(t *testing.T, endpoint, version string, opts *mcp.ClientOptions, stream bool) *mcp.ClientSession {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "client", Version: "1"}, opts).Connect(ctx,
		&mcp.StreamableClientTransport{Endpoint: endpoint, MaxRetries: -1, DisableStandaloneSSE: !stream}, &mcp.ClientSessionOptions{ProtocolVersion: version})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	return cs
}

func resultText(t *testing.T, res *mcp.CallToolResult) string {
	t.Helper()
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

// TestAnswerGoSDK2025: at 2025-11-25 go-sdk's client gets -32042 with the
// URL elicitation in data.elicitations, as its URL elicitation middleware
// parses it (url mode, the link, an id); once the person connects in the
// browser, notifications/elicitation/complete reaches the client's
// completion handler on its GET stream, and the same call goes through.
func TestAnswerGoSDK2025(t *testing.T) {
	g, endpoint := newGate(t)
	handler := func(context.Context, *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
		return &mcp.ElicitResult{Action: "accept"}, nil
	}
	completed := make(chan string, 1)
	cs := connectClientStream(t, endpoint, "2025-11-25", &mcp.ClientOptions{ElicitationHandler: handler,
		Capabilities: &mcp.ClientCapabilities{Elicitation: &mcp.ElicitationCapabilities{URL: &mcp.URLElicitationCapabilities{}}},
		ElicitationCompleteHandler: func(_ context.Context, req *mcp.ElicitationCompleteNotificationRequest) {
			completed <- req.Params.ElicitationID
		}}, true)
	ctx := context.Background()
	_, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "whoami", Arguments: map[string]any{}})
	var rpcErr *jsonrpc.Error
	if !errors.As(err, &rpcErr) || rpcErr.Code != mcp.CodeURLElicitationRequired {
		t.Fatalf("got %v, want the -32042 error", err)
	}
	var data struct {
		Elicitations []*mcp.ElicitParams `json:"elicitations"`
	}
	if err := json.Unmarshal(rpcErr.Data, &data); err != nil || len(data.Elicitations) != 1 {
		t.Fatalf("data %s: %v", rpcErr.Data, err)
	}
	e := data.Elicitations[0]
	if e.Mode != "url" || !strings.HasPrefix(e.URL, site+PathPrefix) || e.ElicitationID == "" || !strings.Contains(e.Message, "github") || e.RequestedSchema != nil {
		t.Fatalf("elicitation %+v", e)
	}
	if strings.Contains(rpcErr.Message, e.URL) {
		t.Fatalf("a capable client's error message repeats the link: %q", rpcErr.Message)
	}
	a := browser{}
	g.f.signIn(a, "alice")
	g.connectInBrowser(t, a, e.URL)
	if len(g.f.connected) != 1 || g.f.connected[0].Elicitation != e.ElicitationID {
		t.Fatalf("connected %+v, want the elicitation %q", g.f.connected, e.ElicitationID)
	}
	select {
	case id := <-completed:
		if id != e.ElicitationID {
			t.Fatalf("completion of %q, want %q", id, e.ElicitationID)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("no notifications/elicitation/complete reached the client")
	}
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "whoami", Arguments: map[string]any{}})
	if err != nil || res.IsError || resultText(t, res) != "alice at github" {
		t.Fatalf("after connecting: %v %+v", err, res)
	}
}

// TestAnswerGoSDK2026: at 2026-07-28 go-sdk's client gets input_required
// with the URL elicitation and hands it to its elicitation handler, which
// opens the link and accepts at once, as a client does; the client
// retries with inputResponses and the requestState while the person is
// still connecting in the browser, and the retry waits for the
// connection and succeeds.
func TestAnswerGoSDK2026(t *testing.T) {
	g, endpoint := newGate(t)
	a := browser{}
	g.f.signIn(a, "alice")
	var seen []*mcp.ElicitParams
	browsed := make(chan error, 1)
	handler := func(_ context.Context, req *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
		seen = append(seen, req.Params)
		go func() { browsed <- g.follow(a, req.Params.URL) }()
		return &mcp.ElicitResult{Action: "accept"}, nil
	}
	cs := connectClient(t, endpoint, "2026-07-28", &mcp.ClientOptions{ElicitationHandler: handler,
		Capabilities: &mcp.ClientCapabilities{Elicitation: &mcp.ElicitationCapabilities{URL: &mcp.URLElicitationCapabilities{}}}})
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "whoami", Arguments: map[string]any{}})
	if err != nil || res.IsError || resultText(t, res) != "alice at github" {
		t.Fatalf("call: %v %+v", err, res)
	}
	if err := <-browsed; err != nil {
		t.Fatal(err)
	}
	if len(seen) != 1 || seen[0].Mode != "url" || !strings.HasPrefix(seen[0].URL, site+PathPrefix) || seen[0].ElicitationID == "" {
		t.Fatalf("elicitations %+v", seen)
	}
	if len(g.states) != 1 || g.states[0] != seen[0].ElicitationID || g.declined != 0 {
		t.Fatalf("the retry carried %v (declined %d), want the elicitation %q", g.states, g.declined, seen[0].ElicitationID)
	}
}

// TestAnswerDeclined2026: a person who declines: the retry says so, the
// call ends in a tool error saying so, without a second link, and no
// account is connected.
func TestAnswerDeclined2026(t *testing.T) {
	g, endpoint := newGate(t)
	asked := 0
	handler := func(context.Context, *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
		asked++
		return &mcp.ElicitResult{Action: "decline"}, nil
	}
	cs := connectClient(t, endpoint, "2026-07-28", &mcp.ClientOptions{ElicitationHandler: handler,
		Capabilities: &mcp.ClientCapabilities{Elicitation: &mcp.ElicitationCapabilities{URL: &mcp.URLElicitationCapabilities{}}}})
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "whoami", Arguments: map[string]any{}})
	if err != nil || !res.IsError || !strings.Contains(resultText(t, res), "declined") {
		t.Fatalf("got %v %+v, want a tool error saying the person declined", err, res)
	}
	if asked != 1 || g.declined != 1 || g.connected() {
		t.Fatalf("asked %d, declined %d, connected %v", asked, g.declined, g.connected())
	}
}

// TestAnswerWithoutCapability: a client that does not declare URL
// elicitation (go-sdk's without an elicitation handler, or with form
// elicitation only) gets a tool error that names the link, at both
// versions.
func TestAnswerWithoutCapability(t *testing.T) {
	for _, version := range []string{"2025-11-25", "2026-07-28"} {
		for name, opts := range map[string]*mcp.ClientOptions{
			"none": nil,
			"form only": {ElicitationHandler: func(context.Context, *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
				return &mcp.ElicitResult{Action: "cancel"}, nil
			}, Capabilities: &mcp.ClientCapabilities{Elicitation: &mcp.ElicitationCapabilities{Form: &mcp.FormElicitationCapabilities{}}}},
		} {
			t.Run(version+" "+name, func(t *testing.T) {
				_, endpoint := newGate(t)
				cs := connectClient(t, endpoint, version, opts)
				res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "whoami", Arguments: map[string]any{}})
				if err != nil || !res.IsError || res.NeedsInput() {
					t.Fatalf("got %v %+v, want a tool error", err, res)
				}
				if text := resultText(t, res); !strings.Contains(text, site+PathPrefix+"zcl_") || !strings.Contains(text, "github") {
					t.Fatalf("the tool error does not name the link: %q", text)
				}
			})
		}
	}
}

// TestURLCapable: only elicitation.url as an object declares it; a
// duplicate key, which two readers could read differently, declares
// nothing.
func TestURLCapable(t *testing.T) {
	for caps, want := range map[string]bool{
		`{"elicitation":{"url":{}}}`:                      true,
		`{"elicitation":{"form":{},"url":{}}}`:            true,
		`{"elicitation":{}}`:                              false,
		`{"elicitation":{"form":{}}}`:                     false,
		`{"elicitation":{"url":true}}`:                    false,
		`{"elicitation":{"url":{}},"elicitation":{}}`:     false,
		`{"elicitation":{"url":{}, "u\u0072l":{}}}`:       false,
		`{"Elicitation":{"url":{}}}`:                      false,
		`{"elicitation":{"URL":{}}}`:                      false,
		``:                                                false,
		`[]`:                                              false,
		`{"elicitation":{"url":{}}} trailing`:             false,
		`{"sampling":{},"elicitation":{"url":{"x":[1]}}}`: true,
	} {
		if got := URLCapable([]byte(caps)); got != want {
			t.Errorf("URLCapable(%s) = %v, want %v", caps, got, want)
		}
	}
}

// TestRetryAttacks: a 2026-07-28 retry carrying a connect requestState
// goes on only for the owner and the upstream whose live link it names.
// Each refused retry is refused before any wait: nobody holds requests
// open with a state that is not theirs.
func TestRetryAttacks(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	alices, err := f.svc.Create(ctx, "alice", "github")
	if err != nil {
		t.Fatal(err)
	}
	alicesLinear, err := f.svc.Create(ctx, "alice", "linear")
	if err != nil {
		t.Fatal(err)
	}
	bobs, err := f.svc.Create(ctx, "bob", "github")
	if err != nil {
		t.Fatal(err)
	}
	accept := func(id string) string { return `{` + strconvQuote(id) + `:{"action":"accept"}}` }
	for _, c := range []struct {
		name, owner, state, inputs string
		want                       error
	}{
		{"bob's retry with alice's state", "bob", RequestState(alices.Elicitation), accept(alices.Elicitation), ErrRetryNotYours},
		{"alice's retry with bob's state", "alice", RequestState(bobs.Elicitation), accept(bobs.Elicitation), ErrRetryNotYours},
		{"a made-up state", "alice", RequestState("made-up"), accept("made-up"), ErrRetryNotYours},
		{"the prefix alone", "alice", "zidane-connect.", `{}`, ErrRetryNotYours},
		{"alice's state of another upstream", "alice", RequestState(alicesLinear.Elicitation), accept(alicesLinear.Elicitation), ErrRetryNotYours},
		{"bob declining alice's link", "bob", RequestState(alices.Elicitation), `{` + strconvQuote(alices.Elicitation) + `:{"action":"decline"}}`, ErrRetryNotYours},
		{"alice declines", "alice", RequestState(alices.Elicitation), `{` + strconvQuote(alices.Elicitation) + `:{"action":"decline"}}`, ErrDeclined},
		{"alice cancels", "alice", RequestState(alices.Elicitation), `{` + strconvQuote(alices.Elicitation) + `:{"action":"cancel"}}`, ErrDeclined},
		{"an upstream's own state", "alice", "upstream-state-1", `{"q":{"action":"accept"}}`, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			body := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"whoami","requestState":` + strconvQuote(c.state) + `,"inputResponses":` + c.inputs + `,"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}`
			m, err := message.Read([]byte(body))
			if err != nil {
				t.Fatal(err)
			}
			f.svc.waits.mu.Lock()
			before := f.svc.waits.total
			f.svc.waits.mu.Unlock()
			// A cancelled context: a wait, were one started, would end at
			// once; the test asserts none started.
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			if err := f.svc.Settle(ctx, c.owner, "github", m.Calls[0]); !errors.Is(err, c.want) || (c.want == nil && err != nil) {
				t.Fatalf("Settle: %v, want %v", err, c.want)
			}
			f.svc.waits.mu.Lock()
			n := f.svc.waits.total - before
			f.svc.waits.mu.Unlock()
			if n != 0 {
				t.Fatal("the retry registered a wait")
			}
			if c.want == nil {
				return
			}
			status, answer := RetryAnswer(m.Calls[0], "github", c.want)
			switch {
			case errors.Is(c.want, ErrRetryNotYours):
				if status != http.StatusForbidden || !strings.Contains(string(answer), `"code":-32602`) || !strings.Contains(string(answer), "not issued to you") || strings.Contains(string(answer), PathPrefix) {
					t.Fatalf("the refusal: %d %s", status, answer)
				}
			default:
				if status != http.StatusOK || !strings.Contains(string(answer), `"isError":true`) || !strings.Contains(string(answer), "declined") {
					t.Fatalf("the declined answer: %d %s", status, answer)
				}
			}
		})
	}
	// Bob refused with alice's state made no link of his, and alice's
	// link is still hers.
	if _, err := f.svc.links.peek(ctx, strings.TrimPrefix(alices.URL, site+PathPrefix)); err != nil {
		t.Fatalf("alice's link after the attacks: %v", err)
	}
}

// TestWaitConnected: a wait for any of alice's links at github ends when
// she connects through one of them after the wait began (not for an
// earlier connection), naming all her live elicitations for
// github (each a call that asked) and none of bob's or another upstream's.
func TestWaitConnected(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	first, _ := f.svc.Create(ctx, "alice", "github")
	second, _ := f.svc.Create(ctx, "alice", "github")
	other, _ := f.svc.Create(ctx, "alice", "linear")
	bobs, _ := f.svc.Create(ctx, "bob", "github")
	// A connection made before the wait began (since revoked) is none.
	f.svc.done(ctx, Connection{Owner: "alice", Upstream: "github", Elicitation: first.Elicitation})
	f.clock.add(time.Second)
	since := f.clock.now()
	type result struct {
		ids []string
		ok  bool
	}
	got := make(chan result, 1)
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	go func() {
		ids, ok := f.svc.WaitConnected(wctx, "alice", "github", since)
		got <- result{ids, ok}
	}()
	// Bob connecting wakes nothing of alice's.
	f.svc.done(ctx, Connection{Owner: "bob", Upstream: "github", Elicitation: bobs.Elicitation})
	f.svc.done(ctx, Connection{Owner: "alice", Upstream: "github", Elicitation: second.Elicitation})
	r := <-got
	if !r.ok || len(r.ids) != 2 || r.ids[0] != first.Elicitation || r.ids[1] != second.Elicitation {
		t.Fatalf("WaitConnected: %v %v, want alice's two github elicitations", r.ids, r.ok)
	}
	for _, id := range r.ids {
		if id == other.Elicitation || id == bobs.Elicitation {
			t.Fatalf("WaitConnected named %s", id)
		}
	}
	ended, end := context.WithCancel(ctx)
	end()
	if ids, ok := f.svc.WaitConnected(ended, "bob", "linear", since); ok || ids != nil {
		t.Fatalf("bob never connected linear: %v %v", ids, ok)
	}
}

func strconvQuote(s string) string { b, _ := json.Marshal(s); return string(b) }

// TestRespond: the answer a route writes reads the call it refused from
// the body the edge decided on: its version, its client's capabilities,
// its id among a batch's; without that body, the call is answered as a
// client without the capability.
func TestRespond(t *testing.T) {
	f := newFixture(t)
	modern := `{"jsonrpc":"2.0","id":%s,"method":"tools/call","params":{"name":"whoami","_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{"elicitation":{"url":{}}}}}}`
	plain := `{"jsonrpc":"2.0","id":%s,"method":"tools/call","params":{"name":"whoami"}}`
	for _, c := range []struct {
		name, body, id string
		inBody         bool
		want           string
	}{
		{"2026 capable", fmt.Sprintf(modern, `"a"`), `"a"`, true, `"resultType":"input_required"`},
		{"batch, second", "[" + fmt.Sprintf(plain, "1") + "," + fmt.Sprintf(modern, "2") + "]", "2", true, `"resultType":"input_required"`},
		{"batch, first", "[" + fmt.Sprintf(plain, "1") + "," + fmt.Sprintf(modern, "2") + "]", "1", true, `"isError":true`},
		{"no body in context", fmt.Sprintf(modern, "7"), "7", false, `"isError":true`},
		{"initialize, capable", `{"jsonrpc":"2.0","id":9,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{"elicitation":{"url":{}}},"clientInfo":{"name":"c","version":"1"}}}`, "9", true, `"message":"URL elicitation required: connect your account at github","data":{"elicitations":[{"mode":"url"`},
		{"initialize, not capable", `{"jsonrpc":"2.0","id":9,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"c","version":"1"}}}`, "9", true, `by opening http`},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodPost, "/mcp", strings.NewReader(c.body))
			if c.inBody {
				b, err := message.Read([]byte(c.body))
				if err != nil {
					t.Fatal(err)
				}
				r = r.WithContext(message.NewContext(r.Context(), b))
			}
			rec := httptest.NewRecorder()
			method := "tools/call"
			if strings.Contains(c.body, `"initialize"`) {
				method = "initialize"
			}
			f.svc.Respond(rec, r, "alice", "github", json.RawMessage(c.id), method, nil)
			got := rec.Body.String()
			if rec.Code != http.StatusOK || !strings.Contains(got, c.want) || !strings.Contains(got, `"id":`+c.id) || !strings.Contains(got, site+PathPrefix+"zcl_") {
				t.Fatalf("%d %s, want %s for id %s", rec.Code, got, c.want, c.id)
			}
		})
	}
}

// TestRespondNotAPerson: a caller whose owner no person can sign in as
// gets 403 saying so, not a link nobody could use, nor "try again".
func TestRespondNotAPerson(t *testing.T) {
	f := newFixture(t)
	r := httptest.NewRequest(http.MethodPost, "/mcp", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"whoami"}}`))
	rec := httptest.NewRecorder()
	f.svc.Respond(rec, r, "not a person", "github", json.RawMessage("1"), "tools/call", nil)
	if got := rec.Body.String(); rec.Code != http.StatusForbidden || !strings.Contains(got, `"code":-32003`) || !strings.Contains(got, "does not belong to a person") || strings.Contains(got, PathPrefix) {
		t.Fatalf("%d %s", rec.Code, got)
	}
}

// TestSettleEndsOnAnyConnection: the retry of a call answered with one
// link goes on once its person connected through another of their links
// for the same upstream (a client that asked twice), and not for a
// connection of someone else's, or one made before the link.
func TestSettleEndsOnAnyConnection(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	f.svc.done(ctx, Connection{Owner: "alice", Upstream: "github", Elicitation: "long-ago"})
	f.clock.add(time.Second)
	first, _ := f.svc.Create(ctx, "alice", "github")
	second, _ := f.svc.Create(ctx, "alice", "github")
	bobs, _ := f.svc.Create(ctx, "bob", "github")
	body := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"whoami","requestState":` + strconvQuote(RequestState(first.Elicitation)) +
		`,"inputResponses":{` + strconvQuote(first.Elicitation) + `:{"action":"accept"}}}}`
	m, err := message.Read([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	settled := make(chan error, 1)
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	go func() { settled <- f.svc.Settle(wctx, "alice", "github", m.Calls[0]) }()
	f.svc.done(ctx, Connection{Owner: "bob", Upstream: "github", Elicitation: bobs.Elicitation})
	f.clock.add(time.Second)
	f.svc.done(ctx, Connection{Owner: "alice", Upstream: "github", Elicitation: second.Elicitation})
	select {
	case err := <-settled:
		if err != nil || wctx.Err() != nil {
			t.Fatalf("Settle: %v (waited out: %v)", err, wctx.Err())
		}
	case <-wctx.Done():
		t.Fatal("the retry still waits after alice connected through her other link")
	}
}

// TestSettleAny: on a route that does not name the upstream, a retry is
// settled for the upstream of its owner's link: a decline of alice's own
// link is reported; bob's link in alice's retry names no link of hers, and
// the call goes on at once, with no wait.
func TestSettleAny(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	alices, _ := f.svc.Create(ctx, "alice", "linear")
	bobs, _ := f.svc.Create(ctx, "bob", "linear")
	retry := func(id, action string) message.Call {
		m, err := message.Read([]byte(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"whoami","requestState":` + strconvQuote(RequestState(id)) +
			`,"inputResponses":{` + strconvQuote(id) + `:{"action":"` + action + `"}}}}`))
		if err != nil {
			t.Fatal(err)
		}
		return m.Calls[0]
	}
	if !f.svc.SettleAny(ctx, "alice", retry(alices.Elicitation, "decline")) {
		t.Fatal("alice's decline of her own link was not reported")
	}
	ended, end := context.WithCancel(ctx)
	end()
	if f.svc.SettleAny(ended, "alice", retry(bobs.Elicitation, "decline")) {
		t.Fatal("bob's link settled alice's retry")
	}
	f.svc.waits.mu.Lock()
	n := f.svc.waits.total
	f.svc.waits.mu.Unlock()
	if n != 0 {
		t.Fatalf("%d waits started", n)
	}
}

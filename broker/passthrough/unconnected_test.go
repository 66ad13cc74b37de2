package passthrough

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	connectlink "github.com/Tahul/caddy-zidane-mcp/broker/connect"
	"github.com/Tahul/caddy-zidane-mcp/broker/internal/upstreamtest"
	"github.com/Tahul/caddy-zidane-mcp/broker/upstream"
	"github.com/Tahul/caddy-zidane-mcp/broker/upstreamauth"
	"github.com/Tahul/caddy-zidane-mcp/internal/oauthtest"
	"github.com/Tahul/caddy-zidane-mcp/message"
	"github.com/Tahul/caddy-zidane-mcp/policy"
)

// perUser is a route to a real OAuth-protected upstream whose tool says
// which upstream user called it, with each person's own token
// (upstreamauth's per-owner client): a person connects by their own login
// at the upstream's authorization server.
type perUser struct {
	as   *oauthtest.AuthServer
	up   *oauthtest.MCPServer
	oc   *upstreamauth.Client
	rt   *route
	mu   sync.Mutex
	caps [][]byte // the initCaps each connect answer was given
	// connected is closed when a person connects (the tests connect one).
	connected chan struct{}
	once      sync.Once
	edit      func(*upstream.Config, *Options)
	store     *certmagic.FileStorage
}

// elicitationID is the id of the elicitation every connect answer of
// these tests carries.
const elicitationID = "el-1"

func newPerUser(t *testing.T, upOpts oauthtest.MCPOptions) *perUser {
	t.Helper()
	as := oauthtest.NewAuthServer(oauthtest.AuthServerOptions{})
	t.Cleanup(as.Close)
	up := oauthtest.NewMCPServer(as, upOpts)
	t.Cleanup(up.Close)
	as.AddClient("gw", "", nil)
	key := make([]byte, 32)
	rand.Read(key)
	store := &certmagic.FileStorage{Path: t.TempDir()}
	oc, err := upstreamauth.New(context.Background(), "github", up.URL,
		upstreamauth.Config{ClientID: "gw", RedirectURL: "http://127.0.0.1:9/callback"},
		upstreamauth.Options{Storage: store, Key: key})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(oc.Close)
	g := &perUser{as: as, up: up, oc: oc, connected: make(chan struct{}), store: store}
	g.edit = func(u *upstream.Config, o *Options) {
		u.Headers = nil
		o.Credentials = oc.OwnerTransport(func(ctx context.Context) string {
			p, _ := policy.PrincipalFrom(ctx)
			return p.Name
		})
		o.Store = store
		o.ConnectRequired = func(w http.ResponseWriter, r *http.Request, rpcID json.RawMessage, method string, err *upstreamauth.ConnectRequiredError, initCaps []byte) {
			g.mu.Lock()
			g.caps = append(g.caps, initCaps)
			g.mu.Unlock()
			c := message.Call{Method: method}
			if b, ok := message.FromContext(r.Context()); ok && len(b.Calls) == 1 {
				c = b.Calls[0]
			}
			caps := initCaps
			version := "2025-11-25"
			if c.HasMetaVersion {
				version, caps = c.MetaVersion, connectlink.MetaCapabilities(c.Meta)
			}
			w.Header().Set("Content-Type", "application/json")
			w.Write(connectlink.Answer(connectlink.Required{ID: rpcID, Method: method, Version: version, URLElicitation: connectlink.URLCapable(caps),
				Upstream: err.Upstream, Link: connectlink.Link{URL: "https://gw.example/zidane/connect/zcl_x", Elicitation: elicitationID, Expires: time.Now().Add(time.Minute)}}))
		}
		o.Elicitations = func(context.Context, *http.Request) []string {
			select {
			case <-g.connected:
				return []string{elicitationID}
			default:
				return nil
			}
		}
		o.Connected = func(ctx context.Context, r *http.Request, _ time.Time) ([]string, bool) {
			select {
			case <-g.connected:
				return []string{elicitationID}, true
			case <-ctx.Done():
				return nil, false
			}
		}
	}
	g.rt = newRoute(t, up.URL, g.edit)
	return g
}

// connectAccount runs who's own login at the upstream's authorization
// server, as the connect link does.
func (g *perUser) connectAccount(t testing.TB, who string) {
	t.Helper()
	oc, err := g.oc.ForOwner(who)
	if err != nil {
		t.Fatal(err)
	}
	authURL, err := oc.BeginLogin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	u, _ := url.Parse(authURL)
	q := u.Query()
	q.Set("login_hint", who)
	u.RawQuery = q.Encode()
	browser := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := browser.Get(u.String())
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	loc, err := url.Parse(resp.Header.Get("Location"))
	if err != nil || resp.StatusCode != http.StatusFound {
		t.Fatalf("authorization endpoint: %d %v", resp.StatusCode, err)
	}
	if err := oc.Callback(context.Background(), loc.Query()); err != nil {
		t.Fatal(err)
	}
	g.once.Do(func() { close(g.connected) })
}

func (g *perUser) upstreamRequests() int {
	n, _ := g.up.Stats()
	return n
}

// TestUnconnectedGetsNoUpstreamData: what a person who has not connected
// their account sends, at either version, is answered by the gateway with
// no upstream data, or with the connect answer; none of it reaches the
// upstream, with any credential.
func TestUnconnectedGetsNoUpstreamData(t *testing.T) {
	g := newPerUser(t, oauthtest.MCPOptions{})
	init := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{"elicitation":{"url":{}}},"clientInfo":{"name":"c","version":"1"}}}`
	resp, body := post(t, g.rt.endpoint(), bobBearer, "", init)
	sid := resp.Header.Get("Mcp-Session-Id")
	if resp.StatusCode != http.StatusOK || sid == "" || !strings.Contains(body, `"version":"not connected"`) || !strings.Contains(body, `"listChanged":true`) {
		t.Fatalf("initialize: %d %q %s", resp.StatusCode, sid, body)
	}
	meta := `"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{"elicitation":{"url":{}}}}`
	for _, c := range []struct {
		name, sid, body string
		status          int
		want            string
	}{
		{"initialized", sid, `{"jsonrpc":"2.0","method":"notifications/initialized"}`, http.StatusAccepted, ""},
		{"tools/list", sid, `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`, http.StatusOK, `"result":{"tools":[]}`},
		{"prompts/list", sid, `{"jsonrpc":"2.0","id":3,"method":"prompts/list"}`, http.StatusOK, `"result":{"prompts":[]}`},
		{"resources/list", sid, `{"jsonrpc":"2.0","id":4,"method":"resources/list"}`, http.StatusOK, `"result":{"resources":[]}`},
		{"resources/templates/list", sid, `{"jsonrpc":"2.0","id":5,"method":"resources/templates/list"}`, http.StatusOK, `"resourceTemplates":[]`},
		{"ping", sid, `{"jsonrpc":"2.0","id":6,"method":"ping"}`, http.StatusOK, `"result":{}`},
		{"tools/call, session with URL elicitation", sid, `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"whoami","arguments":{}}}`, http.StatusOK, `"code":-32042`},
		{"tools/call, no session, no capability", "", `{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":"whoami","arguments":{}}}`, http.StatusOK, `"isError":true`},
		{"server/discover", "", `{"jsonrpc":"2.0","id":9,"method":"server/discover","params":{` + meta + `}}`, http.StatusOK, `"supportedVersions":["2026-07-28"]`},
		{"tools/list 2026", "", `{"jsonrpc":"2.0","id":10,"method":"tools/list","params":{` + meta + `}}`, http.StatusOK, `"tools":[]`},
		{"tools/call 2026", "", `{"jsonrpc":"2.0","id":11,"method":"tools/call","params":{"name":"whoami","arguments":{},` + meta + `}}`, http.StatusOK, `"resultType":"input_required"`},
		{"resources/read", sid, `{"jsonrpc":"2.0","id":12,"method":"resources/read","params":{"uri":"file:///x"}}`, http.StatusOK, `"code":-32042`},
	} {
		t.Run(c.name, func(t *testing.T) {
			resp, body := post(t, g.rt.endpoint(), bobBearer, c.sid, c.body)
			if resp.StatusCode != c.status || !strings.Contains(body, c.want) {
				t.Fatalf("%d %s, want %d with %s", resp.StatusCode, body, c.status, c.want)
			}
		})
	}
	// The session remembered its initialize's URL elicitation; the call
	// without a session had no capability.
	g.mu.Lock()
	caps := g.caps
	g.mu.Unlock()
	if len(caps) < 2 || string(caps[0]) != string(urlCaps) || caps[1] != nil {
		t.Fatalf("initCaps given: %q", caps)
	}
	// Another token cannot use bob's pending session.
	if resp, body := post(t, g.rt.endpoint(), aliceBearer, sid, `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`); resp.StatusCode != http.StatusNotFound {
		t.Fatalf("bob's pending session with alice's token: %d %s", resp.StatusCode, body)
	}
	if n := g.upstreamRequests(); n != 0 || len(g.up.Bearers()) != 0 {
		t.Fatalf("the upstream got %d requests (bearers %d) from a person not connected", n, len(g.up.Bearers()))
	}
}

// TestHandshakeBeforeConnecting2025: go-sdk's client at 2025-11-25, with
// URL elicitation, connects and lists before its person has connected; its
// call gets -32042; once the person connects, its GET stream carries
// notifications/elicitation/complete and tools/list_changed, and the same
// session's retry runs at the upstream as that person: on an upstream
// without sessions, and on one that keeps them (the pending session then
// goes on with the upstream session the gateway started as the person).
func TestHandshakeBeforeConnecting2025(t *testing.T) {
	for _, stateful := range []bool{false, true} {
		t.Run(map[bool]string{false: "stateless upstream", true: "stateful upstream"}[stateful], func(t *testing.T) {
			handshake2025(t, stateful)
		})
	}
}

func handshake2025(t *testing.T, stateful bool) {
	g := newPerUser(t, oauthtest.MCPOptions{Stateful: stateful})
	completed := make(chan string, 4)
	listChanged := make(chan struct{}, 4)
	cs, err := connect(t, g.rt.endpoint(), aliceBearer, &mcp.ClientOptions{
		ElicitationHandler: func(context.Context, *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			return &mcp.ElicitResult{Action: "accept"}, nil
		},
		Capabilities: &mcp.ClientCapabilities{Elicitation: &mcp.ElicitationCapabilities{URL: &mcp.URLElicitationCapabilities{}}},
		ElicitationCompleteHandler: func(_ context.Context, r *mcp.ElicitationCompleteNotificationRequest) {
			completed <- r.Params.ElicitationID
		},
		ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) { listChanged <- struct{}{} },
	}, legacyMCP)
	if err != nil {
		t.Fatalf("the handshake before connecting: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if res, err := cs.ListTools(ctx, nil); err != nil || len(res.Tools) != 0 {
		t.Fatalf("tools before connecting: %v %+v", err, res)
	}
	_, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: "whoami", Arguments: map[string]any{}})
	var rpcErr *jsonrpc.Error
	if !errors.As(err, &rpcErr) || rpcErr.Code != mcp.CodeURLElicitationRequired || !strings.Contains(string(rpcErr.Data), elicitationID) {
		t.Fatalf("the call before connecting: %v", err)
	}
	if n := g.upstreamRequests(); n != 0 {
		t.Fatalf("the upstream got %d requests before alice connected", n)
	}
	g.connectAccount(t, "alice")
	select {
	case id := <-completed:
		if id != elicitationID {
			t.Fatalf("elicitation/complete for %q", id)
		}
	case <-ctx.Done():
		t.Fatal("no notifications/elicitation/complete on the GET stream")
	}
	select {
	case <-listChanged:
	case <-ctx.Done():
		t.Fatal("no notifications/tools/list_changed")
	}
	if res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "whoami", Arguments: map[string]any{}}); err != nil || res.IsError || upstreamtest.ResultText(res) != "whoami: alice" {
		t.Fatalf("the retry: %v %q", err, upstreamtest.ResultText(res))
	}
	if res, err := cs.ListTools(ctx, nil); err != nil || len(res.Tools) == 0 {
		t.Fatalf("tools once connected: %v %+v", err, res)
	}
	// Another replica (the same key and storage) goes on with the same
	// upstream session.
	other := newRoute(t, g.up.URL, g.edit)
	if resp, body := post(t, other.endpoint(), aliceBearer, cs.ID(), `{"jsonrpc":"2.0","id":50,"method":"tools/call","params":{"name":"whoami","arguments":{}}}`); resp.StatusCode != http.StatusOK || !strings.Contains(body, "whoami: alice") {
		t.Fatalf("the session on another replica: %d %s", resp.StatusCode, body)
	}
	for _, b := range g.up.Bearers() {
		if strings.Contains(aliceBearer, b) {
			t.Error("the client's token reached the upstream")
		}
	}
}

// TestHandshakeBeforeConnecting2026: go-sdk's client at 2026-07-28 (its
// default) discovers and lists before its person has connected; its call
// gets input_required with the URL elicitation, its handler connects the
// person, and the retry runs at the upstream as that person.
func TestHandshakeBeforeConnecting2026(t *testing.T) {
	g := newPerUser(t, oauthtest.MCPOptions{})
	var retried []string
	g.rt.pt.retry = func(w http.ResponseWriter, r *http.Request, c message.Call) bool {
		retried = append(retried, c.RequestState)
		return false
	}
	cs, err := connect(t, g.rt.endpoint(), bobBearer, &mcp.ClientOptions{
		ElicitationHandler: func(_ context.Context, r *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			if r.Params.Mode != "url" || r.Params.ElicitationID != elicitationID {
				return &mcp.ElicitResult{Action: "decline"}, nil
			}
			g.connectAccount(t, "bob")
			return &mcp.ElicitResult{Action: "accept"}, nil
		},
		Capabilities: &mcp.ClientCapabilities{Elicitation: &mcp.ElicitationCapabilities{URL: &mcp.URLElicitationCapabilities{}}},
	}, "2026-07-28")
	if err != nil {
		t.Fatalf("the handshake before connecting: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if res, err := cs.ListTools(ctx, nil); err != nil || len(res.Tools) != 0 {
		t.Fatalf("tools before connecting: %v %+v", err, res)
	}
	if n := g.upstreamRequests(); n != 0 {
		t.Fatalf("the upstream got %d requests before bob connected", n)
	}
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "whoami", Arguments: map[string]any{}})
	if err != nil || res.IsError || upstreamtest.ResultText(res) != "whoami: bob" {
		t.Fatalf("bob's call: %v %+v", err, res)
	}
	if len(retried) != 1 || retried[0] != connectlink.RequestState(elicitationID) {
		t.Fatalf("retries seen: %q", retried)
	}
	if res, err := cs.ListTools(ctx, nil); err != nil || len(res.Tools) == 0 {
		t.Fatalf("tools once connected: %v %+v", err, res)
	}
}

// TestRetryAnsweredByTheHook: a retry the hook answers (a requestState
// not the caller's) never reaches the upstream, even for a person who is
// connected; a requestState of the connect shape in a batch is refused.
func TestRetryAnsweredByTheHook(t *testing.T) {
	g := newPerUser(t, oauthtest.MCPOptions{})
	g.connectAccount(t, "alice")
	before := g.upstreamRequests()
	g.rt.pt.retry = func(w http.ResponseWriter, r *http.Request, c message.Call) bool {
		w.WriteHeader(http.StatusForbidden)
		io.WriteString(w, `{"jsonrpc":"2.0","id":1,"error":{"code":-32602,"message":"not issued to you"}}`)
		return true
	}
	call := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"whoami","arguments":{},"requestState":"zidane-connect.someone-elses","inputResponses":{}}}`
	if resp, body := post(t, g.rt.endpoint(), aliceBearer, "", call); resp.StatusCode != http.StatusForbidden || !strings.Contains(body, "not issued") {
		t.Fatalf("the retry: %d %s", resp.StatusCode, body)
	}
	if resp, body := post(t, g.rt.endpoint(), aliceBearer, "", "["+call+"]"); resp.StatusCode != http.StatusBadRequest || !strings.Contains(body, "batch") {
		t.Fatalf("the retry in a batch: %d %s", resp.StatusCode, body)
	}
	if n := g.upstreamRequests() - before; n != 0 {
		t.Fatalf("the upstream got %d requests", n)
	}
}

// TestRetryGoesWithoutTheConnectState: a retry the hook lets go on reaches
// the upstream as the call the client first made: without the gateway's
// requestState and inputResponses (the upstream never made that
// elicitation), with the tool, its arguments and _meta as sent; an
// upstream's own requestState goes as it is.
func TestRetryGoesWithoutTheConnectState(t *testing.T) {
	var mu sync.Mutex
	var bodies []string
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		bodies = append(bodies, string(b))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"ok"}]}}`)
	}))
	t.Cleanup(up.Close)
	rt := newRoute(t, up.URL, func(u *upstream.Config, o *Options) { u.Headers = nil })
	rt.pt.retry = func(http.ResponseWriter, *http.Request, message.Call) bool { return false }
	for _, c := range []struct{ body, want, gone string }{
		{`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"whoami","arguments":{"a":"<b>"},"requestState":"zidane-connect.el","inputResponses":{"el":{"action":"accept"}},"_meta":{"k":1}}}`,
			`{"id":1,"jsonrpc":"2.0","method":"tools/call","params":{"_meta":{"k":1},"arguments":{"a":"<b>"},"name":"whoami"}}`, "zidane-connect"},
		{`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"whoami","requestState":"upstream-own","inputResponses":{}}}`,
			`"requestState":"upstream-own","inputResponses":{}`, ""},
	} {
		mu.Lock()
		bodies = nil
		mu.Unlock()
		if resp, body := post(t, rt.endpoint(), aliceBearer, "", c.body); resp.StatusCode != http.StatusOK {
			t.Fatalf("%d %s", resp.StatusCode, body)
		}
		mu.Lock()
		got := bodies
		mu.Unlock()
		if len(got) != 1 || !strings.Contains(got[0], c.want) || (c.gone != "" && strings.Contains(got[0], c.gone)) {
			t.Fatalf("the upstream got %q, want %s", got, c.want)
		}
	}
}

// TestPendingRecordsArePruned: starting a pending session's upstream
// session deletes the stored records of pending sessions past their
// lifetime, and keeps the live ones.
func TestPendingRecordsArePruned(t *testing.T) {
	g := newPerUser(t, oauthtest.MCPOptions{Stateful: true})
	ctx := context.Background()
	old, _ := json.Marshal(pendingRecord{Sealed: "x", Expires: time.Now().Add(-time.Minute)})
	live, _ := json.Marshal(pendingRecord{Sealed: "y", Expires: time.Now().Add(time.Hour)})
	if g.store.Store(ctx, "zidane/broker/pending/old", old) != nil || g.store.Store(ctx, "zidane/broker/pending/live", live) != nil {
		t.Fatal("storing")
	}
	resp, _ := post(t, g.rt.endpoint(), aliceBearer, "", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"c","version":"1"}}}`)
	sid := resp.Header.Get("Mcp-Session-Id")
	g.connectAccount(t, "alice")
	if resp, body := post(t, g.rt.endpoint(), aliceBearer, sid, `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"whoami","arguments":{}}}`); resp.StatusCode != http.StatusOK || !strings.Contains(body, "whoami: alice") {
		t.Fatalf("the call once connected: %d %s", resp.StatusCode, body)
	}
	if g.store.Exists(ctx, "zidane/broker/pending/old") {
		t.Error("an expired pending record was kept")
	}
	if !g.store.Exists(ctx, "zidane/broker/pending/live") {
		t.Error("a live pending record was deleted")
	}
}

// TestPendingSessionOfALargeInitialize: an initialize whose params are
// larger than a sealed id holds still gets a pending session that opens
// (its params cut to the version, capabilities and client info, or less),
// and the upstream session starts from them once connected.
func TestPendingSessionOfALargeInitialize(t *testing.T) {
	g := newPerUser(t, oauthtest.MCPOptions{Stateful: true})
	big := strings.Repeat("<x>", 1000)
	for _, params := range []string{
		`{"protocolVersion":"2025-11-25","capabilities":{"elicitation":{"url":{}}},"clientInfo":{"name":"c","version":"1","title":"` + big + `"}}`,
		// Within the 400 bytes, but each < is six once escaped.
		`{"protocolVersion":"2025-11-25","capabilities":{"experimental":{"x":"` + strings.Repeat("<", 250) + `"}},"clientInfo":{"name":"c","version":"1"}}`,
	} {
		resp, body := post(t, g.rt.endpoint(), aliceBearer, "", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":`+params+`}`)
		sid := resp.Header.Get("Mcp-Session-Id")
		if resp.StatusCode != http.StatusOK || sid == "" {
			t.Fatalf("initialize: %d %s", resp.StatusCode, body)
		}
		if resp, body := post(t, g.rt.endpoint(), aliceBearer, sid, `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`); resp.StatusCode != http.StatusOK || !strings.Contains(body, `"tools":[]`) {
			t.Fatalf("the pending session: %d %s", resp.StatusCode, body)
		}
		g.connectAccount(t, "alice")
		if resp, body := post(t, g.rt.endpoint(), aliceBearer, sid, `{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"whoami","arguments":{}}}`); resp.StatusCode != http.StatusOK || !strings.Contains(body, "whoami: alice") {
			t.Fatalf("the call once connected: %d %s", resp.StatusCode, body)
		}
		oc, err := g.oc.ForOwner("alice")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := oc.Revoke(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}

// TestSessionRemembersURLElicitation: a session that began with its
// person connected remembers whether its client declared URL elicitation
// in its initialize: once the person's connection is gone, that client's
// call gets -32042 and another client's a tool error naming the link.
func TestSessionRemembersURLElicitation(t *testing.T) {
	g := newPerUser(t, oauthtest.MCPOptions{Stateful: true})
	g.connectAccount(t, "alice")
	sessions := map[string]string{}
	for name, caps := range map[string]string{"url": `{"elicitation":{"url":{}}}`, "none": `{}`} {
		resp, body := post(t, g.rt.endpoint(), aliceBearer, "", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":`+caps+`,"clientInfo":{"name":"c","version":"1"}}}`)
		if resp.StatusCode != http.StatusOK || resp.Header.Get("Mcp-Session-Id") == "" || strings.Contains(body, "not connected") {
			t.Fatalf("initialize (%s) while connected: %d %s", name, resp.StatusCode, body)
		}
		sessions[name] = resp.Header.Get("Mcp-Session-Id")
		if resp, body := post(t, g.rt.endpoint(), aliceBearer, sessions[name], `{"jsonrpc":"2.0","method":"notifications/initialized"}`); resp.StatusCode != http.StatusAccepted {
			t.Fatalf("initialized: %d %s", resp.StatusCode, body)
		}
	}
	oc, err := g.oc.ForOwner("alice")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := oc.Revoke(context.Background()); err != nil {
		t.Fatal(err)
	}
	call := `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"whoami","arguments":{}}}`
	if resp, body := post(t, g.rt.endpoint(), aliceBearer, sessions["url"], call); resp.StatusCode != http.StatusOK || !strings.Contains(body, `"code":-32042`) {
		t.Fatalf("the URL-capable session's call once disconnected: %d %s", resp.StatusCode, body)
	}
	if resp, body := post(t, g.rt.endpoint(), aliceBearer, sessions["none"], call); resp.StatusCode != http.StatusOK || !strings.Contains(body, `"isError":true`) || !strings.Contains(body, "zcl_x") {
		t.Fatalf("the other session's call once disconnected: %d %s", resp.StatusCode, body)
	}
}

// TestDiscoverOfALegacyUpstream: once the upstream has answered a
// connected person's server/discover without 2026-07-28 (it speaks only
// 2025-11-25), a person not connected is not told 2026-07-28 by the
// gateway: go-sdk's client falls back to initialize, gets a pending
// session, and its call once connected runs at the upstream as that
// person. An upstream that speaks both keeps the gateway's 2026-07-28
// answer.
func TestDiscoverOfALegacyUpstream(t *testing.T) {
	for _, c := range []struct {
		name     string
		stateful bool
		want     string
	}{
		{"2025-11-25 only", true, "2025-11-25"},
		{"both versions", false, "2026-07-28"},
	} {
		t.Run(c.name, func(t *testing.T) { discoverOf(t, c.stateful, c.want) })
	}
}

func discoverOf(t *testing.T, stateful bool, want string) {
	g := newPerUser(t, oauthtest.MCPOptions{Stateful: stateful})
	g.connectAccount(t, "alice")
	if _, err := connect(t, g.rt.endpoint(), aliceBearer, nil, "2026-07-28"); err != nil {
		t.Fatalf("alice's client, connected: %v", err)
	}
	if g.rt.pt.legacy.Load() != stateful {
		t.Fatalf("legacy noted as %v", g.rt.pt.legacy.Load())
	}
	cs, err := connect(t, g.rt.endpoint(), bobBearer, &mcp.ClientOptions{
		Capabilities: &mcp.ClientCapabilities{Elicitation: &mcp.ElicitationCapabilities{URL: &mcp.URLElicitationCapabilities{}}},
		ElicitationHandler: func(context.Context, *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			return &mcp.ElicitResult{Action: "decline"}, nil
		},
	}, "2026-07-28")
	if err != nil {
		t.Fatalf("bob's client, not connected: %v", err)
	}
	if v := cs.InitializeResult().ProtocolVersion; v != want {
		t.Fatalf("bob's client speaks %q, want %q", v, want)
	}
	g.connectAccount(t, "bob")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "whoami", Arguments: map[string]any{}})
	if err != nil || res.IsError || upstreamtest.ResultText(res) != "whoami: bob" {
		t.Fatalf("bob's call once connected: %v %+v", err, res)
	}
}

// TestStreamOpenedAfterConnectingTellsOfIt: a 2025-11-25 client that
// waits for notifications/elicitation/complete (the TypeScript SDK's
// example application) may open its GET stream only once its person has
// connected: the stream started late, or lost a race for the pending
// session with the client's own POST (storage locks poll) while the
// person connected. The stream of a session that had not started when it
// came still tells of the completion and of the changed list, whether the
// upstream serves a GET stream or answers 405; once that session started,
// a GET is the upstream's again (its 405).
func TestStreamOpenedAfterConnectingTellsOfIt(t *testing.T) {
	for _, stateful := range []bool{false, true} {
		t.Run(map[bool]string{false: "upstream without a GET stream", true: "upstream with a GET stream"}[stateful], func(t *testing.T) {
			g := newPerUser(t, oauthtest.MCPOptions{Stateful: stateful})
			resp, body := post(t, g.rt.endpoint(), aliceBearer, "", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{"elicitation":{"url":{}}},"clientInfo":{"name":"c","version":"1"}}}`)
			sid := resp.Header.Get("Mcp-Session-Id")
			if resp.StatusCode != http.StatusOK || sid == "" {
				t.Fatalf("initialize: %d %s", resp.StatusCode, body)
			}
			if resp, body := post(t, g.rt.endpoint(), aliceBearer, sid, `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"whoami","arguments":{}}}`); !strings.Contains(body, `"code":-32042`) {
				t.Fatalf("the call before connecting: %d %s", resp.StatusCode, body)
			}
			g.connectAccount(t, "alice")
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			// Another token with alice's session id is not told of her
			// elicitations, and starts nothing at the upstream as her.
			before := g.upstreamRequests()
			resp = getStream(ctx, t, g.rt.endpoint(), bobBearer, sid)
			resp.Body.Close()
			if resp.StatusCode != http.StatusNotFound {
				t.Fatalf("bob's GET of alice's session: HTTP %d, want 404", resp.StatusCode)
			}
			if n := g.upstreamRequests(); n != before {
				t.Fatalf("bob's GET of alice's session reached the upstream (%d requests)", n-before)
			}
			stream := openStream(ctx, t, g.rt.endpoint(), sid)
			if got := stream.next(t); !strings.Contains(got, `"method":"notifications/elicitation/complete"`) || !strings.Contains(got, `"elicitationId":"`+elicitationID+`"`) {
				t.Fatalf("the stream's first message: %s", got)
			}
			if got := stream.next(t); !strings.Contains(got, `"method":"notifications/tools/list_changed"`) {
				t.Fatalf("the stream's second message: %s", got)
			}
			if resp, body := post(t, g.rt.endpoint(), aliceBearer, sid, `{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"whoami","arguments":{}}}`); resp.StatusCode != http.StatusOK || !strings.Contains(body, "whoami: alice") {
				t.Fatalf("the retry: %d %s", resp.StatusCode, body)
			}
			stream.close()
			if stateful {
				// The upstream's answer to another GET depends on whether
				// it has seen the first one end yet (go-sdk answers 409
				// while it holds it); the stateless one answers 405, which
				// the gateway's own stream never does.
				return
			}
			// The session has started: a stream opened now is the upstream's.
			resp = getStream(ctx, t, g.rt.endpoint(), aliceBearer, sid)
			resp.Body.Close()
			if resp.StatusCode != http.StatusMethodNotAllowed {
				t.Fatalf("a stream of the started session: HTTP %d, want the upstream's 405", resp.StatusCode)
			}
		})
	}
}

// sseStream reads the data of a GET stream's events, one at a time.
type sseStream struct {
	resp *http.Response
	sc   *bufio.Scanner
}

// getStream opens bearer's GET stream of session sid.
func getStream(ctx context.Context, t *testing.T, endpoint, bearer, sid string) *http.Response {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, endpoint, nil)
	req.Header.Set("Authorization", bearer)
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("Mcp-Session-Id", sid)
	req.Header.Set("Mcp-Protocol-Version", legacyMCP)
	resp, err := httpClient(t, bearer).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

func openStream(ctx context.Context, t *testing.T, endpoint, sid string) *sseStream {
	t.Helper()
	resp := getStream(ctx, t, endpoint, aliceBearer, sid)
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		resp.Body.Close()
		t.Fatalf("the GET stream: HTTP %d %s %s", resp.StatusCode, resp.Header.Get("Content-Type"), b)
	}
	return &sseStream{resp: resp, sc: bufio.NewScanner(resp.Body)}
}

// next is the data of the stream's next event with data.
func (s *sseStream) next(t *testing.T) string {
	t.Helper()
	for s.sc.Scan() {
		if data, ok := strings.CutPrefix(s.sc.Text(), "data: "); ok {
			return data
		}
	}
	t.Fatalf("the stream ended: %v", s.sc.Err())
	return ""
}

func (s *sseStream) close() { s.resp.Body.Close() }

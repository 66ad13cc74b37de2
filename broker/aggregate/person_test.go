package aggregate

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/Tahul/caddy-zidane-mcp/broker/connect"
	"github.com/Tahul/caddy-zidane-mcp/broker/upstream"
	"github.com/Tahul/caddy-zidane-mcp/broker/upstreamauth"
	"github.com/Tahul/caddy-zidane-mcp/message"
	"github.com/Tahul/caddy-zidane-mcp/policy"
)

// personUp is a real go-sdk upstream that takes each person's own token
// (Bearer person-<name>) and serves each person their own server: whoami
// reports the person the token is for, and alice alone has alice_private.
// It records the Authorization of every request it gets.
type personUp struct {
	http *httptest.Server

	mu      sync.Mutex
	auths   []string
	servers map[string]*mcp.Server
	streams map[string]int // open GET streams, by person
}

func newPersonUp(t *testing.T) *personUp {
	t.Helper()
	u := &personUp{servers: map[string]*mcp.Server{}, streams: map[string]int{}}
	serverOf := func(person string) *mcp.Server {
		u.mu.Lock()
		defer u.mu.Unlock()
		if s := u.servers[person]; s != nil {
			return s
		}
		// 2025-11-25: its sessions are visible, so the test sees one end.
		s := mcp.NewServer(&mcp.Implementation{Name: "people", Version: "1"}, &mcp.ServerOptions{SupportedProtocolVersions: []string{"2025-11-25"}})
		mcp.AddTool(s, &mcp.Tool{Name: "whoami", Description: "who " + person + " is"}, func(ctx context.Context, req *mcp.CallToolRequest, in aggIn) (*mcp.CallToolResult, any, error) {
			who := strings.TrimPrefix(req.Extra.Header.Get("Authorization"), "Bearer person-")
			if req.Params.RequestState != "" || len(req.Params.InputResponses) > 0 {
				who += " (with the state " + req.Params.RequestState + ")"
			}
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "whoami: " + who}}}, nil, nil
		})
		mcp.AddTool(s, &mcp.Tool{Name: "progress"}, func(ctx context.Context, req *mcp.CallToolRequest, in aggIn) (*mcp.CallToolResult, any, error) {
			if tok := req.Params.GetProgressToken(); tok != nil {
				_ = req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: tok, Progress: 1, Total: 2, Message: "half of " + person + "'s work"})
			}
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "done"}}}, nil, nil
		})
		mcp.AddTool(s, &mcp.Tool{Name: "ask"}, func(ctx context.Context, req *mcp.CallToolRequest, in aggIn) (*mcp.CallToolResult, any, error) {
			res, err := req.Session.Elicit(ctx, &mcp.ElicitParams{Message: "colour?", RequestedSchema: &jsonschema.Schema{Type: "object", Properties: map[string]*jsonschema.Schema{"c": {Type: "string"}}}})
			if err != nil {
				return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: "elicitation failed: " + err.Error()}}}, nil, nil
			}
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: person + " answered " + res.Action + " " + fmt.Sprint(res.Content["c"])}}}, nil, nil
		})
		if person == "alice" {
			mcp.AddTool(s, &mcp.Tool{Name: "alice_private", Description: "alice's own tool"}, func(ctx context.Context, req *mcp.CallToolRequest, in aggIn) (*mcp.CallToolResult, any, error) {
				return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "alice's secret"}}}, nil, nil
			})
		}
		u.servers[person] = s
		return s
	}
	h := mcp.NewStreamableHTTPHandler(func(r *http.Request) *mcp.Server {
		return serverOf(strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer person-"))
	}, nil)
	u.http = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		auth := r.Header.Get("Authorization")
		u.mu.Lock()
		u.auths = append(u.auths, auth)
		u.mu.Unlock()
		if !strings.HasPrefix(auth, "Bearer person-") {
			http.Error(w, "a person's token is required", http.StatusUnauthorized)
			return
		}
		if r.Method == http.MethodGet {
			person := strings.TrimPrefix(auth, "Bearer person-")
			u.mu.Lock()
			u.streams[person]++
			u.mu.Unlock()
			defer func() {
				u.mu.Lock()
				u.streams[person]--
				u.mu.Unlock()
			}()
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(u.http.Close)
	return u
}

func (u *personUp) seen() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return slices.Clone(u.auths)
}

// open is how many GET streams person's upstream sessions hold open at
// the upstream: a gateway that ended them closed these.
func (u *personUp) open(person string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.streams[person]
}

// people is the test's credentials layer of the per-person upstream, as
// the gateway's is (upstreamauth.OwnerTransport over callerOwner): the
// person of the request's upstream session, never another's; a person who
// has not connected gets ErrConnectRequired and nothing is sent. A request
// that names no person gets the operator's shared token: the layer a
// misconfigured gateway would have, so that any request the route sends
// without its person shows at the upstream.
type people struct {
	mu        sync.Mutex
	connected map[string]bool
}

func (p *people) set(owner string, on bool) {
	p.mu.Lock()
	p.connected[owner] = on
	p.mu.Unlock()
}

func (p *people) is(owner string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.connected[owner]
}

func (p *people) layer(next http.RoundTripper) http.RoundTripper {
	return roundTripFunc(func(r *http.Request) (*http.Response, error) {
		r = r.Clone(r.Context())
		owner, ok := upstreamauth.CallOwner(r.Context())
		if pr, has := policy.PrincipalFrom(r.Context()); has && ok && pr.OwnerID() != owner {
			return nil, errors.New("two people for one request")
		}
		switch {
		case !ok:
			r.Header.Set("Authorization", "Bearer operator")
		case !p.is(owner):
			return nil, &upstreamauth.ConnectRequiredError{Upstream: "people", Reason: "not connected"}
		default:
			r.Header.Set("Authorization", "Bearer person-"+owner)
		}
		return next.RoundTrip(r)
	})
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

const testConnectURL = "https://gateway.example/zidane/connect/zcl_test"

// personServe serves an aggregate of a shared upstream and the per-person
// upstream behind the edge's principal (X-Test-Token names the token,
// X-Test-Owner its person) and reading of the body.
func personServe(t *testing.T, pu *personUp, ppl *people, opts Options) string {
	t.Helper()
	_, url := personServeAgg(t, pu, ppl, opts)
	return url
}

// personServeAgg is personServe, returning the route too.
func personServeAgg(t *testing.T, pu *personUp, ppl *people, opts Options) (*Aggregate, string) {
	t.Helper()
	return personServeWith(t, newAggUp(t, "shared").config(), pu, ppl, opts)
}

// personServeWith is personServeAgg with shared as the shared upstream.
func personServeWith(t *testing.T, shared upstream.Config, pu *personUp, ppl *people, opts Options) (*Aggregate, string) {
	t.Helper()
	return personServeCfg(t, shared, upstream.Config{Name: "people", URL: pu.http.URL}, ppl, opts)
}

// personServeCfg is personServeWith with perUser as the per-person
// upstream's config (named "people").
func personServeCfg(t *testing.T, shared, perUser upstream.Config, ppl *people, opts Options) (*Aggregate, string) {
	t.Helper()
	opts.PerUser = func(name string) bool { return name == "people" }
	opts.Credentials = func(name string) func(http.RoundTripper) http.RoundTripper {
		if name == "people" {
			return ppl.layer
		}
		return nil
	}
	opts.Connected = func(up, owner string) bool { return up == "people" && ppl.is(owner) }
	opts.ConnectState = func(state string) bool { _, ok := connect.ElicitationOf(state); return ok }
	if opts.ConnectRequired == nil {
		opts.ConnectRequired = testConnectAnswer
	}
	a, err := New([]upstream.Config{shared, perUser}, opts)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p := policy.Principal{TokenID: r.Header.Get("X-Test-Token"), Name: r.Header.Get("X-Test-Owner"), Owner: r.Header.Get("X-Test-Owner")}
		ctx := policy.WithPrincipal(r.Context(), p)
		if r.Method == http.MethodPost {
			body, b := readBody(t, r)
			r.Body = body
			if m, err := message.Read(b); err == nil {
				ctx = message.NewContext(ctx, m)
			}
		}
		a.ServeHTTP(w, r.WithContext(ctx))
	}))
	t.Cleanup(func() {
		srv.CloseClientConnections()
		a.Close()
		srv.Close()
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := a.Ready(ctx); err != nil {
		t.Fatal(err)
	}
	return a, srv.URL
}

func readBody(t *testing.T, r *http.Request) (io.ReadCloser, []byte) {
	t.Helper()
	b, err := io.ReadAll(r.Body)
	if err != nil {
		t.Error(err)
	}
	return io.NopCloser(bytes.NewReader(b)), b
}

// testConnectAnswer answers as the gateway's connect links do, with a link
// of the person's own.
func testConnectAnswer(ctx context.Context, owner, up string, c message.Call, initCaps []byte) ([]byte, error) {
	version := "2025-11-25"
	caps := initCaps
	if c.HasMetaVersion {
		version, caps = c.MetaVersion, connect.MetaCapabilities(c.Meta)
	}
	return connect.Answer(connect.Required{ID: c.ID.Raw(), Method: c.Method, Version: version, URLElicitation: connect.URLCapable(caps),
		Upstream: up, Link: connect.Link{URL: testConnectURL + "_" + owner, Elicitation: "el-" + owner, Expires: time.Now().Add(10 * time.Minute)}}), nil
}

// personRT sends a person's token, as their client does.
type personRT struct{ token, owner string }

func (p personRT) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("X-Test-Token", p.token)
	r.Header.Set("X-Test-Owner", p.owner)
	return http.DefaultTransport.RoundTrip(r)
}

// personClient connects owner's client at version ("": 2026-07-28).
func personClient(t *testing.T, url, version, owner string) *mcp.ClientSession {
	t.Helper()
	c := mcp.NewClient(&mcp.Implementation{Name: owner + "-client", Version: "1"}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cs, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: &http.Client{Transport: personRT{token: "tok-" + owner, owner: owner}}, MaxRetries: -1},
		&mcp.ClientSessionOptions{ProtocolVersion: version})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

func callText(t *testing.T, cs *mcp.ClientSession, tool string) (string, bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: map[string]any{"text": "x"}})
	if err != nil {
		return "error: " + err.Error(), true
	}
	return aggText(t, res), res.IsError
}

// TestAggregatePerUserAttacks: on the aggregated route, a per-person
// upstream is reached with each caller's own token and nobody else's, at
// both protocol versions.
func TestAggregatePerUserAttacks(t *testing.T) {
	for _, version := range []string{"2025-11-25", ""} {
		name := version
		if name == "" {
			name = "2026-07-28"
		}
		t.Run(name, func(t *testing.T) {
			pu := newPersonUp(t)
			ppl := &people{connected: map[string]bool{"alice": true, "bob": true}}
			url := personServe(t, pu, ppl, Options{})
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			alice := personClient(t, url, version, "alice")
			bob := personClient(t, url, version, "bob")
			carol := personClient(t, url, version, "carol")

			// A's list shows the upstream's tools for A; B's never shows
			// what was listed with A's token.
			if got, want := aggToolNames(t, ctx, alice), []string{"mcp_people_alice_private", "mcp_people_ask", "mcp_people_progress", "mcp_people_whoami", "mcp_shared_echo", "mcp_shared_secret"}; !slices.Equal(got, want) {
				t.Errorf("alice lists %v, want %v", got, want)
			}
			if got, want := aggToolNames(t, ctx, bob), []string{"mcp_people_ask", "mcp_people_progress", "mcp_people_whoami", "mcp_shared_echo", "mcp_shared_secret"}; !slices.Equal(got, want) {
				t.Errorf("bob lists %v (alice's tools must not show), want %v", got, want)
			}
			// A's call runs as A, B's as B, in either order, and again.
			for _, step := range []struct {
				cs   *mcp.ClientSession
				want string
			}{{alice, "whoami: alice"}, {bob, "whoami: bob"}, {alice, "whoami: alice"}, {bob, "whoami: bob"}} {
				if got, isErr := callText(t, step.cs, "mcp_people_whoami"); isErr || got != step.want {
					t.Errorf("call: %q (error %v), want %q", got, isErr, step.want)
				}
			}
			// The connect tool, called once connected, says so.
			if got, isErr := callText(t, alice, "mcp_people_connect_account"); isErr || !strings.Contains(got, "is connected") {
				t.Errorf("alice's connect tool once connected: %q (error %v)", got, isErr)
			}
			// B calling A's own tool by name reaches the upstream as B,
			// where it does not exist: never A's result.
			if got, _ := callText(t, bob, "mcp_people_alice_private"); strings.Contains(got, "alice's secret") {
				t.Errorf("bob got alice's result: %q", got)
			}

			// A person without a connection never reaches the upstream
			// with any credential: the list offers the connect tool, a
			// call answers with their own link.
			before := len(pu.seen())
			if got, want := aggToolNames(t, ctx, carol), []string{"mcp_people_connect_account", "mcp_shared_echo", "mcp_shared_secret"}; !slices.Equal(got, want) {
				t.Errorf("carol lists %v, want %v", got, want)
			}
			for _, tool := range []string{"mcp_people_whoami", "mcp_people_connect_account", "mcp_people_alice_private"} {
				got, isErr := callText(t, carol, tool)
				if !isErr || !strings.Contains(got, testConnectURL+"_carol") {
					t.Errorf("carol's call of %s: %q (error %v), want a tool error naming her link", tool, got, isErr)
				}
			}
			if after := pu.seen(); len(after) != before {
				t.Errorf("the upstream got %d requests while carol, not connected, listed and called: %q", len(after)-before, after[before:])
			}

			// The operator's shared token, or a request without its
			// person, never reaches the per-person upstream; every request
			// carries alice's or bob's own token.
			for _, auth := range pu.seen() {
				if auth != "Bearer person-alice" && auth != "Bearer person-bob" {
					t.Errorf("the upstream got Authorization %q", auth)
				}
			}

			// Revocation ends the person's upstream session (its stream
			// at the upstream closes; nothing more is sent with a token
			// that is no longer usable, not even its DELETE), and their
			// next call gets the link, without reaching the upstream.
			if pu.open("alice") == 0 {
				t.Fatal("alice has no upstream stream open to end")
			}
			ppl.set("alice", false)
			deadline := time.Now().Add(10 * time.Second)
			for pu.open("alice") > 0 {
				if time.Now().After(deadline) {
					t.Fatal("alice's upstream session outlived the revocation of her connection by 10s")
				}
				time.Sleep(20 * time.Millisecond)
			}
			before = len(pu.seen())
			if got, isErr := callText(t, alice, "mcp_people_whoami"); !isErr || !strings.Contains(got, testConnectURL+"_alice") {
				t.Errorf("alice's call after revocation: %q (error %v), want her link", got, isErr)
			}
			if got, want := aggToolNames(t, ctx, alice), []string{"mcp_people_connect_account", "mcp_shared_echo", "mcp_shared_secret"}; !slices.Equal(got, want) {
				t.Errorf("alice lists %v after revocation, want %v", got, want)
			}
			if after := pu.seen(); len(after) != before {
				t.Errorf("the upstream got %q after alice's connection was revoked", after[before:])
			}
			if got, isErr := callText(t, bob, "mcp_people_whoami"); isErr || got != "whoami: bob" {
				t.Errorf("bob after alice's revocation: %q (error %v)", got, isErr)
			}
		})
	}
}

// TestAggregatePerUserBounds: person sessions are bounded in number; the
// person past the bound is told to try later and reaches nothing.
func TestAggregatePerUserBounds(t *testing.T) {
	pu := newPersonUp(t)
	ppl := &people{connected: map[string]bool{"alice": true, "bob": true}}
	url := personServe(t, pu, ppl, Options{MaxPeople: 1})
	alice := personClient(t, url, "2025-11-25", "alice")
	bob := personClient(t, url, "2025-11-25", "bob")
	if got, isErr := callText(t, alice, "mcp_people_whoami"); isErr || got != "whoami: alice" {
		t.Fatalf("alice: %q", got)
	}
	if got, isErr := callText(t, bob, "mcp_people_whoami"); !isErr || !strings.Contains(got, "too many people") {
		t.Errorf("bob past the bound: %q (error %v), want a tool error saying too many people", got, isErr)
	}
	for _, auth := range pu.seen() {
		if auth == "Bearer person-bob" {
			t.Error("bob reached the upstream past the bound")
		}
	}
}

// TestAggregatePerUserUnconnectedHoldNoPlace: people who have not
// connected hold no person session, so however many list and call, a
// connected person past them still gets one.
func TestAggregatePerUserUnconnectedHoldNoPlace(t *testing.T) {
	pu := newPersonUp(t)
	ppl := &people{connected: map[string]bool{"alice": true}}
	url := personServe(t, pu, ppl, Options{MaxPeople: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, who := range []string{"carol", "dave", "erin"} {
		cs := personClient(t, url, "2025-11-25", who)
		aggToolNames(t, ctx, cs)
		if got, isErr := callText(t, cs, "mcp_people_whoami"); !isErr || !strings.Contains(got, testConnectURL+"_"+who) {
			t.Errorf("%s: %q, want their link", who, got)
		}
	}
	alice := personClient(t, url, "2025-11-25", "alice")
	if got, isErr := callText(t, alice, "mcp_people_whoami"); isErr || got != "whoami: alice" {
		t.Errorf("alice after three people not connected: %q (error %v)", got, isErr)
	}
}

// TestAggregatePerUserNotAPerson: a credential of no person who could
// connect gets the hook's refusal, with its status, and reaches nothing.
func TestAggregatePerUserNotAPerson(t *testing.T) {
	pu := newPersonUp(t)
	ppl := &people{connected: map[string]bool{}}
	url := personServe(t, pu, ppl, Options{ConnectRequired: func(context.Context, string, string, message.Call, []byte) ([]byte, error) {
		return nil, &ConnectRefusal{Status: http.StatusForbidden, Code: message.CodeForbidden, Message: "people takes each person's own account, and this credential is no person's"}
	}})
	robot := personClient(t, url, "2025-11-25", "robot")
	got, isErr := callText(t, robot, "mcp_people_whoami")
	if !isErr || !strings.Contains(got, "no person's") {
		t.Errorf("robot's call: %q, want the refusal", got)
	}
	if n := len(pu.seen()); n != 0 {
		t.Errorf("the upstream got %d requests", n)
	}
	status, body := modernPost(t, url, `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"mcp_people_whoami","arguments":{},"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientInfo":{"name":"x","version":"1"},"io.modelcontextprotocol/clientCapabilities":{}}}}`,
		map[string]string{"X-Test-Token": "tok-robot", "X-Test-Owner": "robot", "Mcp-Method": "tools/call", "Mcp-Name": "mcp_people_whoami"})
	if status != http.StatusForbidden || !strings.Contains(body, "no person's") {
		t.Errorf("robot's 2026-07-28 call: HTTP %d %s, want 403 with the refusal", status, body)
	}
}

// TestAggregatePerUserRetryStateStaysHere: the 2026-07-28 retry of a
// connect answer carries the gateway's requestState and the person's
// answer to the gateway's elicitation; neither goes upstream.
func TestAggregatePerUserRetryStateStaysHere(t *testing.T) {
	pu := newPersonUp(t)
	ppl := &people{connected: map[string]bool{"alice": true}}
	url := personServe(t, pu, ppl, Options{})
	meta := `"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientInfo":{"name":"x","version":"1"},"io.modelcontextprotocol/clientCapabilities":{"elicitation":{"url":{}}}}`
	hdr := map[string]string{"X-Test-Token": "tok-alice", "X-Test-Owner": "alice", "Mcp-Method": "tools/call", "Mcp-Name": "mcp_people_whoami"}
	for _, tc := range []struct{ name, params, want string }{
		{"the gateway's state", `"requestState":"` + connect.RequestState("el-alice") + `","inputResponses":{"el-alice":{"action":"accept"}}`, `whoami: alice"`},
		{"the upstream's own state", `"requestState":"the-upstreams-own","inputResponses":{"q1":{"action":"accept"}}`, `whoami: alice (with the state the-upstreams-own)"`},
	} {
		status, body := modernPost(t, url, `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"mcp_people_whoami","arguments":{"text":"x"},`+tc.params+`,`+meta+`}}`, hdr)
		if status != http.StatusOK || !strings.Contains(body, tc.want) {
			t.Errorf("%s: HTTP %d %s, want %s", tc.name, status, body, tc.want)
		}
	}
}

// TestAggregatePerUserProgress: an upstream's progress on a person's
// session reaches the call it is for, at both versions.
func TestAggregatePerUserProgress(t *testing.T) {
	pu := newPersonUp(t)
	ppl := &people{connected: map[string]bool{"alice": true}}
	url := personServe(t, pu, ppl, Options{})
	for _, version := range []string{"2025-11-25", ""} {
		got := make(chan string, 4)
		c := mcp.NewClient(&mcp.Implementation{Name: "alice-client", Version: "1"}, &mcp.ClientOptions{
			ProgressNotificationHandler: func(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
				got <- fmt.Sprint(req.Params.ProgressToken) + ": " + req.Params.Message
			}})
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		cs, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: &http.Client{Transport: personRT{token: "tok-alice", owner: "alice"}}, MaxRetries: -1},
			&mcp.ClientSessionOptions{ProtocolVersion: version})
		if err != nil {
			t.Fatal(err)
		}
		params := &mcp.CallToolParams{Name: "mcp_people_progress", Arguments: map[string]any{"text": "x"}}
		params.SetProgressToken("p-7")
		if _, err := cs.CallTool(ctx, params); err != nil {
			t.Fatal(err)
		}
		select {
		case p := <-got:
			if p != "p-7: half of alice's work" {
				t.Errorf("%q: progress %q", version, p)
			}
		case <-ctx.Done():
			t.Errorf("%q: no progress reached the caller", version)
		}
		cs.Close()
		cancel()
	}
}

// TestAggregatePerUserListingIsStale: a listing that holds a person's
// tools changes when they connect or are revoked, so it is never fresh
// for the shared upstreams' ttlMs.
func TestAggregatePerUserListingIsStale(t *testing.T) {
	pu := newPersonUp(t)
	ppl := &people{connected: map[string]bool{"alice": true}}
	_, url := personServeWith(t, ttlUp(t, "shared", 5000), pu, ppl, Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, version := range []string{"2025-11-25", ""} {
		res, err := personClient(t, url, version, "alice").ListTools(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if res.TTLMs != 0 || res.CacheScope != "private" {
			t.Errorf("%q: tools/list ttlMs %d cacheScope %q; want 0, private", version, res.TTLMs, res.CacheScope)
		}
	}
}

// TestAggregatePerUserRestart: restarting a per_user upstream ends the
// people's sessions to it; each person's next call opens their own again.
func TestAggregatePerUserRestart(t *testing.T) {
	pu := newPersonUp(t)
	ppl := &people{connected: map[string]bool{"alice": true}}
	a, url := personServeAgg(t, pu, ppl, Options{})
	alice := personClient(t, url, "2025-11-25", "alice")
	if got, _ := callText(t, alice, "mcp_people_whoami"); got != "whoami: alice" {
		t.Fatalf("alice: %q", got)
	}
	if pu.open("alice") == 0 {
		t.Fatal("alice has no upstream stream open")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := a.Restart(ctx, "people"); err != nil {
		t.Fatal(err)
	}
	for pu.open("alice") > 0 {
		if ctx.Err() != nil {
			t.Fatal("alice's upstream stream outlived the restart by 10s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got, _ := callText(t, alice, "mcp_people_whoami"); got != "whoami: alice" {
		t.Errorf("alice after the restart: %q", got)
	}
}

// TestAggregatePerUserAlone: a route whose one upstream is per_user is
// ready at once (there is no catalog to wait for), and with prefix
// conditional offers the upstream's own names.
func TestAggregatePerUserAlone(t *testing.T) {
	pu := newPersonUp(t)
	ppl := &people{connected: map[string]bool{"alice": true}}
	a, err := New([]upstream.Config{{Name: "people", URL: pu.http.URL}}, Options{
		Prefix:          PrefixConditional,
		PerUser:         func(string) bool { return true },
		Credentials:     func(string) func(http.RoundTripper) http.RoundTripper { return ppl.layer },
		ConnectRequired: testConnectAnswer,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := a.Ready(ctx); err != nil {
		t.Fatalf("a route of one per_user upstream is not ready: %v", err)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p := policy.Principal{TokenID: r.Header.Get("X-Test-Token"), Owner: r.Header.Get("X-Test-Owner")}
		ctx := policy.WithPrincipal(r.Context(), p)
		if r.Method == http.MethodPost {
			body, b := readBody(t, r)
			r.Body = body
			if m, err := message.Read(b); err == nil {
				ctx = message.NewContext(ctx, m)
			}
		}
		a.ServeHTTP(w, r.WithContext(ctx))
	}))
	defer srv.Close()
	defer srv.CloseClientConnections()
	alice, bob := personClient(t, srv.URL, "2025-11-25", "alice"), personClient(t, srv.URL, "", "bob")
	if got := aggToolNames(t, ctx, alice); !slices.Equal(got, []string{"alice_private", "ask", "progress", "whoami"}) {
		t.Errorf("alice lists %v", got)
	}
	if got, _ := callText(t, alice, "whoami"); got != "whoami: alice" {
		t.Errorf("alice: %q", got)
	}
	if got := aggToolNames(t, ctx, bob); !slices.Equal(got, []string{"connect_account"}) {
		t.Errorf("bob, not connected, lists %v", got)
	}
	if got, isErr := callText(t, bob, "whoami"); !isErr || !strings.Contains(got, testConnectURL+"_bob") {
		t.Errorf("bob: %q, want his link", got)
	}
}

// TestAggregatePerUserElicitation: an upstream's elicitation on a
// person's session reaches a 2026-07-28 caller as an input request, and
// is refused for a 2025-11-25 caller (the session serves all the person's
// clients, and a 2025-11-25 call is not waiting for one).
func TestAggregatePerUserElicitation(t *testing.T) {
	pu := newPersonUp(t)
	ppl := &people{connected: map[string]bool{"alice": true}}
	url := personServe(t, pu, ppl, Options{})
	for _, tc := range []struct{ version, want string }{
		{"", "alice answered accept blue"},
		{"2025-11-25", "no call of this client is waiting"},
	} {
		c := mcp.NewClient(&mcp.Implementation{Name: "alice-client", Version: "1"}, &mcp.ClientOptions{
			ElicitationHandler: func(context.Context, *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
				return &mcp.ElicitResult{Action: "accept", Content: map[string]any{"c": "blue"}}, nil
			}})
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		cs, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: &http.Client{Transport: personRT{token: "tok-alice", owner: "alice"}}, MaxRetries: -1},
			&mcp.ClientSessionOptions{ProtocolVersion: tc.version})
		if err != nil {
			t.Fatal(err)
		}
		got, _ := callText(t, cs, "mcp_people_ask")
		if !strings.Contains(got, tc.want) {
			t.Errorf("%q: %q, want %q", tc.version, got, tc.want)
		}
		cs.Close()
		cancel()
	}
}

// TestAggregatePerUserConnectCompletes: a 2025-11-25 session given a
// connect link hears, once its person has connected,
// notifications/elicitation/complete for that link and
// tools/list_changed; its list then shows the upstream's tools.
func TestAggregatePerUserConnectCompletes(t *testing.T) {
	pu := newPersonUp(t)
	ppl := &people{connected: map[string]bool{}}
	connected := make(chan struct{})
	url := personServe(t, pu, ppl, Options{AwaitConnect: func(ctx context.Context, owner, elicitation string) bool {
		if owner != "carol" || elicitation != "el-carol" {
			return false
		}
		select {
		case <-connected:
			return true
		case <-ctx.Done():
			return false
		}
	}})
	complete, changed := make(chan string, 4), make(chan struct{}, 16)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cs := carolAsksToConnect(t, ctx, url, &mcp.ClientOptions{
		ElicitationHandler: func(context.Context, *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			return &mcp.ElicitResult{Action: "accept"}, nil
		},
		ElicitationCompleteHandler: func(_ context.Context, req *mcp.ElicitationCompleteNotificationRequest) {
			complete <- req.Params.ElicitationID
		},
		ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) {
			select {
			case changed <- struct{}{}:
			default:
			}
		},
	}, false)
	ppl.set("carol", true)
	close(connected)
	select {
	case id := <-complete:
		if id != "el-carol" {
			t.Errorf("elicitation/complete for %q", id)
		}
	case <-ctx.Done():
		t.Fatal("no notifications/elicitation/complete")
	}
	select {
	case <-changed:
	case <-ctx.Done():
		t.Fatal("no notifications/tools/list_changed")
	}
	if got := aggToolNames(t, ctx, cs); !slices.Contains(got, "mcp_people_whoami") || slices.Contains(got, "mcp_people_connect_account") {
		t.Errorf("carol's list once connected: %v", got)
	}
	if got, isErr := callText(t, cs, "mcp_people_whoami"); isErr || got != "whoami: carol" {
		t.Errorf("carol once connected: %q", got)
	}
}

// carolAsksToConnect connects carol's go-sdk client (opts, declaring URL
// elicitation) at 2025-11-25, without its GET stream when noStream, and
// has it call one of the per-person upstream's tools before she has
// connected: the call gets -32042 with her link. The session ends with
// the test.
func carolAsksToConnect(t *testing.T, ctx context.Context, url string, opts *mcp.ClientOptions, noStream bool) *mcp.ClientSession {
	t.Helper()
	opts.Capabilities = &mcp.ClientCapabilities{Elicitation: &mcp.ElicitationCapabilities{URL: &mcp.URLElicitationCapabilities{}}}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "carol-client", Version: "1"}, opts).Connect(ctx,
		&mcp.StreamableClientTransport{Endpoint: url, HTTPClient: &http.Client{Transport: personRT{token: "tok-carol", owner: "carol"}}, MaxRetries: -1, DisableStandaloneSSE: noStream},
		&mcp.ClientSessionOptions{ProtocolVersion: "2025-11-25"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	_, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: "mcp_people_whoami", Arguments: map[string]any{"text": "x"}})
	var rpcErr *jsonrpc.Error
	if !errors.As(err, &rpcErr) || rpcErr.Code != mcp.CodeURLElicitationRequired || !strings.Contains(string(rpcErr.Data), testConnectURL+"_carol") {
		t.Fatalf("carol's call: %v, want -32042 with her link", err)
	}
	return cs
}

// TestAggregatePerUserNeedsHTTP: a per-person upstream is refused at New
// unless it is http or sse.
func TestAggregatePerUserNeedsHTTP(t *testing.T) {
	_, err := New([]upstream.Config{{Name: "local", Transport: upstream.TransportStdio, Command: "true"}}, Options{PerUser: func(string) bool { return true }})
	if err == nil || !strings.Contains(err.Error(), "http or sse") {
		t.Fatalf("a stdio per-person upstream: %v, want a refusal naming http or sse", err)
	}
}

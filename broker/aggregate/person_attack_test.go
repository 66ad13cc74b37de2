package aggregate

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/Tahul/caddy-zidane-mcp/broker/upstream"
)

// TestAggregatePerUserToolsDenyHolds: an operator's tools allow/deny of a
// per_user upstream holds for calls as for listings: a person who is
// connected calls a tool the lists keep back, by its name or a case
// variant the upstream might resolve to it, and it never reaches the
// upstream (it is not offered, as a shared upstream's is not).
func TestAggregatePerUserToolsDenyHolds(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  func(*upstream.Config)
		tool string
	}{
		{"denied", func(c *upstream.Config) { c.ToolsDeny = []string{"progress"} }, "mcp_people_progress"},
		{"denied, another case", func(c *upstream.Config) { c.ToolsDeny = []string{"progress"} }, "mcp_people_PROGRESS"},
		{"not allowed", func(c *upstream.Config) { c.ToolsAllow = []string{"whoami"} }, "mcp_people_progress"},
	} {
		for _, version := range []string{"2025-11-25", ""} {
			t.Run(tc.name+"/"+version, func(t *testing.T) {
				pu := newPersonUp(t)
				ppl := &people{connected: map[string]bool{"alice": true}}
				cfg := upstream.Config{Name: "people", URL: pu.http.URL}
				tc.cfg(&cfg)
				_, url := personServeCfg(t, newAggUp(t, "shared").config(), cfg, ppl, Options{})
				alice := personClient(t, url, version, "alice")
				if got, isErr := callText(t, alice, "mcp_people_whoami"); isErr || got != "whoami: alice" {
					t.Fatalf("alice's allowed call: %q (error %v)", got, isErr)
				}
				got, isErr := callText(t, alice, tc.tool)
				// The route's refusal names the tool as the route offers
				// it; the upstream's would name its own.
				if !isErr || !strings.Contains(got, `unknown tool "`+tc.tool+`"`) {
					t.Errorf("alice's call of %s, kept back by the upstream's lists: %q (error %v), want it refused as an unknown tool", tc.tool, got, isErr)
				}
				if strings.Contains(got, "done") || strings.Contains(got, "answered") {
					t.Errorf("the kept-back tool %s ran upstream: %q", tc.tool, got)
				}
			})
		}
	}
}

// TestAggregatePerUserElicitationStaysWithItsClient: a person's upstream
// session serves all their tokens, such as their own client's and an
// agent's of one of their sessions. While the agent holds a call waiting
// for input, the upstream's question in the person's own client's call
// must not be put to the agent (who would answer it for them): it is
// refused, naming why.
func TestAggregatePerUserElicitationStaysWithItsClient(t *testing.T) {
	pu := newPersonUp(t)
	ppl := &people{connected: map[string]bool{"alice": true}}
	url := personServe(t, pu, ppl, Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	asked, release := make(chan struct{}, 1), make(chan struct{})
	agent := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "1"}, &mcp.ClientOptions{
		ElicitationHandler: func(ctx context.Context, req *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			select {
			case asked <- struct{}{}:
			default:
			}
			select {
			case <-release:
			case <-ctx.Done():
			}
			return &mcp.ElicitResult{Action: "accept", Content: map[string]any{"c": "agent's"}}, nil
		}})
	acs, err := agent.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: &http.Client{Transport: personRT{token: "tok-alice-agent", owner: "alice"}}, MaxRetries: -1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer acs.Close()
	agentDone := make(chan string, 1)
	go func() {
		res, err := acs.CallTool(ctx, &mcp.CallToolParams{Name: "mcp_people_ask", Arguments: map[string]any{"text": "x"}})
		if err != nil {
			agentDone <- "error: " + err.Error()
			return
		}
		agentDone <- aggTextOf(res)
	}()
	select {
	case <-asked: // the agent's call waits for its input
	case <-ctx.Done():
		t.Fatal("the agent was never asked")
	}

	laptop := mcp.NewClient(&mcp.Implementation{Name: "alice-laptop", Version: "1"}, &mcp.ClientOptions{
		ElicitationHandler: func(context.Context, *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			return &mcp.ElicitResult{Action: "accept", Content: map[string]any{"c": "alice's"}}, nil
		}})
	lcs, err := laptop.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: &http.Client{Transport: personRT{token: "tok-alice", owner: "alice"}}, MaxRetries: -1},
		&mcp.ClientSessionOptions{ProtocolVersion: "2025-11-25"})
	if err != nil {
		t.Fatal(err)
	}
	defer lcs.Close()
	got, isErr := callText(t, lcs, "mcp_people_ask")
	if !isErr || !strings.Contains(got, "more than one client") {
		t.Errorf("alice's own call while her agent waits: %q (error %v), want its question refused, naming the other client", got, isErr)
	}

	close(release)
	select {
	case got := <-agentDone:
		if got != "alice answered accept agent's" {
			t.Errorf("the agent's own call: %q", got)
		}
	case <-ctx.Done():
		t.Fatal("the agent's call never ended")
	}
}

// TestAggregatePerUserProgressStaysWithItsClient: a person's upstream
// session serves all their tokens, whose clients choose their progress
// tokens: an agent of one of the person's sessions that calls with the
// progress token of the person's own client's call in flight gets its own
// call's progress, never the other call's.
func TestAggregatePerUserProgressStaysWithItsClient(t *testing.T) {
	gate, started := make(chan struct{}), make(chan struct{}, 2)
	srv := mcp.NewServer(&mcp.Implementation{Name: "work", Version: "1"}, &mcp.ServerOptions{SupportedProtocolVersions: []string{"2025-11-25"}})
	type workIn struct {
		Who string `json:"who"`
	}
	mcp.AddTool(srv, &mcp.Tool{Name: "work"}, func(ctx context.Context, req *mcp.CallToolRequest, in workIn) (*mcp.CallToolResult, any, error) {
		started <- struct{}{}
		select {
		case <-gate:
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		}
		_ = req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: req.Params.GetProgressToken(), Progress: 1, Total: 2, Message: "progress of " + in.Who})
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "done"}}}, nil, nil
	})
	up := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, nil))
	defer up.Close()
	defer up.CloseClientConnections()
	ppl := &people{connected: map[string]bool{"alice": true}}
	_, url := personServeCfg(t, newAggUp(t, "shared").config(), upstream.Config{Name: "people", URL: up.URL}, ppl, Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	type client struct {
		who, token string
		got        chan string
		done       chan error
	}
	var clients []*client
	for _, c := range []*client{{who: "laptop", token: "tok-alice"}, {who: "agent", token: "tok-alice-agent"}} {
		c.got, c.done = make(chan string, 4), make(chan error, 1)
		mc := mcp.NewClient(&mcp.Implementation{Name: c.who, Version: "1"}, &mcp.ClientOptions{
			ProgressNotificationHandler: func(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
				c.got <- fmt.Sprint(req.Params.ProgressToken) + ": " + req.Params.Message
			}})
		cs, err := mc.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: &http.Client{Transport: personRT{token: c.token, owner: "alice"}}, MaxRetries: -1},
			&mcp.ClientSessionOptions{ProtocolVersion: "2025-11-25"})
		if err != nil {
			t.Fatal(err)
		}
		defer cs.Close()
		params := &mcp.CallToolParams{Name: "mcp_people_work", Arguments: map[string]any{"who": c.who}}
		params.SetProgressToken("p-7") // the agent's the same as the laptop's
		go func() {
			_, err := cs.CallTool(ctx, params)
			c.done <- err
		}()
		select { // each call is at the upstream before the next starts
		case <-started:
		case <-ctx.Done():
			t.Fatalf("%s's call never reached the upstream", c.who)
		}
		clients = append(clients, c)
	}
	close(gate)
	for _, c := range clients {
		if err := <-c.done; err != nil {
			t.Fatalf("%s's call: %v", c.who, err)
		}
	}
	for _, c := range clients {
		select {
		case got := <-c.got:
			if want := "p-7: progress of " + c.who; got != want {
				t.Errorf("%s got the progress %q, want %q", c.who, got, want)
			}
		case <-ctx.Done():
			t.Errorf("%s got no progress", c.who)
		}
	}
}

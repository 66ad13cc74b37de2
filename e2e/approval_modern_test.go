package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// plainPeer is a go-sdk client that declares no elicitation: at
// 2026-07-28 a held call of its is told with the tool error, as at
// 2025-11-25.
func plainPeer(t *testing.T, endpoint string, hc *http.Client, version string) (*peer, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "e2e-plain", Version: "1"}, nil).Connect(ctx,
		&mcp.StreamableClientTransport{Endpoint: endpoint, HTTPClient: hc, MaxRetries: -1}, &mcp.ClientSessionOptions{ProtocolVersion: version})
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { cs.Close() })
	return &peer{cs: cs}, nil
}

// TestApprovalInputRequired drives go-sdk's 2026-07-28 client through the
// built binary, on guard, the broker's pass-through and the aggregated
// route: a held call is answered input_required, which the client follows
// (its elicitation handler shows the message naming the approval and waits);
// the operator approves through the CLI; the client's retry, carrying the
// requestState, runs the call once with the approved arguments. Meanwhile
// the attacks on the retry, sent raw, are each refused with a word of why:
// another principal's requestState, a made-up one, the approval's with a
// changed argument; and the retry replayed after it ran.
func TestApprovalInputRequired(t *testing.T) {
	upstream := startStatelessEverythingServer(t)
	rule := `policy {
			approve "tool.name == 'json_schema_2020_12_tool' && args.name == 'production'" "production needs a second person"
		}`
	c, ports := ruledGateway(t, upstream, rule)
	alice := createToken(t, c, "alice", "--scope", "mcp", "--owner", "alice")
	mallory := createToken(t, c, "mallory", "--scope", "mcp", "--owner", "mallory")

	for route, port := range ports {
		t.Run(route, func(t *testing.T) {
			endpoint := fmt.Sprintf("http://127.0.0.1:%d/mcp", port)
			asked, proceed := make(chan string, 4), make(chan struct{})
			cs, err := mcp.NewClient(&mcp.Implementation{Name: "e2e-approval", Version: "1"}, &mcp.ClientOptions{
				ElicitationHandler: func(ctx context.Context, r *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
					asked <- r.Params.Message
					select {
					case <-proceed:
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
			email := route + "@example.com"
			args := map[string]any{"name": "production", "email": email}
			type answer struct {
				res *mcp.CallToolResult
				err error
			}
			done := make(chan answer, 1)
			go func() {
				res, err := callRouteTool(cs, "json_schema_2020_12_tool", args)
				done <- answer{res, err}
			}()
			var msg string
			select {
			case msg = <-asked:
			case a := <-done:
				t.Fatalf("the held call ended without asking: %s", outcome(a.res, a.err))
			case <-time.After(30 * time.Second):
				t.Fatal("the held call asked nothing within 30s")
			}
			id := approvalID.FindString(msg)
			if id == "" || !strings.Contains(msg, "production needs a second person") {
				t.Fatalf("the input request: %q", msg)
			}
			if out, errOut, err := c.Run(t, "zidane", "approvals", "approve", id); err != nil {
				t.Fatalf("approve: %v %s %s", err, out, errOut)
			}

			// go-sdk sends the arguments with sorted keys: the bytes the
			// approval holds.
			params := func(state, args string) string {
				return `"name":"json_schema_2020_12_tool","arguments":` + args + `,"requestState":"zidane-approval.` + state +
					`","inputResponses":{"` + state + `":{"action":"accept"}},`
			}
			approved := `{"email":"` + email + `","name":"production"}`
			for _, a := range []struct {
				name, token, params, word string
			}{
				{"another principal's requestState", mallory, params(id, approved), "not issued to you"},
				{"a made-up requestState", alice, params("apv_AAAAAAAAAAAAAAAAAAAAAA", approved), "not issued to you"},
				{"the approval's requestState with a changed argument", alice, params(id, `{"email":"evil-`+email+`","name":"production"}`), "not the call that was approved"},
			} {
				st, body, raw := rawModern(t, endpoint, a.token, "tools/call", "json_schema_2020_12_tool", a.params)
				if st != http.StatusForbidden || !strings.Contains(string(body), a.word) {
					t.Errorf("%s: %d %s, want 403 saying %q", a.name, st, raw, a.word)
				}
			}

			// A call no rule holds, carrying an approval's requestState
			// (the rule changed between the rounds, or a client that
			// copies it): the state is the gateway's, and the backend
			// gets the call without it.
			st, body, raw := rawModern(t, endpoint, alice, "tools/call", "json_schema_2020_12_tool", params(id, `{"email":"`+email+`","name":"staging"}`))
			if st != http.StatusOK || strings.Contains(string(body), `"error"`) || strings.Contains(string(body), `"isError":true`) || !strings.Contains(string(body), "staging") {
				t.Errorf("a call no rule holds with an approval's requestState: %d %s", st, raw)
			}

			close(proceed)
			var a answer
			select {
			case a = <-done:
			case <-time.After(30 * time.Second):
				t.Fatal("the approved retry did not end within 30s")
			}
			if text := outcome(a.res, a.err); a.err != nil || a.res.IsError || !strings.Contains(text, email) || strings.Contains(text, "evil-") {
				t.Fatalf("the approved call: %s", text)
			}
			st, body, raw = rawModern(t, endpoint, alice, "tools/call", "json_schema_2020_12_tool", params(id, approved))
			if st != http.StatusForbidden || !strings.Contains(string(body), "used already") {
				t.Fatalf("the retry replayed after it ran: %d %s", st, raw)
			}
			for _, l := range auditLines(c) {
				if l["event"] == "approval_approved" && l["caller"] == "alice" && strings.Contains(fmt.Sprint(l), id) {
					return
				}
			}
			t.Errorf("no audit line of the approval of %s", id)
		})
	}
}

// TestApprovalReachesTheBackendOnce: behind guard, a go-sdk MCP server
// that records what reaches it: a held call that go-sdk's 2026-07-28
// client follows through input_required runs there once, after the
// approval, with the approved arguments and without the gateway's
// requestState and inputResponses; the same call made again waits anew
// and, declined, never reaches it.
func TestApprovalReachesTheBackendOnce(t *testing.T) {
	s := mcp.NewServer(&mcp.Implementation{Name: "deployer", Version: "1"}, nil)
	type args struct {
		Environment string `json:"environment"`
		Version     string `json:"version"`
	}
	var mu sync.Mutex
	var ran []string
	var seen [][]byte
	mcp.AddTool(s, &mcp.Tool{Name: "deploy", Description: "deploys"}, func(_ context.Context, _ *mcp.CallToolRequest, a args) (*mcp.CallToolResult, any, error) {
		mu.Lock()
		ran = append(ran, a.Environment+" "+a.Version)
		mu.Unlock()
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "deployed " + a.Version}}}, nil, nil
	})
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, &mcp.StreamableHTTPOptions{JSONResponse: true, Stateless: true})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		if bytes.Contains(body, []byte(`"tools/call"`)) {
			mu.Lock()
			seen = append(seen, body)
			mu.Unlock()
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		h.ServeHTTP(w, r)
	}))
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
			approve "tool.name == 'deploy' && args.environment == 'production'" "production deploys need a second person"
		}
	}
	reverse_proxy %s
}
`, AdminPlaceholder, port, port, strings.TrimPrefix(up.URL, "http://")))
	alice := createToken(t, c, "alice", "--scope", "mcp", "--owner", "alice")
	asked, answer := make(chan string, 4), make(chan string)
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "e2e-approval", Version: "1"}, &mcp.ClientOptions{
		ElicitationHandler: func(ctx context.Context, r *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			asked <- r.Params.Message
			select {
			case action := <-answer:
				return &mcp.ElicitResult{Action: action}, nil
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
	call := func() <-chan string {
		done := make(chan string, 1)
		go func() {
			res, err := callRouteTool(cs, "deploy", map[string]any{"environment": "production", "version": "1.2.3"})
			done <- outcome(res, err)
		}()
		return done
	}
	waitAsked := func(done <-chan string) string {
		t.Helper()
		select {
		case msg := <-asked:
			return approvalID.FindString(msg)
		case out := <-done:
			t.Fatalf("the held call ended without asking: %s", out)
		case <-time.After(30 * time.Second):
			t.Fatal("the held call asked nothing within 30s")
		}
		return ""
	}
	done := call()
	id := waitAsked(done)
	if out, errOut, err := c.Run(t, "zidane", "approvals", "approve", id); err != nil {
		t.Fatalf("approve %q: %v %s %s", id, err, out, errOut)
	}
	answer <- "accept"
	if out := <-done; !strings.Contains(out, "deployed 1.2.3") || strings.Contains(out, "isError=true") {
		t.Fatalf("the approved call: %s", out)
	}
	mu.Lock()
	if len(ran) != 1 || ran[0] != "production 1.2.3" || len(seen) != 1 || bytes.Contains(seen[0], []byte("requestState")) ||
		bytes.Contains(seen[0], []byte("inputResponses")) || bytes.Contains(seen[0], []byte("zidane-approval")) {
		t.Fatalf("the backend ran %q and got %q, want the approved call once without the gateway's state", ran, seen)
	}
	mu.Unlock()

	done = call()
	if again := waitAsked(done); again == "" || again == id {
		t.Fatalf("the same call made again waits on %q, want a new approval (not %s)", again, id)
	}
	answer <- "decline"
	if out := <-done; !strings.Contains(out, "not made") {
		t.Fatalf("the declined wait: %s", out)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(ran) != 1 || len(seen) != 1 {
		t.Fatalf("after the replay the backend ran %q and got %d calls", ran, len(seen))
	}
}

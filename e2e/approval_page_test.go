package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"html"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	signinidp "github.com/Tahul/caddy-zidane-mcp/authserver/idp"
)

var approvalFormToken = regexp.MustCompile(`name="token" value="([0-9a-f]+)"`)

// TestApprovalPage: the status page of a held call on the sign-in site,
// through the binary: anyone with its address sees the tool and the
// rule's message, not the arguments; bob, signed in with the approve
// scope, sees the arguments and approves with the page's button, after
// which the caller's same call runs once. A cross-origin post, the caller
// posting (signed in with the approve scope, with bob's form), and a post
// signed out are each refused, and the call stays held. At 2026-07-28
// go-sdk's client that declares URL elicitation is sent to the page by the
// input_required answer's one input request, and its retry runs once
// approved there.
func TestApprovalPage(t *testing.T) {
	upstream := startStatelessEverythingServer(t)
	base := fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
	c := startCaddy(t, fmt.Sprintf(`{
	admin {{ADMIN}}
	zidane {
		signin {
			issuer %[1]s
		}
	}
}

%[1]s {
	zidane_mcp {
		guard
		resource %[1]s/mcp
		policy {
			approve "tool.name == 'json_schema_2020_12_tool' && args.name == 'production'" "production needs a second person"
		}
	}
	reverse_proxy %[2]s
}
`, base, strings.TrimSuffix(strings.TrimPrefix(upstream, "http://"), "/mcp")))
	alice := createToken(t, c, "alice", "--scope", "mcp", "--owner", "alice")
	p, err := plainPeer(t, base+"/mcp", bearerClient(alice, nil), legacyVersion)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	args := map[string]any{"name": "production", "email": "secret-ops@example.com"}
	res, err := callRouteTool(p.cs, "json_schema_2020_12_tool", args)
	id := approvalID.FindString(outcome(res, err))
	if id == "" {
		t.Fatalf("the held call: %s", outcome(res, err))
	}
	page := "/zidane/approvals/" + id

	anon := newFormBrowser(t, base)
	resp, body := anon.get(base + page)
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, "json_schema_2020_12_tool") || !strings.Contains(body, "production needs a second person") ||
		strings.Contains(body, "secret-ops") || strings.Contains(body, `id="approve"`) {
		t.Fatalf("the page to anyone: %d %s", resp.StatusCode, body)
	}
	if resp.Header.Get("X-Frame-Options") != "DENY" || resp.Header.Get("Cache-Control") != "no-store" {
		t.Errorf("the page's headers: %v", resp.Header)
	}
	signedIn := func(owner string) *formBrowser {
		b := newFormBrowser(t, base)
		if resp, body := b.post(signinidp.LinkPath, url.Values{"secret": {signInLink(t, c, owner, "mcp", "approve")}}); resp.StatusCode != http.StatusOK {
			t.Fatalf("%s's sign-in: %d %s", owner, resp.StatusCode, body)
		}
		return b
	}
	bob := signedIn("bob")
	resp, body = bob.get(base + page)
	m := approvalFormToken.FindStringSubmatch(body)
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, "secret-ops") || m == nil {
		t.Fatalf("the page to bob: %d %s", resp.StatusCode, body)
	}
	bobToken := html.UnescapeString(m[1])
	owner := signedIn("alice")
	if _, body := owner.get(base + page); !strings.Contains(body, "your call") || strings.Contains(body, `id="approve"`) {
		t.Fatalf("the page to alice, the caller: %s", body)
	}

	evil := newFormBrowser(t, base)
	evil.hc.Jar = bob.hc.Jar
	evil.origin = "http://evil.example"
	for _, a := range []struct {
		name   string
		b      *formBrowser
		token  string
		status int
		word   string
	}{
		{"a cross-origin post with bob's cookie", evil, bobToken, http.StatusForbidden, "own page"},
		{"alice posting bob's form", owner, bobToken, http.StatusForbidden, "not shown to the person"},
		{"a post signed out", anon, bobToken, http.StatusForbidden, "not signed in"},
	} {
		resp, body := a.b.post(page, url.Values{"decision": {"approve"}, "token": {a.token}})
		if resp.StatusCode != a.status || !strings.Contains(body, a.word) {
			t.Errorf("%s: %d %s, want %d saying %q", a.name, resp.StatusCode, body, a.status, a.word)
		}
	}
	if out, _, err := c.Run(t, "zidane", "approvals", "list"); err != nil || !strings.Contains(out, id) {
		t.Fatalf("after the refused posts the call is no longer pending: %v %s", err, out)
	}
	bob.hc.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	if resp, body := bob.post(page, url.Values{"decision": {"approve"}, "token": {bobToken}}); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("bob's approval: %d %s", resp.StatusCode, body)
	}
	res, err = callRouteTool(p.cs, "json_schema_2020_12_tool", args)
	if err != nil || res.IsError || !strings.Contains(outcome(res, err), "secret-ops") {
		t.Fatalf("the approved call: %s", outcome(res, err))
	}

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// At 2026-07-28 the input request is the page's URL elicitation.
	asked, accept := make(chan *mcp.ElicitParams, 2), make(chan struct{})
	modern, err := mcp.NewClient(&mcp.Implementation{Name: "e2e-url-modern", Version: "1"}, &mcp.ClientOptions{
		Capabilities: &mcp.ClientCapabilities{Elicitation: &mcp.ElicitationCapabilities{URL: &mcp.URLElicitationCapabilities{}}},
		ElicitationHandler: func(ctx context.Context, r *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			asked <- r.Params
			select {
			case <-accept:
				return &mcp.ElicitResult{Action: "accept"}, nil
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		},
	}).Connect(ctx, &mcp.StreamableClientTransport{Endpoint: base + "/mcp", HTTPClient: bearerClient(alice, nil), MaxRetries: -1},
		&mcp.ClientSessionOptions{ProtocolVersion: modernVersion})
	if err != nil {
		t.Fatalf("connect at 2026-07-28: %v", err)
	}
	defer modern.Close()
	modernArgs := map[string]any{"name": "production", "email": "modern-ops@example.com"}
	done := make(chan string, 1)
	go func() {
		res, err := modern.CallTool(ctx, &mcp.CallToolParams{Name: "json_schema_2020_12_tool", Arguments: modernArgs})
		done <- outcome(res, err)
	}()
	var ep *mcp.ElicitParams
	select {
	case ep = <-asked:
	case out := <-done:
		t.Fatalf("the held call at 2026-07-28 ended without asking: %s", out)
	}
	mid := approvalID.FindString(ep.ElicitationID)
	if ep.Mode != "url" || mid == "" || ep.URL != base+"/zidane/approvals/"+mid {
		t.Fatalf("the 2026-07-28 input request: %+v", ep)
	}
	_, body = bob.get(ep.URL)
	m = approvalFormToken.FindStringSubmatch(body)
	if m == nil {
		t.Fatalf("no buttons for bob: %s", body)
	}
	if resp, body := bob.post("/zidane/approvals/"+mid, url.Values{"decision": {"approve"}, "token": {html.UnescapeString(m[1])}}); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("bob's approval: %d %s", resp.StatusCode, body)
	}
	close(accept)
	if out := <-done; !strings.Contains(out, "modern-ops@example.com") || strings.Contains(out, "isError=true") {
		t.Fatalf("the approved call at 2026-07-28: %s", out)
	}
	for _, l := range auditLines(c) {
		if l["event"] == "approval_approved" && l["by"] == "bob" && l["caller"] == "alice" {
			return
		}
	}
	t.Error("no audit line of bob's approval through the page")
}

// TestApprovalURLElicitation: at 2025-11-25 on the broker and the
// aggregated routes, where the gateway signs people in, a go-sdk client
// whose initialize declared URL elicitation gets a held call answered with
// the -32042 error whose one URL elicitation is the approval's status
// page; once approved there, the same call runs. A client without the
// capability reads the page's address in the tool error.
func TestApprovalURLElicitation(t *testing.T) {
	// A stateful upstream: the session the broker seals remembers what
	// its initialize declared; the aggregated route holds the session.
	upstream := startEverythingServer(t)
	base := fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
	aggregated := fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
	rule := `policy {
			approve "tool.name.endsWith('json_schema_2020_12_tool') && args.name == 'production'" "production needs a second person"
		}`
	c := startCaddy(t, fmt.Sprintf(`{
	admin {{ADMIN}}
	zidane {
		upstream ev %[2]s
		signin {
			issuer %[1]s
		}
	}
}

%[1]s {
	zidane_mcp {
		broker ev
		resource %[1]s/mcp
		%[3]s
	}
}

%[4]s {
	zidane_mcp {
		aggregate ev
		prefix conditional
		resource %[4]s/mcp
		%[3]s
	}
}
`, base, upstream, rule, aggregated))
	alice := createToken(t, c, "alice", "--scope", "upstream:ev", "--scope", "mcp", "--owner", "alice")
	bob := newFormBrowser(t, base)
	if resp, body := bob.post(signinidp.LinkPath, url.Values{"secret": {signInLink(t, c, "bob", "approve")}}); resp.StatusCode != http.StatusOK {
		t.Fatalf("bob's sign-in: %d %s", resp.StatusCode, body)
	}
	bob.hc.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	for route, site := range map[string]string{"broker": base, "aggregate": aggregated} {
		t.Run(route, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			cs, err := mcp.NewClient(&mcp.Implementation{Name: "e2e-url", Version: "1"}, &mcp.ClientOptions{
				Capabilities: &mcp.ClientCapabilities{Elicitation: &mcp.ElicitationCapabilities{URL: &mcp.URLElicitationCapabilities{}}},
			}).Connect(ctx, &mcp.StreamableClientTransport{Endpoint: site + "/mcp", HTTPClient: bearerClient(alice, nil), MaxRetries: -1},
				&mcp.ClientSessionOptions{ProtocolVersion: legacyVersion})
			if err != nil {
				t.Fatalf("connect: %v", err)
			}
			defer cs.Close()
			email := route + "-url-ops@example.com"
			args := map[string]any{"name": "production", "email": email}
			res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "json_schema_2020_12_tool", Arguments: args})
			var rpcErr *jsonrpc.Error
			if !errors.As(err, &rpcErr) || rpcErr.Code != mcp.CodeURLElicitationRequired {
				t.Fatalf("the held call of a client with URL elicitation: %s, want -32042", outcome(res, err))
			}
			var data struct {
				Elicitations []mcp.ElicitParams `json:"elicitations"`
			}
			if err := json.Unmarshal(rpcErr.Data, &data); err != nil || len(data.Elicitations) != 1 {
				t.Fatalf("the error's data: %v %s", err, rpcErr.Data)
			}
			el := data.Elicitations[0]
			id := approvalID.FindString(el.ElicitationID)
			if el.Mode != "url" || id == "" || el.URL != base+"/zidane/approvals/"+id || !strings.Contains(el.Message, "production needs a second person") {
				t.Fatalf("the elicitation: %+v", el)
			}

			// The person opens the page; bob, who may approve, approves there.
			if resp, body := newFormBrowser(t, base).get(el.URL); resp.StatusCode != http.StatusOK || !strings.Contains(body, "production needs a second person") {
				t.Fatalf("the page: %d %s", resp.StatusCode, body)
			}
			_, body := bob.get(el.URL)
			m := approvalFormToken.FindStringSubmatch(body)
			if m == nil {
				t.Fatalf("no buttons for bob: %s", body)
			}
			if resp, body := bob.post("/zidane/approvals/"+id, url.Values{"decision": {"approve"}, "token": {html.UnescapeString(m[1])}}); resp.StatusCode != http.StatusSeeOther {
				t.Fatalf("bob's approval: %d %s", resp.StatusCode, body)
			}
			res, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: "json_schema_2020_12_tool", Arguments: args})
			if err != nil || res.IsError || !strings.Contains(outcome(res, err), email) {
				t.Fatalf("the approved call: %s", outcome(res, err))
			}

			plain, err := plainPeer(t, site+"/mcp", bearerClient(alice, nil), legacyVersion)
			if err != nil {
				t.Fatalf("connect without URL elicitation: %v", err)
			}
			res, err = callRouteTool(plain.cs, "json_schema_2020_12_tool", map[string]any{"name": "production", "email": "plain-" + email})
			text := outcome(res, err)
			other := approvalID.FindString(text)
			if err != nil || !res.IsError || other == "" || !strings.Contains(text, base+"/zidane/approvals/"+other) {
				t.Fatalf("a client without URL elicitation: %s, want the page's address in the tool error", text)
			}
		})
	}
}

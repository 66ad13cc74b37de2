package e2e

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"
)

var approvalID = regexp.MustCompile(`apv_[A-Za-z0-9_-]{22}`)

// TestApprovalOnGuard drives go-sdk clients at both protocol versions
// through the guard route in front of a real MCP server, with an approve
// rule over an argument: the held call is answered with a tool error
// naming its approval, which the operator lists and approves through
// the CLI; the same call then runs once, with the approved arguments; a
// changed argument, another principal's same call and a replay are each
// held on an approval of their own (they do not run); a denied approval
// is a refusal that says so; every answer is audited.
func TestApprovalOnGuard(t *testing.T) {
	upstream := startStatelessEverythingServer(t)
	port := freePort(t)
	c := startCaddy(t, fmt.Sprintf(`{
	admin %s
}

http://127.0.0.1:%d {
	zidane_mcp {
		guard
		resource http://127.0.0.1:%d/mcp
		policy {
			approve "tool.name == 'json_schema_2020_12_tool' && args.name == 'production'" "production needs a second person"
		}
	}
	reverse_proxy %s
}
`, AdminPlaceholder, port, port, strings.TrimSuffix(strings.TrimPrefix(upstream, "http://"), "/mcp")))
	alice := createToken(t, c, "alice", "--scope", "mcp", "--owner", "alice")
	mallory := createToken(t, c, "mallory", "--scope", "mcp", "--owner", "mallory")
	endpoint := fmt.Sprintf("http://127.0.0.1:%d/mcp", port)

	pending := func() map[string]map[string]any {
		out, errOut, err := c.Run(t, "zidane", "approvals", "list", "--json")
		if err != nil {
			t.Fatalf("approvals list: %v %s", err, errOut)
		}
		var list []map[string]any
		if err := json.Unmarshal([]byte(out), &list); err != nil {
			t.Fatalf("approvals list --json: %v\n%s", err, out)
		}
		byID := map[string]map[string]any{}
		for _, a := range list {
			byID[a["id"].(string)] = a
		}
		return byID
	}
	for _, version := range []string{modernVersion, legacyVersion} {
		t.Run(version, func(t *testing.T) {
			p, err := plainPeer(t, endpoint, bearerClient(alice, nil), version)
			if err != nil {
				t.Fatalf("connect: %v", err)
			}
			m, err := plainPeer(t, endpoint, bearerClient(mallory, nil), version)
			if err != nil {
				t.Fatalf("connect mallory: %v", err)
			}
			email := "ops-" + version + "@example.com"
			prod := map[string]any{"name": "production", "email": email}
			held := func(who *peer, args map[string]any) string {
				t.Helper()
				res, err := callRouteTool(who.cs, "json_schema_2020_12_tool", args)
				text := outcome(res, err)
				if err != nil || !res.IsError || !strings.Contains(text, "production needs a second person") || !strings.Contains(text, "awaits") {
					t.Fatalf("a held call: %s", text)
				}
				id := approvalID.FindString(text)
				if id == "" {
					t.Fatalf("the held call names no approval: %s", text)
				}
				return id
			}

			id := held(p, prod)
			a, ok := pending()[id]
			if !ok || a["tool"] != "json_schema_2020_12_tool" || !strings.Contains(fmt.Sprint(a["arguments"]), "production") || a["owner"] != "alice" {
				t.Fatalf("the operator's list: %v", pending())
			}
			if again := held(p, prod); again != id {
				t.Fatalf("the same call again, before an answer: %s, want %s", again, id)
			}
			other := held(m, prod)
			changed := held(p, map[string]any{"name": "production", "email": "evil-" + email})
			if other == id || changed == id {
				t.Fatalf("another principal's call (%s) or a changed argument (%s) found alice's approval %s", other, changed, id)
			}

			from := c.LogSize()
			if out, errOut, err := c.Run(t, "zidane", "approvals", "approve", id); err != nil || !strings.Contains(out, "approved") {
				t.Fatalf("approve: %v %s %s", err, out, errOut)
			}
			c.WaitForLogFrom(t, from, `"event":"approval_approved"`, 10*time.Second)
			if _, errOut, err := c.Run(t, "zidane", "approvals", "approve", id); err == nil || !strings.Contains(errOut, "answered already") {
				t.Fatalf("a second answer: %v %s", err, errOut)
			}

			// Mallory's call and the changed one are still held.
			if again := held(m, prod); again != other {
				t.Fatalf("mallory after alice's approval: %s", again)
			}
			res, err := callRouteTool(p.cs, "json_schema_2020_12_tool", prod)
			if err != nil || res.IsError || !strings.Contains(outcome(res, err), email) || strings.Contains(outcome(res, err), "evil-") {
				t.Fatalf("the approved call: %s", outcome(res, err))
			}
			if replay := held(p, prod); replay == id {
				t.Fatalf("the approved call made again ran on the used approval %s", id)
			}

			// A denied approval is a refusal that says so.
			if out, errOut, err := c.Run(t, "zidane", "approvals", "deny", changed); err != nil || !strings.Contains(out, "denied") {
				t.Fatalf("deny: %v %s %s", err, out, errOut)
			}
			res, err = callRouteTool(p.cs, "json_schema_2020_12_tool", map[string]any{"name": "production", "email": "evil-" + email})
			if text := outcome(res, err); err != nil || !res.IsError || !strings.Contains(text, "denied") || !strings.Contains(text, changed) {
				t.Fatalf("the denied call: %s", text)
			}
		})
	}
	// The admin listing holds the held calls' arguments (mallory's call
	// is still held): like the routes that change state, it is refused
	// without the admin key, since any process on the host, an agent
	// included, reaches the admin API's loopback port.
	for _, key := range []string{"", "wrong"} {
		req, _ := http.NewRequest(http.MethodGet, c.AdminURL("/zidane/approvals"), nil)
		if key != "" {
			req.Header.Set("Authorization", "Zidane-Admin-Key "+key)
		}
		resp, err := shortClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden || !strings.Contains(string(b), "admin key") || strings.Contains(string(b), "production") {
			t.Errorf("GET /zidane/approvals with key %q: %d %s, want 403 naming the admin key", key, resp.StatusCode, b)
		}
	}
	for _, l := range auditLines(c) {
		if l["event"] == "approval_approved" && l["by"] == "(operator)" && l["caller"] == "alice" {
			return
		}
	}
	t.Fatal("no audit line of the operator's approval of alice's call")
}

// TestApprovalThroughInteractions: an approver with the approve scope
// sees a held call in the sessions endpoint's interactions pending and
// approves it with answer; the caller's same call then runs once. The
// caller (even holding the approve scope) neither sees nor answers their
// own call; a principal without the scope sees none and is refused.
func TestApprovalThroughInteractions(t *testing.T) {
	upstream := startStatelessEverythingServer(t)
	guard, sess := freePort(t), freePort(t)
	c := startCaddy(t, fmt.Sprintf(`{
	admin %s
}

http://127.0.0.1:%d {
	zidane_mcp {
		guard
		resource http://127.0.0.1:%d/mcp
		policy {
			approve "tool.name == 'json_schema_2020_12_tool' && args.name == 'production'" "production needs a second person"
		}
	}
	reverse_proxy %s
}

http://127.0.0.1:%d {
	zidane_mcp {
		sessions
		resource http://127.0.0.1:%d/mcp
	}
}
`, AdminPlaceholder, guard, guard, strings.TrimSuffix(strings.TrimPrefix(upstream, "http://"), "/mcp"), sess, sess))
	site := fmt.Sprintf("http://127.0.0.1:%d/mcp", guard)
	alice := createToken(t, c, "alice", "--scope", "mcp", "--scope", "chat", "--scope", "approve", "--owner", "alice")
	bob := createToken(t, c, "bob", "--scope", "chat", "--scope", fmt.Sprintf("approve:127.0.0.1:%d", guard), "--owner", "bob")
	carol := createToken(t, c, "carol", "--scope", "chat", "--owner", "carol")
	sessions := fmt.Sprintf("http://127.0.0.1:%d/mcp", sess)

	for _, version := range []string{modernVersion, legacyVersion} {
		t.Run(version, func(t *testing.T) {
			p, err := plainPeer(t, site, bearerClient(alice, nil), version)
			if err != nil {
				t.Fatalf("connect: %v", err)
			}
			peerOf := func(tok string) *peer {
				q, err := plainPeer(t, sessions, bearerClient(tok, nil), version)
				if err != nil {
					t.Fatalf("connect to the sessions endpoint: %v", err)
				}
				return q
			}
			a, b, k := peerOf(alice), peerOf(bob), peerOf(carol)
			args := map[string]any{"name": "production", "email": "ops-" + version + "@example.com"}
			res, err := callRouteTool(p.cs, "json_schema_2020_12_tool", args)
			id := approvalID.FindString(outcome(res, err))
			if id == "" {
				t.Fatalf("the held call: %s", outcome(res, err))
			}
			pending := func(q *peer) string {
				res, err := callRouteTool(q.cs, "interactions", map[string]any{"verb": "pending"})
				if err != nil || res.IsError {
					t.Fatalf("pending: %s", outcome(res, err))
				}
				return outcome(res, err)
			}
			if got := pending(b); !strings.Contains(got, id) || !strings.Contains(got, "production") {
				t.Fatalf("bob's pending does not show the held call %s: %s", id, got)
			}
			if got := pending(a); strings.Contains(got, id) {
				t.Fatalf("alice sees her own held call as hers to answer: %s", got)
			}
			if got := pending(k); strings.Contains(got, id) {
				t.Fatalf("carol, without the approve scope, sees the held call: %s", got)
			}
			answer := func(q *peer) string {
				res, err := callRouteTool(q.cs, "interactions", map[string]any{"verb": "answer", "requestId": id, "decision": "allow"})
				return outcome(res, err)
			}
			if got := answer(a); !strings.Contains(got, "own call") {
				t.Fatalf("alice approving her own call: %s", got)
			}
			if got := answer(k); !strings.Contains(got, "approve scope") {
				t.Fatalf("carol approving: %s", got)
			}
			from := c.LogSize()
			if got := answer(b); !strings.Contains(got, "Approved "+id) {
				t.Fatalf("bob approving: %s", got)
			}
			c.WaitForLogFrom(t, from, `"by":"bob"`, 10*time.Second)
			if got := answer(b); !strings.Contains(got, "first") {
				t.Fatalf("a second answer: %s", got)
			}
			res, err = callRouteTool(p.cs, "json_schema_2020_12_tool", args)
			if err != nil || res.IsError || !strings.Contains(outcome(res, err), "ops-"+version) {
				t.Fatalf("the approved call: %s", outcome(res, err))
			}
			res, err = callRouteTool(p.cs, "json_schema_2020_12_tool", args)
			if replay := approvalID.FindString(outcome(res, err)); replay == "" || replay == id {
				t.Fatalf("the replay: %s", outcome(res, err))
			}
		})
	}
}

// TestApprovalAcrossReplicas: two replicas on one NATS storage serving the
// same site: a call held on A is listed and approved through B's CLI;
// the same call then made on both at once runs on exactly one of them,
// and the other is held anew.
func TestApprovalAcrossReplicas(t *testing.T) {
	a, b, urlA, urlB := guardReplicas(t, startStatelessEverythingServer(t), `policy {
			approve "tool.name == 'json_schema_2020_12_tool' && args.name == 'production'" "production needs a second person"
		}`)
	stdout, stderr, err := a.Run(t, "zidane", "token", "create", "--name", "alice", "--scope", "mcp", "--owner", "alice")
	if err != nil {
		t.Fatalf("token create on A: %v %s", err, stderr)
	}
	token := strings.TrimSpace(stdout)
	waitStatus(t, urlB, token, http.StatusOK, 20*time.Second)

	for _, version := range []string{modernVersion, legacyVersion} {
		t.Run(version, func(t *testing.T) {
			pa, err := plainPeer(t, urlA, bearerClient(token, nil), version)
			if err != nil {
				t.Fatalf("connect A: %v", err)
			}
			pb, err := plainPeer(t, urlB, bearerClient(token, nil), version)
			if err != nil {
				t.Fatalf("connect B: %v", err)
			}
			args := map[string]any{"name": "production", "email": "ops-" + version + "@example.com"}
			res, err := callRouteTool(pa.cs, "json_schema_2020_12_tool", args)
			id := approvalID.FindString(outcome(res, err))
			if id == "" {
				t.Fatalf("the held call on A: %s", outcome(res, err))
			}
			if out, _, err := b.Run(t, "zidane", "approvals", "list"); err != nil || !strings.Contains(out, id) {
				t.Fatalf("B's list: %v %s", err, out)
			}
			if out, errOut, err := b.Run(t, "zidane", "approvals", "approve", id); err != nil {
				t.Fatalf("approve through B: %v %s %s", err, out, errOut)
			}
			type result struct {
				ran  bool
				text string
			}
			results := make(chan result, 2)
			for _, p := range []*peer{pa, pb} {
				go func() {
					res, err := callRouteTool(p.cs, "json_schema_2020_12_tool", args)
					results <- result{err == nil && !res.IsError, outcome(res, err)}
				}()
			}
			ran := 0
			for range 2 {
				r := <-results
				switch {
				case r.ran:
					ran++
				case approvalID.FindString(r.text) == "" || strings.Contains(r.text, id):
					t.Fatalf("the call that did not run: %s, want it held anew", r.text)
				}
			}
			if ran != 1 {
				t.Fatalf("the approved call ran %d times across two replicas", ran)
			}
		})
	}
}

// TestApprovalExpires: a held call no one answers within approval_pending
// leaves the list, cannot be approved any more (409, expired), and the
// same call made again is held on a new approval.
func TestApprovalExpires(t *testing.T) {
	upstream := startStatelessEverythingServer(t)
	port := freePort(t)
	c := startCaddy(t, fmt.Sprintf(`{
	admin %s
	zidane {
		approval_pending 2s
	}
}

http://127.0.0.1:%d {
	zidane_mcp {
		guard
		resource http://127.0.0.1:%d/mcp
		policy {
			approve "tool.name == 'json_schema_2020_12_tool' && args.name == 'production'" "production needs a second person"
		}
	}
	reverse_proxy %s
}
`, AdminPlaceholder, port, port, strings.TrimSuffix(strings.TrimPrefix(upstream, "http://"), "/mcp")))
	alice := createToken(t, c, "alice", "--scope", "mcp", "--owner", "alice")
	p, err := plainPeer(t, fmt.Sprintf("http://127.0.0.1:%d/mcp", port), bearerClient(alice, nil), modernVersion)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	args := map[string]any{"name": "production", "email": "ops@example.com"}
	res, err := callRouteTool(p.cs, "json_schema_2020_12_tool", args)
	id := approvalID.FindString(outcome(res, err))
	if id == "" {
		t.Fatalf("the held call: %s", outcome(res, err))
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		out, errOut, err := c.Run(t, "zidane", "approvals", "list")
		if err != nil {
			t.Fatalf("approvals list: %v %s", err, errOut)
		}
		if !strings.Contains(out, id) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s is still listed 30s after it was held with approval_pending 2s", id)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if _, errOut, err := c.Run(t, "zidane", "approvals", "approve", id); err == nil || !strings.Contains(errOut, "expired") {
		t.Fatalf("approving an expired approval: %v %s", err, errOut)
	}
	res, err = callRouteTool(p.cs, "json_schema_2020_12_tool", args)
	if again := approvalID.FindString(outcome(res, err)); again == "" || again == id || !res.IsError {
		t.Fatalf("the call after its approval expired: %s", outcome(res, err))
	}
}

// TestApprovalOnBrokerAndAggregate: the same flow on the broker's
// pass-through and aggregated routes, at both versions: held, approved
// through the CLI, run once with the approved arguments, the replay held
// anew.
func TestApprovalOnBrokerAndAggregate(t *testing.T) {
	upstream := startStatelessEverythingServer(t)
	ports := map[string]int{"broker": freePort(t), "aggregate": freePort(t)}
	rule := `policy {
			approve "tool.name.endsWith('json_schema_2020_12_tool') && args.name == 'production'" "production needs a second person"
		}`
	c := startCaddy(t, fmt.Sprintf(`{
	admin %s
	zidane {
		upstream ev %s
	}
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
`, AdminPlaceholder, upstream, ports["broker"], rule, ports["aggregate"], rule))
	alice := createToken(t, c, "alice", "--scope", "mcp", "--owner", "alice")
	for _, route := range []string{"broker", "aggregate"} {
		for _, version := range []string{modernVersion, legacyVersion} {
			t.Run(route+"/"+version, func(t *testing.T) {
				p, err := plainPeer(t, fmt.Sprintf("http://127.0.0.1:%d/mcp", ports[route]), bearerClient(alice, nil), version)
				if err != nil {
					t.Fatalf("connect: %v", err)
				}
				email := route + "-" + version + "@example.com"
				args := map[string]any{"name": "production", "email": email}
				res, err := callRouteTool(p.cs, "json_schema_2020_12_tool", args)
				id := approvalID.FindString(outcome(res, err))
				if id == "" || !strings.Contains(outcome(res, err), "production needs a second person") {
					t.Fatalf("the held call: %s", outcome(res, err))
				}
				if out, errOut, err := c.Run(t, "zidane", "approvals", "approve", id); err != nil {
					t.Fatalf("approve: %v %s %s", err, out, errOut)
				}
				res, err = callRouteTool(p.cs, "json_schema_2020_12_tool", map[string]any{"name": "production", "email": "evil-" + email})
				if held := approvalID.FindString(outcome(res, err)); held == "" || held == id {
					t.Fatalf("a changed argument after the approval: %s", outcome(res, err))
				}
				res, err = callRouteTool(p.cs, "json_schema_2020_12_tool", args)
				if err != nil || res.IsError || !strings.Contains(outcome(res, err), email) {
					t.Fatalf("the approved call: %s", outcome(res, err))
				}
				res, err = callRouteTool(p.cs, "json_schema_2020_12_tool", args)
				if replay := approvalID.FindString(outcome(res, err)); replay == "" || replay == id {
					t.Fatalf("the replay: %s", outcome(res, err))
				}
			})
		}
	}
}

// guardReplicas runs two replicas on one NATS storage, each with a guard
// site in front of the MCP server at upstream serving one resource, with
// the zidane_mcp option rule; it returns them and their MCP endpoints.
func guardReplicas(t *testing.T, upstream, rule string) (a, b *Caddy, urlA, urlB string) {
	t.Helper()
	natsURL := startNATSServer(t)
	clusterKey := "ZIDANE_CLUSTER_KEY=" + base64.StdEncoding.EncodeToString([]byte(randomHex(16)))
	site := fmt.Sprintf("http://127.0.0.1:%d/mcp", freePort(t)) // the resource both replicas serve
	replica := func() (*Caddy, string) {
		port := freePort(t)
		c := startCaddy(t, fmt.Sprintf(`{
	admin %s
	storage zidane_nats
	zidane {
		cluster {
			url %s
			lock_ttl 5s
		}
	}
}

http://127.0.0.1:%d {
	zidane_mcp {
		guard
		resource %s
		%s
	}
	reverse_proxy %s
}
`, AdminPlaceholder, natsURL, port, site, rule, strings.TrimSuffix(strings.TrimPrefix(upstream, "http://"), "/mcp")), clusterKey)
		return c, fmt.Sprintf("http://127.0.0.1:%d/mcp", port)
	}
	a, urlA = replica()
	b, urlB = replica()
	return a, b, urlA, urlB
}

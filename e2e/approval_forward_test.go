package e2e

import (
	"encoding/base64"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// switchHost sends every request to the host it holds now: one client
// session whose requests reach whichever replica the test chooses.
type switchHost struct{ host atomic.Value }

func (s *switchHost) RoundTrip(r *http.Request) (*http.Response, error) {
	h := s.host.Load().(string)
	r = r.Clone(r.Context())
	r.URL.Host, r.Host = h, h
	return http.DefaultTransport.RoundTrip(r)
}

// approvalAggregateReplicas starts a NATS server and a stateless
// upstream, and returns how to start a replica of an aggregated route over
// it, in cluster mode, as node, with an approve rule on production calls
// of json_schema_2020_12_tool.
func approvalAggregateReplicas(t *testing.T) func(node string) (*Caddy, string) {
	t.Helper()
	natsURL := startNATSServer(t)
	upstream := startStatelessEverythingServer(t)
	clusterKey := "ZIDANE_CLUSTER_KEY=" + base64.StdEncoding.EncodeToString([]byte(randomHex(16)))
	return func(node string) (*Caddy, string) {
		host := fmt.Sprintf("127.0.0.1:%d", freePort(t))
		c := startCaddy(t, fmt.Sprintf(`{
	admin %s
	storage zidane_nats
	zidane {
		cluster {
			url %s
			node %s
			advertise http://%s
		}
		upstream ev %s
	}
}

http://%s {
	zidane_mcp {
		aggregate ev
		prefix conditional
		policy {
			approve "tool.name.endsWith('json_schema_2020_12_tool') && args.name == 'production'" "production needs a second person"
		}
	}
}
`, AdminPlaceholder, natsURL, node, host, upstream, host), clusterKey)
		return c, host
	}
}

// TestApprovalOnAForwardedSession: on the aggregated route in cluster
// mode, a 2025-11-25 session lives on the replica that opened it (A), and
// a request for it that reaches B is forwarded to A. A call an approve
// rule holds, sent through B, is held; once approved it runs exactly once,
// through B (A, which runs it, settles the approval), with the approved
// arguments; a changed argument and the replay are held anew, through
// either replica. Before the owner settled held calls, the approved call
// was consumed by B and refused by A: it never ran.
func TestApprovalOnAForwardedSession(t *testing.T) {
	replica := approvalAggregateReplicas(t)
	a, hostA := replica("gw-a")
	b, hostB := replica("gw-b")
	alice := createToken(t, a, "alice", "--scope", "mcp", "--owner", "alice")
	for _, h := range []string{hostA, hostB} {
		waitStatus(t, "http://"+h+"/mcp", alice, http.StatusOK, 20*time.Second)
	}
	sw := &switchHost{}
	sw.host.Store(hostA)
	p, err := plainPeer(t, "http://"+hostA+"/mcp", bearerClient(alice, sw), legacyVersion)
	if err != nil {
		t.Fatalf("initialize on A: %v", err)
	}
	sw.host.Store(hostB) // from here on, every request of the session reaches B, which forwards it to A

	args := map[string]any{"name": "production", "email": "forwarded@example.com"}
	res, err := callRouteTool(p.cs, "json_schema_2020_12_tool", args)
	id := approvalID.FindString(outcome(res, err))
	if id == "" || !strings.Contains(outcome(res, err), "production needs a second person") {
		t.Fatalf("the held call through B: %s", outcome(res, err))
	}
	if out, errOut, err := b.Run(t, "zidane", "approvals", "approve", id); err != nil {
		t.Fatalf("approve through B: %v %s %s", err, out, errOut)
	}
	res, err = callRouteTool(p.cs, "json_schema_2020_12_tool", map[string]any{"name": "production", "email": "evil@example.com"})
	if held := approvalID.FindString(outcome(res, err)); held == "" || held == id {
		t.Fatalf("a changed argument after the approval, through B: %s", outcome(res, err))
	}
	res, err = callRouteTool(p.cs, "json_schema_2020_12_tool", args)
	if err != nil || res.IsError || !strings.Contains(outcome(res, err), "forwarded@example.com") {
		t.Fatalf("the approved call through B: %s", outcome(res, err))
	}
	for _, h := range []string{hostB, hostA} {
		sw.host.Store(h)
		res, err = callRouteTool(p.cs, "json_schema_2020_12_tool", args)
		if replay := approvalID.FindString(outcome(res, err)); replay == "" || replay == id {
			t.Fatalf("the replay through %s: %s", h, outcome(res, err))
		}
	}
	// A neighbour no rule holds runs through B as it did.
	sw.host.Store(hostB)
	res, err = callRouteTool(p.cs, "json_schema_2020_12_tool", map[string]any{"name": "staging", "email": "s@example.com"})
	if err != nil || res.IsError {
		t.Fatalf("the staging call through B: %s", outcome(res, err))
	}
	// The audit: A, which settled and ran the approved call, has its
	// approved-rule line and its tool-call line; B, which forwarded it
	// unsettled, wrote neither (its one tool-call line is the staging
	// call's, which it decided and forwarded).
	approved := func(c *Caddy) (n int) {
		for _, l := range logLines(c, "call allowed by a rule") {
			if l["effect"] == "approved" {
				n++
			}
		}
		return n
	}
	if na, nb := approved(a), approved(b); na != 1 || nb != 0 {
		t.Errorf("approved rule lines: %d on A, %d on B; want 1 on A, which ran the call", na, nb)
	}
	if na, nb := len(logLines(a, "tool call")), len(logLines(b, "tool call")); na != 1 || nb != 1 {
		t.Errorf("tool call lines: %d on A, %d on B; want 1 each (the approved call on A, the staging call on B)", na, nb)
	}
}

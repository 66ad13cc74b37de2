package e2e

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestApprovalForwardAttacks: a client of the aggregated route in cluster
// mode chooses which replica each request reaches and what it carries.
// Whatever it chooses, a call an approve rule holds runs only once a
// person approved it, once, with the approved arguments: sent through the
// replica that does not hold its 2025-11-25 session, in a batch, with a
// 2026-07-28 header on the 2025-11-25 session, with hop headers of its
// own, with the session id of a replica that is gone or of none, or sent
// to both replicas at once. Each refusal says why, and the replica that
// refuses it writes its audit line.
func TestApprovalForwardAttacks(t *testing.T) {
	replica := approvalAggregateReplicas(t)
	a, hostA := replica("gw-a")
	b, hostB := replica("gw-b")
	c, hostC := replica("gw-c")
	alice := createToken(t, a, "alice", "--scope", "mcp", "--owner", "alice")
	for _, h := range []string{hostA, hostB, hostC} {
		waitStatus(t, "http://"+h+"/mcp", alice, http.StatusOK, 20*time.Second)
	}
	open := func(host string) string {
		t.Helper()
		ans := post(t, "http://"+host+"/mcp", alice, initializeBody)
		sid := ans.header.Get("Mcp-Session-Id")
		if ans.status != http.StatusOK || sid == "" {
			t.Fatalf("initialize on %s: %d %s", host, ans.status, ans.body)
		}
		if ans := post(t, "http://"+host+"/mcp", alice, `{"jsonrpc":"2.0","method":"notifications/initialized"}`,
			"Mcp-Session-Id", sid, "Mcp-Protocol-Version", legacyVersion); ans.status != http.StatusAccepted {
			t.Fatalf("initialized on %s: %d %s", host, ans.status, ans.body)
		}
		return sid
	}
	sidA, sidC := open(hostA), open(hostC)
	// A session id that opens with no key of the cluster's: one
	// character of A's changed.
	mid := len(sidA) / 2
	forged := sidA[:mid] + map[bool]string{true: "A", false: "B"}[sidA[mid] != 'A'] + sidA[mid+1:]
	c.Stop(t) // sidC is now the session of a replica that is gone

	// The call, byte for byte the same each time: an approval is of these
	// bytes of arguments. Its output echoes the e-mail address: the call ran.
	const ran = "attack-forward@example.com"
	held := `{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"json_schema_2020_12_tool","arguments":{"email":"` + ran + `","name":"production"}}}`
	n := 10
	call := func(host, sid string, headers ...string) rawAnswer {
		t.Helper()
		n++
		return post(t, "http://"+host+"/mcp", alice, fmt.Sprintf(held, n),
			append([]string{"Mcp-Session-Id", sid, "Mcp-Protocol-Version", legacyVersion}, headers...)...)
	}
	first := call(hostB, sidA)
	id := approvalID.FindString(first.body)
	if id == "" || strings.Contains(first.body, ran) || !strings.Contains(first.body, "production needs a second person") {
		t.Fatalf("the held call through B: %d %s", first.status, first.body)
	}
	refusedOnB := len(logLines(b, "request refused"))

	// Before anyone approves it: no way through.
	for _, at := range []struct {
		name string
		send func() rawAnswer
		// want is a word of the refusal.
		want string
	}{
		{"again through B", func() rawAnswer { return call(hostB, sidA) }, id},
		{"straight to A, which holds the session", func() rawAnswer { return call(hostA, sidA) }, id},
		{"in a batch through B", func() rawAnswer {
			n++
			return post(t, "http://"+hostB+"/mcp", alice, "["+fmt.Sprintf(held, n)+`,{"jsonrpc":"2.0","id":99,"method":"ping"}]`,
				"Mcp-Session-Id", sidA, "Mcp-Protocol-Version", legacyVersion)
		}, "batch"},
		{"a 2026-07-28 header on the 2025-11-25 session, through B", func() rawAnswer {
			n++
			return post(t, "http://"+hostB+"/mcp", alice, fmt.Sprintf(held, n), "Mcp-Session-Id", sidA,
				"Mcp-Protocol-Version", "2026-07-28", "Mcp-Method", "tools/call", "Mcp-Name", "json_schema_2020_12_tool")
		}, "approval"},
		{"hop headers of the client's own, through B", func() rawAnswer {
			return call(hostB, sidA, "Zidane-Hop", "v3 gw-a gw-b 1 x", "Zidane-Hop-Principal", "alice")
		}, "hop"},
		{"hop headers of the client's own, to A", func() rawAnswer {
			return call(hostA, sidA, "Zidane-Hop", "v3 gw-b gw-a 1 x", "Zidane-Hop-Principal", "alice")
		}, "hop"},
	} {
		ans := at.send()
		if strings.Contains(ans.body, ran) {
			t.Errorf("%s: the held call ran before anyone approved it: %d %s", at.name, ans.status, ans.body)
			continue
		}
		if !strings.Contains(strings.ToLower(ans.body), strings.ToLower(at.want)) {
			t.Errorf("%s: want a refusal that says %q: %d %s", at.name, at.want, ans.status, ans.body)
		}
	}

	if out, errOut, err := b.Run(t, "zidane", "approvals", "approve", id); err != nil {
		t.Fatalf("approve through B: %v %s %s", err, out, errOut)
	}

	// Approved: a request that cannot run it neither runs it nor uses
	// the approval up.
	for _, at := range []struct {
		name, sid string
		status    int
		reason    string
	}{
		{"the session of a replica that is gone, through B", sidC, http.StatusNotFound, "session_node"},
		{"a session id no replica gave out, through B", forged, http.StatusNotFound, "session_unknown"},
	} {
		from, calls := len(logLines(b, "request refused")), len(logLines(b, "tool call"))
		ans := call(hostB, at.sid)
		if strings.Contains(ans.body, ran) || ans.status != at.status || !strings.Contains(ans.body, at.reason) {
			t.Errorf("%s: %d %s; want %d %s, not run", at.name, ans.status, ans.body, at.status, at.reason)
		}
		// Nothing ran, so nothing used the approval: B audits no tool
		// call and no approved rule.
		if n := len(logLines(b, "tool call")); n != calls {
			t.Errorf("%s: B audited a tool call it never ran", at.name)
		}
		for _, l := range logLines(b, "call allowed by a rule") {
			if l["effect"] == "approved" {
				t.Errorf("%s: B used the approval up on a call it refused: %v", at.name, l)
			}
		}
		if lines := logLines(b, "request refused"); len(lines) <= from || !strings.Contains(fmt.Sprint(lines[len(lines)-1]["reason"]), at.reason) {
			t.Errorf("%s: B wrote no audit line of its refusal %s", at.name, at.reason)
		}
	}
	if len(logLines(b, "request refused")) <= refusedOnB {
		t.Errorf("B audited none of the refusals it answered")
	}

	// Sent to both replicas at once: it runs once.
	var wg sync.WaitGroup
	answers := make([]rawAnswer, 2)
	for i, h := range []string{hostA, hostB} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			answers[i] = post(t, "http://"+h+"/mcp", alice, fmt.Sprintf(held, 100+i),
				"Mcp-Session-Id", sidA, "Mcp-Protocol-Version", legacyVersion)
		}()
	}
	wg.Wait()
	runs := 0
	for i, ans := range answers {
		switch {
		case strings.Contains(ans.body, ran):
			runs++
		case approvalID.FindString(ans.body) == "" || approvalID.FindString(ans.body) == id:
			t.Errorf("the approved call sent to both replicas, the one through %d that did not run: %d %s; want it held anew", i, ans.status, ans.body)
		}
	}
	if runs != 1 {
		t.Fatalf("the approved call sent to A and B at once ran %d times, want once: %+v", runs, answers)
	}
	var again string
	for _, h := range []string{hostB, hostA} {
		ans := call(h, sidA)
		if strings.Contains(ans.body, ran) {
			t.Errorf("the replay through %s ran: %s", h, ans.body)
		}
		again = approvalID.FindString(ans.body)
	}

	// A 2026-07-28 request naming the 2025-11-25 session has no session
	// to be forwarded to: the replica it reaches settles it and runs it,
	// once. Approved anew, it runs through B; its replay through A does not.
	if again == "" || again == id {
		t.Fatalf("the replay was not held anew")
	}
	if out, errOut, err := a.Run(t, "zidane", "approvals", "approve", again); err != nil {
		t.Fatalf("approve through A: %v %s %s", err, out, errOut)
	}
	modern := func(host string) rawAnswer {
		t.Helper()
		n++
		body := strings.Replace(fmt.Sprintf(held, n), `"name":"production"}}`,
			`"name":"production"},"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}`, 1)
		return post(t, "http://"+host+"/mcp", alice, body, "Mcp-Session-Id", sidA,
			"Mcp-Protocol-Version", "2026-07-28", "Mcp-Method", "tools/call", "Mcp-Name", "json_schema_2020_12_tool")
	}
	if ans := modern(hostB); !strings.Contains(ans.body, ran) {
		t.Errorf("the approved call at 2026-07-28 naming the 2025-11-25 session, through B: %d %s; want it run", ans.status, ans.body)
	}
	if ans := modern(hostA); strings.Contains(ans.body, ran) || approvalID.FindString(ans.body) == "" {
		t.Errorf("its replay through A: %d %s; want it held anew", ans.status, ans.body)
	}
}

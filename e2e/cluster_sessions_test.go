//lint:file-ignore SA1019 session events travel as notifications/message (mcpendpoint/doc.go), so the client reads them with LoggingMessageHandler, deprecated only from protocol 2026-07-28.

package e2e

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// The sessions endpoint on shared NATS storage: three replicas, each
// running the agents of the sessions created through it, each serving
// every verb on every session (forwarded to the node that runs it over
// NATS), with one event sequence for the cluster. The demo agent
// (`caddy zidane demo-agent`) plays the agents.

// sessionsReplicaCaddyfile serves the sessions endpoint on http://host on
// NATS storage; identity is the storage block's node and advertise lines.
func sessionsReplicaCaddyfile(natsURLs []string, identity, host string) string {
	return fmt.Sprintf(`{
	admin %s
	grace_period 3s
	storage zidane_nats
	zidane {
		cluster {
			url %s
			replicas %d
			%s
		}
		default_agent demo
	}
}

http://%s {
	zidane_mcp {
		sessions
		rate_limit {
			per_token 500/s 1000
			per_ip 100/s 200
		}
	}
}
`, AdminPlaceholder, strings.Join(natsURLs, " "), len(natsURLs), identity, host)
}

// replicaIdentity is the node and advertise lines of replica node at host.
func replicaIdentity(node, host string) string {
	return fmt.Sprintf("node %s\n\t\tadvertise http://%s", node, host)
}

// sessionIDOn and requestIDOn match the ids of a session run by node, and
// of one of its interactions.
func sessionIDOn(node string) *regexp.Regexp {
	return regexp.MustCompile(`^ses_[a-z0-9]{16}\.` + regexp.QuoteMeta(node) + `$`)
}

func requestIDOn(node string) *regexp.Regexp {
	return regexp.MustCompile(`^req_[a-z0-9]{16}\.` + regexp.QuoteMeta(node) + `$`)
}

// anyNodeSession matches a session id of any of the test's replicas, and
// captures the node.
var anyNodeSession = regexp.MustCompile(`^ses_[a-z0-9]{16}\.(gw-[0-2])$`)

// agentRunners are the replicas whose log has an "agent running" line for
// session id.
func agentRunners(replicas []*Caddy, id string) []int {
	var out []int
	for i, c := range replicas {
		for _, l := range logLines(c, "agent running") {
			if l["session"] == id {
				out = append(out, i)
				break
			}
		}
	}
	return out
}

// eventsWhen calls events with filter through c until ok accepts what it
// answers, for at most 10 s, and returns that: an event reaches every
// replica's log through the cluster's stream, a moment after the state
// change that made it. It fails the test with the last answer.
func eventsWhen(t *testing.T, c sessionsClient, filter map[string]any, what string, ok func([]eventView) bool) []eventView {
	t.Helper()
	start := time.Now()
	for tries := 1; ; tries++ {
		evs := eventsOf(t, c, filter).Events
		if ok(evs) {
			if tries > 1 {
				t.Logf("%s: in the events through %s after %v (%d calls)", what, c.name(), time.Since(start).Round(time.Millisecond), tries)
			}
			return evs
		}
		if time.Since(start) > 10*time.Second {
			t.Fatalf("%s: never in the events through %s within 10s; the last answer: %+v", what, c.name(), evs)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A sessions site on NATS storage needs this replica's node id, which
// names the node in every session id it runs, and its advertised address,
// which puts it in the node registry where the others find it: without
// them it is refused, and the refusal names what to set; with them, it
// serves.
func TestClusterAgentSessionsNeedNode(t *testing.T) {
	natsURL := startNATSServer(t)
	host := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	c := startCaddy(t, sessionsReplicaCaddyfile([]string{natsURL}, replicaIdentity("gw-0", host), host),
		"ZIDANE_CLUSTER_KEY="+base64.StdEncoding.EncodeToString([]byte(randomHex(16))))
	token := createToken(t, c, "n", "--scope", "chat")
	if got := post(t, "http://"+host+"/mcp", token, initializeBody); got.status != http.StatusOK || !strings.Contains(got.body, "protocolVersion") {
		t.Fatalf("the sessions site on NATS storage with node and advertise: %d %s", got.status, tail(got.body, 300))
	}
	for _, tc := range []struct{ name, identity string }{
		{"neither node nor advertise", ""},
		{"node without advertise", "node gw-0"},
	} {
		out, err := c.TryReload(t, sessionsReplicaCaddyfile([]string{natsURL}, tc.identity, host))
		if err == nil || !strings.Contains(out, "node") || !strings.Contains(out, "advertise") {
			t.Errorf("a sessions site on NATS storage with %s: %v\n%s\nwant a refusal that names node and advertise", tc.name, err, out)
		}
	}
	if got := post(t, "http://"+host+"/mcp", token, initializeBody); got.status != http.StatusOK {
		t.Fatalf("the running config after the refused reloads: %d %s", got.status, tail(got.body, 300))
	}
}

// TestClusterAgentSessions: three replicas of the sessions endpoint on a
// three-node NATS cluster, a legacy (2025-11-25) go-sdk client connected
// straight to each, and a Caddy reverse_proxy load balancer in front of
// them.
//   - A session runs on the replica that got its create, and its id (and its
//     interactions' request ids) names that node.
//   - Every verb works on every session from every replica.
//   - The <session-event>s go to the MCP session of the owner's credential
//     that last sent, whichever replica that client is connected to.
//   - interactions pending lists every replica's interactions; answer works
//     from any replica, and of two concurrent answers through two replicas
//     exactly one wins.
//   - Event seqs are cluster-wide; events and list on any replica show every
//     replica's sessions, each once.
//   - A 2026-07-28 client on one replica follows a session of another
//     through subscriptions/listen.
//   - Through the load balancer, go-sdk clients at both versions create,
//     send, wait, answer, read transcripts and list with no error.
//   - A replica restarted with the same node id resumes its own sessions, and
//     no other replica runs them, then or ever.
func TestClusterAgentSessions(t *testing.T) {
	_, natsURLs := startNATSCluster(t)
	key := "ZIDANE_CLUSTER_KEY=" + base64.StdEncoding.EncodeToString([]byte(randomHex(16)))
	const n = 3
	var replicas []*Caddy
	var urls []string
	var hosts []string
	for i := range n {
		host := fmt.Sprintf("127.0.0.1:%d", freePort(t))
		replicas = append(replicas, startCaddy(t, sessionsReplicaCaddyfile(natsURLs, replicaIdentity(fmt.Sprintf("gw-%d", i), host), host), key))
		hosts = append(hosts, host)
		urls = append(urls, "http://"+host+"/mcp")
	}
	token := createToken(t, replicas[0], "agents", "--scope", "chat")
	for _, u := range urls {
		waitStatus(t, u, token, http.StatusOK, 20*time.Second)
	}
	// c[i] is a 2025-11-25 client connected straight to replica i.
	c := make([]*goSessions, n)
	for i := range n {
		c[i] = connectGoSessions(t, urls[i], token, fmt.Sprintf("gw-%d", i))
	}
	dir := t.TempDir()

	// s[i] runs on replica i, created one after the other: the first
	// turn's done event of each has a higher seq than the one before.
	s := make([]string, n)
	firstDone := make([]pushedEvent, n)
	t.Run("a session runs on the replica that got its create, and its id names that node", func(t *testing.T) {
		for i := range n {
			id := createSession(t, c[i], dir, fmt.Sprintf("hello from gw-%d", i)).SessionID
			if !sessionIDOn(fmt.Sprintf("gw-%d", i)).MatchString(id) {
				t.Fatalf("created through gw-%d: session id %q, want ses_<16 characters>.gw-%d", i, id, i)
			}
			s[i] = id
			p := c[i].pushes().await(t, "done for "+id, eventFor(id, "done"))
			want := fmt.Sprintf(`<session-event session="%s" status="done" seq="%d">`, id, p.Event.Seq)
			if !strings.HasPrefix(p.Event.Text, want) || !strings.Contains(p.Event.Text, fmt.Sprintf("You said: hello from gw-%d", i)) {
				t.Fatalf("the creating client on gw-%d was pushed %s, want %s… carrying the answer", i, p.Raw, want)
			}
			firstDone[i] = p
			if i > 0 && p.Event.Seq <= firstDone[i-1].Event.Seq {
				t.Fatalf("the done event of %s (on gw-%d) has seq %d, not above %d of %s (on gw-%d), which came before it",
					id, i, p.Event.Seq, firstDone[i-1].Event.Seq, s[i-1], i-1)
			}
		}
		for i, id := range s {
			if got := agentRunners(replicas, id); !slices.Equal(got, []int{i}) {
				t.Fatalf("the agent of %s ran on replicas %v, want only gw-%d", id, got, i)
			}
		}
	})
	if t.Failed() {
		t.FailNow()
	}

	t.Run("every verb on a session from the replicas that do not run it", func(t *testing.T) {
		id := s[0]
		if v := settleIn(t, c[1], id, "idle"); v.Turns != 1 || v.LastMessage != "You said: hello from gw-0" || v.Agent != "demo" || v.Cwd != dir {
			t.Fatalf("read through gw-1 of a session on gw-0: %+v", v)
		}
		if queued := sendPrompt(t, c[2], id, "sleep: 5m"); queued {
			t.Fatal("send through gw-2 to an idle session said it was queued")
		}
		awaitMessage(t, c[1], id, "Sleeping for 5m0s")
		if !sendPrompt(t, c[1], id, "after the nap") {
			t.Fatal("send through gw-1 to a running session was not queued")
		}
		if v := readSession(t, c[2], id, false); v.State != "running" || v.Queued != 1 {
			t.Fatalf("read through gw-2 while sleeping: %+v, want running with 1 queued", v)
		}
		var w waitView
		sessionsCall(t, c[2], "wait", map[string]any{"sessionId": id, "timeout": 1}).decode(t, &w)
		if w.Settled || w.State != "running" {
			t.Fatalf("wait 1s through gw-2 on a sleeping session: %+v", w)
		}
		var st struct {
			Mode string `json:"mode"`
		}
		sessionsCall(t, c[1], "steer", map[string]any{"sessionId": id, "text": "wrap up now"}).decode(t, &st)
		if st.Mode != "steering" {
			t.Fatalf("steer through gw-1: mode %q, want steering", st.Mode)
		}
		if v := settleIn(t, c[2], id, "idle"); v.Turns != 3 || v.LastMessage != "You said: after the nap" {
			t.Fatalf("after steering and the queued prompt, through gw-2: %+v", v)
		}
		tr := transcriptOf(t, c[1], id, nil)
		if len(tr.Turns) != 3 || !strings.Contains(tr.Turns[1].Answer, "Steered: wrap up now") || tr.Turns[2].Prompt != "after the nap" {
			t.Fatalf("transcript through gw-1: %+v", tr.Turns)
		}
		sendPrompt(t, c[1], id, "sleep: 5m")
		awaitMessage(t, c[2], id, "Sleeping for 5m0s")
		if a := sessionsCall(t, c[2], "cancel", map[string]any{"sessionId": id}); !strings.Contains(a.Text, "Cancelled the running turn") {
			t.Fatalf("cancel through gw-2: %s", a.Text)
		}
		settleIn(t, c[1], id, "idle")
		if last := lastTurn(t, transcriptOf(t, c[2], id, nil)); last.Prompt != "sleep: 5m" || last.StopReason != "cancelled" {
			t.Fatalf("the cancelled turn, through gw-2: %+v", last)
		}
		want := []string{"done", "done", "done", "cancelled"}
		statusesOf := func(evs []eventView) []string {
			var statuses []string
			for _, ev := range evs {
				statuses = append(statuses, ev.SessionID+" "+ev.Status)
			}
			slices.Reverse(statuses)
			return statuses
		}
		var wantFor []string
		for _, st := range want {
			wantFor = append(wantFor, id+" "+st)
		}
		eventsWhen(t, c[1], map[string]any{"sessionId": id, "limit": 100}, "the events of "+id+", oldest first "+strings.Join(want, ", "),
			func(evs []eventView) bool { return slices.Equal(statusesOf(evs), wantFor) })
		if got := agentRunners(replicas, id); !slices.Equal(got, []int{0}) {
			t.Fatalf("the agent of %s ran on replicas %v, want only gw-0", id, got)
		}
	})

	t.Run("events go to the client of the owner's last sender, on any replica", func(t *testing.T) {
		id := createSession(t, c[0], dir, "pushed to gw-0's client").SessionID
		c[0].pushes().await(t, "done for "+id, eventFor(id, "done"))
		for _, to := range []int{1, 2, 0} {
			prompt := fmt.Sprintf("sent through gw-%d", to)
			sendPrompt(t, c[to], id, prompt)
			got := c[to].pushes().await(t, "done of "+prompt+" for "+id, func(p pushedEvent) bool {
				return p.Event.SessionID == id && p.Event.Status == "done" && strings.Contains(p.Event.Summary, prompt)
			})
			if !strings.Contains(got.Event.Text, fmt.Sprintf(`<session-event session="%s" status="done" seq="%d">`, id, got.Event.Seq)) {
				t.Fatalf("pushed to gw-%d's client: %s", to, got.Raw)
			}
			for i, other := range c {
				if i == to {
					continue
				}
				other.pushes().mu.Lock()
				for _, p := range other.pushes().events {
					if p.Event.SessionID == id && strings.Contains(p.Event.Summary, prompt) {
						t.Errorf("gw-%d's client, which did not send %q, was pushed its event: %s", i, prompt, p.Raw)
					}
				}
				other.pushes().mu.Unlock()
			}
		}
	})

	t.Run("interactions: pending from every replica, answered from any, first answer wins", func(t *testing.T) {
		asked := createSession(t, c[2], dir, "ask: which branch?").SessionID
		for _, round := range []struct {
			owner   int
			answers [2]int // the replicas the two concurrent answers go through
		}{{0, [2]int{1, 2}}, {1, [2]int{1, 2}}} {
			node := fmt.Sprintf("gw-%d", round.owner)
			cmd := "rm -rf build on " + node
			id := createSession(t, c[round.owner], dir, "approve: "+cmd).SessionID
			settleIn(t, c[round.answers[1]], id, "blocked")
			settleIn(t, c[round.answers[0]], asked, "blocked")
			it := onlyPending(t, c[round.answers[0]], id)
			if !requestIDOn(node).MatchString(it.RequestID) || it.Kind != "approval" || it.SessionID != id {
				t.Fatalf("pending of %s: %+v, want an approval with request id req_<16 characters>.%s", id, it, node)
			}
			q := onlyPending(t, c[round.owner], asked)
			if !requestIDOn("gw-2").MatchString(q.RequestID) || q.Kind != "question" {
				t.Fatalf("pending of %s through %s: %+v", asked, node, q)
			}
			for i := range n {
				all := pendingOf(t, c[i], "")
				for _, want := range []string{it.RequestID, q.RequestID} {
					if !slices.ContainsFunc(all, func(x interactionView) bool { return x.RequestID == want }) {
						t.Fatalf("interactions pending through gw-%d lacks %s: %+v", i, want, all)
					}
				}
			}

			start := make(chan struct{})
			var wg sync.WaitGroup
			answers := make([]toolAnswer, 2)
			errs := make([]error, 2)
			for k, decision := range []string{"allow", "reject"} {
				wg.Go(func() {
					<-start
					answers[k], errs[k] = c[round.answers[k]].tryCall(t, "interactions", map[string]any{"verb": "answer", "requestId": it.RequestID, "decision": decision})
				})
			}
			close(start)
			wg.Wait()
			for k := range 2 {
				if errs[k] != nil {
					t.Fatalf("answer through gw-%d: %v", round.answers[k], errs[k])
				}
			}
			if answers[0].IsError == answers[1].IsError {
				t.Fatalf("two concurrent answers to %s through gw-%d and gw-%d: errors %v and %v (%s | %s), want exactly one to win",
					it.RequestID, round.answers[0], round.answers[1], answers[0].IsError, answers[1].IsError, answers[0].Text, answers[1].Text)
			}
			win := 0
			if answers[0].IsError {
				win = 1
			}
			lose := answers[1-win]
			if lose.errorCode() != "already_answered" || !strings.Contains(lose.Text, "answered") {
				t.Fatalf("the losing answer through gw-%d: code %q, %s; want already_answered", round.answers[1-win], lose.errorCode(), lose.Text)
			}
			want := "Allowed: " + cmd
			if win == 1 {
				want = "Rejected: " + cmd
			}
			if v := settleIn(t, c[0], id, "idle"); v.LastMessage != want {
				t.Fatalf("after the winning answer through gw-%d: %+v, want last message %q", round.answers[win], v, want)
			}
			t.Logf("round on %s: the answer through gw-%d won; gw-%d was told: %s", node, round.answers[win], round.answers[1-win], lose.Text)
		}
		// The question of the session on gw-2, answered through gw-0.
		q := onlyPending(t, c[1], asked)
		if a := answerInteraction(t, c[0], q.RequestID, map[string]any{"action": "accept", "content": map[string]any{"answer": "main"}}); a.IsError {
			t.Fatalf("answer through gw-0 of a question on gw-2: %s", a.Text)
		}
		if v := settleIn(t, c[1], asked, "idle"); v.LastMessage != "You answered: main" {
			t.Fatalf("after the answer through gw-0: %+v", v)
		}
		if msg := callRefused(t, c[2], "interactions", map[string]any{"verb": "answer", "requestId": q.RequestID, "action": "decline"}, "already_answered"); !strings.Contains(msg, "answered") {
			t.Fatalf("a second answer through gw-2, the node that runs the session: %s", msg)
		}
		for i := range n {
			if got := pendingOf(t, c[i], ""); len(got) != 0 {
				t.Fatalf("interactions pending through gw-%d after every answer: %+v", i, got)
			}
		}
	})

	t.Run("event seqs are cluster-wide and events lists every replica's", func(t *testing.T) {
		for i := range n {
			evs := eventsOf(t, c[i], map[string]any{"limit": 100}).Events
			seen := map[string]bool{}
			for k, ev := range evs {
				if k > 0 && ev.Seq >= evs[k-1].Seq {
					t.Fatalf("events through gw-%d: seq %d after %d, want distinct seqs, newest first", i, ev.Seq, evs[k-1].Seq)
				}
				seen[ev.SessionID] = true
			}
			for _, id := range s {
				if !seen[id] {
					t.Fatalf("events through gw-%d lack the events of %s", i, id)
				}
			}
			for j, id := range s {
				evs := eventsOf(t, c[i], map[string]any{"sessionId": id, "status": "done", "limit": 100}).Events
				if len(evs) == 0 || evs[len(evs)-1].Seq != firstDone[j].Event.Seq {
					t.Fatalf("done events of %s through gw-%d: %+v; want the oldest with the pushed seq %d", id, i, evs, firstDone[j].Event.Seq)
				}
			}
		}
	})

	t.Run("list on every replica shows every replica's sessions, each once", func(t *testing.T) {
		var lists [n][]string
		for i := range n {
			var l listView
			sessionsCall(t, c[i], "list", map[string]any{"limit": 100}).decode(t, &l)
			for _, v := range l.Sessions {
				lists[i] = append(lists[i], v.SessionID)
			}
			for _, id := range s {
				if k := slices.Index(lists[i], id); k < 0 || !l.Sessions[k].Worker {
					t.Fatalf("list through gw-%d lacks %s as the token's worker: %+v", i, id, l)
				}
			}
			sorted := slices.Clone(lists[i])
			slices.Sort(sorted)
			if len(slices.Compact(sorted)) != len(lists[i]) {
				t.Fatalf("list through gw-%d names a session twice: %v", i, lists[i])
			}
			if l.Partial {
				t.Fatalf("list through gw-%d with every replica up is partial: %+v", i, l)
			}
		}
		for i := 1; i < n; i++ {
			a, b := slices.Clone(lists[0]), slices.Clone(lists[i])
			slices.Sort(a)
			slices.Sort(b)
			if !slices.Equal(a, b) {
				t.Fatalf("list through gw-0: %v; through gw-%d: %v", lists[0], i, lists[i])
			}
		}
	})

	t.Run("a 2026-07-28 client follows a session of another replica", func(t *testing.T) {
		m := connectModernSessions(t, urls[1], token, "modern-gw-1")
		id := s[0]
		uri := "zidane://sessions/" + id + "/events"
		ctx, cancel := context.WithTimeout(context.Background(), sessionCallTimeout)
		defer cancel()
		rr, err := m.cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: uri})
		var read eventsView
		if err == nil && len(rr.Contents) == 1 {
			err = json.Unmarshal([]byte(rr.Contents[0].Text), &read)
		}
		if err != nil || !slices.ContainsFunc(read.Events, func(ev eventView) bool { return ev.Seq == firstDone[0].Event.Seq }) {
			t.Fatalf("resources/read %s (the URI create answered as eventsResource) through gw-1: %v %+v; want the events of the session on gw-0", uri, err, rr)
		}
		m.subscribe(t, uri)
		m.pushes().await(t, "the first done of "+id+", read through gw-1", func(p pushedEvent) bool { return p.Event.Seq == firstDone[0].Event.Seq })
		sendPrompt(t, c[0], id, "followed from gw-1")
		m.pushes().await(t, "the event of a prompt sent through gw-0, read through gw-1", func(p pushedEvent) bool {
			return p.Event.SessionID == id && p.Event.Status == "done" && strings.Contains(p.Event.Summary, "followed from gw-1")
		})
	})

	t.Run("through the load balancer at both protocol versions", func(t *testing.T) {
		lb, _ := startLoadBalancer(t, hosts)
		// Two clients at each version; one that cannot connect is a
		// failure, and the others go on.
		var clients []*goSessions
		var failures []error
		for i, v := range []string{legacyVersion, legacyVersion, modernVersion, modernVersion} {
			label := fmt.Sprintf("lb-%d-%s", i, v)
			g, err := tryConnectGoSessionsAt(t, lb, token, label, v)
			if err != nil {
				failures = append(failures, fmt.Errorf("%s: connect through the load balancer: %w", label, err))
				continue
			}
			if got := g.cs.InitializeResult().ProtocolVersion; got != v {
				t.Fatalf("%s: negotiated %s through the load balancer, want %s", label, got, v)
			}
			clients = append(clients, g)
		}
		const rounds = 3
		var mu sync.Mutex
		calls := 0
		perNode := map[string]int{}
		var made []string
		var wg sync.WaitGroup
		for _, g := range clients {
			wg.Go(func() {
				for r := range rounds {
					id, node, k, err := lbCycle(t, g, dir, r)
					mu.Lock()
					calls += k
					if err != nil {
						failures = append(failures, fmt.Errorf("%s round %d: %w", g.label, r, err))
					} else {
						perNode[node]++
						made = append(made, id)
					}
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		t.Logf("through the load balancer: %d clients × %d rounds, %d tool calls, %d failed; sessions per node: %v", len(clients), rounds, calls, len(failures), perNode)
		for _, err := range failures {
			t.Error(err)
		}
		// One list through the load balancer, on whichever replica it
		// lands, shows the sessions of every node.
		if len(clients) > 0 {
			var l listView
			sessionsCall(t, clients[0], "list", map[string]any{"limit": 100}).decode(t, &l)
			nodes := map[string]bool{}
			listed := map[string]bool{}
			for _, v := range l.Sessions {
				listed[v.SessionID] = true
				if m := anyNodeSession.FindStringSubmatch(v.SessionID); m != nil {
					nodes[m[1]] = true
				}
				if v.Unreachable {
					t.Errorf("list through the load balancer, every replica up: %s is unreachable", v.SessionID)
				}
			}
			for _, id := range append(slices.Clone(s), made...) {
				if !listed[id] {
					t.Errorf("list through the load balancer lacks %s", id)
				}
			}
			if len(nodes) != n || l.Partial {
				t.Errorf("list through the load balancer: sessions of nodes %v (partial %v), want all %d", nodes, l.Partial, n)
			}
		}
	})

	t.Run("a replica restarted with its node id resumes its own sessions, and only it runs them", func(t *testing.T) {
		id := s[1]
		sendPrompt(t, c[0], id, "second turn on gw-1")
		before := settleIn(t, c[0], id, "idle")
		trBefore := transcriptOf(t, c[2], id, nil)
		if before.Turns != 2 || len(trBefore.Turns) != 2 {
			t.Fatalf("before the restart: %+v, transcript %+v", before, trBefore.Turns)
		}
		c[1].cs.Close()
		replicas[1].Stop(t)
		// While gw-1 is down, no other replica takes its session over, and
		// the refusal says whose it is (the README: "… runs on replica
		// "gw-1", which does not answer …; try again once it is back").
		a, err := c[0].tryCall(t, "sessions", map[string]any{"verb": "send", "sessionId": id, "prompt": "while gw-1 is down"})
		if err != nil || !a.IsError {
			t.Fatalf("send through gw-0 to a session of the stopped gw-1: %v %s; want a tool error", err, a.Text)
		}
		if !strings.Contains(a.Text, `runs on replica "gw-1"`) || !strings.Contains(a.Text, "once it is back") {
			t.Errorf("send through gw-0 to a session of the stopped gw-1 answered %q; want the refusal to say its node gw-1 is down and to try again once it is back, as the README says", a.Text)
		}
		// Still listed on the others, from the directory, as it last was,
		// and marked unreachable once their registry has seen gw-1 leave;
		// the others' sessions are not.
		for _, k := range []int{0, 2} {
			deadline := time.Now().Add(10 * time.Second)
			for {
				var l listView
				sessionsCall(t, c[k], "list", map[string]any{"limit": 100}).decode(t, &l)
				i := slices.IndexFunc(l.Sessions, func(v sessionView) bool { return v.SessionID == id })
				if i < 0 || l.Sessions[i].Turns != before.Turns || l.Sessions[i].LastMessage != before.LastMessage || l.Partial {
					t.Fatalf("list through gw-%d while gw-1 is down: %+v; want %s listed as it was before", k, l, id)
				}
				if !l.Sessions[i].Unreachable {
					if time.Now().After(deadline) {
						t.Fatalf("list through gw-%d 10s after gw-1 stopped: %s is not marked unreachable", k, id)
					}
					time.Sleep(50 * time.Millisecond)
					continue
				}
				for _, v := range l.Sessions {
					if v.Unreachable != strings.HasSuffix(v.SessionID, ".gw-1") {
						t.Errorf("list through gw-%d while gw-1 is down: %s unreachable %v", k, v.SessionID, v.Unreachable)
					}
				}
				break
			}
		}
		replicas[1].start(t)
		waitStatus(t, urls[1], token, http.StatusOK, 20*time.Second)
		c[1] = connectGoSessions(t, urls[1], token, "gw-1-again")

		v := settleIn(t, c[0], id, "idle")
		if v.Turns != before.Turns || v.LastMessage != before.LastMessage || v.Title != before.Title || v.Cwd != before.Cwd {
			t.Fatalf("read through gw-0 after gw-1 restarted: %+v, before it: %+v", v, before)
		}
		tr := transcriptOf(t, c[2], id, nil)
		if len(tr.Turns) != len(trBefore.Turns) {
			t.Fatalf("transcript through gw-2 after the restart: %+v, before it: %+v", tr.Turns, trBefore.Turns)
		}
		for k := range tr.Turns {
			if tr.Turns[k].Prompt != trBefore.Turns[k].Prompt || tr.Turns[k].Answer != trBefore.Turns[k].Answer {
				t.Fatalf("turn %d after the restart: %+v, before it: %+v", k+1, tr.Turns[k], trBefore.Turns[k])
			}
		}
		sendPrompt(t, c[2], id, "after the restart")
		if v := settleIn(t, c[0], id, "idle"); v.Turns != before.Turns+1 || v.LastMessage != "You said: after the restart" {
			t.Fatalf("a prompt through gw-2 after gw-1 restarted: %+v", v)
		}
		eventsWhen(t, c[1], map[string]any{"sessionId": id, "text": "after the restart", "limit": 100}, "the done event of the prompt after the restart",
			func(evs []eventView) bool { return len(evs) == 1 && evs[0].Status == "done" })
		eventsWhen(t, c[0], map[string]any{"sessionId": id, "text": "after the restart", "limit": 100}, "the done event of the prompt after the restart",
			func(evs []eventView) bool { return len(evs) == 1 && evs[0].Status == "done" })
		resumed := false
		for _, l := range logLines(replicas[1], "agent running") {
			if l["session"] == id && l["resumed"] == true {
				resumed = true
			}
		}
		if !resumed {
			t.Errorf(`gw-1 has no "agent running" log line with resumed true for %s: its agent was not resumed after the restart`, id)
		}
		// A new session through the restarted replica is its own.
		fresh := createSession(t, c[1], dir, "after gw-1 came back").SessionID
		if !sessionIDOn("gw-1").MatchString(fresh) {
			t.Fatalf("created through the restarted gw-1: %q", fresh)
		}
		settleIn(t, c[2], fresh, "idle")

		// Every session is listed once on every replica, and only the node
		// its id names ever ran its agent.
		var l listView
		sessionsCall(t, c[1], "list", map[string]any{"limit": 100}).decode(t, &l)
		seen := map[string]bool{}
		for _, v := range l.Sessions {
			if seen[v.SessionID] {
				t.Errorf("list through the restarted gw-1 names %s twice", v.SessionID)
			}
			seen[v.SessionID] = true
			m := anyNodeSession.FindStringSubmatch(v.SessionID)
			if m == nil {
				t.Errorf("list through gw-1 has session id %q, which names none of the replicas", v.SessionID)
				continue
			}
			want := int(m[1][len(m[1])-1] - '0')
			if got := agentRunners(replicas, v.SessionID); !slices.Equal(got, []int{want}) {
				t.Errorf("the agent of %s ran on replicas %v, want only %s", v.SessionID, got, m[1])
			}
		}
		for _, want := range append(slices.Clone(s), fresh) {
			if !seen[want] {
				t.Errorf("list through the restarted gw-1 lacks %s", want)
			}
		}
		for i := range n {
			var li listView
			sessionsCall(t, c[i], "list", map[string]any{"limit": 100}).decode(t, &li)
			if len(li.Sessions) != len(l.Sessions) {
				t.Errorf("list through gw-%d has %d sessions, through gw-1 %d", i, len(li.Sessions), len(l.Sessions))
			}
		}
	})
}

// lbCycle drives one session through the load balancer with g: create,
// wait, send an approval prompt, pending, answer, wait, transcript, list.
// It returns the node the session runs on, the number of tool calls made,
// and the first failure.
func lbCycle(t *testing.T, g *goSessions, dir string, round int) (id, node string, calls int, err error) {
	call := func(tool string, args map[string]any, v any) (toolAnswer, error) {
		calls++
		a, err := g.tryCall(t, tool, args)
		if err != nil {
			return a, fmt.Errorf("%s %v: %w", tool, args["verb"], err)
		}
		if a.IsError {
			return a, fmt.Errorf("%s %v: tool error %s", tool, args["verb"], a.Text)
		}
		if v != nil {
			if err := json.Unmarshal(a.Data, v); err != nil {
				return a, fmt.Errorf("%s %v: structured content %s: %w", tool, args["verb"], a.Data, err)
			}
		}
		return a, nil
	}
	settled := func(id string) (sessionView, error) {
		deadline := time.Now().Add(sessionSettle)
		for {
			var w waitView
			if _, err := call("sessions", map[string]any{"verb": "wait", "sessionId": id, "timeout": 5}, &w); err != nil {
				return w.sessionView, err
			}
			if w.Settled {
				return w.sessionView, nil
			}
			if time.Now().After(deadline) {
				return w.sessionView, fmt.Errorf("%s still %s after %s", id, w.State, sessionSettle)
			}
		}
	}
	prompt := fmt.Sprintf("%s round %d", g.label, round)
	var cr createdView
	if _, err := call("sessions", map[string]any{"verb": "create", "cwd": dir, "prompt": prompt}, &cr); err != nil {
		return "", "", calls, err
	}
	m := anyNodeSession.FindStringSubmatch(cr.SessionID)
	if m == nil {
		return "", "", calls, fmt.Errorf("create answered session id %q, which names none of the replicas", cr.SessionID)
	}
	id, node = cr.SessionID, m[1]
	if v, err := settled(id); err != nil || v.State != "idle" || v.LastMessage != "You said: "+prompt {
		return id, node, calls, fmt.Errorf("the first turn of %s: %+v %v", id, v, err)
	}
	cmd := "deploy " + prompt
	if _, err := call("sessions", map[string]any{"verb": "send", "sessionId": id, "prompt": "approve: " + cmd}, nil); err != nil {
		return id, node, calls, err
	}
	if v, err := settled(id); err != nil || v.State != "blocked" {
		return id, node, calls, fmt.Errorf("%s after the approval prompt: %+v %v, want blocked", id, v, err)
	}
	var p pendingView
	if _, err := call("interactions", map[string]any{"verb": "pending", "sessionId": id}, &p); err != nil {
		return id, node, calls, err
	}
	if len(p.Interactions) != 1 || !requestIDOn(node).MatchString(p.Interactions[0].RequestID) {
		return id, node, calls, fmt.Errorf("pending of %s: %+v, want one request of %s", id, p.Interactions, node)
	}
	if _, err := call("interactions", map[string]any{"verb": "answer", "requestId": p.Interactions[0].RequestID, "decision": "allow"}, nil); err != nil {
		return id, node, calls, err
	}
	if v, err := settled(id); err != nil || v.State != "idle" || v.LastMessage != "Allowed: "+cmd {
		return id, node, calls, fmt.Errorf("%s after the answer: %+v %v", id, v, err)
	}
	var tr transcriptView
	if _, err := call("sessions", map[string]any{"verb": "transcript", "sessionId": id}, &tr); err != nil {
		return id, node, calls, err
	}
	if len(tr.Turns) != 2 || tr.Turns[0].Prompt != prompt || tr.Turns[1].Answer != "Allowed: "+cmd {
		return id, node, calls, fmt.Errorf("transcript of %s: %+v", id, tr.Turns)
	}
	var l listView
	if _, err := call("sessions", map[string]any{"verb": "list", "limit": 100}, &l); err != nil {
		return id, node, calls, err
	}
	if !slices.ContainsFunc(l.Sessions, func(v sessionView) bool { return v.SessionID == id }) {
		return id, node, calls, errors.New("list lacks " + id)
	}
	return id, node, calls, nil
}

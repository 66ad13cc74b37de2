package sessions_test

import (
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"testing"

	"github.com/Tahul/caddy-zidane-mcp/sessions"
)

// limited starts an engine with small limits, its idle timer off so that
// only making room stops an agent, and its log captured.
func limited(t *testing.T, maxAgents, perToken, sessionsPerToken int) (*sessions.Engine, *syncBuffer) {
	t.Helper()
	logs := &syncBuffer{}
	e, _ := newEngine(t, func(c *sessions.Config) {
		c.Limits.MaxAgents = maxAgents
		c.Limits.MaxAgentsPerToken = perToken
		c.Limits.MaxSessionsPerToken = sessionsPerToken
		c.Limits.IdleTimeout = -1
		c.Logger = slog.New(slog.NewTextHandler(logs, nil))
	})
	return e, logs
}

// madeRoomBy returns the sessions whose agents were stopped to make room,
// in order, as the log says.
func madeRoomBy(logs *syncBuffer) []string {
	var ids []string
	for _, m := range regexp.MustCompile(`idle agent stopped to make room[^\n]* session=(ses_\w+)`).FindAllStringSubmatch(logs.String(), -1) {
		ids = append(ids, m[1])
	}
	return ids
}

// TestOneTokenCannotLockOthersOut: token A fills max_agents with idle
// sessions; token B still creates and runs one, because A's least recently
// used idle agent is stopped for it, and that session of A's resumes
// through session/load at its next prompt.
func TestOneTokenCannotLockOthersOut(t *testing.T) {
	e, logs := limited(t, 3, 3, 10)
	a, b := owner("alice"), owner("bob")
	var mine []string
	for i := range 3 {
		id := create(t, e, a, fmt.Sprintf("a%d", i))
		waitState(t, e, id, sessions.StateIdle)
		mine = append(mine, id)
	}
	theirs := create(t, e, b, "b runs")
	if v := waitState(t, e, theirs, sessions.StateIdle); v.LastMessage != "You said: b runs" {
		t.Fatalf("B's session: %+v", v)
	}
	if got := madeRoomBy(logs); fmt.Sprint(got) != fmt.Sprint(mine[:1]) {
		t.Fatalf("agents stopped for room: %v, want A's least recently used, %s", got, mine[0])
	}
	if v, _ := e.Read(looker, mine[0], false); v.State != sessions.StateIdle || v.Error != "" {
		t.Fatalf("the session whose agent made room: %+v, want it idle", v)
	}

	// A's dormant session resumes at its next prompt, which makes room in
	// turn: the least recently used idle agent is now A's second.
	if _, err := e.Send(ctxT(t), a, mine[0], "back"); err != nil {
		t.Fatal(err)
	}
	if v := waitState(t, e, mine[0], sessions.StateIdle); v.LastMessage != "You said: back" || v.Turns != 2 {
		t.Fatalf("resumed session: %+v", v)
	}
	if !strings.Contains(logs.String(), "resumed=true") {
		t.Errorf("the agent was not relaunched with session/load; logs:\n%s", logs)
	}
	if got := madeRoomBy(logs); fmt.Sprint(got) != fmt.Sprint([]string{mine[0], mine[1]}) {
		t.Errorf("agents stopped for room: %v, want %s then %s", got, mine[0], mine[1])
	}
	tr, _ := e.Transcript(looker, mine[0], 0, true)
	if len(tr) != 2 || tr[0].Answer != "You said: a0" {
		t.Errorf("the resumed session's transcript = %+v", tr)
	}
}

// TestAgentsPerToken: a token whose sessions all run long turns is refused
// at max_agents_per_token with a quota error, while another token is not;
// once one of its turns ends, its own idle agent makes room.
func TestAgentsPerToken(t *testing.T) {
	e, logs := limited(t, 10, 2, 10)
	a, b := owner("ann"), owner("ben")
	busy := []string{create(t, e, a, "sleep: 10m"), create(t, e, a, "sleep: 10m")}
	for _, id := range busy {
		sleeping(t, e, id)
	}
	_, err := e.Create(ctxT(t), a, sessions.CreateRequest{Cwd: t.TempDir(), Prompt: "a third"})
	wantErr(t, err, sessions.ErrQuota, `token "ann"`, "2 agent processes", "max_agents_per_token")
	if id := create(t, e, b, "ben is fine"); waitState(t, e, id, sessions.StateIdle).LastMessage != "You said: ben is fine" {
		t.Fatal("B's session did not run")
	}

	if err := e.Cancel(ctxT(t), a, busy[0]); err != nil {
		t.Fatal(err)
	}
	id := create(t, e, a, "a third, now")
	if v := waitState(t, e, id, sessions.StateIdle); v.LastMessage != "You said: a third, now" {
		t.Fatalf("A's third session: %+v", v)
	}
	if got := madeRoomBy(logs); fmt.Sprint(got) != fmt.Sprint(busy[:1]) {
		t.Errorf("agents stopped for room: %v, want A's idle one, %s", got, busy[0])
	}
	// The busy one is never stopped for room.
	if v, _ := e.Read(looker, busy[1], false); v.State != sessions.StateRunning {
		t.Errorf("A's running session: %+v", v)
	}
}

// TestNoRoomWithoutIdleAgents: at max_agents, with every agent running a
// turn or unable to resume (the minimal agent has no session/load), a new
// session is refused as busy and nothing is stopped.
func TestNoRoomWithoutIdleAgents(t *testing.T) {
	e, logs := limited(t, 2, 2, 10)
	running := create(t, e, owner("cat"), "sleep: 10m")
	sleeping(t, e, running)
	noLoad := create(t, e, owner("dan"), "idle, but cannot resume", func(r *sessions.CreateRequest) { r.Agent = "minimal" })
	waitState(t, e, noLoad, sessions.StateIdle)

	_, err := e.Create(ctxT(t), owner("eve"), sessions.CreateRequest{Cwd: t.TempDir(), Prompt: "room?"})
	wantErr(t, err, sessions.ErrBusy, "2 agent processes are running", "none is idle and able to resume")
	if got := madeRoomBy(logs); len(got) != 0 {
		t.Errorf("agents stopped for room: %v, want none", got)
	}
	if msg := lastMessage(t, e, noLoad); msg != "ok: idle, but cannot resume" {
		t.Errorf("the agent without session/load: %q", msg)
	}
	if _, err := e.Send(ctxT(t), owner("dan"), noLoad, "still here"); err != nil {
		t.Fatal(err)
	}
	if v := waitState(t, e, noLoad, sessions.StateIdle); v.LastMessage != "ok: still here" {
		t.Errorf("the agent without session/load lost its session: %+v", v)
	}
}

// TestSessionsPerToken: a token at max_sessions_per_token is refused, with
// a quota error that names the limit; another token is not, and a session
// that ends stops counting.
func TestSessionsPerToken(t *testing.T) {
	e, _ := limited(t, 10, 10, 2)
	f, g := owner("fay"), owner("gus")
	first := create(t, e, f, "one")
	create(t, e, f, "two")
	_, err := e.Create(ctxT(t), f, sessions.CreateRequest{Cwd: t.TempDir(), Prompt: "three"})
	wantErr(t, err, sessions.ErrQuota, `token "fay" has 2 live sessions`, "max_sessions_per_token")
	create(t, e, g, "gus is fine")

	waitState(t, e, first, sessions.StateIdle)
	if _, err := e.Send(ctxT(t), f, first, "crash"); err != nil {
		t.Fatal(err)
	}
	waitState(t, e, first, sessions.StateError)
	create(t, e, f, "three, once one has ended")
}

// A token derived from another (an orchestrator's, minted for its agent)
// counts against the quota of its chain's top, so that minting children
// does not multiply what one credential may hold. A token of another chain
// keeps its own.
func TestDerivedTokensShareTheirChainsQuota(t *testing.T) {
	e, _ := limited(t, 10, 10, 2)
	f := owner("fay")
	child := sessions.Owner{TokenID: "tok-fay-child", TokenName: "fay's orchestrator", ID: f.TokenID, Quota: f.TokenID, MCPSession: "mcp-child"}
	grandchild := sessions.Owner{TokenID: "tok-fay-grandchild", TokenName: "its worker", ID: f.TokenID, Quota: f.TokenID, MCPSession: "mcp-grandchild"}
	create(t, e, f, "one")
	create(t, e, child, "two, by the child")
	_, err := e.Create(ctxT(t), grandchild, sessions.CreateRequest{Cwd: t.TempDir(), Prompt: "three"})
	wantErr(t, err, sessions.ErrQuota, "max_sessions_per_token")
	_, err = e.Create(ctxT(t), f, sessions.CreateRequest{Cwd: t.TempDir(), Prompt: "three"})
	wantErr(t, err, sessions.ErrQuota, "max_sessions_per_token")
	create(t, e, owner("gus"), "gus is fine")
}

// TestCounts: what the gateway's gauges read: the sessions that have not
// ended, and the agent processes. A session whose idle agent was stopped
// to make room is still open, with no process.
func TestCounts(t *testing.T) {
	e, logs := limited(t, 2, 2, 10)
	if open, agents := e.Counts(); open != 0 || agents != 0 {
		t.Fatalf("a new engine counts %d open sessions and %d agents", open, agents)
	}
	for i := range 2 {
		waitState(t, e, create(t, e, owner("ann"), fmt.Sprintf("a%d", i)), sessions.StateIdle)
	}
	if open, agents := e.Counts(); open != 2 || agents != 2 {
		t.Fatalf("two idle sessions: %d open, %d agents; want 2 and 2", open, agents)
	}
	waitState(t, e, create(t, e, owner("ben"), "b"), sessions.StateIdle)
	if len(madeRoomBy(logs)) != 1 {
		t.Fatalf("no agent was stopped to make room at max_agents 2; logs:\n%s", logs)
	}
	if open, agents := e.Counts(); open != 3 || agents != 2 {
		t.Fatalf("three sessions, one agent stopped for room: %d open, %d agents; want 3 and 2", open, agents)
	}
}

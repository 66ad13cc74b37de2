package sessions_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"

	"github.com/Tahul/caddy-zidane-mcp/sessions"
)

// person is token of owner name, on an MCP session of its own.
func person(name, token string) sessions.Owner {
	return sessions.Owner{TokenID: "tok-" + token, TokenName: token, ID: name, MCPSession: "mcp-" + token}
}

// The attack of the issue: bob, who holds chat like alice, approved
// `rm -rf /srv/prod` in alice's session and took her events with a send.
// Each verb bob tries on alice's session is refused, and nothing of hers
// moves.
func TestAnotherOwnerCannotTouchASession(t *testing.T) {
	e, _ := newEngine(t)
	alice, bob := person("alice", "alice-laptop"), person("bob", "bob-laptop")
	id := create(t, e, alice, "approve: rm -rf /srv/prod")
	it := pendingOne(t, e, id)
	before := eventsOf(e, id, "")

	ctx := ctxT(t)
	for _, tc := range []struct {
		verb string
		try  func() error
	}{
		{"send", func() error { _, err := e.Send(ctx, bob, id, "and /home too"); return err }},
		{"steer", func() error { _, err := e.Steer(ctx, bob, id, "hurry"); return err }},
		{"cancel", func() error { return e.Cancel(ctx, bob, id) }},
		{"answer", func() error {
			return e.Answer(ctx, bob, it.RequestID, sessions.Answer{Decision: "allow"})
		}},
		{"read", func() error { _, err := e.Read(bob, id, true); return err }},
		{"transcript", func() error { _, err := e.Transcript(bob, id, 0, true); return err }},
		{"wait", func() error { _, err := e.Wait(ctx, bob, id, time.Millisecond); return err }},
		{"events", func() error { _, err := e.Events(bob, sessions.EventFilter{SessionID: id}); return err }},
		{"pending", func() error { _, err := e.Pending(bob, id); return err }},
	} {
		err := tc.try()
		if !errors.Is(err, sessions.ErrNotOwner) {
			t.Errorf("bob %s on alice's session: %v, want ErrNotOwner", tc.verb, err)
			continue
		}
		if strings.Contains(err.Error(), "alice") {
			t.Errorf("bob %s: the refusal names alice's token: %v", tc.verb, err)
		}
	}
	if list, _ := e.List(bob, 100); len(list) != 0 {
		t.Errorf("bob lists %+v", list)
	}
	if evs, _ := e.Events(bob, sessions.EventFilter{Limit: 100}); len(evs) != 0 {
		t.Errorf("bob sees events %+v", evs)
	}
	if p, _ := e.Pending(bob, ""); len(p) != 0 {
		t.Errorf("bob sees pending %+v", p)
	}
	// A request id bob learned some other way gets the same refusal once
	// it is answered: he learns nothing of how it ended.
	if err := e.Answer(ctx, alice, it.RequestID, sessions.Answer{Decision: "reject"}); err != nil {
		t.Fatal(err)
	}
	waitState(t, e, id, sessions.StateIdle)
	wantErr(t, e.Answer(ctx, bob, it.RequestID, sessions.Answer{Decision: "allow"}), sessions.ErrNotOwner)
	if msg := lastMessage(t, e, id); msg != "Rejected: rm -rf /srv/prod" {
		t.Fatalf("alice's session ended with %q", msg)
	}
	evs := eventsOf(e, id, "")
	if len(evs) != len(before)+1 || slices.ContainsFunc(evs, func(ev sessions.Event) bool { return ev.Target != "mcp-alice-laptop" }) {
		t.Fatalf("alice's events = %+v, want all of them pushed to her", evs)
	}
}

// Two tokens of one owner share the sessions: her phone acts on what her
// laptop started, and her latest sender gets the events.
func TestTokensOfOneOwnerShareTheirSessions(t *testing.T) {
	e, _ := newEngine(t)
	laptop, phone := person("alice", "laptop"), person("alice", "phone")
	id := create(t, e, laptop, "approve: deploy")
	it := pendingOne(t, e, id)
	if p, err := e.Pending(phone, ""); err != nil || len(p) != 1 {
		t.Fatalf("the phone's pending: %+v, %v", p, err)
	}
	if err := e.Answer(ctxT(t), phone, it.RequestID, sessions.Answer{Decision: "allow"}); err != nil {
		t.Fatal(err)
	}
	waitState(t, e, id, sessions.StateIdle)
	if _, err := e.Send(ctxT(t), phone, id, "and now?"); err != nil {
		t.Fatal(err)
	}
	waitState(t, e, id, sessions.StateIdle)
	evs := eventsOf(e, id, sessions.EventDone)
	if len(evs) != 2 || evs[0].Target != "mcp-phone" || evs[1].Target != "mcp-laptop" {
		t.Fatalf("done events = %+v, want the first to the laptop, the one after the phone's send to the phone", evs)
	}
	list, _ := e.List(phone, 10)
	if len(list) != 1 || list[0].Worker || list[0].Foreign {
		t.Fatalf("the phone lists %+v: alice's session, not created by the phone", list)
	}
}

// Callers that reach other owners' sessions: share_sessions reads them,
// sessions:any acts on them, interactions:any answers them. None of them
// takes the owner's events.
func TestAccessToOtherOwnersSessions(t *testing.T) {
	e, _ := newEngine(t)
	alice := person("alice", "alice")
	id := create(t, e, alice, "approve: publish")
	it := pendingOne(t, e, id)
	ctx := ctxT(t)

	shared := person("bob", "bob")
	shared.OtherSessions, shared.OtherInteractions = sessions.AccessRead, sessions.AccessRead
	if v, err := e.Read(shared, id, false); err != nil || v.SessionID != id {
		t.Fatalf("share_sessions read: %v", err)
	}
	if list, _ := e.List(shared, 10); len(list) != 1 || !list[0].Foreign {
		t.Fatalf("share_sessions list: %+v", list)
	}
	if p, err := e.Pending(shared, ""); err != nil || len(p) != 1 {
		t.Fatalf("share_sessions pending: %+v %v", p, err)
	}
	_, err := e.Send(ctx, shared, id, "hi")
	wantErr(t, err, sessions.ErrNotOwner)
	wantErr(t, e.Answer(ctx, shared, it.RequestID, sessions.Answer{Decision: "allow"}), sessions.ErrNotOwner)

	admin := person("ops", "ops")
	admin.OtherSessions = sessions.AccessAll
	wantErr(t, e.Answer(ctx, admin, it.RequestID, sessions.Answer{Decision: "allow"}), sessions.ErrNotOwner)
	if _, err := e.Pending(admin, id); !errors.Is(err, sessions.ErrNotOwner) {
		t.Fatalf("sessions:any without interactions:any, pending: %v", err)
	}
	admin.OtherInteractions = sessions.AccessAll
	if err := e.Answer(ctx, admin, it.RequestID, sessions.Answer{Decision: "allow"}); err != nil {
		t.Fatalf("interactions:any answer: %v", err)
	}
	waitState(t, e, id, sessions.StateIdle)
	if _, err := e.Send(ctx, admin, id, "one more"); err != nil {
		t.Fatalf("sessions:any send: %v", err)
	}
	waitState(t, e, id, sessions.StateIdle)
	for _, ev := range eventsOf(e, id, "") {
		if ev.Target != "mcp-alice" {
			t.Fatalf("event %+v went to %s: a send of another owner moved alice's events", ev, ev.Target)
		}
	}
}

// Sessions keep their owner across a restart; a record written before
// owners existed belongs to the token that created it.
func TestOwnerSurvivesARestart(t *testing.T) {
	st := &certmagic.FileStorage{Path: t.TempDir()}
	useStore := func(c *sessions.Config) { c.Storage = st }
	laptop, phone := person("alice", "laptop"), person("alice", "phone")
	e1, _ := newEngine(t, useStore)
	id := create(t, e1, laptop, "hello")
	waitState(t, e1, id, sessions.StateIdle)
	old := create(t, e1, laptop, "from an older version")
	waitState(t, e1, old, sessions.StateIdle)
	e1.Close()

	// Make old look like what an older version wrote: no owner.
	ctx := context.Background()
	for _, name := range []string{"session.json", "events.json"} {
		key := "zidane/sessions/" + old + "/" + name
		b, err := st.Load(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		var v any
		json.Unmarshal(b, &v)
		strip := func(m map[string]any) { delete(m, "owner") }
		switch v := v.(type) {
		case map[string]any:
			strip(v)
		case []any:
			for _, ev := range v {
				strip(ev.(map[string]any))
			}
		}
		b, _ = json.Marshal(v)
		if err := st.Store(ctx, key, b); err != nil {
			t.Fatal(err)
		}
	}

	e2, _ := newEngine(t, useStore)
	waitState(t, e2, id, sessions.StateIdle)
	if _, err := e2.Send(ctxT(t), phone, id, "still mine"); err != nil {
		t.Fatalf("the owner's other token after a restart: %v", err)
	}
	_, err := e2.Send(ctxT(t), phone, old, "not the creator's token")
	wantErr(t, err, sessions.ErrNotOwner)
	if _, err := e2.Send(ctxT(t), sessions.Owner{TokenID: laptop.TokenID, TokenName: "laptop"}, old, "the creator's token"); err != nil {
		t.Fatalf("an old record's creator: %v", err)
	}
	if evs, err := e2.Events(sessions.Owner{TokenID: laptop.TokenID}, sessions.EventFilter{SessionID: old}); err != nil || len(evs) == 0 {
		t.Fatalf("an old record's events to its creator: %+v %v", evs, err)
	}
	_, err = e2.Events(bobOf(), sessions.EventFilter{SessionID: id})
	wantErr(t, err, sessions.ErrNotOwner)
}

func bobOf() sessions.Owner { return person("bob", "bob") }

// The gateway hears of a session's end (to delete its agent's tokens), and
// each launch of its agent carries the owner and the creator's latest
// credential expiry (to bound them).
func TestHooksSeeTheOwnerAndTheEnd(t *testing.T) {
	var mu sync.Mutex
	var launches []sessions.SessionInfo
	var logs syncBuffer
	ended := make(chan string, 10)
	e, _ := newEngine(t, func(c *sessions.Config) {
		c.Limits.IdleTimeout = 20 * time.Millisecond
		c.Logger = slog.New(slog.NewTextHandler(&logs, nil))
		c.MCPServers = func(s sessions.SessionInfo) []sessions.McpServer {
			mu.Lock()
			launches = append(launches, s)
			mu.Unlock()
			return nil
		}
		c.Ended = func(id string) { ended <- id }
	})
	launched := func() int { mu.Lock(); defer mu.Unlock(); return len(launches) }
	stopped := func(n int) func() bool {
		return func() bool { return strings.Count(logs.String(), "agent stopped after being idle") == n }
	}
	soon := time.Now().Add(time.Hour).UTC()
	alice := person("alice", "jwt")
	alice.TokenID, alice.Expires = "jwt:alice", &soon
	id := create(t, e, alice, "hello")
	waitState(t, e, id, sessions.StateIdle)
	eventually(t, "the idle agent to stop", stopped(1))

	// Another owner's permitted send does not refresh the expiry; the
	// creator's fresh credential does.
	later := soon.Add(time.Hour)
	admin := person("ops", "ops")
	admin.OtherSessions, admin.Expires = sessions.AccessAll, &later
	if _, err := e.Send(ctxT(t), admin, id, "ops here"); err != nil {
		t.Fatal(err)
	}
	waitState(t, e, id, sessions.StateIdle)
	eventually(t, "the relaunched agent to stop", stopped(2))
	fresh := alice
	fresh.Expires = &later
	if _, err := e.Send(ctxT(t), fresh, id, "me again"); err != nil {
		t.Fatal(err)
	}
	waitState(t, e, id, sessions.StateIdle)
	if n := launched(); n != 3 {
		t.Fatalf("%d launches, want 3", n)
	}
	mu.Lock()
	for i, want := range []time.Time{soon, soon, later} {
		got := launches[i].Owner
		if got.ID != "alice" || got.TokenID != "jwt:alice" || got.Expires == nil || !got.Expires.Equal(want) {
			t.Errorf("launch %d: owner %+v, want alice's jwt expiring at %v", i+1, got, want)
		}
	}
	mu.Unlock()
	if !e.Alive(id) {
		t.Fatal("a live session is not Alive")
	}

	crashed := create(t, e, alice, "crash")
	waitState(t, e, crashed, sessions.StateError)
	select {
	case got := <-ended:
		if got != crashed {
			t.Fatalf("Ended(%s), want %s", got, crashed)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Ended was not called for a session whose agent crashed")
	}
	if e.Alive(crashed) || e.Alive("ses_none") {
		t.Fatal("a crashed or unknown session is Alive")
	}
}

// Sessions dropped past max_sessions are ended for the gateway too.
func TestEvictedSessionsEnd(t *testing.T) {
	ended := make(chan string, 10)
	e, _ := newEngine(t, func(c *sessions.Config) {
		c.Limits.MaxSessions, c.Limits.MaxSessionsPerToken = 2, 2
		c.Ended = func(id string) { ended <- id }
	})
	o := person("alice", "alice")
	first := create(t, e, o, "crash")
	waitState(t, e, first, sessions.StateError)
	select {
	case got := <-ended:
		if got != first {
			t.Fatalf("Ended(%s) for the crash, want %s", got, first)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Ended was not called for a session whose agent crashed")
	}
	create(t, e, o, "two")
	create(t, e, o, "three") // drops the crashed one
	select {
	case got := <-ended:
		if got != first {
			t.Fatalf("Ended(%s) at eviction, want %s", got, first)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Ended was not called for an evicted session")
	}
}

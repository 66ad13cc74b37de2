package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// prose returns n characters of words, starting with tag, ending in a
// letter (the demo agent trims its prompt), and all ASCII so characters
// and bytes agree.
func prose(tag string, n int) string {
	var b strings.Builder
	b.WriteString(tag)
	for i := 0; b.Len() < n; i++ {
		fmt.Fprintf(&b, " word%04d", i)
	}
	s := b.String()[:n]
	if strings.HasSuffix(s, " ") {
		s = s[:n-1] + "z"
	}
	return s
}

// TestSessionsLimits checks the documented output limits through what the
// tools answer: read cuts the last message at 600 characters, transcript
// cuts each prompt and answer at 1200 and shows 10 turns by default and 50
// at most, wait waits 30 seconds by default and 50 at most, and events
// shows 20 by default and 100 at most. full: true always gives the whole
// text.
func TestSessionsLimits(t *testing.T) {
	gw := startSessionsGateway(t, "", "")
	token := createToken(t, gw.c, "limits", "--scope", "chat")
	g := connectGoSessions(t, gw.url, token, "go-sdk")
	ts := connectTSSessions(t, gw.url, token, "typescript")
	dir := t.TempDir()

	t.Run("read cuts the last message at 600 characters unless full", func(t *testing.T) {
		prompt := prose("long echo", 1000)
		id := createSession(t, g, dir, prompt).SessionID
		settleIn(t, g, id, "idle")
		whole := "You said: " + prompt
		for _, c := range []sessionsClient{g, ts} {
			a := sessionsCall(t, c, "read", map[string]any{"sessionId": id})
			var v sessionView
			a.decode(t, &v)
			if utf8.RuneCountInString(v.LastMessage) != 600 || !v.Truncated || !strings.HasPrefix(whole, v.LastMessage) {
				t.Errorf("%s: read: %d characters, truncated %v; want the first 600 of the %d", c.name(), utf8.RuneCountInString(v.LastMessage), v.Truncated, len(whole))
			}
			if !strings.Contains(a.Text, "cut at 600 characters; read with full: true") {
				t.Errorf("%s: read text does not say it was cut:\n%s", c.name(), a.Text)
			}
			if v := readSession(t, c, id, true); v.LastMessage != whole || v.Truncated {
				t.Errorf("%s: read full: %d characters, truncated %v; want all %d", c.name(), len(v.LastMessage), v.Truncated, len(whole))
			}
		}
		var l listView
		sessionsCall(t, g, "list", nil).decode(t, &l)
		for _, v := range l.Sessions {
			if v.SessionID == id && (utf8.RuneCountInString(v.LastMessage) > 600 || !v.Truncated) {
				t.Errorf("list shows %d characters of the last message, truncated %v", utf8.RuneCountInString(v.LastMessage), v.Truncated)
			}
		}
		var w waitView
		sessionsCall(t, g, "wait", map[string]any{"sessionId": id}).decode(t, &w)
		if utf8.RuneCountInString(w.LastMessage) != 600 || !w.Truncated {
			t.Errorf("wait shows %d characters of the last message, truncated %v", utf8.RuneCountInString(w.LastMessage), w.Truncated)
		}
	})

	t.Run("transcript cuts each prompt and answer at 1200 characters unless full", func(t *testing.T) {
		medium := prose("medium echo", 1000) // answer 1010 characters: under the cut
		long := prose("long echo", 2000)     // answer 2010 characters: over it
		id := createSession(t, g, dir, medium).SessionID
		sendPrompt(t, g, id, long)
		settleIn(t, g, id, "idle")
		for _, c := range []sessionsClient{g, ts} {
			a := sessionsCall(t, c, "transcript", map[string]any{"sessionId": id})
			var tr transcriptView
			a.decode(t, &tr)
			if len(tr.Turns) != 2 {
				t.Fatalf("%s: %d turns", c.name(), len(tr.Turns))
			}
			m, l := tr.Turns[0], tr.Turns[1]
			if m.Prompt != medium || m.Answer != "You said: "+medium || m.Truncated {
				t.Errorf("%s: a turn under 1200 characters came back cut: prompt %d of %d characters, answer %d of %d, truncated %v",
					c.name(), utf8.RuneCountInString(m.Prompt), len(medium), utf8.RuneCountInString(m.Answer), len(medium)+10, m.Truncated)
			}
			if m.Index != 1 || m.StopReason != "end_turn" {
				t.Errorf("%s: turn 1 = index %d stop %q", c.name(), m.Index, m.StopReason)
			}
			if l.Prompt != long[:1200] || l.Answer != ("You said: " + long)[:1200] || !l.Truncated || !tr.Truncated {
				t.Errorf("%s: a turn over 1200 characters: prompt %d characters (want the first 1200 of %d), answer %d, truncated %v (transcript %v)",
					c.name(), utf8.RuneCountInString(l.Prompt), len(long), utf8.RuneCountInString(l.Answer), l.Truncated, tr.Truncated)
			}
			if !strings.Contains(a.Text, "cut at 1200 characters") {
				t.Errorf("%s: transcript text does not name the cut:\n%.300s", c.name(), a.Text)
			}
			var full transcriptView
			sessionsCall(t, c, "transcript", map[string]any{"sessionId": id, "full": true}).decode(t, &full)
			if len(full.Turns) != 2 || full.Turns[1].Prompt != long || full.Turns[1].Answer != "You said: "+long || full.Truncated ||
				full.Turns[0].Answer != "You said: "+medium {
				t.Errorf("%s: transcript full: %+v", c.name(), full.Turns)
			}
		}
	})

	t.Run("transcript shows the last 10 turns by default and 50 at most", func(t *testing.T) {
		id := createSession(t, g, dir, "turn 1").SessionID
		for i := 2; i <= 12; i++ {
			sendPrompt(t, g, id, fmt.Sprintf("turn %d", i))
		}
		if v := settleIn(t, g, id, "idle"); v.Turns != 12 {
			t.Fatalf("after 12 prompts: %+v", v)
		}
		indexes := func(tr transcriptView) (first, last, n int) {
			if len(tr.Turns) == 0 {
				return 0, 0, 0
			}
			return tr.Turns[0].Index, tr.Turns[len(tr.Turns)-1].Index, len(tr.Turns)
		}
		for _, tc := range []struct {
			args               map[string]any
			first, last, count int
			note               string
		}{
			{nil, 3, 12, 10, ""},
			{map[string]any{"turns": 11}, 2, 12, 11, ""},
			{map[string]any{"turns": 50}, 1, 12, 12, ""},
			{map[string]any{"turns": 150}, 1, 12, 12, "`turns` 150 is above the maximum: used 50"},
		} {
			for _, c := range []sessionsClient{g, ts} {
				tr := transcriptOf(t, c, id, tc.args)
				first, last, n := indexes(tr)
				if first != tc.first || last != tc.last || n != tc.count {
					t.Errorf("%s: transcript %v: turns %d..%d (%d), want %d..%d (%d)", c.name(), tc.args, first, last, n, tc.first, tc.last, tc.count)
				}
				if got := strings.Join(tr.Notes, "; "); got != tc.note {
					t.Errorf("%s: transcript %v: notes %q, want %q", c.name(), tc.args, got, tc.note)
				}
			}
		}
		if msg := callRefused(t, g, "sessions", map[string]any{"verb": "transcript", "sessionId": id, "turns": 0}, "bad_input"); !strings.Contains(msg, "at least 1") {
			t.Errorf("turns 0: %s", msg)
		}
	})

	t.Run("wait waits 30 seconds by default and 50 at most", func(t *testing.T) {
		id := createSession(t, g, dir, "ready").SessionID
		settleIn(t, g, id, "idle")
		for _, tc := range []struct {
			args    map[string]any
			timeout int
			note    string
		}{
			{nil, 30, ""},
			{map[string]any{"timeout": 7}, 7, ""},
			{map[string]any{"timeout": 50}, 50, ""},
			{map[string]any{"timeout": 120}, 50, "`timeout` 120 is above the maximum: used 50 seconds"},
		} {
			for _, c := range []sessionsClient{g, ts} {
				args := map[string]any{"sessionId": id}
				for k, v := range tc.args {
					args[k] = v
				}
				a := sessionsCall(t, c, "wait", args)
				var w waitView
				a.decode(t, &w)
				if w.TimeoutSeconds != tc.timeout || !w.Settled || w.State != "idle" || strings.Join(w.Notes, "; ") != tc.note {
					t.Errorf("%s: wait %v on an idle session = %s; want timeout %d, settled, note %q", c.name(), tc.args, a.Data, tc.timeout, tc.note)
				}
				if tc.note != "" && !strings.HasPrefix(a.Text, "Note: "+tc.note) {
					t.Errorf("%s: wait text does not start with the note:\n%s", c.name(), a.Text)
				}
			}
		}
		if msg := callRefused(t, g, "sessions", map[string]any{"verb": "wait", "sessionId": id, "timeout": 0}, "bad_input"); !strings.Contains(msg, "at least 1") {
			t.Errorf("timeout 0: %s", msg)
		}
	})

	t.Run("wait returns as soon as the session is blocked or idle", func(t *testing.T) {
		// Each call's own deadline is shorter than the wait it asks for:
		// only a wait that returns when the session settles can meet it.
		for _, tc := range []struct{ prompt, state string }{
			{"approve: make release", "blocked"},
			{"sleep: 2s", "idle"},
		} {
			id := createSession(t, g, dir, tc.prompt).SessionID
			ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
			a, err := g.callCtx(ctx, "sessions", map[string]any{"verb": "wait", "sessionId": id, "timeout": 50})
			cancel()
			if err != nil {
				t.Fatalf("wait 50 for a session that turns %s did not return before 40s: %v", tc.state, err)
			}
			var w waitView
			a.decode(t, &w)
			if w.State != tc.state || !w.Settled || w.TimeoutSeconds != 50 {
				t.Fatalf("wait for %q = %s, want settled %s", tc.prompt, a.Data, tc.state)
			}
		}
	})
}

// TestSessionsListLimit creates 32 sessions (32 demo-agent processes) and
// checks list: 30 by default with partial set, at most 100, newest first.
// Their 32 finished events check the limits of events: 20 by default, 100
// at most.
func TestSessionsListLimit(t *testing.T) {
	// One token launches all 32 at once, past the default
	// max_agents_per_token (16): this test is about list, not quotas.
	gw := startSessionsGateway(t, "max_agents_per_token 32", "")
	token := createToken(t, gw.c, "lister", "--scope", "chat", "--owner", "lister")
	phone := createToken(t, gw.c, "lister-phone", "--scope", "chat", "--owner", "lister")
	stranger := createToken(t, gw.c, "stranger", "--scope", "chat")
	g := connectGoSessions(t, gw.url, token, "go-sdk")
	dir := t.TempDir()

	const n = 32
	ids := make([]string, n)
	for i := range n {
		ids[i] = createSession(t, g, dir, fmt.Sprintf("session %02d", i+1)).SessionID
	}
	for _, id := range ids {
		settleIn(t, g, id, "idle")
	}
	newestFirst := func(got []sessionView) bool {
		for i, v := range got {
			if v.SessionID != ids[n-1-i] {
				return false
			}
		}
		return true
	}
	for _, tc := range []struct {
		args    map[string]any
		count   int
		limit   int
		partial bool
		note    string
	}{
		{nil, 30, 30, true, ""},
		{map[string]any{"limit": 31}, 31, 31, true, ""},
		{map[string]any{"limit": 32}, 32, 32, false, ""},
		{map[string]any{"limit": 100}, 32, 100, false, ""},
		{map[string]any{"limit": 150}, 32, 100, false, "`limit` 150 is above the maximum: used 100"},
	} {
		t.Run(fmt.Sprintf("limit %v", tc.args["limit"]), func(t *testing.T) {
			a := sessionsCall(t, g, "list", tc.args)
			var l listView
			a.decode(t, &l)
			if len(l.Sessions) != tc.count || l.Limit != tc.limit || l.Partial != tc.partial || strings.Join(l.Notes, "; ") != tc.note {
				t.Fatalf("list %v: %d sessions, limit %d, partial %v, notes %q; want %d, %d, %v, %q",
					tc.args, len(l.Sessions), l.Limit, l.Partial, l.Notes, tc.count, tc.limit, tc.partial, tc.note)
			}
			if !newestFirst(l.Sessions) {
				t.Fatalf("list %v is not newest first: first %q", tc.args, l.Sessions[0].Title)
			}
			if tc.partial != strings.Contains(a.Text, "partial: more exist") {
				t.Fatalf("list %v text does not tell whether more exist:\n%.300s", tc.args, a.Text)
			}
			for _, v := range l.Sessions {
				if !v.Worker || v.State != "idle" {
					t.Fatalf("list %v: %+v, want an idle worker", tc.args, v)
				}
			}
		})
	}
	t.Run("another token of the owner sees them, not as its workers", func(t *testing.T) {
		s := connectGoSessions(t, gw.url, phone, "phone")
		var l listView
		sessionsCall(t, s, "list", map[string]any{"limit": 100}).decode(t, &l)
		if len(l.Sessions) != n {
			t.Fatalf("the owner's other token lists %d sessions", len(l.Sessions))
		}
		for _, v := range l.Sessions {
			if v.Worker {
				t.Fatalf("the owner's other token sees %s as its worker", v.SessionID)
			}
		}
	})
	t.Run("another owner's token sees none of them", func(t *testing.T) {
		s := connectGoSessions(t, gw.url, stranger, "stranger")
		var l listView
		sessionsCall(t, s, "list", map[string]any{"limit": 100}).decode(t, &l)
		if len(l.Sessions) != 0 {
			t.Fatalf("stranger lists %d sessions of another owner", len(l.Sessions))
		}
	})
	if msg := callRefused(t, g, "sessions", map[string]any{"verb": "list", "limit": 0}, "bad_input"); !strings.Contains(msg, "at least 1") {
		t.Errorf("limit 0: %s", msg)
	}

	for _, tc := range []struct {
		args  map[string]any
		count int
		limit int
		note  string
	}{
		{nil, 20, 20, ""},
		{map[string]any{"limit": 5}, 5, 5, ""},
		{map[string]any{"limit": 100}, n, 100, ""},
		{map[string]any{"limit": 150}, n, 100, "`limit` 150 is above the maximum: used 100"},
	} {
		t.Run(fmt.Sprintf("events limit %v", tc.args["limit"]), func(t *testing.T) {
			a := sessionsCall(t, g, "events", tc.args)
			var ev eventsView
			a.decode(t, &ev)
			if len(ev.Events) != tc.count || ev.Limit != tc.limit || strings.Join(ev.Notes, "; ") != tc.note {
				t.Fatalf("events %v: %d events, limit %d, notes %q; want %d, %d, %q", tc.args, len(ev.Events), ev.Limit, ev.Notes, tc.count, tc.limit, tc.note)
			}
			if atLimit := tc.count == tc.limit; atLimit != strings.Contains(a.Text, "the limit; older ones may exist") {
				t.Fatalf("events %v text does not tell whether older ones may exist:\n%.200s", tc.args, a.Text)
			}
			seen := map[string]bool{}
			for i, e := range ev.Events {
				if e.Status != "done" || !slices.Contains(ids, e.SessionID) || (i > 0 && e.Seq >= ev.Events[i-1].Seq) {
					t.Fatalf("events %v: event %d is %+v, want the finish of one of the sessions, newest first", tc.args, i, e)
				}
				seen[e.SessionID] = true
			}
			if len(seen) != len(ev.Events) {
				t.Fatalf("events %v: %d events for %d sessions, want one finish each", tc.args, len(ev.Events), len(seen))
			}
		})
	}
}

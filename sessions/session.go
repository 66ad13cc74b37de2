package sessions

import (
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/Tahul/caddy-zidane-mcp/sessions/acpclient"
)

// PreviewChars is how much of the last message `read` shows unless asked
// for all of it.
const PreviewChars = 600

// TranscriptChars is where a transcript cuts each prompt and answer, unless
// full.
const TranscriptChars = 1200

// session is one coding-agent session. Every field but persistMu is
// guarded by Engine.mu.
type session struct {
	rec record // what storage keeps

	agent    *acpclient.Agent // nil before launch, after the agent ended, and while dormant
	gen      int              // launch generation: updates from an older process are ignored
	steering bool             // the running agent advertised _session/steering
	worker   bool             // a goroutine is launching the agent or running turns
	queue    queue
	turn     *turn  // the running turn
	turns    []Turn // finished turns, oldest first, bounded
	bytes    int    // text held in turns
	pending  []*interaction
	events   []Event       // this session's recent events, for storage
	lastErr  string        // why the last turn failed, while the session lives on
	changed  chan struct{} // closed and replaced at every state change (Wait)
	idle     *time.Timer
	// idleSince is when the worker last went idle with the agent running:
	// the least recent is stopped first to make room (see quota.go).
	idleSince time.Time

	persistMu sync.Mutex // orders this session's storage writes
}

// turn is the turn being run.
type turn struct {
	Turn
	answer    strings.Builder
	truncated bool
	gap       bool   // a tool call came since the last text: start a new paragraph
	cancel    string // why it is being cancelled; "" when it is not
	done      chan struct{}
}

func newSession(rec record) *session {
	return &session{rec: rec, changed: make(chan struct{})}
}

// dead reports whether the session can take no more prompts.
func (s *session) dead() bool {
	return s.rec.State == StateEnded || s.rec.State == StateError
}

func (s *session) state() State {
	switch {
	case s.dead():
		return s.rec.State
	case len(s.pending) > 0:
		return StateBlocked
	case s.turn != nil || s.queue.len() > 0:
		return StateRunning
	}
	return StateIdle
}

// notify wakes everyone waiting for a change of this session.
func (s *session) notify() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// lastMessage is the running turn's answer so far, or else the last
// turn's answer.
func (s *session) lastMessage() string {
	if s.turn != nil && s.turn.answer.Len() > 0 {
		return s.turn.answer.String()
	}
	if n := len(s.turns); n > 0 {
		return s.turns[n-1].Answer
	}
	return ""
}

func (s *session) view(full bool) SessionView {
	v := SessionView{
		SessionID: s.rec.ID,
		Title:     s.rec.Title,
		Cwd:       s.rec.Cwd,
		Agent:     s.rec.Agent,
		State:     s.state(),
		Turns:     s.rec.Turns,
		Queued:    s.queue.len(),
		Error:     s.rec.Error,
		Created:   s.rec.Created,
		Updated:   s.rec.Updated,
	}
	if v.Error == "" {
		v.Error = s.lastErr
	}
	v.LastMessage = s.lastMessage()
	if !full {
		v.LastMessage, v.Truncated = cut(v.LastMessage, PreviewChars)
	}
	return v
}

// addTurn keeps a finished turn, dropping the oldest past the limits.
func (s *session) addTurn(t Turn, l Limits) {
	s.turns = append(s.turns, t)
	s.bytes += len(t.Prompt) + len(t.Answer)
	for len(s.turns) > 1 && (len(s.turns) > l.MaxTurns || s.bytes > l.MaxTranscriptBytes) {
		s.bytes -= len(s.turns[0].Prompt) + len(s.turns[0].Answer)
		s.turns[0] = Turn{}
		s.turns = s.turns[1:]
	}
}

// addEvent keeps ev for storage, dropping the oldest past the limit.
func (s *session) addEvent(ev Event, l Limits) {
	s.events = append(s.events, ev)
	if over := len(s.events) - l.MaxSessionEvents; over > 0 {
		s.events = append([]Event(nil), s.events[over:]...)
	}
}

// appendText adds agent text to the running turn, up to max bytes.
func (t *turn) appendText(text string, limit int) {
	if t.truncated || text == "" {
		return
	}
	if t.gap && t.answer.Len() > 0 {
		t.answer.WriteString("\n\n")
	}
	t.gap = false
	if room := limit - t.answer.Len(); len(text) > room {
		text, _ = cutBytes(text, max(room, 0))
		t.answer.WriteString(text)
		t.answer.WriteString("\n[… the rest of this answer was cut: it passed the engine's limit]")
		t.truncated = true
		return
	}
	t.answer.WriteString(text)
}

// cut shortens s to n characters.
func cut(s string, n int) (string, bool) {
	if utf8.RuneCountInString(s) <= n {
		return s, false
	}
	i, count := 0, 0
	for i = range s {
		if count == n {
			break
		}
		count++
	}
	return s[:i] + "…", true
}

// cutBytes shortens s to at most n bytes without splitting a character.
func cutBytes(s string, n int) (string, bool) {
	if len(s) <= n {
		return s, false
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n], true
}

// firstLine is s's first non-empty line, cut to n characters.
func firstLine(s string, n int) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = strings.TrimSpace(s[:i])
	}
	s, _ = cut(s, n)
	return s
}

package mcpendpoint

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/sessions"
)

// memSessions is a small in-memory implementation of the sessions.Sessions
// contract, standing in for the engine: sessions in a map, a FIFO prompt
// queue, first-answer-wins interactions under a mutex, and an event log with
// subscribers. No agent runs: a test ends a turn with finish and raises a
// question with ask. It records the arguments the endpoint passed, so tests
// can check limits without measuring time.
type memSessions struct {
	mu       sync.Mutex
	sessions map[string]*memSession
	order    []string // creation order
	inter    map[string]*memInteraction
	events   []sessions.Event
	subs     map[int]func(sessions.Event)
	nextSub  int
	nextID   int
	seq      int64
	changed  chan struct{} // closed and replaced on every state change
	steering bool          // agents support _session/steering
	// createErr, when set, is what Create returns (a quota, the roots).
	createErr error

	// What the endpoint last passed.
	lastOwner      sessions.Owner
	lastCreate     sessions.CreateRequest
	lastListLimit  int
	lastTurns      int
	lastFull       bool
	lastWait       time.Duration
	lastFilter     sessions.EventFilter
	lastAnswer     sessions.Answer
	lastPendingFor string
}

type memSession struct {
	view    sessions.SessionView
	creator string // token id
	owner   string // the creator's owner
	target  string // MCP session that created or last sent
	turns   []sessions.Turn
	queue   []string
}

type memInteraction struct {
	in       sessions.Interaction
	answered bool
}

func newMemSessions() *memSessions {
	return &memSessions{
		sessions: map[string]*memSession{},
		inter:    map[string]*memInteraction{},
		subs:     map[int]func(sessions.Event){},
		changed:  make(chan struct{}),
	}
}

var _ sessions.Sessions = (*memSessions)(nil)

// emitLocked records an event and calls the subscribers, in seq order.
func (m *memSessions) emitLocked(s *memSession, status sessions.EventStatus, kind, summary, requestID string) sessions.Event {
	m.seq++
	ev := sessions.Event{
		Seq: m.seq, SessionID: s.view.SessionID, Status: status, Kind: kind,
		Summary: summary, RequestID: requestID, Time: time.Now(), Target: s.target,
	}
	m.events = append(m.events, ev)
	for _, fn := range m.subs {
		fn(ev)
	}
	return ev
}

func (m *memSessions) changedLocked() {
	close(m.changed)
	m.changed = make(chan struct{})
}

func (m *memSessions) startTurnLocked(s *memSession, prompt string) {
	s.turns = append(s.turns, sessions.Turn{Index: len(s.turns) + 1, Prompt: prompt, Started: time.Now()})
	s.view.Turns = len(s.turns)
	s.view.State = sessions.StateRunning
	s.view.Updated = time.Now()
	m.changedLocked()
}

func (m *memSessions) Create(_ context.Context, owner sessions.Owner, req sessions.CreateRequest) (sessions.Created, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.lastOwner, m.lastCreate = owner, req
	if m.createErr != nil {
		return sessions.Created{}, m.createErr
	}
	if req.Cwd == "" || req.Prompt == "" {
		return sessions.Created{}, fmt.Errorf("%w: cwd and prompt are required", sessions.ErrBadRequest)
	}
	m.nextID++
	id := fmt.Sprintf("s%d", m.nextID)
	title := req.Title
	if title == "" {
		title, _ = cut(req.Prompt, 40)
	}
	s := &memSession{
		view: sessions.SessionView{
			SessionID: id, Title: title, Cwd: req.Cwd, Agent: req.Agent,
			Link: "http://127.0.0.1/s/" + id, Created: time.Now(),
		},
		creator: owner.TokenID,
		owner:   owner.OwnerID(),
		target:  owner.MCPSession,
	}
	m.sessions[id] = s
	m.order = append(m.order, id)
	m.startTurnLocked(s, req.Prompt)
	return sessions.Created{SessionID: id, Link: s.view.Link}, nil
}

func (m *memSessions) get(id string) (*memSession, error) {
	s, ok := m.sessions[id]
	if !ok {
		return nil, fmt.Errorf("session %q: %w", id, sessions.ErrNoSession)
	}
	return s, nil
}

// memReach is the engine's ownership rule: an owner's own sessions, or
// another's when access is at least need.
func memReach(s *memSession, o sessions.Owner, access, need sessions.Access) error {
	if s.owner == o.OwnerID() || access >= need {
		return nil
	}
	return fmt.Errorf("%w: session %s", sessions.ErrNotOwner, s.view.SessionID)
}

// getFor is get for owner, needing access need in OtherSessions.
func (m *memSessions) getFor(o sessions.Owner, id string, need sessions.Access) (*memSession, error) {
	s, err := m.get(id)
	if err != nil {
		return nil, err
	}
	return s, memReach(s, o, o.OtherSessions, need)
}

func (m *memSessions) Send(_ context.Context, owner sessions.Owner, id, prompt string) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.lastOwner = owner
	s, err := m.getFor(owner, id, sessions.AccessAll)
	if err != nil {
		return false, err
	}
	if s.view.State == sessions.StateEnded {
		return false, sessions.ErrEnded
	}
	if owner.OwnerID() == s.owner && owner.MCPSession != "" {
		// As the engine does: a caller without an MCP session (2026-07-28)
		// moves nothing.
		s.target = owner.MCPSession
	}
	if s.view.State == sessions.StateRunning || s.view.State == sessions.StateBlocked {
		s.queue = append(s.queue, prompt)
		s.view.Queued = len(s.queue)
		return true, nil
	}
	m.startTurnLocked(s, prompt)
	return false, nil
}

func (m *memSessions) Steer(_ context.Context, owner sessions.Owner, id, text string) (string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.lastOwner = owner
	s, err := m.getFor(owner, id, sessions.AccessAll)
	if err != nil {
		return "", err
	}
	if s.view.State != sessions.StateRunning && s.view.State != sessions.StateBlocked {
		return "", sessions.ErrNotRunning
	}
	if m.steering {
		return "steering", nil
	}
	s.queue = append([]string{text}, s.queue...)
	s.view.Queued = len(s.queue)
	return "queued-first", nil
}

func (m *memSessions) Cancel(_ context.Context, owner sessions.Owner, id string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.lastOwner = owner
	s, err := m.getFor(owner, id, sessions.AccessAll)
	if err != nil {
		return err
	}
	if s.view.State != sessions.StateRunning && s.view.State != sessions.StateBlocked {
		return sessions.ErrNotRunning
	}
	for rid, in := range m.inter {
		if in.in.SessionID == id && !in.answered {
			delete(m.inter, rid)
		}
	}
	s.turns[len(s.turns)-1].StopReason = "cancelled"
	s.turns[len(s.turns)-1].Ended = time.Now()
	s.view.State = sessions.StateIdle
	m.changedLocked()
	m.emitLocked(s, sessions.EventCancelled, "cancelled", "turn cancelled", "")
	return nil
}

func (m *memSessions) Read(owner sessions.Owner, id string, full bool) (sessions.SessionView, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.lastOwner, m.lastFull = owner, full
	s, err := m.getFor(owner, id, sessions.AccessRead)
	if err != nil {
		return sessions.SessionView{}, err
	}
	return s.view, nil // LastMessage whole: the endpoint enforces the cut
}

func (m *memSessions) List(owner sessions.Owner, limit int) ([]sessions.SessionView, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.lastOwner, m.lastListLimit = owner, limit
	var out []sessions.SessionView
	seen := 0
	for i := len(m.order) - 1; i >= 0; i-- {
		s := m.sessions[m.order[i]]
		if memReach(s, owner, owner.OtherSessions, sessions.AccessRead) != nil {
			continue
		}
		seen++
		if len(out) < limit {
			v := s.view
			v.Worker = s.creator == owner.TokenID
			v.Foreign = s.owner != owner.OwnerID()
			out = append(out, v)
		}
	}
	return out, seen > limit
}

func (m *memSessions) Transcript(owner sessions.Owner, id string, turns int, full bool) ([]sessions.Turn, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.lastTurns, m.lastFull = turns, full
	s, err := m.getFor(owner, id, sessions.AccessRead)
	if err != nil {
		return nil, err
	}
	start := max(0, len(s.turns)-turns)
	return slices.Clone(s.turns[start:]), nil
}

func (m *memSessions) Wait(ctx context.Context, owner sessions.Owner, id string, timeout time.Duration) (sessions.SessionView, error) {
	m.mu.Lock()
	m.lastWait = timeout
	m.mu.Unlock()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for {
		m.mu.Lock()
		s, err := m.getFor(owner, id, sessions.AccessRead)
		if err != nil {
			m.mu.Unlock()
			return sessions.SessionView{}, err
		}
		v, changed := s.view, m.changed
		m.mu.Unlock()
		if v.State != sessions.StateRunning {
			return v, nil
		}
		select {
		case <-changed:
		case <-timer.C:
			return v, nil
		case <-ctx.Done():
			return v, ctx.Err()
		}
	}
}

func (m *memSessions) Events(owner sessions.Owner, f sessions.EventFilter) ([]sessions.Event, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.lastFilter = f
	if s, ok := m.sessions[f.SessionID]; ok {
		if err := memReach(s, owner, owner.OtherSessions, sessions.AccessRead); err != nil {
			return nil, err
		}
	}
	if f.Limit <= 0 {
		f.Limit = 20
	}
	var out []sessions.Event
	for i := len(m.events) - 1; i >= 0 && len(out) < f.Limit; i-- {
		ev := m.events[i]
		if (f.SessionID == "" || ev.SessionID == f.SessionID) &&
			(f.Status == "" || ev.Status == f.Status) &&
			(f.Text == "" || strings.Contains(strings.ToLower(ev.Summary), strings.ToLower(f.Text))) &&
			ev.Seq > f.Since &&
			memReach(m.sessions[ev.SessionID], owner, owner.OtherSessions, sessions.AccessRead) == nil {
			out = append(out, ev)
		}
	}
	return out, nil
}

func (m *memSessions) Pending(owner sessions.Owner, id string) ([]sessions.Interaction, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.lastPendingFor = id
	if s, ok := m.sessions[id]; ok {
		if err := memReach(s, owner, owner.OtherInteractions, sessions.AccessRead); err != nil {
			return nil, err
		}
	}
	var out []sessions.Interaction
	for _, in := range m.inter {
		if !in.answered && (id == "" || in.in.SessionID == id) &&
			memReach(m.sessions[in.in.SessionID], owner, owner.OtherInteractions, sessions.AccessRead) == nil {
			out = append(out, in.in)
		}
	}
	slices.SortFunc(out, func(a, b sessions.Interaction) int { return strings.Compare(a.RequestID, b.RequestID) })
	return out, nil
}

func (m *memSessions) Answer(_ context.Context, owner sessions.Owner, requestID string, ans sessions.Answer) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.lastOwner, m.lastAnswer = owner, ans
	in, ok := m.inter[requestID]
	if !ok {
		return sessions.ErrNoInteraction
	}
	if err := memReach(m.sessions[in.in.SessionID], owner, owner.OtherInteractions, sessions.AccessAll); err != nil {
		return err
	}
	if in.answered {
		return sessions.ErrAlreadyAnswered
	}
	if (in.in.Kind == sessions.KindQuestion) != (ans.Action != "") {
		return fmt.Errorf("%w: %s %s needs a matching answer", sessions.ErrBadRequest, in.in.Kind, requestID)
	}
	in.answered = true
	s := m.sessions[in.in.SessionID]
	s.view.State = sessions.StateRunning
	m.changedLocked()
	return nil
}

func (m *memSessions) Subscribe(fn func(sessions.Event)) func() {
	m.mu.Lock()
	defer m.mu.Unlock()
	id := m.nextSub
	m.nextSub++
	m.subs[id] = fn
	return func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		delete(m.subs, id)
	}
}

func (m *memSessions) RevokeToken(tokenID string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, id := range m.order {
		s := m.sessions[id]
		if s.creator == tokenID && s.view.State == sessions.StateRunning {
			s.view.State = sessions.StateIdle
			m.emitLocked(s, sessions.EventCancelled, "cancelled", "token revoked", "")
		}
	}
	m.changedLocked()
}

// finish ends the running turn of id with answer, as an agent would, and
// starts the next queued prompt.
func (m *memSessions) finish(id, answer string) sessions.Event {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.sessions[id]
	t := &s.turns[len(s.turns)-1]
	t.Answer, t.StopReason, t.Ended = answer, "end_turn", time.Now()
	s.view.LastMessage = answer
	s.view.State = sessions.StateIdle
	ev := m.emitLocked(s, sessions.EventDone, "finished", "turn finished: "+firstLine(answer), "")
	if len(s.queue) > 0 {
		next := s.queue[0]
		s.queue = s.queue[1:]
		s.view.Queued = len(s.queue)
		m.startTurnLocked(s, next)
	} else {
		m.changedLocked()
	}
	return ev
}

// ask makes the running turn of id wait on an interaction.
func (m *memSessions) ask(id string, kind sessions.InteractionKind, summary string, payload any) (string, sessions.Event) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.sessions[id]
	raw, _ := json.Marshal(payload)
	rid := fmt.Sprintf("r%d", len(m.inter)+1)
	m.inter[rid] = &memInteraction{in: sessions.Interaction{
		RequestID: rid, SessionID: id, Kind: kind, Summary: summary, Payload: raw, Created: time.Now(),
	}}
	s.view.State = sessions.StateBlocked
	m.changedLocked()
	return rid, m.emitLocked(s, sessions.EventNeedsAttention, "needs-attention", summary, rid)
}

// seed adds n sessions created by tokenID, with turns turns each.
func (m *memSessions) seed(n int, tokenID string) []string {
	ids := make([]string, n)
	for i := range ids {
		c, _ := m.Create(context.Background(), sessions.Owner{TokenID: tokenID}, sessions.CreateRequest{Cwd: "/repo", Prompt: fmt.Sprintf("task %d", i)})
		m.finish(c.SessionID, fmt.Sprintf("done %d", i))
		ids[i] = c.SessionID
	}
	return ids
}

func (m *memSessions) state(id string) sessions.State {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.sessions[id].view.State
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(s, "\n")
	l, _ = cut(l, 80)
	return l
}

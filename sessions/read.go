package sessions

import (
	"context"
	"time"
)

// Read returns a session's view; LastMessage is cut to PreviewChars
// unless full.
func (e *Engine) Read(owner Owner, sessionID string, full bool) (SessionView, error) {
	e.mu.Lock()
	s, err := e.sessionLocked(sessionID, owner, owner.OtherSessions, AccessRead)
	if err != nil {
		e.mu.Unlock()
		return SessionView{}, err
	}
	v := s.view(full)
	e.mu.Unlock()
	v.Link = e.link(sessionID) // outside the lock: LinkFor is the caller's code
	return v, nil
}

// List returns the sessions owner sees (its owner's, or every owner's with
// AccessRead), newest first, at most limit (20 when limit <= 0), and
// whether more exist. Worker marks the ones owner's token created, Foreign
// those of other owners.
func (e *Engine) List(owner Owner, limit int) ([]SessionView, bool) {
	if limit <= 0 {
		limit = 20
	}
	e.mu.Lock()
	all := make([]*session, 0, len(e.sessions))
	for _, s := range e.sessions {
		if reach(s, owner, owner.OtherSessions, AccessRead) == nil {
			all = append(all, s)
		}
	}
	out := make([]SessionView, len(all))
	for i, s := range all {
		out[i] = ListedView(s.view(false), owner, s.rec.Owner, s.rec.OwnerTokenID)
	}
	e.mu.Unlock()
	SortViews(out)
	n := min(limit, len(out))
	out = out[:n]
	for i := range out {
		out[i].Link = e.link(out[i].SessionID)
	}
	return out, len(all) > n
}

// Transcript returns the last turns (all kept turns when turns <= 0),
// oldest first, the running one last. Prompts and answers are cut to
// TranscriptChars unless full.
func (e *Engine) Transcript(owner Owner, sessionID string, turns int, full bool) ([]Turn, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	s, err := e.sessionLocked(sessionID, owner, owner.OtherSessions, AccessRead)
	if err != nil {
		return nil, err
	}
	list := append([]Turn(nil), s.turns...)
	if s.turn != nil {
		t := s.turn.Turn
		t.Answer = s.turn.answer.String()
		list = append(list, t)
	}
	if turns > 0 && len(list) > turns {
		list = list[len(list)-turns:]
	}
	if !full {
		for i := range list {
			list[i].Prompt, _ = cut(list[i].Prompt, TranscriptChars)
			list[i].Answer, _ = cut(list[i].Answer, TranscriptChars)
		}
	}
	return list, nil
}

// Wait returns once the session is idle, blocked, ended or errored, or
// once timeout has passed or ctx ended, with the session's view then.
func (e *Engine) Wait(ctx context.Context, owner Owner, sessionID string, timeout time.Duration) (SessionView, error) {
	var timer <-chan time.Time
	if timeout > 0 {
		t := time.NewTimer(timeout)
		defer t.Stop()
		timer = t.C
	}
	for {
		e.mu.Lock()
		s, err := e.sessionLocked(sessionID, owner, owner.OtherSessions, AccessRead)
		if err != nil {
			e.mu.Unlock()
			return SessionView{}, err
		}
		v := s.view(false)
		changed := s.changed
		e.mu.Unlock()
		v.Link = e.link(sessionID)
		if v.State != StateRunning || timer == nil {
			return v, nil
		}
		select {
		case <-changed:
		case <-timer:
			return e.Read(owner, sessionID, false)
		case <-ctx.Done():
			return v, ctx.Err()
		}
	}
}

// Events returns the events filter selects among those of the sessions
// owner sees, newest first. A filter on a session that owner does not
// reach gets ErrNotOwner; a session that is gone (dropped past
// MaxSessions) still shows its events to its owner.
func (e *Engine) Events(owner Owner, filter EventFilter) ([]Event, error) {
	if filter.SessionID != "" {
		e.mu.Lock()
		s := e.sessions[filter.SessionID]
		var err error
		if s != nil {
			err = reach(s, owner, owner.OtherSessions, AccessRead)
		}
		e.mu.Unlock()
		if err != nil {
			return nil, err
		}
	}
	return e.events.query(filter, visibleEvents(owner)), nil
}

// LastEventSeq is the number of the last event the engine recorded (0
// before any).
func (e *Engine) LastEventSeq() int64 {
	e.events.mu.Lock()
	defer e.events.mu.Unlock()
	return e.events.seq
}

// Subscribe calls fn with every new event, in Seq order, from a goroutine
// of the subscription's own, until unsubscribe is called (a call already
// under way may still complete). A subscriber that falls 1,024 events
// behind loses the oldest of them; Events still has them.
func (e *Engine) Subscribe(fn func(Event)) func() {
	return e.events.subscribe(fn)
}

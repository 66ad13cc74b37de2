package sessions

import (
	"context"
	"fmt"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/sessions/acpclient"
)

// sessionLocked returns session id when owner's access reaches it: its own
// owner's, or another's when access (OtherSessions or OtherInteractions)
// is at least need.
func (e *Engine) sessionLocked(id string, owner Owner, access, need Access) (*session, error) {
	s := e.sessions[id]
	if s == nil {
		return nil, fmt.Errorf("%w: %q; list the sessions to find its id", ErrNoSession, id)
	}
	if err := reach(s, owner, access, need); err != nil {
		return nil, err
	}
	return s, nil
}

// reach refuses owner a session of another owner unless access reaches
// need. The error names the session, never whose it is.
func reach(s *session, owner Owner, access, need Access) error {
	if Sees(owner, s.rec.Owner, access, need) {
		return nil
	}
	return fmt.Errorf("%w: session %s", ErrNotOwner, s.rec.ID)
}

// liveSessionLocked returns a session that owner may act on and that can
// take prompts. Ownership is decided first, so a stranger learns nothing of
// the session's state.
func (e *Engine) liveSessionLocked(id string, owner Owner) (*session, error) {
	if e.closed {
		return nil, ErrClosed
	}
	s, err := e.sessionLocked(id, owner, owner.OtherSessions, AccessAll)
	if err != nil {
		return nil, err
	}
	if s.dead() {
		return nil, fmt.Errorf("%w: %s is %s (%s); create a new session to continue", ErrEnded, id, s.rec.State, s.rec.Error)
	}
	return s, nil
}

// touchLocked records a prompt from owner. A credential of the session's
// own owner becomes its latest sender, whose MCP session gets its events
// from now on; the creator's own credential also refreshes the expiry that
// bounds the agent's tokens at its next launch. Anyone else (a caller with
// sessions:any, an orchestrator's relay) moves nothing.
func (e *Engine) touchLocked(s *session, owner Owner) {
	s.rec.Updated = time.Now().UTC()
	if owner.OwnerID() != s.rec.Owner {
		return
	}
	if owner.MCPSession != "" {
		s.rec.Target = owner.MCPSession
	}
	if owner.TokenID == s.rec.OwnerTokenID && owner.Expires != nil && (s.rec.OwnerExpires == nil || owner.Expires.After(*s.rec.OwnerExpires)) {
		s.rec.OwnerExpires, s.rec.OwnerIssued = owner.Expires, owner.Issued
		s.rec.OwnerScopes = append([]string(nil), owner.Scopes...)
	}
}

// Send queues prompt, or runs it at once when the session is idle.
func (e *Engine) Send(_ context.Context, owner Owner, sessionID, text string) (bool, error) {
	if err := e.checkText("prompt", text); err != nil {
		return false, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	s, err := e.liveSessionLocked(sessionID, owner)
	if err != nil {
		return false, err
	}
	if err := e.enqueueLocked(s, prompt{text: text, owner: owner}, false); err != nil {
		return false, err
	}
	return s.turn != nil || s.queue.len() > 1, nil
}

// enqueueLocked adds p to the queue (at its head with first) and makes sure
// a worker runs it.
func (e *Engine) enqueueLocked(s *session, p prompt, first bool) error {
	if s.queue.len() >= e.lim.MaxQueue {
		return fmt.Errorf("%w: %d prompts are already queued for %s; wait for some to run, or cancel", ErrBadRequest, s.queue.len(), s.rec.ID)
	}
	if !s.holdsAgent() {
		// The session is dormant: its agent must be relaunched.
		if err := e.roomForAgentLocked(s.rec.quotaID(), s.rec.OwnerTokenName, false); err != nil {
			return fmt.Errorf("%s's agent must be relaunched: %w", s.rec.ID, err)
		}
	}
	if first {
		s.queue.pushFront(p)
	} else {
		s.queue.push(p)
	}
	e.touchLocked(s, p.owner)
	e.stopIdle(s)
	e.startWorkerLocked(s)
	e.changedLocked(s)
	return nil
}

// Steer gives the agent guidance. When the agent advertised the
// _session/steering extension and a turn is running, the guidance goes to
// that turn ("steering"); otherwise it goes to the head of the queue
// ("queued-first"), which runs it at once when the session is idle.
func (e *Engine) Steer(ctx context.Context, owner Owner, sessionID, text string) (string, error) {
	if err := e.checkText("steering text", text); err != nil {
		return "", err
	}
	e.mu.Lock()
	s, err := e.liveSessionLocked(sessionID, owner)
	if err != nil {
		e.mu.Unlock()
		return "", err
	}
	t, a, acpID := s.turn, s.agent, s.rec.ACPSessionID
	if t != nil && t.cancel == "" && s.steering && a != nil {
		e.touchLocked(s, owner)
		e.mu.Unlock()
		err := a.Steer(ctx, acpID, text)
		e.mu.Lock()
		if err == nil {
			// The turn may have ended while the agent took the guidance.
			ended := s.turn != t
			e.noteSteeringLocked(s, t, text)
			e.mu.Unlock()
			if ended {
				e.persist(s, saveTranscript)
			}
			return "steering", nil
		}
		if acpclient.IsMethodNotFound(err) {
			s.steering = false
		}
		e.log.Warn("steering failed; queueing the guidance first instead", "session", s.rec.ID, "error", err)
		if s.dead() {
			e.mu.Unlock()
			return "", fmt.Errorf("%w: %s is %s (%s)", ErrEnded, s.rec.ID, s.rec.State, s.rec.Error)
		}
	}
	defer e.mu.Unlock()
	if err := e.enqueueLocked(s, prompt{text: text, owner: owner}, true); err != nil {
		return "", err
	}
	return "queued-first", nil
}

// noteSteeringLocked adds guidance the agent took to turn t's prompt in
// the transcript, whether t still runs or has just ended.
func (e *Engine) noteSteeringLocked(s *session, t *turn, text string) {
	note := "\n\n[steering] " + text
	if s.turn == t {
		t.Prompt += note
		return
	}
	for i := len(s.turns) - 1; i >= 0; i-- {
		if s.turns[i].Index == t.Index {
			s.turns[i].Prompt += note
			s.bytes += len(note)
			return
		}
	}
}

// Cancel interrupts the running turn and drops the prompts queued behind
// it: it sends session/cancel, answers every pending interaction of the
// session as cancelled, and waits (up to Limits.CancelTimeout) for the
// turn to end with stop reason cancelled. An agent that does not stop in
// time is stopped, and the session ends with an error that says so.
func (e *Engine) Cancel(ctx context.Context, owner Owner, sessionID string) error {
	who := owner.TokenName
	if who == "" {
		who = "a client"
	}
	e.mu.Lock()
	s, err := e.liveSessionLocked(sessionID, owner)
	if err != nil {
		e.mu.Unlock()
		return err
	}
	done, ok := e.cancelLocked(s, "cancelled by "+who)
	e.mu.Unlock()
	if !ok {
		return fmt.Errorf("%w: %s is %s: there is no turn to cancel", ErrNotRunning, sessionID, s.state())
	}
	if done == nil {
		return nil
	}
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("cancel of %s sent; the turn had not ended when the call ended: %w", sessionID, ctx.Err())
	}
}

// cancelLocked starts the cancellation of s's work: it drops the queue,
// ends the pending interactions and sends session/cancel. done is closed
// once the turn has ended (nil when none was running); ok is false when
// there was nothing to cancel. A watchdog stops an agent that ignores the
// cancel for Limits.CancelTimeout.
func (e *Engine) cancelLocked(s *session, why string) (done chan struct{}, ok bool) {
	dropped := s.queue.clear()
	hadPending := len(s.pending) > 0
	t, a := s.turn, s.agent
	if t == nil {
		e.cancelPendingLocked(s, why)
		if dropped == 0 && !hadPending {
			return nil, false
		}
		e.recordLocked(s, Event{Status: EventCancelled, Kind: "cancelled",
			Summary: fmt.Sprintf("%s: cancelled (%s); %d queued prompt(s) dropped", s.rec.Title, why, dropped)})
		e.changedLocked(s)
		go e.persist(s, saveEvents)
		return nil, true
	}
	if t.cancel == "" {
		t.cancel = why
		if dropped > 0 {
			t.cancel += fmt.Sprintf("; %d queued prompt(s) dropped", dropped)
		}
		acpID := s.rec.ACPSessionID
		go e.sendCancel(s, a, t, acpID, why)
	}
	e.changedLocked(s)
	return t.done, true
}

// sendCancel sends session/cancel, then answers the pending interactions
// as cancelled (the order ACP prescribes: the agent learns of the cancel
// before its permission requests come back "cancelled"), then watches the
// turn: an agent that has not ended it within CancelTimeout is stopped.
func (e *Engine) sendCancel(s *session, a *acpclient.Agent, t *turn, acpID, why string) {
	if a == nil {
		return // the agent is already gone: its turn is ending on its own
	}
	if err := a.Cancel(context.WithoutCancel(e.ctx), acpID); err != nil {
		e.log.Warn("session/cancel could not be sent", "session", s.rec.ID, "error", err)
	}
	e.mu.Lock()
	e.cancelPendingLocked(s, why)
	e.changedLocked(s)
	e.mu.Unlock()

	timer := time.NewTimer(e.lim.CancelTimeout)
	defer timer.Stop()
	select {
	case <-t.done:
		return
	case <-e.ctx.Done():
		return
	case <-timer.C:
	}
	e.mu.Lock()
	if s.turn != t || s.agent != a {
		e.mu.Unlock()
		return
	}
	msg := fmt.Sprintf("the agent had not ended its turn %s after session/cancel, so its process was stopped; create a new session to continue", e.lim.CancelTimeout)
	e.failLocked(s, a, msg)
	e.mu.Unlock()
	e.persist(s, saveRecord|saveEvents)
	a.Close()
}

// RevokeToken cancels the work of every session tokenID created: running
// turns get session/cancel, queued prompts are dropped, and pending
// interactions end as cancelled. It does not wait; the cancelled events
// follow as the turns end.
func (e *Engine) RevokeToken(tokenID string) {
	if tokenID == "" {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return
	}
	for _, s := range e.sessions {
		if s.rec.OwnerTokenID == tokenID && !s.dead() {
			e.cancelLocked(s, "the token that created it was revoked")
		}
	}
}

package sessions

import (
	"fmt"
	"time"
)

// Quotas: what one token may hold, and how a launch finds room (see the
// Engine's doc). Every function here runs under e.mu.

// admitLocked decides whether owner may create a session: its credential
// (with every token derived from the same chain top, see Owner.Quota) has
// fewer than MaxSessionsPerToken live sessions, the engine keeps fewer than
// MaxSessions or has an ended one to drop, and an agent can be launched
// for it (see roomForAgentLocked). With look it only looks: no idle agent
// is stopped.
func (e *Engine) admitLocked(owner Owner, look bool) error {
	tokenID := owner.QuotaID()
	if e.closed {
		return ErrClosed
	}
	if n := e.sessionsOfLocked(tokenID); n >= e.lim.MaxSessionsPerToken {
		return fmt.Errorf("%w: token %q has %d live sessions, the most one token may keep (max_sessions_per_token, which counts the tokens derived from it too); a session stops counting when it ends: go on in one of them (sessions list marks them worker), or ask the operator to raise the limit", ErrQuota, owner.TokenName, n)
	}
	if len(e.sessions) >= e.lim.MaxSessions && !e.anyEndedLocked() {
		return fmt.Errorf("%w: %d sessions are kept and none has ended; this gateway keeps at most %d", ErrBadRequest, len(e.sessions), e.lim.MaxSessions)
	}
	return e.roomForAgentLocked(tokenID, owner.TokenName, look)
}

func (e *Engine) anyEndedLocked() bool {
	for _, s := range e.sessions {
		if s.dead() {
			return true
		}
	}
	return false
}

// roomForAgentLocked makes room for one more agent of a session counted
// against tokenID (a record's quotaID; name is its creator's name). At
// MaxAgentsPerToken it stops the least recently used idle agent counted
// against tokenID that can resume, and at MaxAgents anyone's; it
// refuses only when there is none (ErrQuota, ErrBusy). With look it says
// whether it could, without stopping anything.
func (e *Engine) roomForAgentLocked(tokenID, name string, look bool) error {
	if n := e.agentsOfLocked(tokenID); n >= e.lim.MaxAgentsPerToken {
		victim := e.idlestAgentLocked(tokenID)
		if victim == nil {
			return fmt.Errorf("%w: the sessions of token %q hold %d agent processes, the most one token may (max_agents_per_token, which counts the tokens derived from the same one too), and none of them is idle and able to resume; retry when one of their turns has ended, or cancel one", ErrQuota, name, n)
		}
		if look {
			return nil
		}
		e.evictAgentLocked(victim, "max_agents_per_token")
	}
	if n := e.liveLocked(); n >= e.lim.MaxAgents {
		victim := e.idlestAgentLocked("")
		if victim == nil {
			return fmt.Errorf("%w: %d agent processes are running, the most it allows, and none is idle and able to resume; retry in a few seconds, when a turn has ended or a session has ended", ErrBusy, n)
		}
		if look {
			return nil
		}
		e.evictAgentLocked(victim, "max_agents")
	}
	return nil
}

// liveLocked counts the sessions that hold or are launching an agent.
func (e *Engine) liveLocked() int {
	n := 0
	for _, s := range e.sessions {
		if s.holdsAgent() {
			n++
		}
	}
	return n
}

// agentsOfLocked counts the sessions counted against tokenID that hold or
// are launching an agent.
func (e *Engine) agentsOfLocked(tokenID string) int {
	n := 0
	for _, s := range e.sessions {
		if s.rec.quotaID() == tokenID && s.holdsAgent() {
			n++
		}
	}
	return n
}

// sessionsOfLocked counts the live sessions counted against tokenID.
func (e *Engine) sessionsOfLocked(tokenID string) int {
	n := 0
	for _, s := range e.sessions {
		if s.rec.quotaID() == tokenID && !s.dead() {
			n++
		}
	}
	return n
}

// idlestAgentLocked returns the session whose agent has been idle longest
// among those that can be stopped without loss (of tokenID's sessions, or
// of all when tokenID is ""), or nil.
func (e *Engine) idlestAgentLocked(tokenID string) *session {
	var lru *session
	for _, s := range e.sessions {
		if !s.evictable() || (tokenID != "" && s.rec.quotaID() != tokenID) {
			continue
		}
		if lru == nil || s.idleSince.Before(lru.idleSince) {
			lru = s
		}
	}
	return lru
}

// evictAgentLocked stops s's idle agent to make room, as the idle timer
// would: the session stays idle and its next prompt relaunches the agent
// with session/load. The slot is free at once; the process ends in the
// background.
func (e *Engine) evictAgentLocked(s *session, limit string) {
	a := s.agent
	s.agent = nil
	e.stopIdle(s)
	idle := time.Since(s.idleSince).Round(time.Second)
	e.log.Info("idle agent stopped to make room for another; the next prompt resumes the session", "session", s.rec.ID, "idle", idle, "limit", limit)
	e.workers.Add(1)
	go func() {
		defer e.workers.Done()
		a.Close()
	}()
}

// holdsAgent reports whether s holds an agent slot: it has an agent
// process, or a worker that is launching one.
func (s *session) holdsAgent() bool { return s.agent != nil || s.worker }

// evictable reports whether s's agent can be stopped without loss: it is
// idle (no turn, no queued prompt, no pending interaction, no worker) and
// supports session/load.
func (s *session) evictable() bool {
	return s.agent != nil && !s.worker && s.turn == nil && s.queue.len() == 0 && len(s.pending) == 0 && !s.dead() && s.rec.LoadSession
}

// Counts returns how many sessions have not ended and how many agent
// processes run or are being launched (what max_agents counts), for the
// gateway's gauges.
func (e *Engine) Counts() (open, agents int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, s := range e.sessions {
		if !s.dead() {
			open++
		}
		if s.holdsAgent() {
			agents++
		}
	}
	return open, agents
}

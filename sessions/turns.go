package sessions

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	acp "github.com/coder/acp-go-sdk"

	"github.com/Tahul/caddy-zidane-mcp/sessions/acpclient"
)

// startWorkerLocked makes sure a goroutine launches s's agent if needed
// and runs its queue.
func (e *Engine) startWorkerLocked(s *session) {
	if s.worker || e.closed || s.dead() {
		return
	}
	s.worker = true
	e.workers.Add(1)
	go e.work(s)
}

// work is a session's worker: it launches the agent when there is none
// (session/new, or session/load for a resumed session), then runs the
// queued prompts one turn at a time. It exits when the queue is empty,
// deciding so under the lock, so that a prompt queued meanwhile either
// sees it running or starts a new one.
func (e *Engine) work(s *session) {
	defer e.workers.Done()
	for {
		e.mu.Lock()
		if e.closed || s.dead() {
			s.worker = false
			e.changedLocked(s)
			e.mu.Unlock()
			return
		}
		if s.agent == nil {
			s.gen++
			gen := s.gen
			e.mu.Unlock()
			if err := e.launch(s, gen); err != nil {
				e.mu.Lock()
				s.worker = false
				if !e.closed && !errors.Is(err, acpclient.ErrClosed) {
					e.failLocked(s, nil, err.Error())
				}
				e.mu.Unlock()
				e.persist(s, saveRecord|saveEvents)
				return
			}
			continue
		}
		p, ok := s.queue.pop()
		if !ok {
			s.worker = false
			e.armIdleLocked(s)
			e.changedLocked(s)
			e.mu.Unlock()
			return
		}
		s.rec.Turns++
		t := &turn{done: make(chan struct{})}
		t.Index, t.Prompt, t.Started = s.rec.Turns, p.text, time.Now().UTC()
		s.turn, s.lastErr = t, ""
		a, acpID := s.agent, s.rec.ACPSessionID
		e.changedLocked(s)
		e.mu.Unlock()

		stop, err := a.Prompt(e.ctx, acpID, p.text)
		if !e.endTurn(s, a, t, stop, err) {
			return
		}
	}
}

// launch starts the agent and opens the session on it, within
// LaunchTimeout.
func (e *Engine) launch(s *session, gen int) error {
	e.mu.Lock()
	rec := s.rec
	e.mu.Unlock()
	cfg, ok := e.cfg.Agents[rec.Agent]
	if !ok {
		return fmt.Errorf("agent %q is no longer configured; create a new session with one of the configured agents", rec.Agent)
	}
	if err := e.checkLaunchDirs(&rec); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(e.ctx, e.lim.LaunchTimeout)
	defer cancel()
	log := e.log.With("session", rec.ID, "agent", rec.Agent)
	// The servers come first: a confined agent may connect to their ports.
	hooked := e.sessionServers(rec)
	servers := acpServers(hooked)
	home, tmp, err := e.makeScratch(rec.ID, cfg.User)
	if err != nil {
		return fmt.Errorf("could not launch agent %q: %v", rec.Agent, err)
	}
	a, err := acpclient.Start(ctx, acpclient.Options{
		Command: e.agentCommand(rec, cfg, home, hooked),
		Env:     cfg.Env,
		Home:    home,
		TempDir: tmp,
		User:    cfg.User,
		Dir:     rec.Cwd,
		Handler: &agentHandler{e: e, s: s, gen: gen},
		Logger:  log,
	})
	if err != nil {
		return e.launchError(ctx, rec, "launch", err)
	}
	acpID := rec.ACPSessionID
	if acpID != "" {
		err = a.LoadSession(ctx, acpID, rec.Cwd, servers)
	} else {
		acpID, err = a.NewSession(ctx, rec.Cwd, servers)
	}
	if err != nil {
		a.Close()
		return e.launchError(ctx, rec, "open the session on", err)
	}
	info := a.Info()
	e.mu.Lock()
	if e.closed || s.dead() || s.gen != gen {
		e.mu.Unlock()
		a.Close()
		return acpclient.ErrClosed
	}
	s.agent, s.steering = a, info.Steering
	s.rec.ACPSessionID, s.rec.LoadSession = acpID, info.LoadSession
	e.changedLocked(s)
	e.workers.Add(1) // under the lock that saw the engine open: Close waits for it
	go e.watch(s, a)
	e.mu.Unlock()
	sandbox, user := "off", ""
	if cfg.Sandbox != nil {
		sandbox = "landlock"
	}
	if cfg.User != nil {
		user = cfg.User.Name
	}
	log.Info("agent running", "pid", a.Pid(), "acpSession", acpID, "resumed", rec.ACPSessionID != "", "steering", info.Steering, "loadSession", info.LoadSession,
		"sandbox", sandbox, "user", user)
	e.persist(s, saveRecord)
	return nil
}

// checkLaunchDirs checks, at each launch, the directories the agent of rec
// works in, and sets rec.Cwd to the one the check resolved.
func (e *Engine) checkLaunchDirs(rec *record) error {
	// The roots may have changed since the session was created (a reload,
	// a restart with a new configuration), and so may the directory: the
	// agent starts only in a cwd that is inside them now.
	// The agent starts in the directory the check resolved, not in one
	// that a symlink could make another by the time it starts.
	real, err := inRoots(e.rootSets(rec.OwnerRoots), "cwd", rec.Cwd)
	if err != nil {
		return fmt.Errorf("the agent was not started: %v; create a new session in an allowed directory", err)
	}
	rec.Cwd = real
	// A directory that became the gateway's (a reload, or a session
	// restored from before the rule) is refused here too, with what a
	// worktree session writes besides its cwd.
	dirs := [][2]string{{"cwd", rec.Cwd}}
	if rec.Repo != "" {
		if top := worktreeTop(rec.Cwd); top != "" {
			dirs = append(dirs, [2]string{"the worktree", top})
		}
		dirs = append(dirs, [2]string{"the repository's git directory", filepath.Join(rec.Repo, ".git")})
	}
	for _, d := range dirs {
		if err := e.checkDenied(d[0], d[1]); err != nil {
			if e.cfg.Denied != nil {
				e.cfg.Denied(Owner{TokenID: rec.OwnerTokenID, TokenName: rec.OwnerTokenName, ID: rec.Owner}, rec.ID, err)
			}
			return fmt.Errorf("could not launch agent %q: %v", rec.Agent, err)
		}
	}
	return nil
}

// sessionServers are the MCP servers the gateway gives the agent of rec.
func (e *Engine) sessionServers(rec record) []McpServer {
	if e.cfg.MCPServers == nil {
		return nil
	}
	return e.cfg.MCPServers(SessionInfo{
		SessionID: rec.ID, Title: rec.Title, Cwd: rec.Cwd, Agent: rec.Agent,
		Owner: Owner{TokenID: rec.OwnerTokenID, TokenName: rec.OwnerTokenName, ID: rec.Owner, MCPSession: rec.Target,
			Expires: rec.OwnerExpires, Issued: rec.OwnerIssued, Scopes: rec.OwnerScopes},
		Tools: rec.Tools, Subscribe: rec.Subscribe, Base: rec.Base,
	})
}

func (e *Engine) launchError(ctx context.Context, rec record, what string, err error) error {
	if e.ctx.Err() != nil {
		return acpclient.ErrClosed
	}
	if ctx.Err() != nil {
		return fmt.Errorf("could not %s agent %q within %s (%v); check that %q speaks ACP on stdio", what, rec.Agent, e.lim.LaunchTimeout, err, e.cfg.Agents[rec.Agent].Command[0])
	}
	return fmt.Errorf("could not %s agent %q: %v", what, rec.Agent, err)
}

// watch turns an agent's unexpected end into the session's error.
func (e *Engine) watch(s *session, a *acpclient.Agent) {
	defer e.workers.Done()
	<-a.Done()
	err := a.Err()
	e.mu.Lock()
	if s.agent != a || e.closed || errors.Is(err, acpclient.ErrClosed) {
		e.mu.Unlock()
		return
	}
	e.failLocked(s, a, agentEnded(s.rec.Agent, err))
	e.mu.Unlock()
	e.persist(s, saveRecord|saveEvents)
}

func agentEnded(name string, err error) string {
	return fmt.Sprintf("agent %q failed: %v; create a new session to continue", name, err)
}

// failLocked puts s in the error state, once: its queue is dropped, its
// pending interactions are cancelled, and an error event is recorded.
func (e *Engine) failLocked(s *session, a *acpclient.Agent, msg string) {
	if s.dead() {
		return
	}
	s.rec.State, s.rec.Error = StateError, msg
	if s.agent == a || a == nil {
		s.agent = nil
	}
	// The running turn ends with the session, so that no reader sees an
	// errored session with a turn still running; the worker finds it done.
	if t := s.turn; t != nil {
		t.StopReason = "error"
		e.finishTurnLocked(s, t)
	}
	e.stopIdle(s)
	s.queue.clear()
	e.cancelPendingLocked(s, "the agent failed")
	// The agent is gone for good: so is its scratch directory. The agent
	// process may still be exiting; a file it writes now is lost with it.
	// Close waits for the removal, unless it has begun already.
	if id := s.rec.ID; e.closed {
		go e.dropScratch(id)
	} else {
		e.workers.Add(1)
		go func() {
			defer e.workers.Done()
			e.dropScratch(id)
		}()
	}
	e.recordLocked(s, Event{Status: EventError, Kind: "failed", Summary: fmt.Sprintf("%s: failed: %s", s.rec.Title, msg)})
	e.changedLocked(s)
	e.endedLocked(s.rec.ID)
}

// endTurn records how a turn ended, and the event that says so. It
// reports whether the worker goes on: when nothing is queued, the worker
// ends here, in the same critical section as the turn, so that whoever
// sees the turn ended also sees an idle agent that can make room for
// another (see quota.go).
func (e *Engine) endTurn(s *session, a *acpclient.Agent, t *turn, stop acp.StopReason, err error) bool {
	e.mu.Lock()
	if s.turn != t {
		// failLocked ended it already, with the session.
		e.mu.Unlock()
		e.persist(s, saveRecord|saveTranscript|saveEvents)
		return true
	}
	what := saveRecord | saveTranscript
	var exit *acpclient.ExitError
	switch {
	case err == nil && stop == acp.StopReasonCancelled:
		t.StopReason = string(stop)
		why := t.cancel
		if why == "" {
			why = "by the agent"
		}
		e.recordLocked(s, Event{Status: EventCancelled, Kind: "cancelled", Summary: fmt.Sprintf("%s: turn %d cancelled (%s)", s.rec.Title, t.Index, why)})
		what |= saveEvents
	case err == nil:
		t.StopReason = string(stop)
		msg, _ := cut(t.answer.String(), 200)
		e.recordLocked(s, Event{Status: EventDone, Kind: "finished", Summary: fmt.Sprintf("%s: finished (%s): %s", s.rec.Title, stop, msg)})
		what |= saveEvents
	case e.closed || errors.Is(err, acpclient.ErrClosed) || e.ctx.Err() != nil:
		// The gateway is shutting down (or the agent was stopped on purpose).
		t.StopReason = "interrupted"
	case errors.As(err, &exit):
		t.StopReason = "error"
		e.failLocked(s, a, agentEnded(s.rec.Agent, err))
		what |= saveEvents
	default:
		// The agent is alive and failed this turn only: the session goes on.
		t.StopReason = "error"
		s.lastErr = "the last turn failed: " + turnError(err)
		e.recordLocked(s, Event{Status: EventError, Kind: "failed", Summary: fmt.Sprintf("%s: turn %d failed: %s", s.rec.Title, t.Index, turnError(err))})
		what |= saveEvents
	}
	if s.turn == t { // failLocked may have ended it just now
		e.finishTurnLocked(s, t)
	}
	goOn := true
	if s.queue.len() == 0 && s.agent == a && a != nil && !s.dead() && !e.closed {
		s.worker = false
		e.armIdleLocked(s)
		goOn = false
	}
	e.changedLocked(s)
	e.mu.Unlock()
	e.persist(s, what)
	return goOn
}

// finishTurnLocked moves the running turn t, its StopReason set, to the
// transcript.
func (e *Engine) finishTurnLocked(s *session, t *turn) {
	t.Ended = time.Now().UTC()
	t.Answer = t.answer.String()
	s.addTurn(t.Turn, e.lim)
	s.turn = nil
	s.rec.Updated = t.Ended
	close(t.done)
}

// turnError words a failed prompt: a JSON-RPC error shows its message and
// data rather than the SDK's raw form.
func turnError(err error) string {
	var re *acp.RequestError
	if errors.As(err, &re) {
		if re.Data != nil {
			return fmt.Sprintf("the agent answered error %d, %s: %v", re.Code, re.Message, re.Data)
		}
		return fmt.Sprintf("the agent answered error %d, %s", re.Code, re.Message)
	}
	return err.Error()
}

// armIdleLocked starts the idle timer of a session whose agent can be
// stopped without loss (it supports session/load).
func (e *Engine) armIdleLocked(s *session) {
	e.stopIdle(s)
	s.idleSince = time.Now()
	if e.lim.IdleTimeout < 0 || s.agent == nil || !s.rec.LoadSession || e.closed {
		return
	}
	a := s.agent
	s.idle = time.AfterFunc(e.lim.IdleTimeout, func() { e.sleep(s, a) })
}

func (e *Engine) stopIdle(s *session) {
	if s.idle != nil {
		s.idle.Stop()
		s.idle = nil
	}
}

// sleep stops an idle session's agent; the session stays idle and its
// next prompt relaunches the agent with session/load.
func (e *Engine) sleep(s *session, a *acpclient.Agent) {
	e.mu.Lock()
	if s.agent != a || s.worker || s.turn != nil || len(s.pending) > 0 || s.queue.len() > 0 || s.dead() || e.closed {
		e.mu.Unlock()
		return
	}
	s.agent = nil
	s.idle = nil
	e.mu.Unlock()
	e.log.Info("agent stopped after being idle; the next prompt resumes the session", "session", s.rec.ID, "idle", e.lim.IdleTimeout)
	a.Close()
}

// agentHandler is what one launch of a session's agent calls back. gen
// ties it to that launch: a stopped process's late callbacks change
// nothing.
type agentHandler struct {
	e   *Engine
	s   *session
	gen int
}

func (h *agentHandler) SessionUpdate(n acp.SessionNotification) {
	e, s := h.e, h.s
	e.mu.Lock()
	defer e.mu.Unlock()
	t := s.turn
	// Updates outside a turn (the history session/load replays) are not
	// part of any turn of this engine's.
	if t == nil || s.gen != h.gen {
		return
	}
	switch u := n.Update; {
	case u.AgentMessageChunk != nil:
		if c := u.AgentMessageChunk.Content; c.Text != nil {
			t.appendText(c.Text.Text, e.lim.MaxAnswerBytes)
		}
	case u.ToolCall != nil:
		t.gap = true
	}
}

func (h *agentHandler) RequestPermission(ctx context.Context, req acp.RequestPermissionRequest) acp.RequestPermissionResponse {
	return h.e.ask(ctx, h.s, h.gen, permissionInteraction(req)).perm
}

func (h *agentHandler) Elicit(ctx context.Context, form acp.UnstableCreateElicitationForm) acp.UnstableCreateElicitationResponse {
	return h.e.ask(ctx, h.s, h.gen, questionInteraction(form)).elic
}

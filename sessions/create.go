package sessions

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"
)

// checkText validates a prompt or steering text.
func (e *Engine) checkText(what, text string) error {
	if strings.TrimSpace(text) == "" {
		return fmt.Errorf("%w: the %s is empty; say what the agent should do", ErrBadRequest, what)
	}
	if len(text) > e.lim.MaxPromptBytes {
		return fmt.Errorf("%w: the %s is %d bytes, more than the %d allowed; shorten it or point the agent at a file", ErrBadRequest, what, len(text), e.lim.MaxPromptBytes)
	}
	return nil
}

// Create starts a session and returns its id at once: the agent is
// launched and the first prompt runs in the background. Bad input
// (missing cwd, unknown agent, empty prompt, a worktree that cannot be
// made, a cwd outside the roots) gets ErrBadRequest with what to change;
// a token at its quota gets ErrQuota, a gateway at MaxAgents with no idle
// agent to stop ErrBusy.
func (e *Engine) Create(ctx context.Context, owner Owner, req CreateRequest) (Created, error) {
	if err := e.checkText("prompt", req.Prompt); err != nil {
		return Created{}, err
	}
	agentName := req.Agent
	if agentName == "" {
		agentName = e.cfg.DefaultAgent
	}
	if _, ok := e.cfg.Agents[agentName]; !ok {
		if agentName == "" {
			return Created{}, fmt.Errorf("%w: no agent named and no default agent configured; name one of: %s", ErrBadRequest, strings.Join(e.cfg.agentNames(), ", "))
		}
		return Created{}, fmt.Errorf("%w: unknown agent %q; configured agents: %s", ErrBadRequest, agentName, strings.Join(e.cfg.agentNames(), ", "))
	}
	cwd, err := checkCwd(req.Cwd)
	if err != nil {
		return Created{}, err
	}
	// The roots first: their refusal says where a session may go.
	roots := e.rootSets(owner.Roots)
	if cwd, err = inRoots(roots, "cwd", cwd); err != nil {
		return Created{}, err
	}
	if err := e.checkDenied("cwd", cwd); err != nil {
		return Created{}, err
	}
	env := req.Environment
	switch env.Kind {
	case "", "local":
		env.Kind = "local"
		if env.Branch != "" {
			return Created{}, fmt.Errorf("%w: a branch is only used by environment kind worktree; drop it or use worktree", ErrBadRequest)
		}
	case "worktree":
	default:
		return Created{}, fmt.Errorf("%w: environment kind %q: use local (work in cwd) or worktree (a new git worktree of the repository at cwd)", ErrBadRequest, env.Kind)
	}
	// A first look, before a worktree is made for nothing; the decision
	// is taken again, and an idle agent stopped for room, when the session
	// is added.
	e.mu.Lock()
	err = e.admitLocked(owner, true)
	e.mu.Unlock()
	if err != nil {
		return Created{}, err
	}

	id := e.newID("ses")
	rec := record{
		V:              recordVersion,
		ID:             id,
		Title:          req.Title,
		Cwd:            cwd,
		Agent:          agentName,
		Environment:    env,
		OwnerTokenID:   owner.TokenID,
		OwnerTokenName: owner.TokenName,
		OwnerRoots:     append([]string(nil), owner.Roots...),
		Quota:          owner.QuotaID(),
		Owner:          owner.OwnerID(),
		OwnerExpires:   owner.Expires,
		OwnerScopes:    append([]string(nil), owner.Scopes...),
		OwnerIssued:    owner.Issued,
		Target:         owner.MCPSession,
		Tools:          append([]string(nil), req.Tools...),
		Subscribe:      req.Subscribe,
		Base:           req.Base,
		State:          StateIdle,
	}
	if rec.Title == "" {
		rec.Title = firstLine(req.Prompt, 60)
	}
	if env.Kind == "worktree" {
		if env.Branch == "" {
			rec.Environment.Branch = "zidane/" + id[len("ses_"):idLen] // the random part: a node id may end in ".lock", which git refuses
		}
		wt, err := e.addWorktree(ctx, agentName, cwd, rec.Environment.Branch, roots)
		if err != nil {
			return Created{}, err
		}
		rec.Cwd, rec.Repo = wt.cwd, wt.repo
		e.log.Info("worktree created", "session", id, "repo", wt.repo, "dir", wt.dir, "branch", wt.branch)
	}
	now := time.Now().UTC()
	rec.Created, rec.Updated = now, now

	s := newSession(rec)
	s.queue.push(prompt{text: req.Prompt, owner: owner})
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return Created{}, ErrClosed
	}
	if err := e.admitLocked(owner, false); err != nil {
		e.mu.Unlock()
		if rec.Repo != "" {
			e.log.Warn("a session was refused after its worktree was made; the worktree is left in place", "dir", rec.Cwd, "error", err)
		}
		return Created{}, err
	}
	evicted := e.evictLocked()
	e.sessions[id] = s
	e.startWorkerLocked(s)
	e.noteLocked(id)
	for _, old := range evicted {
		e.noteLocked(old)
	}
	e.mu.Unlock()
	for _, old := range evicted {
		e.forget(old)
	}
	if len(evicted) > 0 {
		e.mu.Lock()
		for _, old := range evicted {
			e.endedLocked(old)
		}
		e.mu.Unlock()
	}
	e.persist(s, saveRecord)
	return Created{SessionID: id, Link: e.link(id)}, nil
}

// evictLocked drops the oldest ended sessions past MaxSessions-1 and
// returns their ids, for forget.
func (e *Engine) evictLocked() []string {
	over := len(e.sessions) - e.lim.MaxSessions + 1
	if over <= 0 {
		return nil
	}
	var dead []*session
	for _, s := range e.sessions {
		if s.dead() {
			dead = append(dead, s)
		}
	}
	sort.Slice(dead, func(i, j int) bool { return dead[i].rec.Updated.Before(dead[j].rec.Updated) })
	var ids []string
	for _, s := range dead[:min(over, len(dead))] {
		delete(e.sessions, s.rec.ID)
		ids = append(ids, s.rec.ID)
	}
	return ids
}

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
	place, err := e.placeOf(owner, req)
	if err != nil {
		return Created{}, err
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
	rec := newRecord(id, owner, req, place)
	if place.env.Kind == "worktree" {
		if place.env.Branch == "" {
			rec.Environment.Branch = "zidane/" + id[len("ses_"):idLen] // the random part: a node id may end in ".lock", which git refuses
		}
		wt, err := e.addWorktree(ctx, place.agent, place.cwd, rec.Environment.Branch, place.roots)
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
	if err := e.add(s, owner); err != nil {
		return Created{}, err
	}
	e.persist(s, saveRecord)
	return Created{SessionID: id, Link: e.link(id)}, nil
}

// place is where a new session runs: its agent, its cwd inside the roots,
// and its environment.
type place struct {
	agent string
	cwd   string
	roots [2][]string
	env   Environment
}

// placeOf checks what a create request asks for, the prompt included,
// and returns where the session runs; a refusal is ErrBadRequest and
// says what to change.
func (e *Engine) placeOf(owner Owner, req CreateRequest) (place, error) {
	if err := e.checkText("prompt", req.Prompt); err != nil {
		return place{}, err
	}
	p := place{agent: req.Agent}
	if p.agent == "" {
		p.agent = e.cfg.DefaultAgent
	}
	if _, ok := e.cfg.Agents[p.agent]; !ok {
		if p.agent == "" {
			return place{}, fmt.Errorf("%w: no agent named and no default agent configured; name one of: %s", ErrBadRequest, strings.Join(e.cfg.agentNames(), ", "))
		}
		return place{}, fmt.Errorf("%w: unknown agent %q; configured agents: %s", ErrBadRequest, p.agent, strings.Join(e.cfg.agentNames(), ", "))
	}
	cwd, err := checkCwd(req.Cwd)
	if err != nil {
		return place{}, err
	}
	// The roots first: their refusal says where a session may go.
	p.roots = e.rootSets(owner.Roots)
	if p.cwd, err = inRoots(p.roots, "cwd", cwd); err != nil {
		return place{}, err
	}
	if err := e.checkDenied("cwd", p.cwd); err != nil {
		return place{}, err
	}
	p.env = req.Environment
	switch p.env.Kind {
	case "", "local":
		p.env.Kind = "local"
		if p.env.Branch != "" {
			return place{}, fmt.Errorf("%w: a branch is only used by environment kind worktree; drop it or use worktree", ErrBadRequest)
		}
	case "worktree":
	default:
		return place{}, fmt.Errorf("%w: environment kind %q: use local (work in cwd) or worktree (a new git worktree of the repository at cwd)", ErrBadRequest, p.env.Kind)
	}
	return p, nil
}

// newRecord is the record of a new session id for owner, in place p.
func newRecord(id string, owner Owner, req CreateRequest, p place) record {
	rec := record{
		V:              recordVersion,
		ID:             id,
		Title:          req.Title,
		Cwd:            p.cwd,
		Agent:          p.agent,
		Environment:    p.env,
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
	return rec
}

// add admits s for owner, makes room by dropping the oldest ended
// sessions, and starts its worker.
func (e *Engine) add(s *session, owner Owner) error {
	rec := s.rec // read before s is shared
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return ErrClosed
	}
	if err := e.admitLocked(owner, false); err != nil {
		e.mu.Unlock()
		if rec.Repo != "" {
			e.log.Warn("a session was refused after its worktree was made; the worktree is left in place", "dir", rec.Cwd, "error", err)
		}
		return err
	}
	evicted := e.evictLocked()
	e.sessions[rec.ID] = s
	e.startWorkerLocked(s)
	e.noteLocked(rec.ID)
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
	return nil
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

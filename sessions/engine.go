package sessions

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/sessions/acpclient"
	"github.com/Tahul/caddy-zidane-mcp/storage"
)

// Engine runs coding-agent sessions: one agent process per session, driven
// over ACP by package acpclient, with its own FIFO prompt queue. It
// implements Sessions.
//
// Concurrency. One mutex guards all in-memory session state. It is never
// held across I/O (agent calls, storage, git), only across map and slice
// updates, so sessions run concurrently: each session's turns run in a
// worker goroutine of its own, which launches the agent first when there
// is none, and each agent callback runs in the SDK's goroutine. Wait
// sleeps on a per-session channel that every state change closes.
//
// Lifecycle of an agent. The worker launches it (initialize, then
// session/new, or session/load for a resumed session) and runs one
// session/prompt per queued prompt. A crash, a protocol error or a launch
// failure puts the session in the error state with the agent's exit
// status and last stderr lines, and records an error event; the other
// sessions never notice. An agent that supports session/load is stopped
// after Limits.IdleTimeout idle and relaunched by the next prompt.
//
// Quotas. A launch needs a slot: fewer than Limits.MaxAgents agents in
// all, and fewer than Limits.MaxAgentsPerToken among the sessions of the
// token that created the session. When there is none, the least recently
// used idle agent that can resume (of that token, or of anyone for the
// global limit) is stopped as the idle timer would stop it, and only when
// there is no such agent is the launch refused. Agents without
// session/load are never stopped so: they hold their slot while their
// session lives, which the per-token limit bounds. Limits.
// MaxSessionsPerToken bounds the live sessions a token created.
//
// Events are recorded when a turn finishes (done), fails (error), is
// cancelled (cancelled), when an interaction becomes pending
// (needs-attention), and when a session fails (error). Subscribers get them
// through a goroutine and a bounded buffer each (see Subscribe), so a slow
// subscriber never slows the engine.
//
// Persistence is described in persist.go: one directory per session under
// zidane/sessions/, written at turn ends and events, never per chunk.
type Engine struct {
	cfg   Config
	lim   Limits
	log   *slog.Logger
	store storage.Storage

	ctx    context.Context // ends at Close: abandons what is still running
	cancel context.CancelFunc

	mu            sync.Mutex
	closed        bool
	roots         []string // Config.Roots, cleaned (see SetRoots)
	sessions      map[string]*session
	pending       map[string]*interaction
	resolved      map[string]resolution
	resolvedOrder []string
	workers       sync.WaitGroup // session workers and agent watchers
	writes        sync.WaitGroup // storage writes under way
	storeDone     bool           // Close is done with storage

	events *eventLog

	// relays maps a child token id to the orchestrator session that
	// subscribed to the sessions that token creates (see Relay).
	relays map[string]string

	hooks []*changeHook // OnChange's
}

var _ Sessions = (*Engine)(nil)

// ErrClosed is returned by calls made after Close.
var ErrClosed = errors.New("the session engine is shut down")

// NewEngine builds an engine and brings back the sessions in storage: a
// session whose agent supports session/load is resumed (its agent is
// relaunched in the background and the session loaded, newest first, up
// to MaxAgents of them and MaxAgentsPerToken of each token's; the others
// are relaunched on their next prompt);
// any other is shown as ended, its transcript and events intact. ctx
// bounds the reading of storage only.
func NewEngine(ctx context.Context, cfg Config) (*Engine, error) {
	if len(cfg.Agents) == 0 {
		return nil, errors.New("sessions: no agent is configured; configure at least one agent command")
	}
	for name, a := range cfg.Agents {
		if len(a.Command) == 0 || a.Command[0] == "" {
			return nil, fmt.Errorf("sessions: agent %q has no command; give the program that speaks ACP on stdio", name)
		}
		if a.Sandbox != nil && len(cfg.Confine) == 0 {
			return nil, fmt.Errorf("sessions: agent %q has a sandbox but Config.Confine names no command to apply it", name)
		}
	}
	if cfg.Node != "" {
		if err := CheckNode(cfg.Node); err != nil {
			return nil, fmt.Errorf("sessions: %w", err)
		}
	}
	if cfg.ScratchRoot == "" {
		cfg.ScratchRoot = filepath.Join(os.TempDir(), "zidane-agents")
	}
	// The engine reads the agents from many goroutines: keep a copy the
	// caller cannot change.
	agents := make(map[string]AgentConfig, len(cfg.Agents))
	for name, a := range cfg.Agents {
		agents[name] = a
	}
	cfg.Agents = agents
	if cfg.DefaultAgent == "" && len(cfg.Agents) == 1 {
		for name := range cfg.Agents {
			cfg.DefaultAgent = name
		}
	}
	if _, ok := cfg.Agents[cfg.DefaultAgent]; cfg.DefaultAgent != "" && !ok {
		return nil, fmt.Errorf("sessions: the default agent %q is not configured (configured: %s)", cfg.DefaultAgent, strings.Join(cfg.agentNames(), ", "))
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	lim := cfg.Limits.withDefaults()
	e := &Engine{
		cfg:      cfg,
		lim:      lim,
		log:      log,
		store:    cfg.Storage,
		sessions: map[string]*session{},
		pending:  map[string]*interaction{},
		resolved: map[string]resolution{},
		relays:   map[string]string{},
	}
	e.events = newEventLog(lim.MaxEvents, log.Warn)
	if err := e.SetRoots(cfg.Roots); err != nil {
		return nil, err
	}
	e.ctx, e.cancel = context.WithCancel(context.Background())
	if err := e.restore(ctx); err != nil {
		e.cancel()
		return nil, err
	}
	return e, nil
}

// restore brings back the stored sessions (see NewEngine).
func (e *Engine) restore(ctx context.Context) error {
	all, err := e.loadAll(ctx)
	if err != nil {
		return err
	}
	var evs []Event
	var resume, changed []*session
	for _, st := range all {
		s := newSession(st.rec)
		for _, t := range st.turns {
			s.addTurn(t, e.lim)
		}
		s.events = st.events
		evs = append(evs, st.events...)
		if !s.dead() {
			_, configured := e.cfg.Agents[s.rec.Agent]
			switch {
			case !configured:
				s.rec.State = StateEnded
				s.rec.Error = fmt.Sprintf("the gateway restarted and agent %q is no longer configured; the transcript is kept: create a new session to continue", s.rec.Agent)
				changed = append(changed, s)
			case !s.rec.LoadSession || s.rec.ACPSessionID == "":
				s.rec.State = StateEnded
				s.rec.Error = fmt.Sprintf("the gateway restarted and agent %q cannot resume sessions (it does not support session/load); the transcript is kept: create a new session to continue", s.rec.Agent)
				changed = append(changed, s)
			default:
				resume = append(resume, s)
			}
		}
		e.sessions[s.rec.ID] = s
	}
	sort.Slice(evs, func(i, j int) bool { return evs[i].Seq < evs[j].Seq })
	if over := len(evs) - e.lim.MaxEvents; over > 0 {
		evs = evs[over:]
	}
	e.events.restore(evs)
	for _, s := range changed {
		e.persist(s, saveRecord)
	}
	for _, s := range e.sessions {
		if s.dead() {
			e.dropScratch(s.rec.ID)
		}
	}
	e.mu.Lock()
	for _, s := range changed {
		e.endedLocked(s.rec.ID)
	}
	e.mu.Unlock()
	// Newest first, up to MaxAgents and MaxAgentsPerToken: the rest stay
	// dormant until a prompt.
	sort.Slice(resume, func(i, j int) bool { return resume[i].rec.Updated.After(resume[j].rec.Updated) })
	e.mu.Lock()
	resuming := 0
	for _, s := range resume {
		if e.liveLocked() < e.lim.MaxAgents && e.agentsOfLocked(s.rec.quotaID()) < e.lim.MaxAgentsPerToken {
			e.startWorkerLocked(s)
			resuming++
		}
	}
	e.mu.Unlock()
	if len(all) > 0 {
		e.log.Info("sessions restored", "sessions", len(all), "resuming", resuming, "ended", len(changed))
	}
	return nil
}

// Close ends every agent process and stops the engine; running turns are
// kept in transcripts with stop reason "interrupted", pending interactions
// end as cancelled, and subscriptions end. It returns within about five
// seconds whatever the agents do, and writes nothing to storage after it
// returns. Later calls return ErrClosed.
func (e *Engine) Close() error {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil
	}
	e.closed = true
	var agents []*acpclient.Agent
	for _, s := range e.sessions {
		e.stopIdle(s)
		e.cancelPendingLocked(s, "the gateway shut down")
		s.queue.clear()
		if s.agent != nil {
			agents = append(agents, s.agent)
		}
	}
	e.mu.Unlock()

	e.cancel() // running prompts return at once
	var wg sync.WaitGroup
	for _, a := range agents {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a.Close()
		}()
	}
	done := make(chan struct{})
	go func() {
		wg.Wait()
		e.workers.Wait()
		close(done)
	}()
	t := time.NewTimer(5 * time.Second)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		e.log.Warn("some agents or turns had not ended 5s after shutdown; leaving them")
	}
	e.mu.Lock()
	e.storeDone = true
	e.mu.Unlock()
	// The interrupted turns are being written; let those writes finish so
	// that nothing touches storage after Close returns.
	written := make(chan struct{})
	go func() {
		e.writes.Wait()
		close(written)
	}()
	select {
	case <-written:
	case <-t.C:
	}
	e.events.closeAll()
	return nil
}

// endedLocked tells the gateway that session id can take no more prompts
// or is gone (Config.Ended), from a goroutine that Close waits for.
func (e *Engine) endedLocked(id string) {
	// An ended orchestrator relays no more: the children it subscribed to
	// are its no longer.
	for child, orch := range e.relays {
		if orch == id {
			delete(e.relays, child)
		}
	}
	if e.cfg.Ended == nil || e.closed {
		return
	}
	e.workers.Add(1)
	go func() {
		defer e.workers.Done()
		e.cfg.Ended(id)
	}()
}

// Alive reports whether the engine has session id and it can still take
// prompts. The gateway asks it when it starts, to delete the credentials of
// sessions that ended while it was not running.
func (e *Engine) Alive(id string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	s := e.sessions[id]
	return s != nil && !s.dead()
}

// newID returns prefix_ and 16 random characters, and .node with a
// Config.Node.
func (e *Engine) newID(prefix string) string {
	id := prefix + "_" + strings.ToLower(rand.Text()[:16])
	if e.cfg.Node != "" {
		id += "." + e.cfg.Node
	}
	return id
}

// idLen is the length of an id newID makes without a node: "ses_" or
// "req_" and 16 characters.
const idLen = 4 + 16

// NodeOf is the node that runs the session or interaction with id, as
// newID wrote it: "" for an id of a single node's, or one that no engine
// made.
func NodeOf(id string) string {
	if len(id) <= idLen+1 || id[idLen] != '.' || id[3] != '_' {
		return ""
	}
	node := id[idLen+1:]
	if CheckNode(node) != nil {
		return ""
	}
	return node
}

// MaxNodeLen bounds a node id.
const MaxNodeLen = 64

// CheckNode says whether node may name a node in ids: 1 to 64 of
// [A-Za-z0-9._-], starting with a letter or digit.
func CheckNode(node string) error {
	if node == "" || len(node) > MaxNodeLen {
		return fmt.Errorf("node id %q: give 1 to %d characters of A-Z a-z 0-9 . _ -, such as gw-1", node, MaxNodeLen)
	}
	for i := 0; i < len(node); i++ {
		c := node[i]
		alnum := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
		if !alnum && (i == 0 || c != '.' && c != '_' && c != '-') {
			return fmt.Errorf("node id %q: give 1 to %d characters of A-Z a-z 0-9 . _ -, starting with a letter or digit, such as gw-1", node, MaxNodeLen)
		}
	}
	return nil
}

func (e *Engine) link(id string) string {
	if e.cfg.LinkFor == nil {
		return ""
	}
	e.mu.Lock()
	base := ""
	if s := e.sessions[id]; s != nil {
		base = s.rec.Base
	}
	e.mu.Unlock()
	if base == "" {
		return ""
	}
	return e.cfg.LinkFor(id, base)
}

// recordLocked adds an event about s to the log, aimed at the MCP session
// of s's owner that created or last sent to s.
func (e *Engine) recordLocked(s *session, ev Event) {
	// The OnChange hooks hear of what the event tells before anyone can
	// hear of the event.
	e.noteLocked(s.rec.ID)
	ev.SessionID = s.rec.ID
	ev.Target = s.rec.Target
	ev.Owner = s.rec.Owner
	ev.Creator = s.rec.OwnerTokenID
	ev = e.events.add(ev)
	s.addEvent(ev, e.lim)
	s.rec.Updated = ev.Time
	if e.cfg.Node == "" {
		// In a cluster the worker may run on another node: every node's
		// events reach the orchestrator through RelayEvent instead.
		e.relayLocked(ev)
	}
}

// RelayEvent queues ev into the orchestrator session here that subscribed
// to the token that created ev's session, if any: in a cluster, where
// every node's events, numbered for the cluster, come to each node, and an
// orchestrator's workers may run on other nodes than its own.
func (e *Engine) RelayEvent(ev Event) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.relayLocked(ev)
}

// Relay delivers the events of every session that the token childTokenID
// creates into session orchestratorID, as queued prompts: an orchestrator
// session subscribed to its workers. The MCPServers hook calls it when it
// gives an orchestrator its child token. Relays live in memory: the hook
// registers them again when it relaunches the orchestrator's agent.
func (e *Engine) Relay(childTokenID, orchestratorID string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.relays[childTokenID] = orchestratorID
}

// relayLocked queues ev into the orchestrator that subscribed to the
// creator of ev's session, if any. The prompt keeps the orchestrator's own
// event target.
func (e *Engine) relayLocked(ev Event) {
	orchID, ok := e.relays[ev.Creator]
	if !ok || orchID == ev.SessionID {
		return
	}
	o := e.sessions[orchID]
	if o == nil || o.dead() {
		return
	}
	owner := Owner{TokenID: o.rec.OwnerTokenID, TokenName: o.rec.OwnerTokenName, ID: o.rec.Owner}
	if err := e.enqueueLocked(o, prompt{text: ev.Render(), owner: owner}, false); err != nil {
		e.log.Warn("a worker's event could not reach its orchestrator", "orchestrator", orchID, "worker", ev.SessionID, "error", err)
	}
}

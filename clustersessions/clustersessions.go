// Package clustersessions serves the agent sessions of every replica of a
// cluster from any one of them. A session runs on the node that created it
// (its id ends in that node's id, [sessions.NodeOf]), whose engine alone
// holds its agent process, its queue and its pending interactions; every
// other replica serves a verb on it by asking that node over the cluster's
// sealed request/reply ([cluster.RPC]). The owning engine decides
// everything as it does on a single node: who may act on the session, and
// which answer to an interaction comes first.
//
// A request carries whom it acts for, never what it may do ([Caller]): the
// token id, the scopes and reach the sending replica's edge found, and a
// JWT principal's access token or a session page's capability. Whoever
// holds the cluster key can send any request, so the node that runs the
// session establishes the caller itself ([Resolver]): a token from its own
// store, a JWT or a capability it verifies, with the scopes and reach it
// finds there narrowed to the request's. A caller it does not know, or a
// claim of more than the credential grants, is refused
// ([sessions.ErrCallerRefused]) and reported ([Options.OnRefusal]).
//
// `list` and `pending` (of every session) are served from shared state,
// the sessions directory (directory.go): each node writes, under its own
// prefix of the cluster's storage, what `list` shows of each of its
// sessions and each interaction waiting for an answer, whenever the engine
// says one changed; every replica follows the directory and answers from
// it, with the engine's own rule of who sees what ([sessions.Sees]). A
// verb returns, and an event is published, once what it changed is in the
// directory, and a read waits until the directory has caught up with what
// was written before it, so a session created or an interaction raised on
// one replica is listed on every other at once. The sessions of a node
// that is not alive are still listed, marked unreachable, from what it
// last wrote; a node that starts rewrites its entries and deletes those of
// sessions it no longer has. With NATS away, `list` gives this node's
// sessions alone and says partial.
//
// Events go through one JetStream stream ([cluster.EventStream]): each
// node publishes its engine's events, every node follows the stream, and
// the stream's sequence is the event's number, the same on every replica.
// A replica's MCP endpoint queries and subscribes to that log, so a client
// on any replica gets the `<session-event>`s of sessions on every node.
package clustersessions

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/cluster"
	"github.com/Tahul/caddy-zidane-mcp/policy"
	"github.com/Tahul/caddy-zidane-mcp/sessions"
)

// Options configure the cluster's sessions on one node.
type Options struct {
	// Local is this node's engine; its Config.Node is Node.
	Local sessions.Sessions
	// Listings is the same engine, whose sessions' listings this node
	// writes to the sessions directory (see directory.go).
	Listings Listings
	// LinkFor makes the link of a session of another node that List
	// shows, as that node's engine would (sessions.Config.LinkFor); nil
	// shows none.
	LinkFor func(sessionID, base string) string
	// Node is this node's id.
	Node string
	// Storage is the cluster's storage, whose connection carries the
	// requests and the events.
	Storage *cluster.Storage
	// Peers returns the other live nodes that serve sessions (the node
	// registry's AliveServing("sessions")): a node is asked only if it is
	// among them.
	Peers func() []string
	// LastEvent is the number of the last event Local recorded (the
	// engine's LastEventSeq): Events waits until the events up to it have
	// come back through the stream, so that what a caller just saw
	// happen (a wait that returned) is in what it reads next.
	LastEvent func() int64
	// Relay, when set, gets every new event of the cluster (not those read
	// back at start), for the orchestrators on this node whose workers
	// run anywhere (the engine's RelayEvent).
	Relay func(sessions.Event)
	// MaxEvents is how many events the log keeps (and a node reads back
	// from the stream when it starts). Default sessions.DefaultMaxEvents.
	MaxEvents int
	// Resolve establishes whom another replica's request acts for on this
	// node (see [Resolver]). Required.
	Resolve Resolver
	// OnRefusal, when set, is told of every request of another replica
	// refused for whom it acts for, for the audit log.
	OnRefusal func(Refusal)
	Logger    *slog.Logger
}

// Caller is whom a request to another node acts for, as it travels: who
// the sending replica's edge authenticated, and what that edge found it
// may do, as an upper bound. It carries identity, never authority:
// whoever holds the cluster key can send any request, so the node takes
// from it only whom it names, and establishes the rest itself
// ([Resolver]).
type Caller struct {
	// TokenID is a token of the store, "jwt:<sub>" for a JWT subject, or
	// "" for a session page's reader.
	TokenID string `json:"token,omitempty"`
	// Scopes are the scopes the sending edge found.
	Scopes []string `json:"scopes,omitempty"`
	// Credential is a JWT principal's access token, or a session page's
	// capability, which the node verifies itself
	// ([sessions.Owner.Credential]); "" for a token of the store.
	Credential string `json:"credential,omitempty"`
	// Sessions and Interactions are how far the sending replica let the
	// caller reach into other owners' sessions and interactions.
	Sessions     sessions.Access `json:"sessions,omitempty"`
	Interactions sessions.Access `json:"interactions,omitempty"`
	// MCPSession is the caller's MCP session on the sending replica,
	// where the events of a session it drives go: an address, no right.
	MCPSession string `json:"mcpSession,omitempty"`
}

// callerOf is whom owner is, as a request to another node carries it.
func callerOf(owner sessions.Owner) Caller {
	return Caller{TokenID: owner.TokenID, Scopes: owner.Scopes, Credential: owner.Credential,
		Sessions: owner.OtherSessions, Interactions: owner.OtherInteractions, MCPSession: owner.MCPSession}
}

// Use is what a request of another replica asks of this node's engine:
// one of Verbs of Tool (a tool of the sessions endpoint), on the session
// or interaction ID ("" for none).
type Use struct {
	Tool  string
	Verbs []string
	ID    string
}

// Resolver establishes, on the node that runs a session, the engine's
// Owner for the caller c of another replica's request for u, as this
// node's edge would for the same credential: a token looked up in this
// node's own store, a JWT verified here, a session page's capability
// checked here against u.ID; and it decides again, as the sending edge
// did, that the caller may use one of u.Verbs. The Owner's scopes are
// those found here narrowed to c.Scopes, and its reach is this node's
// rule's (the request's own narrows it further). It returns an error for
// a caller it refuses: a token unknown here, revoked or expired (or whose
// parent is), a JWT that does not verify or is another subject's, a
// capability for another session; one wrapping policy.ErrScopesClaimed
// for a claim of scopes, or a use, that the credential is not granted
// here.
type Resolver func(ctx context.Context, c Caller, u Use) (sessions.Owner, error)

// Refusal is a request of another replica that this node refused for
// whom it acts for.
type Refusal struct {
	// From is the node the request says it comes from.
	From string
	// Method is the verb; ID the session or interaction it is about.
	Method, ID string
	// TokenID is whom the request claims to act for ("" for a session
	// page's reader).
	TokenID string
	// Reason is rpc_principal (a caller this node does not take) or
	// rpc_scopes (a claim of more than its credential grants here).
	Reason string
	// Message says why, as the caller's replica is told.
	Message string
}

// Sessions is sessions.Sessions for a whole cluster, on one node.
type Sessions struct {
	local  sessions.Sessions
	node   string
	rpc    *cluster.RPC
	stream *cluster.EventStream
	peers  func() []string
	log    *slog.Logger
	events *sessions.EventLog
	relay  func(sessions.Event)
	lastEv func() int64
	dir    *directory
	area   *cluster.NodeArea
	link   func(id, base string) string
	// resolve and refused: see Options.Resolve and Options.OnRefusal.
	resolve Resolver
	refused func(Refusal)

	stopFollow  func()
	unsubscribe func()
	pubDone     chan struct{} // closed once the publisher has stopped

	// instance tells this process's events from those of an earlier
	// process under the same node id, whose engine may have numbered
	// events as this one does (a crash before it stored its events).
	instance string

	mu   sync.Mutex
	cond *sync.Cond        // on mu: broadcast when last, settled or published move
	last map[string]int64  // node -> the engine's number of its last event taken
	inst map[string]string // node -> the instance of its last event taken
	// waits counts, per owner, the waits open here for other replicas.
	waits map[string]int
	// settled is the engine's number of the last event of this node's the
	// publisher is done with (published, or given up on), published of the
	// last it published.
	settled, published int64
}

var _ sessions.Sessions = (*Sessions)(nil)

// Service is the name of the requests' service, in their NATS subject
// (zidane.rpc.<bucket>.<Service>.<node>) and the key that seals them. It
// names the requests' format: a replica of an earlier release, whose
// requests carried the caller's authority, neither reaches this one nor
// is reached by it.
const Service = "sessions-v2"

// streamName is the events' stream.
const streamName = "session_events"

// publishTries bounds the tries to publish one event while NATS is away.
const publishTries = 5

// New starts serving this node's sessions to the other replicas and
// following the cluster's events. Close stops both.
func New(ctx context.Context, opts Options) (*Sessions, error) {
	if opts.Local == nil || opts.Listings == nil || opts.Storage == nil || opts.Peers == nil || opts.Resolve == nil {
		return nil, errors.New("clustersessions: Local, Listings, Storage, Peers and Resolve are required")
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	max := opts.MaxEvents
	if max <= 0 {
		max = sessions.DefaultMaxEvents
	}
	s := &Sessions{
		local: opts.Local, node: opts.Node, peers: opts.Peers, log: log, relay: opts.Relay, lastEv: opts.LastEvent,
		events: sessions.NewEventLog(max, log.Warn), last: map[string]int64{}, inst: map[string]string{}, waits: map[string]int{},
		instance: rand.Text()[:16],
		pubDone:  make(chan struct{}),
		link:     opts.LinkFor,
		resolve:  opts.Resolve,
		refused:  opts.OnRefusal,
	}
	s.cond = sync.NewCond(&s.mu)
	if s.lastEv == nil {
		s.lastEv = func() int64 { return 0 }
	}
	var err error
	if s.stream, err = opts.Storage.OpenEventStream(ctx, streamName, int64(max), log); err != nil {
		return nil, err
	}
	if s.area, err = opts.Storage.FollowNodeArea(directoryArea, accept, log); err != nil {
		return nil, err
	}
	s.dir = newDirectory(opts.Storage, opts.Node, opts.Listings, log)
	s.dir.start(ctx)
	if s.rpc, err = opts.Storage.ServeRPC(Service, opts.Node, s.serve, log); err != nil {
		s.dir.close()
		s.area.Close()
		return nil, err
	}
	// What the stream holds at start is put back, not pushed again: those
	// events were pushed when they happened.
	var backlog uint64
	if backlog, err = s.stream.Last(ctx); err == nil {
		s.stopFollow, err = s.stream.Follow(ctx, uint64(max), func(seq uint64, at time.Time, body []byte) { s.take(seq, at, body, seq <= backlog) })
	}
	if err != nil {
		s.rpc.Close()
		s.dir.close()
		s.area.Close()
		return nil, err
	}
	s.startPublisher()
	return s, nil
}

// Close stops serving and following. The engine is the caller's to close.
func (s *Sessions) Close() {
	s.unsubscribe()
	<-s.pubDone
	s.rpc.Close()
	s.stopFollow()
	s.events.Close()
	s.dir.close()
	s.area.Close()
}

// wireEvent is an event as it travels in the stream: who published it
// (node and process), its number there and when, which a copy put back in
// the stream cannot change.
type wireEvent struct {
	Node     string         `json:"node"`
	Instance string         `json:"instance"`
	Local    int64          `json:"local"`
	At       int64          `json:"at"` // Unix milliseconds
	Event    sessions.Event `json:"event"`
	Target   string         `json:"target,omitempty"`
	Owner    string         `json:"owner,omitempty"`
	Creator  string         `json:"creator,omitempty"`
}

// startPublisher publishes every event of this node's engine to the
// stream, in the engine's order, each under an id of its own so that a
// retry is kept once.
func (s *Sessions) startPublisher() {
	queue := make(chan sessions.Event, 1024)
	stop := make(chan struct{})
	unsub := s.local.Subscribe(func(ev sessions.Event) {
		select {
		case queue <- ev:
		case <-stop:
		}
	})
	var once sync.Once
	s.unsubscribe = func() {
		once.Do(func() {
			unsub()
			close(stop)
		})
	}
	go func() {
		defer close(s.pubDone)
		for {
			select {
			case <-stop:
				return
			case ev := <-queue:
				s.publish(ev, stop)
			}
		}
	}()
}

func (s *Sessions) publish(ev sessions.Event, stop <-chan struct{}) {
	ok := false
	defer func() {
		s.mu.Lock()
		s.settled = max(s.settled, ev.Seq)
		if ok {
			s.published = max(s.published, ev.Seq)
		}
		s.mu.Unlock()
		s.cond.Broadcast()
	}()
	// What the event says happened is in the directory before any
	// replica hears of it.
	s.dir.flush(context.Background())
	id := s.node + ":" + s.instance + ":" + strconv.FormatInt(ev.Seq, 10)
	for try := 1; ; try++ {
		// Dated at each try: the stream takes it within eventFreshness of
		// this, or not at all.
		body, _ := json.Marshal(wireEvent{Node: s.node, Instance: s.instance, Local: ev.Seq, At: time.Now().UnixMilli(),
			Event: ev, Target: ev.Target, Owner: ev.Owner, Creator: ev.Creator})
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := s.stream.Publish(ctx, id, body)
		cancel()
		if err == nil {
			ok = true
			return
		}
		if try == publishTries {
			// Not numbered for the cluster, and not in its log: still
			// pushed to this replica's clients and orchestrators.
			s.log.Error("an event of a session could not reach the cluster's stream: this replica's clients get it without a cluster number, the others' miss it, and events does not list it", "session", ev.SessionID, "engine_seq", ev.Seq, "error", err)
			s.events.Offer(ev)
			if s.relay != nil {
				s.relay(ev)
			}
			return
		}
		select {
		case <-stop:
			return
		case <-time.After(time.Duration(try) * time.Second):
		}
	}
}

// eventFreshness is how far the time an event was published may be from
// the time the stream took it: a copy put back in the stream later, by a
// NATS user without the key, is not taken.
const eventFreshness = 10 * time.Second

// maxInstances bounds the nodes whose last event's process is remembered.
const maxInstances = 4096

// take puts one event of the stream, which the stream took at at, into
// the log.
func (s *Sessions) take(seq uint64, at time.Time, body []byte, restore bool) {
	var w wireEvent
	if json.Unmarshal(body, &w) != nil || sessions.CheckNode(w.Node) != nil || sessions.NodeOf(w.Event.SessionID) != w.Node {
		return
	}
	if d := at.Sub(time.UnixMilli(w.At)); d > eventFreshness || d < -eventFreshness {
		return // published long before the stream took it: a copy put back
	}
	s.mu.Lock()
	if s.inst[w.Node] == w.Instance && w.Local <= s.last[w.Node] {
		s.mu.Unlock()
		return // a copy of one taken
	}
	if _, known := s.inst[w.Node]; !known && len(s.inst) >= maxInstances {
		s.mu.Unlock()
		return
	}
	s.last[w.Node], s.inst[w.Node] = w.Local, w.Instance
	s.mu.Unlock()
	s.cond.Broadcast()
	ev := w.Event
	ev.Seq, ev.Target, ev.Owner, ev.Creator = int64(seq), w.Target, w.Owner, w.Creator
	s.events.Put(ev, restore)
	if !restore && s.relay != nil {
		s.relay(ev)
	}
}

// nodeOf is the node that runs id, or "" when it is this one's (or no
// node's: the local engine then says it does not know it).
func (s *Sessions) nodeOf(id string) string {
	if n := sessions.NodeOf(id); n != s.node {
		return n
	}
	return ""
}

// Create starts the session here: this node runs its agent. It returns
// once the session is in the directory, so that a list on any replica
// shows it.
func (s *Sessions) Create(ctx context.Context, owner sessions.Owner, req sessions.CreateRequest) (sessions.Created, error) {
	c, err := s.local.Create(ctx, owner, req)
	s.dir.flush(ctx)
	return c, err
}

func (s *Sessions) Send(ctx context.Context, owner sessions.Owner, id, prompt string) (bool, error) {
	if n := s.nodeOf(id); n != "" {
		var out struct{ Queued bool }
		err := s.call(ctx, n, "send", request{Caller: callerOf(owner), ID: id, Text: prompt}, &out)
		return out.Queued, err
	}
	defer s.dir.flush(ctx)
	return s.local.Send(ctx, owner, id, prompt)
}

func (s *Sessions) Steer(ctx context.Context, owner sessions.Owner, id, text string) (string, error) {
	if n := s.nodeOf(id); n != "" {
		var out struct{ Mode string }
		err := s.call(ctx, n, "steer", request{Caller: callerOf(owner), ID: id, Text: text}, &out)
		return out.Mode, err
	}
	defer s.dir.flush(ctx)
	return s.local.Steer(ctx, owner, id, text)
}

func (s *Sessions) Cancel(ctx context.Context, owner sessions.Owner, id string) error {
	if n := s.nodeOf(id); n != "" {
		return s.call(ctx, n, "cancel", request{Caller: callerOf(owner), ID: id}, nil)
	}
	defer s.dir.flush(ctx)
	return s.local.Cancel(ctx, owner, id)
}

func (s *Sessions) Read(owner sessions.Owner, id string, full bool) (sessions.SessionView, error) {
	if n := s.nodeOf(id); n != "" {
		var v sessions.SessionView
		err := s.read(n, "read", request{Caller: callerOf(owner), ID: id, Full: full}, &v)
		return v, err
	}
	return s.local.Read(owner, id, full)
}

func (s *Sessions) Transcript(owner sessions.Owner, id string, turns int, full bool) ([]sessions.Turn, error) {
	if n := s.nodeOf(id); n != "" {
		var out []sessions.Turn
		err := s.read(n, "transcript", request{Caller: callerOf(owner), ID: id, N: turns, Full: full}, &out)
		return out, err
	}
	return s.local.Transcript(owner, id, turns, full)
}

func (s *Sessions) Wait(ctx context.Context, owner sessions.Owner, id string, timeout time.Duration) (sessions.SessionView, error) {
	if n := s.nodeOf(id); n != "" {
		var v sessions.SessionView
		err := s.call(ctx, n, "wait", request{Caller: callerOf(owner), ID: id, Wait: timeout}, &v)
		return v, err
	}
	defer s.dir.flush(ctx)
	return s.local.Wait(ctx, owner, id, timeout)
}

// List is this node's sessions, from its engine, and the other nodes',
// from the directory, newest first. The directory is read once it holds
// every entry written before List began (bounded by syncWait): a session
// created on another replica before is listed. A session whose node is
// not alive is listed as its node last wrote it, Unreachable. When the
// directory cannot be read (NATS away), List gives this node's sessions
// alone, and partial.
func (s *Sessions) List(owner sessions.Owner, limit int) ([]sessions.SessionView, bool) {
	if limit <= 0 {
		limit = 20
	}
	ctx, cancel := context.WithTimeout(context.Background(), syncWait)
	err := s.area.Sync(ctx)
	cancel()
	all, partial := s.local.List(owner, limit)
	if err != nil {
		s.log.Warn("the sessions directory could not be read; list shows this node's sessions alone", "error", err)
		return all, true
	}
	alive := s.alive()
	bases := map[string]string{}
	s.area.Each(func(node, _ string, v any) {
		e, ok := v.(*sessionEntry)
		if !ok || node == s.node || !sessions.Sees(owner, e.Owner, owner.OtherSessions, sessions.AccessRead) {
			return
		}
		view := sessions.ListedView(e.View, owner, e.Owner, e.OwnerTokenID)
		view.Unreachable = !alive[node]
		all = append(all, view)
		bases[view.SessionID] = e.Base
	})
	sessions.SortViews(all)
	if len(all) > limit {
		all, partial = all[:limit], true
	}
	for i := range all {
		if base, ok := bases[all[i].SessionID]; ok && base != "" && s.link != nil {
			all[i].Link = s.link(all[i].SessionID, base)
		}
	}
	return all, partial
}

// alive is the set of the other nodes that serve sessions now.
func (s *Sessions) alive() map[string]bool {
	alive := map[string]bool{}
	for _, n := range s.peers() {
		alive[n] = true
	}
	return alive
}

// syncWait bounds how long Events waits for the events a node recorded
// to come back through the stream.
const syncWait = 2 * time.Second

// Events are the cluster's, from the stream. First each node that may
// hold them (the filter's session's, or every live one) says how far it
// has published its events, and Events waits, bounded, until the stream
// has brought them here: what a caller saw happen just before (a wait
// that returned idle) is in what it reads. A filter on a session of
// another node asks that node whether owner reaches it.
func (s *Sessions) Events(owner sessions.Owner, filter sessions.EventFilter) ([]sessions.Event, error) {
	marks := map[string]int64{}
	if n := s.nodeOf(filter.SessionID); n != "" {
		var mark int64
		if err := s.readWithin(n, "mark", request{Caller: callerOf(owner), ID: filter.SessionID}, &mark, markTimeout); err != nil {
			if errors.Is(err, sessions.ErrNotOwner) {
				return nil, err
			}
		} else {
			marks[n] = mark
		}
	} else {
		if filter.SessionID != "" {
			if _, err := s.local.Events(owner, sessions.EventFilter{SessionID: filter.SessionID, Limit: 1}); errors.Is(err, sessions.ErrNotOwner) {
				return nil, err
			}
		} else {
			peers, parts := s.everyNode(func(n string) (any, error) {
				var mark int64
				err := s.readWithin(n, "mark", request{Caller: callerOf(owner)}, &mark, markTimeout)
				return mark, err
			}, func() any { return nil })
			for i, n := range peers {
				if m, ok := parts[i].(int64); ok {
					marks[n] = m
				}
			}
		}
		marks[s.node] = s.mark()
	}
	s.caughtUp(marks)
	return s.events.Query(owner, filter), nil
}

// mark waits, bounded, until the publisher is done with every event the
// engine has recorded, and returns the engine's number of the last one it
// published.
func (s *Sessions) mark() int64 {
	target := s.lastEv()
	deadline := time.Now().Add(syncWait)
	stop := time.AfterFunc(syncWait, s.wake)
	defer stop.Stop()
	s.mu.Lock()
	defer s.mu.Unlock()
	for s.settled < target && time.Now().Before(deadline) {
		s.cond.Wait()
	}
	return s.published
}

// wake wakes the waiters of cond, under its lock, so that a waiter
// between its check and its Wait does not miss it.
func (s *Sessions) wake() {
	s.mu.Lock()
	s.cond.Broadcast()
	s.mu.Unlock()
}

// caughtUp waits, bounded, until the stream has brought the events of
// each node up to its mark.
func (s *Sessions) caughtUp(marks map[string]int64) {
	deadline := time.Now().Add(syncWait)
	stop := time.AfterFunc(syncWait, s.wake)
	defer stop.Stop()
	s.mu.Lock()
	defer s.mu.Unlock()
	for time.Now().Before(deadline) {
		behind := false
		for n, m := range marks {
			if s.last[n] < m {
				behind = true
			}
		}
		if !behind {
			return
		}
		s.cond.Wait()
	}
}

// Pending is a session's, from its node; or this node's, from its
// engine, and the other nodes', from the directory (read as List reads
// it), oldest first. An interaction of a node that is not alive is
// Unreachable. When the directory cannot be read, Pending gives this
// node's alone.
func (s *Sessions) Pending(owner sessions.Owner, id string) ([]sessions.Interaction, error) {
	if id != "" {
		if n := s.nodeOf(id); n != "" {
			var out []sessions.Interaction
			err := s.read(n, "pending", request{Caller: callerOf(owner), ID: id}, &out)
			return out, err
		}
		return s.local.Pending(owner, id)
	}
	ctx, cancel := context.WithTimeout(context.Background(), syncWait)
	err := s.area.Sync(ctx)
	cancel()
	all, lerr := s.local.Pending(owner, "")
	if lerr != nil {
		return nil, lerr
	}
	if err != nil {
		s.log.Warn("the sessions directory could not be read; pending shows this node's interactions alone", "error", err)
		return all, nil
	}
	alive := s.alive()
	s.area.Each(func(node, _ string, v any) {
		e, ok := v.(*pendingEntry)
		if !ok || node == s.node || !sessions.Sees(owner, e.Owner, owner.OtherInteractions, sessions.AccessRead) {
			return
		}
		it := e.Interaction
		it.Unreachable = !alive[node]
		all = append(all, it)
	})
	sessions.SortInteractions(all)
	return all, nil
}

// Answer goes to the node of the interaction, whose engine takes the
// first answer and refuses the others.
func (s *Sessions) Answer(ctx context.Context, owner sessions.Owner, requestID string, a sessions.Answer) error {
	if n := s.nodeOf(requestID); n != "" {
		return s.call(ctx, n, "answer", request{Caller: callerOf(owner), ID: requestID, Answer: &a}, nil)
	}
	defer s.dir.flush(ctx)
	return s.local.Answer(ctx, owner, requestID, a)
}

// Subscribe delivers the cluster's events.
func (s *Sessions) Subscribe(fn func(sessions.Event)) func() { return s.events.Subscribe(fn) }

// RevokeToken cancels what the token started here; every node hears of
// the revocation through the shared token store and does the same.
func (s *Sessions) RevokeToken(tokenID string) {
	s.local.RevokeToken(tokenID)
	s.dir.flush(context.Background())
}

// empty is what everyNode gives for a node that serves no sessions.
var empty = struct{}{}

// everyNode runs remote on every live peer and local here, at once, and
// returns what each gave, the peers' in the order of peers and then
// local's; nil for a peer that failed (logged), empty for one that serves
// no sessions.
func (s *Sessions) everyNode(remote func(node string) (any, error), local func() any) (peers []string, out []any) {
	peers = s.peers()
	out = make([]any, len(peers)+1)
	var wg sync.WaitGroup
	for i, n := range peers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			v, err := remote(n)
			switch {
			case errors.Is(err, cluster.ErrRPCNotServing):
				// Alive in the registry, but with no sessions endpoint
				// (an aggregated route's replica): it holds none.
				out[i] = empty
				return
			case err != nil:
				s.log.Warn("a node did not answer; what it holds is left out", "node", n, "error", err)
				return
			}
			out[i] = v
		}()
	}
	out[len(peers)] = local()
	wg.Wait()
	return peers, out
}

// maxWaitsPerOwner bounds the waits one owner holds open on a node for
// other replicas, each in one of the node's request slots: a caller that
// keeps many open cannot take the slots every other owner's verbs need.
const maxWaitsPerOwner = 16

// holdWait counts a wait of owner's, if it has fewer than
// maxWaitsPerOwner open; release uncounts it.
func (s *Sessions) holdWait(owner string) (release func(), ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.waits[owner] >= maxWaitsPerOwner {
		return nil, false
	}
	s.waits[owner]++
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.waits[owner]--; s.waits[owner] <= 0 {
			delete(s.waits, owner)
		}
	}, true
}

// readTimeout bounds a verb that does not wait (all but wait, send and
// the like, which have their caller's context).
const readTimeout = 15 * time.Second

// unlistedWait bounds the wait for a node the registry does not list as
// serving sessions.
const unlistedWait = 2 * time.Second

// markTimeout bounds a node's answer to "mark", which waits at most
// syncWait for its publisher.
const markTimeout = syncWait + time.Second

// read calls a verb whose caller gives no context, bounded by readTimeout.
func (s *Sessions) read(node, method string, req request, out any) error {
	return s.readWithin(node, method, req, out, readTimeout)
}

func (s *Sessions) readWithin(node, method string, req request, out any, within time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	return s.call(ctx, node, method, req, out)
}

// request is a verb's arguments, as they travel to the session's node.
type request struct {
	Caller Caller           `json:"caller"`
	ID     string           `json:"id,omitempty"`
	Text   string           `json:"text,omitempty"`
	Full   bool             `json:"full,omitempty"`
	N      int              `json:"n,omitempty"`
	Wait   time.Duration    `json:"wait,omitempty"`
	Answer *sessions.Answer `json:"answer,omitempty"`
}

// reply is a verb's outcome: a result, or the engine's error as a code
// that names it and its message.
type reply struct {
	Result json.RawMessage `json:"result,omitempty"`
	Code   string          `json:"code,omitempty"`
	Error  string          `json:"error,omitempty"`
}

// codes name the engine's errors on the wire, in the order encode tries
// them.
var codes = []struct {
	code string
	kind error
}{
	{"not_owner", sessions.ErrNotOwner}, {"no_session", sessions.ErrNoSession},
	{"no_interaction", sessions.ErrNoInteraction}, {"already_answered", sessions.ErrAlreadyAnswered},
	{"not_running", sessions.ErrNotRunning}, {"ended", sessions.ErrEnded},
	{"bad_request", sessions.ErrBadRequest}, {"busy", sessions.ErrBusy},
	{"quota", sessions.ErrQuota}, {"closed", sessions.ErrClosed},
	{"caller_refused", sessions.ErrCallerRefused},
}

func kindOf(code string) error {
	for _, c := range codes {
		if c.code == code {
			return c.kind
		}
	}
	return nil
}

// remoteError is an engine's error from another node: its message as the
// engine wrote it, and the engine error it is.
type remoteError struct {
	msg  string
	kind error
}

func (e *remoteError) Error() string { return e.msg }
func (e *remoteError) Unwrap() error { return e.kind }

func (s *Sessions) call(ctx context.Context, node, method string, req request, out any) error {
	body, err := json.Marshal(req)
	if err != nil {
		return err
	}
	if !slices.Contains(s.peers(), node) {
		// Not alive in the registry, or serving no sessions: down or
		// restarting, most likely, or between two heartbeats of a
		// registry that a failed reload closed. It is asked all the same,
		// briefly: only its sealed answer counts.
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, unlistedWait)
		defer cancel()
	}
	raw, err := s.rpc.Call(ctx, node, method, body)
	if err != nil {
		if errors.Is(err, cluster.ErrRPCUnreachable) {
			// Its node is down: as far as this replica can tell, the
			// session is gone until its node is back.
			return fmt.Errorf("%w: %w (node %s); try again once it is back", sessions.ErrNoSession, sessions.ErrUnreachable, node)
		}
		return fmt.Errorf("%w (node %s)", err, node)
	}
	var rep reply
	if err := json.Unmarshal(raw, &rep); err != nil {
		return fmt.Errorf("node %s answered what this replica cannot read: %w", node, err)
	}
	if rep.Code != "" || rep.Error != "" {
		kind := kindOf(rep.Code)
		if kind == nil {
			return errors.New(rep.Error)
		}
		return &remoteError{msg: rep.Error, kind: kind}
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(rep.Result, out); err != nil {
		return fmt.Errorf("node %s answered what this replica cannot read: %w", node, err)
	}
	return nil
}

// uses are the requests serve carries out, each with the tool and the
// verbs of the sessions endpoint that ask it: a caller may make it only
// if it may call one of them.
var uses = map[string]Use{
	"send":       {Tool: "sessions", Verbs: []string{"send"}},
	"steer":      {Tool: "sessions", Verbs: []string{"steer"}},
	"cancel":     {Tool: "sessions", Verbs: []string{"cancel"}},
	"read":       {Tool: "sessions", Verbs: []string{"read", "events"}}, // events: a session's events resource reads it first
	"transcript": {Tool: "sessions", Verbs: []string{"transcript"}},
	"wait":       {Tool: "sessions", Verbs: []string{"wait"}},
	"mark":       {Tool: "sessions", Verbs: []string{"events"}},
	"pending":    {Tool: "interactions", Verbs: []string{"pending"}},
	"answer":     {Tool: "interactions", Verbs: []string{"answer"}},
}

// serve carries out another replica's request on this node's engine, for
// the caller it establishes here (callerHere). It serves only this node's
// sessions: a request about another node's is refused, so that no request
// is passed on twice.
func (s *Sessions) serve(ctx context.Context, method string, body json.RawMessage) (json.RawMessage, error) {
	var req request
	if err := json.Unmarshal(body, &req); err != nil {
		return nil, fmt.Errorf("a request this node cannot read: %w", err)
	}
	use, ok := uses[method]
	if !ok {
		return nil, fmt.Errorf("no such verb %q", method)
	}
	if req.ID != "" && sessions.NodeOf(req.ID) != s.node {
		return encode(nil, fmt.Errorf("%w: %q is not a session of node %s", sessions.ErrNoSession, req.ID, s.node))
	}
	use.ID = req.ID
	owner, err := s.callerHere(ctx, method, use, req.Caller)
	if err != nil {
		return encode(nil, err)
	}
	var result any
	switch method {
	case "send":
		var q bool
		q, err = s.local.Send(ctx, owner, req.ID, req.Text)
		result = struct{ Queued bool }{q}
	case "steer":
		var m string
		m, err = s.local.Steer(ctx, owner, req.ID, req.Text)
		result = struct{ Mode string }{m}
	case "cancel":
		err = s.local.Cancel(ctx, owner, req.ID)
	case "read":
		result, err = s.local.Read(owner, req.ID, req.Full)
	case "transcript":
		result, err = s.local.Transcript(owner, req.ID, req.N, req.Full)
	case "wait":
		release, ok := s.holdWait(owner.OwnerID())
		if !ok {
			err = fmt.Errorf("%w: %d waits of this owner are open on node %s already; wait on fewer sessions at once, or rely on the <session-event> notifications", sessions.ErrBadRequest, maxWaitsPerOwner, s.node)
			break
		}
		result, err = s.local.Wait(ctx, owner, req.ID, min(req.Wait, cluster.MaxRPCWait-5*time.Second))
		release()
	case "pending":
		result, err = s.local.Pending(owner, req.ID)
	case "mark":
		if req.ID != "" {
			if _, err = s.local.Events(owner, sessions.EventFilter{SessionID: req.ID, Limit: 1}); err != nil {
				break
			}
		}
		result = s.mark()
	case "answer":
		if req.Answer == nil {
			err = fmt.Errorf("%w: an answer is missing", sessions.ErrBadRequest)
			break
		}
		err = s.local.Answer(ctx, owner, req.ID, *req.Answer)
	}
	switch method {
	case "send", "steer", "cancel", "wait", "answer":
		// What the verb changed is in the directory before the caller's
		// replica hears back.
		s.dir.flush(ctx)
	}
	return encode(result, err)
}

// callerHere is the engine's Owner on this node for c, the caller of
// another replica's request for method, which is u: whom the resolver
// establishes from the identity c names, with the reach c claims, which
// may only narrow it. Else it is the refusal, reported to OnRefusal.
func (s *Sessions) callerHere(ctx context.Context, method string, u Use, c Caller) (sessions.Owner, error) {
	refuse := func(reason, msg string) (sessions.Owner, error) {
		if s.refused != nil {
			s.refused(Refusal{From: cluster.RPCFrom(ctx), Method: method, ID: u.ID, TokenID: c.TokenID, Reason: reason, Message: msg})
		}
		return sessions.Owner{}, fmt.Errorf("%w: %s", sessions.ErrCallerRefused, msg)
	}
	owner, err := s.resolve(ctx, c, u)
	switch {
	case errors.Is(err, policy.ErrScopesClaimed):
		return refuse("rpc_scopes", err.Error())
	case err != nil:
		return refuse("rpc_principal", err.Error())
	case c.Sessions > owner.OtherSessions || c.Interactions > owner.OtherInteractions:
		// No replica of this cluster claims more reach than its credential
		// gives it: only a holder of the cluster key would.
		return refuse("rpc_scopes", fmt.Sprintf("the request claims that %s reaches %s sessions and %s interactions; here it reaches %s sessions and %s interactions",
			callerName(c), accessName(c.Sessions), accessName(c.Interactions), accessName(owner.OtherSessions), accessName(owner.OtherInteractions)))
	}
	owner.OtherSessions, owner.OtherInteractions = c.Sessions, c.Interactions
	owner.MCPSession = c.MCPSession
	owner.Credential = "" // checked: the engine has no use for it
	return owner, nil
}

// accessName says what a reaches, for a message.
func accessName(a sessions.Access) string {
	switch a {
	case sessions.AccessOwn:
		return "its owner's"
	case sessions.AccessRead:
		return "(to read) every owner's"
	case sessions.AccessAll:
		return "every owner's"
	}
	return fmt.Sprintf("(access %d)", a)
}

// callerName is whom c names, for a message.
func callerName(c Caller) string {
	if c.TokenID == "" {
		return "a session page's reader"
	}
	return strconv.Quote(c.TokenID)
}

func encode(result any, err error) (json.RawMessage, error) {
	var rep reply
	if err != nil {
		rep.Error = err.Error()
		for _, c := range codes {
			if errors.Is(err, c.kind) {
				rep.Code = c.code
				break
			}
		}
	} else if result != nil {
		b, merr := json.Marshal(result)
		if merr != nil {
			return nil, merr
		}
		rep.Result = b
	}
	return json.Marshal(rep)
}

// Alive is the rule by which node keeps the tokens minted for sessions'
// agents: a session of another node is that node's to judge, so its
// tokens stay; one of this node's, or one whose id names no node (a
// session of this host's from before it joined a cluster), is alive when
// local, this node's engine, says so.
func Alive(node string, local func(id string) bool) func(id string) bool {
	return func(id string) bool {
		if n := sessions.NodeOf(id); n != "" && n != node {
			return true
		}
		return local(id)
	}
}

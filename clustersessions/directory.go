package clustersessions

import (
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/cluster"
	"github.com/Tahul/caddy-zidane-mcp/sessions"
)

// The sessions directory: what `list` and `pending` show of every node's
// sessions, in the cluster's storage, each node's under its own prefix:
//
//	zidane/nodes/<node>/directory/sessions/<session id>   sessionEntry
//	zidane/nodes/<node>/directory/pending/<request id>    pendingEntry
//
// Only the node that runs a session writes its entries, when the engine
// says the session changed (Listings.OnChange: created, a turn started or
// ended, its state or queue changed, an interaction became pending or
// stopped being pending, it failed, it was dropped); never per chunk of an
// agent's answer. A verb that changed a session returns, and an event is
// published, only once the entries of what changed are written (or the
// write failed, bounded by flushWait), so a replica that reads the
// directory after it sees what the verb did. A node that starts rewrites
// its sessions' entries and deletes those of its that no longer exist.
//
// Every replica follows the directory with one watch ([cluster.NodeArea]);
// List and Pending first wait, bounded by syncWait, until the watch has
// brought every entry written before they began, then answer from it. An
// entry counts only if it opens as the value of its own key and names a
// session and an interaction of the node whose prefix holds it.
//
// Bounds: a node writes one session entry per session its engine keeps (at
// most Limits.MaxSessions, 1,000 by default), each a few KiB (LastMessage
// is cut to sessions.PreviewChars), and one pending entry per interaction
// waiting for an answer, which needs a running agent (at most
// Limits.MaxAgents × Limits.MaxPending, 64 × 32 by default), each holding
// its payload (each text in it cut at 256 KiB).
const (
	directoryArea = "directory"
	sessionsDir   = "sessions/"
	pendingDir    = "pending/"
)

// Listings is what the directory reads of this node's engine
// (sessions.Engine implements it).
type Listings interface {
	Listing(id string) (sessions.Listing, bool)
	ListingIDs() []string
	OnChange(fn func(sessionID string)) (stop func())
}

// sessionEntry is what the directory holds of a session.
type sessionEntry struct {
	View         sessions.SessionView `json:"view"`
	Owner        string               `json:"owner"`
	OwnerTokenID string               `json:"ownerTokenId,omitempty"`
	Base         string               `json:"base,omitempty"`
}

// pendingEntry is what the directory holds of an interaction.
type pendingEntry struct {
	Interaction sessions.Interaction `json:"interaction"`
	Owner       string               `json:"owner"`
}

// accept takes an entry of node's directory only if it names a session
// (and an interaction) of that node, under the name of its key.
func accept(node, name string, value []byte) (any, bool) {
	if id, ok := strings.CutPrefix(name, sessionsDir); ok {
		var e sessionEntry
		if json.Unmarshal(value, &e) != nil || e.View.SessionID != id || sessions.NodeOf(id) != node || e.Owner == "" {
			return nil, false
		}
		e.View.Link, e.View.Worker, e.View.Foreign, e.View.Unreachable = "", false, false, false
		return &e, true
	}
	if id, ok := strings.CutPrefix(name, pendingDir); ok {
		var e pendingEntry
		if json.Unmarshal(value, &e) != nil || e.Interaction.RequestID != id || sessions.NodeOf(id) != node ||
			sessions.NodeOf(e.Interaction.SessionID) != node || e.Owner == "" {
			return nil, false
		}
		e.Interaction.Unreachable = false
		return &e, true
	}
	return nil, false
}

// flushWait bounds how long a verb waits for the directory entries of
// what it changed; syncWait (in clustersessions.go) how long List and
// Pending wait for the directory to catch up.
const flushWait = 3 * time.Second

// writeTimeout bounds one write of a session's entries.
const writeTimeout = 10 * time.Second

// directoryWriters is how many sessions' entries are written at once.
const directoryWriters = 4

// directory writes this node's entries.
type directory struct {
	st     *cluster.Storage
	node   string
	lst    Listings
	prefix string // zidane/nodes/<node>/directory/
	log    *slog.Logger
	stop   func()          // the OnChange hook's
	ctx    context.Context // ends at close: a write under way is abandoned
	cancel context.CancelFunc

	mu     sync.Mutex
	cond   *sync.Cond // on mu
	closed bool
	gen    uint64
	want   map[string]uint64 // session id -> the generation of its last change
	done   map[string]uint64 // session id -> the generation last written
	queued map[string]bool
	busy   map[string]bool
	queue  []string
	// failing: the last write failed; verbs do not wait for writes until
	// one succeeds again.
	failing bool
	// written holds what was last written at each key of this node's,
	// pendingOf the request ids written for each session.
	written   map[string][]byte
	pendingOf map[string][]string
	workers   sync.WaitGroup
}

func newDirectory(st *cluster.Storage, node string, lst Listings, log *slog.Logger) *directory {
	d := &directory{
		st: st, node: node, lst: lst, log: log, prefix: "zidane/nodes/" + node + "/" + directoryArea + "/",
		want: map[string]uint64{}, done: map[string]uint64{}, queued: map[string]bool{}, busy: map[string]bool{},
		written: map[string][]byte{}, pendingOf: map[string][]string{},
	}
	d.cond = sync.NewCond(&d.mu)
	d.ctx, d.cancel = context.WithCancel(context.Background())
	return d
}

// start hooks the engine, reconciles what storage holds with what the
// engine holds, and starts the writers. It waits, bounded by ctx, for
// the entries of every session to be written.
func (d *directory) start(ctx context.Context) {
	d.stop = d.lst.OnChange(d.mark)
	for range directoryWriters {
		d.workers.Add(1)
		go d.work()
	}
	ids := d.lst.ListingIDs()
	live := map[string]bool{}
	for _, id := range ids {
		live[d.prefix+sessionsDir+id] = true
		if l, ok := d.lst.Listing(id); ok {
			for _, it := range l.Pending {
				live[d.prefix+pendingDir+it.RequestID] = true
			}
		}
	}
	keys, err := d.st.List(ctx, strings.TrimSuffix(d.prefix, "/"), true)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		d.log.Warn("reading this node's entries in the sessions directory failed; those of sessions that are gone stay listed until the next start", "error", err)
	}
	for _, k := range keys {
		name := strings.TrimPrefix(k, d.prefix)
		if live[k] || name == strings.TrimSuffix(sessionsDir, "/") || name == strings.TrimSuffix(pendingDir, "/") {
			continue
		}
		if err := d.st.Delete(ctx, k); err != nil {
			d.log.Warn("deleting an entry of a session that is gone from the sessions directory failed", "key", k, "error", err)
		}
	}
	for _, id := range ids {
		d.mark(id)
	}
	d.flush(ctx)
}

func (d *directory) close() {
	if d.stop != nil {
		d.stop()
	}
	d.mu.Lock()
	d.closed = true
	d.mu.Unlock()
	d.cancel()
	d.cond.Broadcast()
	d.workers.Wait()
}

// mark notes that session id changed. It runs under the engine's lock:
// it only takes note.
func (d *directory) mark(id string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return
	}
	d.gen++
	d.want[id] = d.gen
	if !d.queued[id] {
		d.queued[id] = true
		d.queue = append(d.queue, id)
	}
	d.cond.Broadcast()
}

// flush waits until the entries of every change noted so far are
// written, or ctx ends, or flushWait has passed; at once while writes
// fail.
func (d *directory) flush(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, flushWait)
	defer cancel()
	stop := context.AfterFunc(ctx, func() {
		d.mu.Lock()
		d.cond.Broadcast()
		d.mu.Unlock()
	})
	defer stop()
	d.mu.Lock()
	defer d.mu.Unlock()
	snap := make(map[string]uint64, len(d.want))
	for id, g := range d.want {
		snap[id] = g
	}
	for ctx.Err() == nil && !d.closed && !d.failing {
		behind := false
		for id, g := range snap {
			if _, open := d.want[id]; open && d.done[id] < g {
				behind = true
				break
			}
		}
		if !behind {
			return
		}
		d.cond.Wait()
	}
}

// work writes the entries of the sessions that changed, one session at a
// time per writer and each session on one writer at a time.
func (d *directory) work() {
	defer d.workers.Done()
	for {
		d.mu.Lock()
		id := ""
		for id == "" && !d.closed {
			for i, q := range d.queue {
				if !d.busy[q] {
					id = q
					d.queue = append(d.queue[:i:i], d.queue[i+1:]...)
					break
				}
			}
			if id == "" {
				d.cond.Wait()
			}
		}
		if d.closed {
			d.mu.Unlock()
			return
		}
		delete(d.queued, id)
		d.busy[id] = true
		g := d.want[id]
		d.mu.Unlock()

		err := d.write(id)

		d.mu.Lock()
		delete(d.busy, id)
		d.failing = err != nil
		switch {
		case err != nil:
			d.log.Warn("writing a session's entry in the sessions directory failed; trying again in a second", "session", id, "error", err)
			time.AfterFunc(time.Second, func() { d.retry(id) })
		case d.want[id] == g:
			delete(d.want, id)
			delete(d.done, id)
		default:
			d.done[id] = g
			if !d.queued[id] {
				d.queued[id] = true
				d.queue = append(d.queue, id)
			}
		}
		d.mu.Unlock()
		d.cond.Broadcast()
	}
}

// retry queues id again after a failed write, without a new generation.
func (d *directory) retry(id string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, open := d.want[id]; d.closed || !open || d.queued[id] {
		return
	}
	d.queued[id] = true
	d.queue = append(d.queue, id)
	d.cond.Broadcast()
}

// write makes session id's entries what the engine holds of it now.
func (d *directory) write(id string) error {
	if sessions.NodeOf(id) != d.node {
		// A session of this host's from before it joined a cluster: list
		// shows it from the engine, here only.
		return nil
	}
	ctx, cancel := context.WithTimeout(d.ctx, writeTimeout)
	defer cancel()
	l, ok := d.lst.Listing(id)
	want := map[string][]byte{}
	var reqs []string
	if ok {
		v := l.View
		v.Link, v.Worker, v.Foreign, v.Unreachable = "", false, false, false
		b, err := json.Marshal(sessionEntry{View: v, Owner: l.Owner, OwnerTokenID: l.OwnerTokenID, Base: l.Base})
		if err != nil {
			return err
		}
		want[d.prefix+sessionsDir+id] = b
		for _, it := range l.Pending {
			b, err := json.Marshal(pendingEntry{Interaction: it, Owner: l.Owner})
			if err != nil {
				return err
			}
			want[d.prefix+pendingDir+it.RequestID] = b
			reqs = append(reqs, it.RequestID)
		}
	}
	d.mu.Lock()
	// Until the deletes below are done, the ids written before count as
	// written: a write that fails half-way leaves none behind unknown.
	known := append([]string(nil), d.pendingOf[id]...)
	for _, r := range reqs {
		if !slices.Contains(known, r) {
			known = append(known, r)
		}
	}
	var stale []string
	for _, r := range known {
		if k := d.prefix + pendingDir + r; want[k] == nil {
			stale = append(stale, k)
		}
	}
	if !ok {
		stale = append(stale, d.prefix+sessionsDir+id)
	}
	var put []string
	for k, b := range want {
		if string(d.written[k]) != string(b) {
			put = append(put, k)
		}
	}
	if len(known) > 0 {
		d.pendingOf[id] = known
	}
	d.mu.Unlock()
	// The session first, so a reader never finds an interaction of a
	// session it does not list; deletes last, for the same reason.
	for _, k := range put {
		if strings.HasPrefix(k, d.prefix+sessionsDir) {
			if err := d.store(ctx, k, want[k]); err != nil {
				return err
			}
		}
	}
	for _, k := range put {
		if !strings.HasPrefix(k, d.prefix+sessionsDir) {
			if err := d.store(ctx, k, want[k]); err != nil {
				return err
			}
		}
	}
	for _, k := range stale {
		if err := d.st.Delete(ctx, k); err != nil {
			return err
		}
		d.mu.Lock()
		delete(d.written, k)
		d.mu.Unlock()
	}
	d.mu.Lock()
	if len(reqs) > 0 {
		d.pendingOf[id] = reqs
	} else {
		delete(d.pendingOf, id)
	}
	d.mu.Unlock()
	return nil
}

func (d *directory) store(ctx context.Context, k string, b []byte) error {
	if err := d.st.Store(ctx, k, b); err != nil {
		return err
	}
	d.mu.Lock()
	d.written[k] = b
	d.mu.Unlock()
	return nil
}

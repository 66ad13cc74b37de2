package sessions

import (
	"context"
	"encoding/json"
	"fmt"
	"path"
	"sort"
	"strings"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/storage"
)

// Storage layout, one directory per session:
//
//	zidane/sessions/<id>/session.json     record: metadata, owner, ACP session id, state
//	zidane/sessions/<id>/transcript.json  []Turn: the finished turns kept
//	zidane/sessions/<id>/events.json      []storedEvent: the session's recent events
//
// With a Config.Node the directory is zidane/nodes/<node>/sessions/<id>/:
// the replicas of a cluster share storage, and each resumes only its own.
//
// The record is written when the session is created, when its agent is
// launched and at every turn end or state change; the transcript at every
// turn end; the events at every event. Nothing is written per chunk.
const storagePrefix = "zidane/sessions"

const recordVersion = 1

// storageTimeout bounds one session's writes.
const storageTimeout = 10 * time.Second

// record is a session's metadata as storage keeps it.
type record struct {
	V              int         `json:"v"`
	ID             string      `json:"id"`
	Title          string      `json:"title"`
	Cwd            string      `json:"cwd"`
	Agent          string      `json:"agent"`
	Environment    Environment `json:"environment"`
	Repo           string      `json:"repo,omitempty"` // the repository a worktree came from
	ACPSessionID   string      `json:"acpSessionId,omitempty"`
	LoadSession    bool        `json:"loadSession,omitempty"` // the agent supports session/load
	OwnerTokenID   string      `json:"ownerTokenId,omitempty"`
	OwnerTokenName string      `json:"ownerTokenName,omitempty"`
	OwnerRoots     []string    `json:"ownerRoots,omitempty"`  // the creating token's roots, checked again at each launch
	Quota          string      `json:"quota,omitempty"`       // Owner.Quota of the creator: whose per-token quotas the session counts against
	OwnerScopes    []string    `json:"ownerScopes,omitempty"` // the creator's credential's scopes at its latest call (see Owner.Scopes)
	Target         string      `json:"target,omitempty"`      // MCP session events go to
	Tools          []string    `json:"tools,omitempty"`
	Subscribe      bool        `json:"subscribe,omitempty"`
	Base           string      `json:"base,omitempty"` // CreateRequest.Base
	Created        time.Time   `json:"created"`
	Updated        time.Time   `json:"updated"`
	// State is idle while the session lives; ended or error after.
	State State  `json:"state"`
	Error string `json:"error,omitempty"`
	Turns int    `json:"turns"`
	// Owner is who the session belongs to (Owner.ID of its creator); a
	// record written before owners existed belongs to OwnerTokenID.
	Owner string `json:"owner,omitempty"`
	// OwnerExpires and OwnerIssued are those of the creator's credential
	// at its latest call, which bound the tokens minted for the agent.
	OwnerExpires *time.Time `json:"ownerExpires,omitempty"`
	OwnerIssued  *time.Time `json:"ownerIssued,omitempty"`
}

// storedEvent is an Event with its push target and owner, which Event's
// JSON omits.
type storedEvent struct {
	Event
	Target string `json:"target,omitempty"`
	Owner  string `json:"owner,omitempty"`
}

type persistWhat int

const (
	saveRecord persistWhat = 1 << iota
	saveTranscript
	saveEvents
)

// prefix is where e keeps its sessions.
func (e *Engine) prefix() string {
	if e.cfg.Node != "" {
		return path.Join("zidane/nodes", e.cfg.Node, "sessions")
	}
	return storagePrefix
}

func (e *Engine) key(id, name string) string { return path.Join(e.prefix(), id, name) }

// persist writes what of s. The snapshot is taken after persistMu is held,
// so the last write of a session always carries its newest state.
func (e *Engine) persist(s *session, what persistWhat) {
	if e.store == nil || what == 0 {
		return
	}
	s.persistMu.Lock()
	defer s.persistMu.Unlock()

	e.mu.Lock()
	if e.storeDone {
		// Close has finished with storage; a write now could outlive it.
		e.mu.Unlock()
		return
	}
	e.writes.Add(1)
	defer e.writes.Done()
	rec := s.rec
	if rec.State != StateEnded && rec.State != StateError {
		rec.State = StateIdle
	}
	var turns []Turn
	if what&saveTranscript != 0 {
		turns = append([]Turn{}, s.turns...)
	}
	var evs []storedEvent
	if what&saveEvents != 0 {
		evs = make([]storedEvent, len(s.events))
		for i, ev := range s.events {
			evs[i] = storedEvent{Event: ev, Target: ev.Target, Owner: ev.Owner}
		}
	}
	e.mu.Unlock()

	ctx, cancel := context.WithTimeout(context.Background(), storageTimeout)
	defer cancel()
	write := func(name string, v any) {
		b, err := json.Marshal(v)
		if err == nil {
			err = e.store.Store(ctx, e.key(rec.ID, name), b)
		}
		if err != nil {
			e.log.Error("storing a session failed; it may be lost at restart", "session", rec.ID, "key", name, "error", err)
		}
	}
	if what&saveRecord != 0 {
		write("session.json", rec)
	}
	if what&saveTranscript != 0 {
		write("transcript.json", turns)
	}
	if what&saveEvents != 0 {
		write("events.json", evs)
	}
}

// forget deletes a session's keys (eviction past Limits.MaxSessions).
func (e *Engine) forget(id string) {
	if e.store == nil {
		e.dropScratch(id)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), storageTimeout)
	defer cancel()
	for _, name := range []string{"session.json", "transcript.json", "events.json"} {
		if err := e.store.Delete(ctx, e.key(id, name)); err != nil && !storage.IsNotExist(err) {
			e.log.Warn("deleting an evicted session failed", "session", id, "error", err)
		}
	}
	_ = e.store.Delete(ctx, path.Join(e.prefix(), id))
	e.dropScratch(id)
}

// stored is one session read back from storage.
type stored struct {
	rec    record
	turns  []Turn
	events []Event
}

// loadAll reads every stored session. A session whose record cannot be
// read is skipped and logged, never fatal: one bad file must not keep the
// gateway from starting.
func (e *Engine) loadAll(ctx context.Context) ([]stored, error) {
	if e.store == nil {
		return nil, nil
	}
	prefix := e.prefix()
	keys, err := e.store.List(ctx, prefix, false)
	if err != nil {
		if storage.IsNotExist(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("list stored sessions under %s: %w", prefix, err)
	}
	ids := map[string]bool{}
	for _, k := range keys {
		rest := strings.TrimPrefix(strings.TrimPrefix(k, prefix), "/")
		if id, _, _ := strings.Cut(rest, "/"); id != "" {
			ids[id] = true
		}
	}
	var out []stored
	for id := range ids {
		var st stored
		b, err := e.store.Load(ctx, e.key(id, "session.json"))
		if err == nil {
			err = json.Unmarshal(b, &st.rec)
		}
		if st.rec.Owner == "" {
			st.rec.Owner = st.rec.OwnerTokenID
		}
		if err != nil || st.rec.ID != id {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			e.log.Warn("skipping a stored session that cannot be read", "session", id, "error", err)
			continue
		}
		if b, err := e.store.Load(ctx, e.key(id, "transcript.json")); err == nil {
			if err := json.Unmarshal(b, &st.turns); err != nil {
				e.log.Warn("a stored transcript cannot be read; the session keeps none", "session", id, "error", err)
			}
		}
		if b, err := e.store.Load(ctx, e.key(id, "events.json")); err == nil {
			var evs []storedEvent
			if err := json.Unmarshal(b, &evs); err != nil {
				e.log.Warn("stored events cannot be read; the session keeps none", "session", id, "error", err)
			}
			for _, ev := range evs {
				ev.Event.Target, ev.Event.Owner = ev.Target, ev.Owner
				if ev.Event.Owner == "" {
					ev.Event.Owner = st.rec.Owner
				}
				st.events = append(st.events, ev.Event)
			}
		}
		out = append(out, st)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].rec.Created.Before(out[j].rec.Created) })
	return out, nil
}

// quotaID is the credential whose per-token quotas r counts against: its
// creator's chain top, or (a record from before quotas followed chains)
// its creator.
func (r record) quotaID() string {
	if r.Quota != "" {
		return r.Quota
	}
	return r.OwnerTokenID
}

package sessions

import (
	"sort"
	"sync"
)

// Who sees what in `list` and `pending`: one rule, which the engine applies
// to its own sessions and a cluster's directory of every node's sessions
// applies to the listings the other nodes wrote (package clustersessions).

// Sees says whether owner's access reaches a session of sessionOwner:
// every owner reaches its own; access (Owner.OtherSessions or
// Owner.OtherInteractions) reaches other owners' when it is at least need.
func Sees(owner Owner, sessionOwner string, access, need Access) bool {
	return sessionOwner == owner.OwnerID() || access >= need
}

// ListedView is v as owner's `list` shows it: Worker when owner's token
// created the session, Foreign when it is another owner's.
func ListedView(v SessionView, owner Owner, sessionOwner, creatorTokenID string) SessionView {
	v.Worker = owner.TokenID != "" && creatorTokenID == owner.TokenID
	v.Foreign = sessionOwner != owner.OwnerID()
	return v
}

// SortViews sorts list as `list` gives it: newest first, and by id among
// sessions created at the same time.
func SortViews(list []SessionView) {
	sort.Slice(list, func(i, j int) bool {
		if !list[i].Created.Equal(list[j].Created) {
			return list[i].Created.After(list[j].Created)
		}
		return list[i].SessionID > list[j].SessionID
	})
}

// SortInteractions sorts list as `pending` gives it: oldest first.
func SortInteractions(list []Interaction) {
	sort.SliceStable(list, func(i, j int) bool { return list[i].Created.Before(list[j].Created) })
}

// Listing is what `list` and `pending` show of one session, with what Sees
// and ListedView need: what a node writes to a cluster's directory of
// sessions, so that any replica answers `list` and `pending` without
// asking it.
type Listing struct {
	// View is `list`'s view of the session, without Link, Worker and
	// Foreign, which depend on the caller.
	View SessionView `json:"view"`
	// Owner is the owner the session belongs to; OwnerTokenID the token
	// that created it.
	Owner        string `json:"owner"`
	OwnerTokenID string `json:"ownerTokenId,omitempty"`
	// Base is where the session's link is made (CreateRequest.Base).
	Base string `json:"base,omitempty"`
	// Pending are the session's interactions waiting for an answer,
	// oldest first.
	Pending []Interaction `json:"pending,omitempty"`
}

// Listing returns session id's listing, and false when the engine does
// not hold it (it was never created here, or it was dropped).
func (e *Engine) Listing(id string) (Listing, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	s := e.sessions[id]
	if s == nil {
		return Listing{}, false
	}
	l := Listing{View: s.view(false), Owner: s.rec.Owner, OwnerTokenID: s.rec.OwnerTokenID, Base: s.rec.Base}
	for _, it := range s.pending {
		l.Pending = append(l.Pending, it.Interaction)
	}
	return l, true
}

// ListingIDs returns the ids of every session the engine holds.
func (e *Engine) ListingIDs() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	ids := make([]string, 0, len(e.sessions))
	for id := range e.sessions {
		ids = append(ids, id)
	}
	return ids
}

// OnChange calls fn with a session's id each time what Listing gives of
// it may have changed: it is created, a turn starts or ends, its state or
// queue changes, an interaction becomes pending or stops being pending,
// it fails, or it is dropped (Listing then says false); for a change an
// event tells of, before any subscriber can get the event. fn is called with
// the engine's lock held: it must only take note, and read the session
// later through Listing. It is never called per chunk of an agent's
// answer. The returned function stops the calls.
func (e *Engine) OnChange(fn func(sessionID string)) (stop func()) {
	e.mu.Lock()
	defer e.mu.Unlock()
	h := &changeHook{fn: fn}
	e.hooks = append(e.hooks, h)
	var once sync.Once
	return func() {
		once.Do(func() {
			e.mu.Lock()
			defer e.mu.Unlock()
			for i, o := range e.hooks {
				if o == h {
					e.hooks = append(e.hooks[:i:i], e.hooks[i+1:]...)
					break
				}
			}
		})
	}
}

type changeHook struct{ fn func(string) }

// changedLocked wakes the waiters of s and tells the OnChange hooks.
func (e *Engine) changedLocked(s *session) {
	s.notify()
	e.noteLocked(s.rec.ID)
}

// noteLocked tells the OnChange hooks that id changed.
func (e *Engine) noteLocked(id string) {
	for _, h := range e.hooks {
		h.fn(id)
	}
}

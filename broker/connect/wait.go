package connect

import (
	"context"
	"sync"
	"time"
)

// Bounds of [Service.Wait].
const (
	// maxWaiters bounds the waits under way in one process.
	maxWaiters = 4096
	// pollEvery is how often a wait reads storage for a completion on
	// another replica.
	pollEvery = 500 * time.Millisecond
)

// waiters wakes the waits of this process when an elicitation completes
// here.
type waiters struct {
	mu    sync.Mutex
	m     map[string]*waiting
	n     int
	total int // waits ever started, for the tests
}

type waiting struct {
	ch chan struct{}
	n  int
}

// add registers a wait for id; the func ends it. It is refused past
// maxWaiters.
func (ws *waiters) add(id string) (<-chan struct{}, func(), bool) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if ws.n >= maxWaiters {
		return nil, nil, false
	}
	if ws.m == nil {
		ws.m = map[string]*waiting{}
	}
	w, ok := ws.m[id]
	if !ok {
		w = &waiting{ch: make(chan struct{})}
		ws.m[id] = w
	}
	w.n++
	ws.n++
	ws.total++
	return w.ch, func() {
		ws.mu.Lock()
		defer ws.mu.Unlock()
		ws.n--
		if w.n--; w.n == 0 && ws.m[id] == w {
			delete(ws.m, id)
		}
	}, true
}

func (ws *waiters) wake(id string) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if w, ok := ws.m[id]; ok {
		close(w.ch)
		delete(ws.m, id)
	}
}

// done notes that owner's elicitation completed, and wakes its waits.
func (s *Service) done(ctx context.Context, c Connection) {
	now := s.now()
	_ = s.dones.put(ctx, c.Elicitation, record{Owner: c.Owner, Upstream: c.Upstream, Elicitation: c.Elicitation, Expires: now.Add(FlowLifetime), At: now})
	s.waits.wake(c.Elicitation)
	s.waits.wake(ownerWaitKey(c.Owner, c.Upstream))
}

// ownerWaitKey names the waits for any of owner's links at upstream;
// the NUL cannot be in an elicitation id, an owner or an upstream name.
func ownerWaitKey(owner, upstream string) string { return "owner\x00" + owner + "\x00" + upstream }

// WaitConnected blocks until owner connects their account at upstream
// through any link of theirs still live, at since or later (a connection
// made before, since revoked, is not one), on this replica or another
// sharing the storage, or until ctx ends. It returns the ids of owner's
// live elicitations for upstream, each a call that asked: a 2025-11-25
// client's stream tells it each is complete
// (notifications/elicitation/complete), so that the calls waiting on them
// are made again. A caller bounds ctx.
func (s *Service) WaitConnected(ctx context.Context, owner, upstream string, since time.Time) ([]string, bool) {
	ch, release, ok := s.waits.add(ownerWaitKey(owner, upstream))
	if ok {
		defer release()
	}
	tick := time.NewTicker(pollEvery)
	defer tick.Stop()
	for {
		ids := s.links.elicitations(ctx, owner, upstream)
		for _, id := range ids {
			if rec, err := s.dones.peek(ctx, id); err == nil && rec.Owner == owner && !rec.At.Before(since) {
				return ids, true
			}
		}
		select {
		case <-ctx.Done():
			return nil, false
		case <-ch:
			ch = nil // woken here: read it back
		case <-tick.C:
		}
	}
}

// Elicitations returns, without waiting, the ids of owner's live
// elicitations for upstream (each a call that asked them to connect): a
// 2025-11-25 client's stream that opens once its person has connected is
// told each is complete.
func (s *Service) Elicitations(ctx context.Context, owner, upstream string) []string {
	return s.links.elicitations(ctx, owner, upstream)
}

// completed reads whether the elicitation completed for owner: yes, no,
// or for someone else (then no wait will change it).
func (s *Service) completed(ctx context.Context, owner, elicitation string) (done, other bool) {
	rec, err := s.dones.peek(ctx, elicitation)
	if err != nil {
		return false, false
	}
	return rec.Owner == owner, rec.Owner != owner
}

// Wait blocks until owner's elicitation (the id of a link made for
// owner) completes, on this replica or another sharing the storage, or
// until ctx ends; it reports whether it completed. A caller bounds ctx:
// the retry of a 2026-07-28 call may wait a little for the person, and
// the stream of a 2025-11-25 client sends notifications/elicitation/
// complete when it returns true. An elicitation completed for another
// owner is never reported.
func (s *Service) Wait(ctx context.Context, owner, elicitation string) bool {
	ch, release, ok := s.waits.add(elicitation)
	if !ok {
		done, _ := s.completed(ctx, owner, elicitation)
		return done
	}
	defer release()
	tick := time.NewTicker(pollEvery)
	defer tick.Stop()
	for {
		done, other := s.completed(ctx, owner, elicitation)
		if done || other {
			return done
		}
		select {
		case <-ctx.Done():
			return false
		case <-ch:
			ch = nil // woken here: read it back, which tells the owner
		case <-tick.C:
		}
	}
}

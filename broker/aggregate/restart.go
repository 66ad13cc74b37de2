package aggregate

import (
	"context"
	"fmt"
	"sync"
)

// Upstreams returns the names of the aggregate's upstreams, in config order.
func (a *Aggregate) Upstreams() []string {
	names := make([]string, 0, len(a.ups))
	for _, up := range a.ups {
		names = append(names, up.cfg.Name)
	}
	return names
}

// Restart ends upstream name's connections — its catalog session (for a
// shared stdio upstream, its process) and every client session's connection
// to it — so the next use connects afresh (a new process for stdio).
// Listings stay registered meanwhile. It returns an error naming the
// upstream when the aggregate has no upstream of that name.
//
// The catalog supervisor reconnects after its usual backoff (a call to a
// shared stdio upstream starts it at once). A call in flight on an old
// connection may fail with a tool error naming the upstream. Restart waits,
// bounded by ctx, for the old connections to close (for stdio, for their
// processes to exit); when ctx ends first they go on closing in the
// background.
func (a *Aggregate) Restart(ctx context.Context, name string) error {
	return a.restart(ctx, name, false)
}

// Retire ends upstream name's connections as [Aggregate.Restart] does, and
// for a shared stdio upstream leaves its process stopped until the next
// call needs it, as the idle close does: it frees the process now. For
// other upstreams it is Restart: their catalog connection, which keeps
// their listings current, connects again.
func (a *Aggregate) Retire(ctx context.Context, name string) error {
	return a.restart(ctx, name, true)
}

func (a *Aggregate) restart(ctx context.Context, name string, retire bool) error {
	up := a.byName[name]
	if up == nil {
		return fmt.Errorf("aggregate: no upstream named %q; the upstreams are %q", name, a.Upstreams())
	}
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return fmt.Errorf("aggregate: cannot restart upstream %q: the broker route is closed", name)
	}
	sessions := make([]*aggSession, 0, len(a.sessions))
	for _, s := range a.sessions {
		sessions = append(sessions, s)
	}
	for _, s := range a.per.people {
		sessions = append(sessions, s) // a per_user upstream's sessions are the people's
	}
	a.mu.Unlock()

	// The catalog: forget it first, so that new calls wait for the next
	// one; its supervisor sees it end and connects again.
	up.mu.Lock()
	catalog := up.catalog
	if catalog != nil {
		up.catalog = nil
		up.idleGen++ // disarms the idle timer
		if retire && up.shared {
			// Its supervisor waits for a call, as after the idle close.
			up.idleClosed = true
			select {
			case <-up.wake: // a stale request to start
			default:
			}
		}
		up.notifyLocked()
	}
	up.mu.Unlock()

	// The downstream sessions' own connections: dropped from their maps,
	// so that the next call opens a new one.
	var conns []*aggConn
	for _, s := range sessions {
		s.mu.Lock()
		if c := s.conns[name]; c != nil {
			delete(s.conns, name)
			conns = append(conns, c)
		}
		s.mu.Unlock()
	}

	var wg sync.WaitGroup
	if catalog != nil {
		wg.Go(func() { catalog.Close() })
	}
	for _, c := range conns {
		wg.Go(func() {
			<-c.done // a connection attempt under way ends first
			if c.cs != nil {
				c.cs.Close()
			}
		})
	}
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		return fmt.Errorf("aggregate: restarting upstream %q: %w", name, ctx.Err())
	}
	switch {
	case catalog == nil:
	case retire && up.shared:
		a.logger.Info("aggregate: shared stdio upstream retired; the next call starts it again", "upstream", name)
	default:
		a.logger.Info("aggregate: upstream restarted; the next use connects again", "upstream", name)
	}
	return nil
}

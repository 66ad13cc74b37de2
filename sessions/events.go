package sessions

import (
	"strings"
	"sync"
	"time"
)

// eventLog is the bounded log of session events: a ring of the last
// Limits.MaxEvents events overall, numbered by a sequence that only grows
// (and survives restarts through storage).
//
// Subscribers never slow the engine down: each has its own goroutine and a
// buffer of subscriberBuffer events. When a subscriber falls that far
// behind, its oldest undelivered events are dropped (and counted in the
// log); the events stay in the log, so `events` with Since still finds
// them.
type eventLog struct {
	mu   sync.Mutex
	ring []Event
	head int // index of the oldest event
	n    int
	seq  int64
	subs map[*subscriber]struct{}
	log  func(msg string, args ...any)
}

const subscriberBuffer = 1024

func newEventLog(max int, warn func(string, ...any)) *eventLog {
	return &eventLog{ring: make([]Event, max), subs: map[*subscriber]struct{}{}, log: warn}
}

// add numbers ev, keeps it and hands it to the subscribers.
func (l *eventLog) add(ev Event) Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.seq++
	ev.Seq = l.seq
	if ev.Time.IsZero() {
		ev.Time = time.Now().UTC()
	}
	l.keep(ev)
	for s := range l.subs {
		s.offer(ev)
	}
	return ev
}

func (l *eventLog) keep(ev Event) {
	if l.n < len(l.ring) {
		l.ring[(l.head+l.n)%len(l.ring)] = ev
		l.n++
		return
	}
	l.ring[l.head] = ev
	l.head = (l.head + 1) % len(l.ring)
}

// restore puts back events read from storage, oldest first, before any
// new event is added.
func (l *eventLog) restore(evs []Event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, ev := range evs {
		l.keep(ev)
		l.seq = max(l.seq, ev.Seq)
	}
}

// query returns the events f selects that visible admits, newest first.
func (l *eventLog) query(f EventFilter, visible func(*Event) bool) []Event {
	limit := f.Limit
	if limit <= 0 {
		limit = 20
	}
	text := strings.ToLower(f.Text)
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []Event
	for i := l.n - 1; i >= 0 && len(out) < limit; i-- {
		ev := l.ring[(l.head+i)%len(l.ring)]
		if ev.Seq <= f.Since {
			break // older ones have smaller numbers still
		}
		if f.SessionID != "" && ev.SessionID != f.SessionID {
			continue
		}
		if !visible(&ev) {
			continue
		}
		if f.Status != "" && ev.Status != f.Status {
			continue
		}
		if text != "" && !strings.Contains(strings.ToLower(ev.Summary), text) {
			continue
		}
		out = append(out, ev)
	}
	return out
}

func (l *eventLog) subscribe(fn func(Event)) func() {
	s := &subscriber{fn: fn, wake: make(chan struct{}, 1), stop: make(chan struct{})}
	l.mu.Lock()
	l.subs[s] = struct{}{}
	l.mu.Unlock()
	go s.run(l)
	return func() {
		l.mu.Lock()
		_, open := l.subs[s]
		delete(l.subs, s)
		l.mu.Unlock()
		if open { // closeAll may have ended it already
			close(s.stop)
		}
	}
}

// closeAll ends every subscription (Engine.Close).
func (l *eventLog) closeAll() {
	l.mu.Lock()
	subs := l.subs
	l.subs = map[*subscriber]struct{}{}
	l.mu.Unlock()
	for s := range subs {
		close(s.stop)
	}
}

type subscriber struct {
	fn   func(Event)
	mu   sync.Mutex
	buf  []Event
	lost int
	wake chan struct{}
	stop chan struct{}
}

// offer queues ev without blocking, dropping the oldest when full.
func (s *subscriber) offer(ev Event) {
	s.mu.Lock()
	if len(s.buf) >= subscriberBuffer {
		copy(s.buf, s.buf[1:])
		s.buf = s.buf[:len(s.buf)-1]
		s.lost++
	}
	s.buf = append(s.buf, ev)
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

func (s *subscriber) run(l *eventLog) {
	for {
		select {
		case <-s.stop:
			return
		case <-s.wake:
		}
		s.mu.Lock()
		batch, lost := s.buf, s.lost
		s.buf, s.lost = nil, 0
		s.mu.Unlock()
		if lost > 0 && l.log != nil {
			l.log("an event subscriber fell behind; its oldest events were dropped", "dropped", lost)
		}
		for _, ev := range batch {
			select {
			case <-s.stop:
				return
			default:
			}
			s.fn(ev)
		}
	}
}

// EventLog is a bounded log of events that its caller numbers: the
// cluster's log of every node's events, numbered by the stream they travel
// in, which the replicas' MCP endpoints query and subscribe to as they
// would an engine's. It keeps and delivers events as the engine's own log
// does (see Engine.Events and Engine.Subscribe).
type EventLog struct{ l *eventLog }

// NewEventLog returns a log of the last max events (Limits.MaxEvents when
// max <= 0); warn gets what a slow subscriber lost.
func NewEventLog(max int, warn func(msg string, args ...any)) *EventLog {
	if max <= 0 {
		max = DefaultMaxEvents
	}
	return &EventLog{l: newEventLog(max, warn)}
}

// Put keeps ev, numbered already above every event kept, and hands it to
// the subscribers unless it is an old event put back (restore).
func (l *EventLog) Put(ev Event, restore bool) {
	l.l.mu.Lock()
	defer l.l.mu.Unlock()
	if ev.Seq <= l.l.seq {
		return
	}
	l.l.seq = ev.Seq
	l.l.keep(ev)
	if restore {
		return
	}
	for s := range l.l.subs {
		s.offer(ev)
	}
}

// Offer hands ev to the subscribers without keeping it: an event that
// could not be numbered (the cluster's stream was away), still pushed to
// the clients this replica serves.
func (l *EventLog) Offer(ev Event) {
	l.l.mu.Lock()
	defer l.l.mu.Unlock()
	for s := range l.l.subs {
		s.offer(ev)
	}
}

// Query returns the events f selects among those owner sees, newest
// first; it does not check f.SessionID's owner (Engine.Events does).
func (l *EventLog) Query(owner Owner, f EventFilter) []Event {
	return l.l.query(f, visibleEvents(owner))
}

// Subscribe calls fn with every event Put from now on, as Engine.Subscribe.
func (l *EventLog) Subscribe(fn func(Event)) func() { return l.l.subscribe(fn) }

// Close ends every subscription.
func (l *EventLog) Close() { l.l.closeAll() }

// visibleEvents says which events owner sees: its owner's, or all with
// AccessRead.
func visibleEvents(owner Owner) func(*Event) bool {
	id, all := owner.OwnerID(), owner.OtherSessions >= AccessRead
	return func(ev *Event) bool { return all || ev.Owner == id }
}

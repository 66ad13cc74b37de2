// Package mcpidle closes the MCP sessions of a streamable HTTP endpoint
// that nobody has used for a while, so that sessions a client opened and
// forgot give their memory back.
//
// A session is in use while one of its HTTP requests is in flight: a POST,
// and also a GET stream held open for server pushes, which go-sdk's own
// StreamableHTTPOptions.SessionTimeout does not count (it would close a
// session whose client listens on a GET stream and sends nothing). The
// timeout runs from the end of the last request. A request counts only
// when it carries the token that opened the session, so another token's
// requests with a guessed id keep nothing alive.
//
// The endpoint tells it when a session opens (with the function that
// closes it), wraps each request of a session in Use, and says when a
// session closed for another reason. It never reads a message and never
// decides who may use a session: the endpoint does.
package mcpidle

import (
	"sync"
	"time"
)

// Sessions tracks the sessions of one endpoint. A nil *Sessions tracks
// nothing and closes nothing: New returns nil for a timeout <= 0.
type Sessions struct {
	timeout  time.Duration
	newTimer func(time.Duration, func()) timer // time.AfterFunc; tests fire their own

	mu      sync.Mutex
	m       map[string]*entry
	stopped bool
}

type entry struct {
	owner string
	close func()
	inUse int
	timer timer
}

// timer is what Sessions needs of a *time.Timer.
type timer interface {
	Stop() bool
	Reset(time.Duration) bool
}

// New returns a tracker that closes a session once it has had no request
// in flight for timeout, or nil (never close) when timeout <= 0.
func New(timeout time.Duration) *Sessions {
	if timeout <= 0 {
		return nil
	}
	return &Sessions{timeout: timeout, m: map[string]*entry{},
		newTimer: func(d time.Duration, f func()) timer { return time.AfterFunc(d, f) }}
}

// Opened starts tracking session id, opened by token owner. close is
// called, from a goroutine of its own, when the session has been idle for
// the timeout. A second Opened of the same id is ignored.
func (s *Sessions) Opened(id, owner string, close func()) {
	if s == nil || id == "" {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped || s.m[id] != nil {
		return
	}
	e := &entry{owner: owner, close: close}
	e.timer = s.newTimer(s.timeout, func() { s.expire(id, e) })
	s.m[id] = e
}

// Use marks a request of session id by token owner in flight: the session
// is not closed until done is called and the timeout has passed again. An
// unknown id, or another token's request, changes nothing.
func (s *Sessions) Use(id, owner string) (done func()) {
	if s == nil || id == "" {
		return func() {}
	}
	s.mu.Lock()
	e := s.m[id]
	if e == nil || e.owner != owner {
		s.mu.Unlock()
		return func() {}
	}
	e.inUse++
	if e.inUse == 1 {
		e.timer.Stop()
	}
	s.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			s.mu.Lock()
			defer s.mu.Unlock()
			e.inUse--
			if e.inUse == 0 && s.m[id] == e {
				e.timer.Reset(s.timeout)
			}
		})
	}
}

// expire closes e's session unless a request began meanwhile (its timer
// may fire just as Use stops it) or it is no longer tracked.
func (s *Sessions) expire(id string, e *entry) {
	s.mu.Lock()
	if s.m[id] != e || e.inUse > 0 {
		s.mu.Unlock()
		return
	}
	delete(s.m, id)
	s.mu.Unlock()
	e.close()
}

// Closed stops tracking session id, which ended otherwise (DELETE, the
// endpoint's close).
func (s *Sessions) Closed(id string) {
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if e := s.m[id]; e != nil {
		e.timer.Stop()
		delete(s.m, id)
	}
}

// Len is the number of sessions tracked.
func (s *Sessions) Len() int {
	if s == nil {
		return 0
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.m)
}

// Stop stops every timer and forgets every session: the endpoint is
// closing them all itself. Later calls of Opened are ignored.
func (s *Sessions) Stop() {
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopped = true
	for id, e := range s.m {
		e.timer.Stop()
		delete(s.m, id)
	}
}

package broker

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/internal/sse"
	"github.com/Tahul/caddy-zidane-mcp/message"
)

// Ordering of an upstream's notifications before its answer.
//
// go-sdk's client delivers a call's answer to the waiting caller at once,
// but hands notifications (log messages, progress) to a handler goroutine
// through a queue. A log message the upstream sent before its answer can
// thus be forwarded downstream after the broker has written the answer and
// closed the call's stream, and be lost. noteCounter counts, per upstream
// session, the notifications read off the wire (in the SSE streams, before
// go-sdk queues them); after a call, [aggConn.awaitNotes] waits until the
// handlers have forwarded as many, so the answer goes out after them. The
// handlers wake the wait as they count (noteGate): it ends at the last
// one, not at a poll after it.

// noteWait bounds that wait.
const noteWait = 500 * time.Millisecond

// noteCounter counts the log and progress notifications in the event
// streams of an upstream's responses, by upstream session id.
type noteCounter struct {
	next http.RoundTripper
	// max bounds what a noteReader holds of one event: the upstream's
	// max_response, past which the answer limit below fails the body.
	max int
	// budget is the in-flight answer budget, in which a noteReader
	// reserves what it holds: go-sdk above holds the same event, whose
	// bytes the answer limit below reserved once.
	budget   *AnswerBudget
	sessions sync.Map // upstream session id -> *atomic.Int64
}

func (n *noteCounter) counter(sessionID string) *atomic.Int64 {
	v, _ := n.sessions.LoadOrStore(sessionID, new(atomic.Int64))
	return v.(*atomic.Int64)
}

// forget drops the counter of an upstream session that ended.
func (n *noteCounter) forget(sessionID string) { n.sessions.Delete(sessionID) }

// fastReadKey marks the context of an upstream request whose stream the
// fast path reads and relays itself (see [fastRead]).
type fastReadKey struct{}

// fastRead marks ctx's request as one the fast path answers: the
// notifications on its stream never reach go-sdk's handlers, so counting
// them would hold the session's next go-sdk call for noteWait.
func fastRead(ctx context.Context) context.Context {
	return context.WithValue(ctx, fastReadKey{}, true)
}

func (n *noteCounter) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := n.next.RoundTrip(req)
	if err != nil || resp.Body == nil || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		return resp, err
	}
	if fast, _ := req.Context().Value(fastReadKey{}).(bool); fast {
		return resp, err
	}
	sid := req.Header.Get(headerSessionID)
	if sid == "" {
		return resp, err
	}
	r := &noteReader{ReadCloser: resp.Body, count: n.counter(sid)}
	r.dec.Max = n.max
	if n.budget != nil {
		// A nil *AnswerBudget holds no limit; as an interface it would
		// not be nil.
		r.dec.Budget = n.budget
	}
	resp.Body = r
	return resp, nil
}

func (n *noteCounter) CloseIdleConnections() {
	if ci, ok := n.next.(interface{ CloseIdleConnections() }); ok {
		ci.CloseIdleConnections()
	}
}

// noteReader counts the events of a stream that carry a log or progress
// notification, as a client reads the stream (see internal/sse: events of
// type message) and as the edge reads a message (package message):
// whatever the spelling of the stream or of the JSON. It holds an event's
// lines until its blank line, and no longer; what it holds is a second
// copy of what go-sdk holds above it, so it is reserved in the answer
// budget too. An event the budget has no room for is not counted: its
// notification, if it is one, may then reach the client after the answer,
// which is better than the gateway holding twice its budget.
type noteReader struct {
	io.ReadCloser
	count *atomic.Int64

	mu     sync.Mutex // Close may come from another goroutine than Read
	dec    sse.Decoder
	closed bool
}

func (r *noteReader) Read(p []byte) (int, error) {
	n, err := r.ReadCloser.Read(p)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return n, err
	}
	r.dec.Write(p[:n], r.event)
	if err != nil {
		r.dec.End()
	}
	return n, err
}

// Close gives back what the reader holds of an event the stream did not
// end.
func (r *noteReader) Close() error {
	err := r.ReadCloser.Close()
	r.mu.Lock()
	r.closed = true
	r.dec.End()
	r.mu.Unlock()
	return err
}

// pending is how many bytes of the current event the reader holds.
func (r *noteReader) pending() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.dec.Pending()
}

func (r *noteReader) event(ev sse.Event) {
	data, ok := ev.Message()
	if !ok {
		return
	}
	b, err := message.ReadAnswer(data)
	if err != nil || b.Batch {
		return
	}
	if c := b.Calls[0]; c.ID.IsZero() && (c.Method == "notifications/message" || c.Method == "notifications/progress") {
		r.count.Add(1)
	}
}

// noteGate counts the notifications an upstream session's handlers have
// forwarded (or dropped), and wakes whoever waits for the count.
type noteGate struct {
	mu      sync.Mutex
	handled int64
	wake    chan struct{} // closed at the next count; nil while nobody waits
}

// done counts one notification handled.
func (g *noteGate) done() {
	g.mu.Lock()
	g.handled++
	wake := g.wake
	g.wake = nil
	g.mu.Unlock()
	if wake != nil {
		close(wake)
	}
}

// count is how many notifications were handled.
func (g *noteGate) count() int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.handled
}

// reached reports whether target notifications were handled, and if not,
// returns a channel closed at the next one.
func (g *noteGate) reached(target int64) (bool, <-chan struct{}) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.handled >= target {
		return true, nil
	}
	if g.wake == nil {
		g.wake = make(chan struct{})
	}
	return false, g.wake
}

// wait waits until target notifications were handled, ctx ends or bound
// passes, whichever comes first.
func (g *noteGate) wait(ctx context.Context, target int64, bound time.Duration) {
	ok, wake := g.reached(target)
	if ok {
		return
	}
	timer := time.NewTimer(bound)
	defer timer.Stop()
	for !ok {
		select {
		case <-wake:
		case <-timer.C:
			return
		case <-ctx.Done():
			return
		}
		ok, wake = g.reached(target)
	}
}

// awaitNotes waits, bounded by noteWait and ctx, until c's handlers have
// forwarded every log and progress notification read so far on its
// upstream session.
func (c *aggConn) awaitNotes(ctx context.Context) {
	if c.received == nil {
		return
	}
	c.handled.wait(ctx, c.received.Load(), noteWait)
}

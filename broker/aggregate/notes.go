package aggregate

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/broker/answerlimit"
	"github.com/Tahul/caddy-zidane-mcp/broker/upstream"
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
// streams of an upstream's responses, by upstream session id, and hands
// go-sdk's client each stream as a client reads it (see noteReader).
type noteCounter struct {
	next http.RoundTripper
	// max bounds what a noteReader holds of one event: the upstream's
	// max_response, past which the answer limit below fails the body.
	max      int
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
	if err != nil || resp.Body == nil || resp.StatusCode < 200 || resp.StatusCode >= 300 ||
		!answerlimit.IsEventStream(resp.Header.Get("Content-Type")) {
		return resp, err
	}
	if fast, _ := req.Context().Value(fastReadKey{}).(bool); fast {
		return resp, err // read by the fast path, with internal/sse
	}
	r := &noteReader{ReadCloser: resp.Body}
	if sid := req.Header.Get(upstream.HeaderSessionID); sid != "" {
		r.count = n.counter(sid)
	}
	r.dec.Max = n.max
	resp.Body = r
	return resp, nil
}

func (n *noteCounter) CloseIdleConnections() {
	if ci, ok := n.next.(interface{ CloseIdleConnections() }); ok {
		ci.CloseIdleConnections()
	}
}

// noteReader reads an upstream's event stream for go-sdk's client, as a
// client reads it (see internal/sse), and hands go-sdk each event in one
// plain spelling that go-sdk's own reader (mcp/event.go, with other rules:
// LF line ends only, spaces trimmed, a line without ':' fatal, a last
// event taken without its blank line) reads the same: id and retry as the
// event set them, and the data of an event of type message, on lines of
// their own. It counts the events that carry a log or progress
// notification, as the edge reads a message (package message), whatever
// the spelling of the JSON. It holds an event's lines until its blank
// line, as the answer limit under it holds the event's bytes in the
// answer budget, and no longer.
type noteReader struct {
	io.ReadCloser
	count *atomic.Int64 // nil: not counted (no upstream session yet)
	mu    sync.Mutex    // guards dec against pending, from another goroutine
	dec   sse.Decoder
	in    []byte // what is read from the upstream
	out   []byte // events in their plain spelling, not yet read by go-sdk
	off   int    // how much of out go-sdk has read
	err   error  // the upstream body's, returned once out is read
}

func (r *noteReader) Read(p []byte) (int, error) {
	for empty := 0; r.off == len(r.out); {
		if r.err != nil {
			return 0, r.err
		}
		if cap(r.out) > 64<<10 {
			r.out = nil // a large event's buffer is not kept for the stream's life
		}
		r.out, r.off = r.out[:0], 0
		if r.in == nil {
			r.in = make([]byte, 16<<10)
		}
		n, err := r.ReadCloser.Read(r.in)
		r.mu.Lock()
		r.dec.Write(r.in[:n], r.event)
		if err != nil {
			r.dec.End()
		}
		r.mu.Unlock()
		switch {
		case err != nil:
			r.err = err
		case n == 0:
			if empty++; empty == 100 {
				r.err = io.ErrNoProgress
			}
		}
	}
	n := copy(p, r.out[r.off:])
	r.off += n
	return n, nil
}

// pending is how many bytes of the current event the reader holds.
func (r *noteReader) pending() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.dec.Pending()
}

func (r *noteReader) event(ev sse.Event) {
	var id, retry []byte
	hasID := false
	for line := range ev.Lines() {
		name, value, comment := sse.Field(line)
		switch {
		case comment:
		case string(name) == "id" && bytes.IndexByte(value, 0) < 0:
			id, hasID = value, true
		case string(name) == "retry" && digitsOnly(value):
			retry = value
		}
	}
	start := len(r.out)
	if hasID {
		r.out = append(append(append(r.out, "id: "...), id...), '\n')
	}
	if retry != nil {
		r.out = append(append(append(r.out, "retry: "...), retry...), '\n')
	}
	if data, ok := ev.Message(); ok {
		r.out = sse.AppendData(r.out, data)
		r.counted(data)
	}
	if len(r.out) > start {
		r.out = append(r.out, '\n')
	}
}

// counted counts data if it is a log or progress notification.
func (r *noteReader) counted(data []byte) {
	if r.count == nil {
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

// digitsOnly reports whether b is a retry value clients take: ASCII
// digits only.
func digitsOnly(b []byte) bool {
	for _, c := range b {
		if c < '0' || c > '9' {
			return false
		}
	}
	return len(b) > 0
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

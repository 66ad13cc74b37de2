package aggregate

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/broker/upstream"
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
// handlers have forwarded as many, so the answer goes out after them.

// noteWait bounds that wait.
const noteWait = 500 * time.Millisecond

// noteCounter counts the log and progress notifications in the event
// streams of an upstream's responses, by upstream session id.
type noteCounter struct {
	next     http.RoundTripper
	sessions sync.Map // upstream session id -> *atomic.Int64
}

func (n *noteCounter) counter(sessionID string) *atomic.Int64 {
	v, _ := n.sessions.LoadOrStore(sessionID, new(atomic.Int64))
	return v.(*atomic.Int64)
}

// forget drops the counter of an upstream session that ended.
func (n *noteCounter) forget(sessionID string) { n.sessions.Delete(sessionID) }

func (n *noteCounter) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := n.next.RoundTrip(req)
	if err != nil || resp.Body == nil || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		return resp, err
	}
	sid := req.Header.Get(upstream.HeaderSessionID)
	if sid == "" {
		return resp, err
	}
	resp.Body = &noteReader{ReadCloser: resp.Body, count: n.counter(sid)}
	return resp, nil
}

func (n *noteCounter) CloseIdleConnections() {
	if ci, ok := n.next.(interface{ CloseIdleConnections() }); ok {
		ci.CloseIdleConnections()
	}
}

// noteReader counts the event-stream data lines that carry a log or
// progress notification. It looks at the start of each line only, where
// a JSON-RPC message names its method.
type noteReader struct {
	io.ReadCloser
	count *atomic.Int64
	line  []byte // the start of the current line
	skip  bool   // the rest of the current line is past the bytes kept
}

const noteLinePrefix = 256

var (
	noteLog      = []byte(`"method":"notifications/message"`)
	noteProgress = []byte(`"method":"notifications/progress"`)
)

func (r *noteReader) Read(p []byte) (int, error) {
	n, err := r.ReadCloser.Read(p)
	for _, b := range p[:n] {
		if b == '\n' {
			r.endLine()
			continue
		}
		if !r.skip {
			r.line = append(r.line, b)
			if len(r.line) >= noteLinePrefix {
				r.endLine()
				r.skip = true
			}
		}
	}
	return n, err
}

func (r *noteReader) endLine() {
	if !r.skip && bytes.HasPrefix(r.line, []byte("data:")) &&
		(bytes.Contains(r.line, noteLog) || bytes.Contains(r.line, noteProgress)) {
		r.count.Add(1)
	}
	r.line, r.skip = r.line[:0], false
}

// awaitNotes waits, bounded by noteWait and ctx, until c's handlers have
// forwarded every log and progress notification read so far on its
// upstream session.
func (c *aggConn) awaitNotes(ctx context.Context) {
	if c.received == nil {
		return
	}
	target := c.received.Load()
	if c.handled.Load() >= target {
		return
	}
	deadline := time.Now().Add(noteWait)
	for c.handled.Load() < target && time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(time.Millisecond)
	}
}

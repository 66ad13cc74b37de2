package answerlimit

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/Tahul/caddy-zidane-mcp/internal/sse"
)

// DefaultMaxResponse is an upstream's max_response when none is
// configured: the most one answer of the upstream may hold.
const DefaultMaxResponse = 16 << 20

// sessionHeader is the header of the upstream session an answer belongs to.
const sessionHeader = "Mcp-Session-Id"

// DefaultBudget is the in-flight answer budget when none is
// configured (see [Budget]).
const DefaultBudget = 256 << 20

// TooLargeError is the failure of an upstream answer over the
// upstream's max_response: for a POST, the whole answer (a JSON body, or
// every event of its stream together); for a GET stream, and the stream
// of a subscriptions/listen (which lasts as long as its client listens),
// one event.
type TooLargeError struct {
	Upstream string
	Limit    int64
	// Event is set for a stream whose limit is per event.
	Event bool
}

// eventLimitKey marks the context of an upstream POST whose event stream
// is bounded per event (see [WithEventLimit]).
type eventLimitKey struct{}

// WithEventLimit marks ctx's request as one whose event stream is bounded
// per event, as a GET stream is: a subscriptions/listen.
func WithEventLimit(ctx context.Context) context.Context {
	return context.WithValue(ctx, eventLimitKey{}, true)
}

func eventLimited(ctx context.Context) bool {
	v, _ := ctx.Value(eventLimitKey{}).(bool)
	return v
}

func (e *TooLargeError) Error() string {
	what := "an answer"
	if e.Event {
		what = "an event on its stream"
	}
	return fmt.Sprintf("the upstream MCP server %q sent %s of more than %s, its max_response; the gateway dropped it and closed the upstream session. Ask the operator to raise max_response for this upstream if such answers are expected",
		e.Upstream, what, formatBytes(e.Limit))
}

// BudgetError is the failure of an upstream answer that would take the
// bytes the gateway holds of upstream answers over its in-flight budget.
type BudgetError struct {
	Upstream string
	Limit    int64
}

func (e *BudgetError) Error() string {
	return fmt.Sprintf("the gateway holds %s of upstream answers at once (max_inflight_response), and the answer of the upstream MCP server %q did not fit; try again shortly",
		formatBytes(e.Limit), e.Upstream)
}

// Exceeded reports whether err is, or wraps, an answer over a limit:
// [TooLargeError] or [BudgetError].
func Exceeded(err error) bool {
	var tl *TooLargeError
	var be *BudgetError
	return errors.As(err, &tl) || errors.As(err, &be)
}

func formatBytes(n int64) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d bytes", n)
}

// Budget bounds the bytes of upstream answers that the broker holds at
// once, across every call and upstream: an answer reserves its bytes as
// they are read, and gives them back when it is closed (a JSON body, which
// its reader holds whole until then) or, on an event stream, at the end of
// each event.
// A read that would go over the budget fails, so many concurrent large
// answers fail instead of exhausting memory. A nil *Budget holds no
// limit. It is safe for concurrent use.
type Budget struct {
	max  int64
	used atomic.Int64
}

// NewBudget returns a budget of max bytes; max <= 0 means
// [DefaultBudget].
func NewBudget(max int64) *Budget {
	if max <= 0 {
		max = DefaultBudget
	}
	return &Budget{max: max}
}

// Used is how many bytes are reserved now.
func (b *Budget) Used() int64 {
	if b == nil {
		return 0
	}
	return b.used.Load()
}

// Take reserves n bytes, and reports false, reserving nothing, when they
// would take the budget over its bound. A nil budget always has room.
func (b *Budget) Take(n int64) bool { return b.take(n) }

// Give returns n bytes reserved by Take.
func (b *Budget) Give(n int64) { b.give(n) }

func (b *Budget) take(n int64) bool {
	if b == nil || n == 0 {
		return true
	}
	if b.used.Add(n) > b.max {
		b.used.Add(-n)
		return false
	}
	return true
}

func (b *Budget) give(n int64) {
	if b != nil && n != 0 {
		b.used.Add(-n)
	}
}

// Transport is a RoundTripper that bounds every answer of one upstream:
// its body fails with [TooLargeError] past max bytes (per event on a
// GET stream), and with [BudgetError] when the shared budget is
// spent. Net/http's own client has no such bound, and go-sdk reads a JSON
// answer whole (io.ReadAll) and an event stream's events whole, which is why
// this sits under both.
type Transport struct {
	// Next is the RoundTripper whose answers are bounded.
	Next http.RoundTripper
	// Max is the upstream's max_response.
	Max      int64
	upstream string
	budget   *Budget
	// SDKLines is set under go-sdk's transports, whose event reader ends a
	// line at LF only (see [lfEvents]): events are counted as it reads them.
	SDKLines bool
	// watchers are told of a failure on the upstream session they watch
	// (by its Mcp-Session-Id): go-sdk's client reports a failed read as a
	// closed connection, without the error that closed it.
	watchers sync.Map // session id -> *limitWatcher
}

// Watch calls fn with the limit failure of any answer on the upstream
// session sid, until the returned func is called.
func (l *Transport) Watch(sid string, fn func(error)) (unwatch func()) {
	if sid == "" {
		return func() {}
	}
	w := &limitWatcher{fn: fn}
	l.watchers.Store(sid, w)
	return func() { l.watchers.CompareAndDelete(sid, w) }
}

type limitWatcher struct{ fn func(error) }

// failed tells the watcher of the upstream session sid, if any, of err.
func (l *Transport) failed(sid string, err error) {
	if sid == "" {
		return
	}
	if w, ok := l.watchers.Load(sid); ok {
		w.(*limitWatcher).fn(err)
	}
}

func NewTransport(next http.RoundTripper, upstream string, max int64, budget *Budget) *Transport {
	if max <= 0 {
		max = DefaultMaxResponse
	}
	return &Transport{Next: next, upstream: upstream, Max: max, budget: budget}
}

func (l *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := l.Next.RoundTrip(req)
	if err != nil || resp.Body == nil || resp.Body == http.NoBody {
		return resp, err
	}
	// Only a successful answer whose media type is text/event-stream is
	// read event by event, and so bounded per event on a GET: its readers
	// (go-sdk, the fast path, the pass-through) take every other body
	// whole, go-sdk even the body of a failed GET stream.
	sse := resp.StatusCode >= 200 && resp.StatusCode < 300 && IsEventStream(resp.Header.Get("Content-Type"))
	perEvent := sse && (req.Method == http.MethodGet || eventLimited(req.Context()))
	if !perEvent && resp.ContentLength > l.Max {
		// Known to be over before a byte is read.
		resp.Body.Close()
		err := &TooLargeError{Upstream: l.upstream, Limit: l.Max}
		l.failed(req.Header.Get(sessionHeader), err)
		return nil, err
	}
	body := &limitedBody{rc: resp.Body, l: l, sid: req.Header.Get(sessionHeader), sse: sse, perEvent: perEvent}
	body.split = &body.html
	if l.SDKLines {
		body.split = &body.lf
	}
	resp.Body = body
	return resp, nil
}

func (l *Transport) CloseIdleConnections() {
	if ci, ok := l.Next.(interface{ CloseIdleConnections() }); ok {
		ci.CloseIdleConnections()
	}
}

// limitedBody counts an answer's bytes against its limit and the budget.
// On an event stream it finds the ends of events where a client does (see
// internal/sse), where a GET stream's count starts again and the bytes
// held so far are given back.
type limitedBody struct {
	rc       io.ReadCloser
	l        *Transport
	sid      string // the upstream session the answer belongs to, if any
	sse      bool
	perEvent bool

	mu    sync.Mutex
	n     int64 // bytes counted against max
	held  int64 // bytes reserved from the budget
	split interface{ End([]byte) int }
	html  sse.Splitter
	lf    lfEvents
	err   error // the failure every later Read returns
}

// lfEvents finds where go-sdk's event reader (mcp/event.go in v1.8.0) ends
// events: it ends a line at LF only, and takes a line of nothing but CRs
// as blank. A lone CR, which ends a line for a client that follows the
// HTML standard (sse.Splitter), is text to it, so a stream spelled with
// lone CRs is one event, which it holds whole, up to its own bound. Its
// ends never come before a client's (a blank line of go-sdk's starts with
// a CR, or follows a LF, either of which ends a client's event first), so
// the fast path, which reads the same answers as a client does, holds no
// event past one. The zero value is at the start of a line.
type lfEvents struct {
	text bool // the current line has a byte other than CR
}

// End returns the length of p up to and including the LF that ends an
// event, or -1 when no event ends in p.
func (s *lfEvents) End(p []byte) int {
	for i, c := range p {
		switch c {
		case '\n':
			if !s.text {
				return i + 1
			}
			s.text = false
		case '\r':
		default:
			s.text = true
		}
	}
	return -1
}

func (b *limitedBody) Read(p []byte) (int, error) {
	// The lock is not held across the read: Close, from another goroutine,
	// must be able to end a read that waits on the network.
	b.mu.Lock()
	failed := b.err
	b.mu.Unlock()
	if failed != nil {
		return 0, failed
	}
	n, err := b.rc.Read(p)
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.err != nil {
		// Closed while the read waited: nothing more is counted or held.
		return 0, b.err
	}
	if n > 0 {
		if lerr := b.count(p[:n]); lerr != nil {
			b.err = lerr
			b.release()
			b.rc.Close()
			b.l.failed(b.sid, lerr)
			return 0, lerr
		}
	}
	if err != nil && b.sse {
		// The stream ended: its events have gone on. The bytes of another
		// answer stay reserved until it is closed, since its reader holds
		// it whole until then (the pass-through, while it writes it out).
		b.release()
	}
	return n, err
}

// count takes chunk into the counts, and fails when a limit is passed.
func (b *limitedBody) count(chunk []byte) error {
	if !b.sse {
		return b.add(int64(len(chunk)))
	}
	// Walk from event end to event end: bytes up to each end are counted
	// in the event they belong to.
	for len(chunk) > 0 {
		end := b.eventEnd(chunk)
		if end < 0 {
			return b.add(int64(len(chunk)))
		}
		if err := b.add(int64(end)); err != nil {
			return err
		}
		chunk = chunk[end:]
		if b.perEvent {
			b.n = 0
		}
		// The event is complete: the reader above has it whole, and
		// holds it no longer than it takes to hand it on.
		b.l.budget.give(b.held)
		b.held = 0
	}
	return nil
}

// eventEnd returns the length of chunk up to and including the line end
// that ends an event, or -1 when no event ends in chunk. It keeps the line
// state across calls.
func (b *limitedBody) eventEnd(chunk []byte) int { return b.split.End(chunk) }

func (b *limitedBody) add(n int64) error {
	b.n += n
	if b.n > b.l.Max {
		return &TooLargeError{Upstream: b.l.upstream, Limit: b.l.Max, Event: b.perEvent}
	}
	if !b.l.budget.take(n) {
		return &BudgetError{Upstream: b.l.upstream, Limit: b.l.budget.max}
	}
	b.held += n
	return nil
}

func (b *limitedBody) release() {
	b.l.budget.give(b.held)
	b.held = 0
}

func (b *limitedBody) Close() error {
	err := b.rc.Close()
	b.mu.Lock()
	b.release()
	if b.err == nil {
		b.err = errReadAfterClose
	}
	b.mu.Unlock()
	return err
}

var errReadAfterClose = errors.New("read of an upstream answer after it was closed")

// IsEventStream reports whether a Content-Type is text/event-stream.
func IsEventStream(contentType string) bool {
	mt, _, _ := strings.Cut(contentType, ";")
	return strings.EqualFold(strings.TrimSpace(mt), "text/event-stream")
}

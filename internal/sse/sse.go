// Package sse is the module's one reader of text/event-stream: every place
// that reads or relays an event stream (the edge's listing filter, the
// broker's answer limit, pass-through relay, fast paths, notification
// count and the plain spelling it hands go-sdk's client, the sessions
// endpoint's channel rewrite, the benchmark's idle probe) splits it here,
// by the rules the HTML standard gives clients
// (https://html.spec.whatwg.org/multipage/server-sent-events.html#event-stream-interpretation),
// so that what the gateway reads, counts or filters is what a client
// dispatches:
//
//   - one UTF-8 byte-order mark at the start of the stream is skipped;
//   - a line ends at CRLF, LF or a lone CR;
//   - a line starting with ':' is a comment;
//   - a line is a field name, then optionally ':' and a value, of which one
//     leading space is not part; a line without ':' is a field with an empty
//     value;
//   - data fields are joined by LF; event names the event's type; id sets
//     the last event id unless its value holds a NUL; retry is taken only
//     when it is all ASCII digits; other fields are ignored;
//   - a blank line ends the event, which a client dispatches when it has a
//     data field; an event the stream ends in, without its blank line, is
//     never dispatched.
//
// Readers that hold an event bound it in bytes, and say so with a
// [*TooLargeError] or [ErrBudget]. The package decides nothing about what
// the events carry.
//
// go-sdk v1.8.0 has a reader of its own (mcp/event.go), unexported and with
// other rules: it trims all spaces around a value, ends lines only at LF,
// keeps a byte-order mark, and fails a line without ':'. A reader that
// agrees with clients has to be written here.
package sse

import (
	"bytes"
	"errors"
	"fmt"
	"iter"
	"strconv"
)

var bom = []byte{0xEF, 0xBB, 0xBF}

// TooLargeError is an event over a reader's bound.
type TooLargeError struct {
	Max int // the bound, in bytes
}

func (e *TooLargeError) Error() string {
	return fmt.Sprintf("an event of the stream is over %d bytes", e.Max)
}

// ErrBudget is an event dropped because the [Budget] had no room for it.
var ErrBudget = errors.New("the byte budget has no room for an event of the stream")

// Budget is a byte budget shared with others: a [Decoder] reserves what it
// holds with Take, and gives it back with Give.
type Budget interface {
	Take(n int64) bool
	Give(n int64)
}

// Event is one event of a stream: its lines up to the blank line that
// ended it, the byte-order mark removed and each line ended by LF. Its
// bytes are its own.
type Event struct {
	raw  []byte
	data bool
}

// Raw is the event's lines, each ended by LF, without the blank line.
func (e Event) Raw() []byte { return e.raw }

// Lines yields the event's lines, without their line ends.
func (e Event) Lines() iter.Seq[[]byte] {
	return func(yield func([]byte) bool) {
		for rest := e.raw; len(rest) > 0; {
			i := bytes.IndexByte(rest, '\n')
			if !yield(rest[:i]) {
				return
			}
			rest = rest[i+1:]
		}
	}
}

// Data is the event's data fields' values joined by LF, and whether it has
// a data field: a client dispatches an event only when it has one.
func (e Event) Data() ([]byte, bool) {
	if !e.data {
		return nil, false
	}
	var (
		out []byte
		n   int
	)
	for line := range e.Lines() {
		name, value, comment := Field(line)
		if comment || string(name) != "data" {
			continue
		}
		switch n++; n {
		case 1:
			out = value // one data line, the usual case: no copy
		case 2:
			out = append(append(append(make([]byte, 0, len(out)+1+len(value)), out...), '\n'), value...)
		default:
			out = append(append(out, '\n'), value...)
		}
	}
	if out == nil {
		out = []byte{}
	}
	return out, true
}

// Message is the data of an event of type "message", the type clients
// (the MCP SDKs, an EventSource's onmessage) take messages from; events of
// other types, and events without data, carry none.
func (e Event) Message() ([]byte, bool) {
	if t := e.Type(); len(t) != 0 && string(t) != "message" {
		return nil, false
	}
	return e.Data()
}

// Type is the value of the event's last event field; empty means
// "message".
func (e Event) Type() []byte {
	var t []byte
	for line := range e.Lines() {
		if name, value, comment := Field(line); !comment && string(name) == "event" {
			t = value
		}
	}
	return t
}

// Field splits a line of an event into its field name and value: one
// space after the ':' is not part of the value. A comment (a line starting
// with ':') has no name.
func Field(line []byte) (name, value []byte, comment bool) {
	name, value, found := bytes.Cut(line, []byte(":"))
	if found && len(name) == 0 {
		return nil, nil, true
	}
	if len(value) > 0 && value[0] == ' ' {
		value = value[1:]
	}
	return name, value, false
}

// AppendMessage appends an event of type message (what MCP's streamable
// HTTP transport sends) carrying data.
func AppendMessage(dst, data []byte) []byte {
	dst = append(dst, "event: message\n"...)
	return append(AppendData(dst, data), '\n')
}

// AppendData appends data as the data lines of an event, one per line of
// data (any line end in it becomes LF, as a client reads it back).
func AppendData(dst, data []byte) []byte {
	for {
		i := bytes.IndexAny(data, "\r\n")
		dst = append(dst, "data: "...)
		if i < 0 {
			return append(append(dst, data...), '\n')
		}
		dst = append(append(dst, data[:i]...), '\n')
		if data[i] == '\r' && i+1 < len(data) && data[i+1] == '\n' {
			i++
		}
		data = data[i+1:]
	}
}

// Decoder reads an event stream given to Write in pieces of any size, and
// hands on each event as its blank line comes. What it holds is the
// current event's lines so far, once, bounded by Max and by Budget; an
// event over either is dropped (OnDrop is told) and the stream read on
// from its next blank line. The zero value reads without bounds. A Decoder
// is not safe for concurrent use.
type Decoder struct {
	// Max bounds the bytes of one event: its lines, each counted with one
	// line end, and the line not yet ended. 0 means no bound.
	Max int
	// Budget, when set, reserves what the Decoder holds.
	Budget Budget
	// OnDrop, when set, is called once for each event dropped, with a
	// *TooLargeError or ErrBudget.
	OnDrop func(error)

	started   bool   // the stream's start (and any byte-order mark) is behind
	bomSeen   int    // bytes of a byte-order mark seen at the start
	cr        bool   // the last byte was a CR: a LF right after it ends no line
	event     []byte // the current event's lines, each ended by LF, then the line not yet ended
	lineStart int    // where the line not yet ended starts in event
	lineLen   int    // bytes of the line not yet ended, held or not
	data      bool   // the current event has a data field
	skip      bool   // the current event is dropped
	held      int64  // bytes reserved from Budget
	lastID    []byte
	retry     int
	hasRetry  bool
}

// Write reads p and calls fn with each event that p completes, in order.
func (d *Decoder) Write(p []byte, fn func(Event)) {
	if !d.started {
		n := 0
		for n < len(p) && d.bomSeen < len(bom) && p[n] == bom[d.bomSeen] {
			n++
			d.bomSeen++
		}
		switch {
		case d.bomSeen == len(bom):
			d.started = true
		case n == len(p):
			return // a byte-order mark may still be coming
		default:
			// Not a byte-order mark: what looked like one is text.
			d.started = true
			d.feed(bom[:d.bomSeen], fn)
		}
		p = p[n:]
	}
	d.feed(p, fn)
	d.account()
}

// End reads the end of the stream: an event without its blank line is not
// dispatched, as a client never dispatches it. It gives back what the
// Decoder held.
func (d *Decoder) End() {
	d.event, d.lineStart, d.lineLen, d.data, d.skip = nil, 0, 0, false, false
	d.release()
}

// Pending is how many bytes of the current, unfinished event the Decoder
// holds.
func (d *Decoder) Pending() int { return len(d.event) }

// LastEventID is the last event id of the stream so far.
func (d *Decoder) LastEventID() []byte { return d.lastID }

// Retry is the reconnection time the stream last set, in milliseconds.
func (d *Decoder) Retry() (ms int, ok bool) { return d.retry, d.hasRetry }

func (d *Decoder) feed(p []byte, fn func(Event)) {
	for len(p) > 0 {
		if d.cr {
			d.cr = false
			if p[0] == '\n' {
				p = p[1:]
				continue
			}
		}
		i := bytes.IndexAny(p, "\r\n")
		if i < 0 {
			d.text(p)
			return
		}
		d.text(p[:i])
		d.cr = p[i] == '\r'
		p = p[i+1:]
		d.endLine(fn)
	}
}

// text takes bytes of the line not yet ended.
func (d *Decoder) text(b []byte) {
	d.lineLen += len(b)
	if d.skip || len(b) == 0 {
		return
	}
	d.event = append(d.event, b...)
	if d.Max > 0 && len(d.event) > d.Max {
		d.drop(&TooLargeError{Max: d.Max})
	}
}

func (d *Decoder) endLine(fn func(Event)) {
	blank := d.lineLen == 0
	d.lineLen = 0
	if blank {
		d.dispatch(fn)
		return
	}
	if d.skip {
		return
	}
	line := d.event[d.lineStart:]
	d.event = append(d.event, '\n')
	if d.Max > 0 && len(d.event) > d.Max {
		d.drop(&TooLargeError{Max: d.Max})
		return
	}
	d.lineStart = len(d.event)
	d.fieldSeen(line)
}

// fieldSeen applies the fields that act as their line is read: data marks
// the event as one a client dispatches, id and retry set the stream's
// state.
func (d *Decoder) fieldSeen(line []byte) {
	switch line[0] {
	case 'd', 'i', 'r':
	default:
		return
	}
	name, value, _ := Field(line)
	switch string(name) {
	case "data":
		d.data = true
	case "id":
		if bytes.IndexByte(value, 0) < 0 {
			d.lastID = append(d.lastID[:0], value...)
		}
	case "retry":
		if n, ok := digits(value); ok {
			d.retry, d.hasRetry = n, true
		}
	}
}

// digits reads a retry value: ASCII digits only (strconv.Atoi also takes
// a sign).
func digits(b []byte) (int, bool) {
	if len(b) == 0 {
		return 0, false
	}
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
	}
	n, err := strconv.Atoi(string(b))
	return n, err == nil
}

func (d *Decoder) dispatch(fn func(Event)) {
	raw, data, skip := d.event, d.data, d.skip
	// The event's bytes go with it: a buffer kept for the stream's life
	// would hold the largest event's size until the stream ends.
	d.event, d.lineStart, d.data, d.skip = nil, 0, false, false
	if skip || len(raw) == 0 {
		return
	}
	fn(Event{raw: raw, data: data})
}

// drop drops the current event, err saying why.
func (d *Decoder) drop(err error) {
	if !d.skip && d.OnDrop != nil {
		d.OnDrop(err)
	}
	d.skip, d.event, d.lineStart, d.data = true, nil, 0, false
}

// account keeps what the Decoder holds reserved in the Budget. When the
// Budget has no room, the current event is dropped.
func (d *Decoder) account() {
	if d.Budget == nil {
		return
	}
	want := int64(len(d.event))
	switch {
	case want < d.held:
		d.Budget.Give(d.held - want)
		d.held = want
	case want > d.held:
		if d.Budget.Take(want - d.held) {
			d.held = want
			return
		}
		d.drop(ErrBudget)
		d.release()
	}
}

// release gives back all the Decoder holds in the Budget.
func (d *Decoder) release() {
	if d.Budget != nil && d.held != 0 {
		d.Budget.Give(d.held)
	}
	d.held = 0
}

package sse

import (
	"errors"
	"io"
)

// Reader reads the events of a stream from an io.Reader, one at a time.
type Reader struct {
	r     io.Reader
	d     Decoder
	buf   []byte
	queue []Event
	err   error
}

// NewReader reads r's events, each bounded by maxEvent bytes (0: no
// bound). An event over the bound ends the reading with a *TooLargeError.
func NewReader(r io.Reader, maxEvent int) *Reader {
	rd := &Reader{r: r, buf: make([]byte, 16<<10)}
	rd.d.Max = maxEvent
	rd.d.OnDrop = func(err error) {
		if rd.err == nil {
			rd.err = err
		}
	}
	return rd
}

// Next returns the next event, or the error that ended the stream: io.EOF
// at its end (an event without its blank line is not returned), a
// *TooLargeError, or the underlying reader's.
func (r *Reader) Next() (Event, error) {
	for empty := 0; len(r.queue) == 0; {
		if r.err != nil {
			return Event{}, r.err
		}
		n, err := r.r.Read(r.buf)
		if n == 0 && err == nil {
			// As bufio does: a reader that returns nothing, again and
			// again, is broken.
			if empty++; empty == 100 {
				err = io.ErrNoProgress
			}
		}
		r.d.Write(r.buf[:n], func(ev Event) {
			if r.err == nil { // nothing after an event that was too large
				r.queue = append(r.queue, ev)
			}
		})
		if err != nil && r.err == nil {
			r.err = err
			if errors.Is(err, io.EOF) {
				r.d.End()
			}
		}
		if r.err != nil && !errors.Is(r.err, io.EOF) {
			// A failure drops what it cut short; the events before it
			// were whole.
			break
		}
	}
	if len(r.queue) == 0 {
		return Event{}, r.err
	}
	ev := r.queue[0]
	r.queue = r.queue[1:]
	return ev, nil
}

// Splitter finds where events end in a stream read piece by piece, holding
// none of its bytes: what a relay that passes bytes on unchanged, or a
// count of an event's bytes, needs. It ends events exactly where a
// [Decoder] does. The zero value is at the start of a stream.
type Splitter struct {
	started bool
	bomSeen int
	midLine bool // a byte of the current line has been seen
	cr      bool // the last byte was CR: a LF right after it ends no line
}

// End returns the length of p up to and including the line end that ends
// an event (a blank line), or -1 when no event ends in p. Called again
// with the rest of p, it finds the next.
func (s *Splitter) End(p []byte) int {
	i := 0
	if !s.started {
		for i < len(p) && s.bomSeen < len(bom) && p[i] == bom[s.bomSeen] {
			i++
			s.bomSeen++
		}
		switch {
		case s.bomSeen == len(bom):
			s.started = true
		case i == len(p):
			return -1
		default:
			s.started = true
			if s.bomSeen > 0 {
				s.midLine = true // what looked like a byte-order mark is text
			}
		}
	}
	for ; i < len(p); i++ {
		c := p[i]
		if c == '\n' && s.cr {
			s.cr = false
			continue
		}
		s.cr = false
		if c == '\r' || c == '\n' {
			s.cr = c == '\r'
			if !s.midLine {
				return i + 1
			}
			s.midLine = false
			continue
		}
		s.midLine = true
	}
	return -1
}

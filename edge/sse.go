package edge

import "bytes"

// sseFilter reads a server-sent event stream as the HTML standard has
// clients read it, so that what it filters is what a client dispatches: a
// line ends at CRLF, LF or a lone CR; a byte-order mark at the start of the
// stream is skipped; a line starting with ':' is a comment; a field without
// ':' has an empty value, one space after the ':' is not part of the
// value; an event is dispatched at a blank line, its data lines joined by
// LF. It writes each event back out with LF line ends and the data of its
// JSON-RPC message filtered, or drops it whole.
type sseFilter struct {
	f       *Listing
	buf     []byte // bytes not yet split into lines
	scanned int    // how much of buf holds no line end
	started bool   // the stream's first bytes were seen (for the BOM)
	// event holds the current event's lines, each ended by LF, in one
	// buffer: a slice per line would cost many times the bytes of an event
	// of short lines.
	event []byte
	size  int   // the current event's bytes, line ends counted
	skip  bool  // the current event is over maxFilteredBody: dropped
	held  int64 // bytes of buf and event reserved from the Listing's budget
}

// account keeps what the filter holds (the unsplit bytes and the current
// event) reserved in the Listing's in-flight budget. When the budget has
// no room, the current event is dropped, as one over maxFilteredBody is.
func (s *sseFilter) account() {
	want := int64(len(s.buf) + len(s.event))
	switch {
	case want < s.held:
		s.f.Budget.Give(s.held - want)
		s.held = want
	case want > s.held:
		if s.f.Budget.Take(want - s.held) {
			s.held = want
			return
		}
		if !s.skip {
			s.f.drop(Drop{Reason: "answer_budget"})
		}
		s.skip, s.event, s.size = true, nil, 0
		s.buf, s.scanned = s.buf[:0], 0
		s.release()
	}
}

// pending is how many bytes of the current, unfinished event the filter
// has seen: its lines so far and what is not yet split into lines.
func (s *sseFilter) pending() int { return s.size + len(s.buf) }

// release gives back all the filter holds in the budget.
func (s *sseFilter) release() {
	s.f.Budget.Give(s.held)
	s.held = 0
}

var bom = []byte{0xEF, 0xBB, 0xBF}

// write takes bytes of the stream and returns the events they complete,
// filtered.
func (s *sseFilter) write(p []byte) [][]byte {
	s.buf = append(s.buf, p...)
	if !s.started {
		if len(s.buf) < len(bom) && bytes.HasPrefix(bom, s.buf) {
			return nil // a BOM may still be coming
		}
		s.started = true
		s.buf = bytes.TrimPrefix(s.buf, bom)
	}
	out := s.lines0(false)
	s.account()
	return out
}

// end returns what the stream's last bytes complete. An event without its
// blank line is never dispatched by a client, so it is not passed on.
func (s *sseFilter) end() [][]byte {
	if !s.started {
		s.started = true
		s.buf = bytes.TrimPrefix(s.buf, bom)
	}
	defer s.release()
	return s.lines0(true)
}

// lines0 splits s.buf into lines and dispatches the events they end. At
// the end of the stream a trailing CR ends its line.
func (s *sseFilter) lines0(final bool) [][]byte {
	var out [][]byte
	for {
		i := bytes.IndexAny(s.buf[s.scanned:], "\r\n")
		if i < 0 {
			s.scanned = len(s.buf)
			if len(s.buf) > maxFilteredBody {
				s.tooLarge()
				s.buf, s.scanned = s.buf[:0], 0
			}
			return out
		}
		i += s.scanned
		next := i + 1
		if s.buf[i] == '\r' {
			if i+1 == len(s.buf) && !final {
				s.scanned = i
				return out // a LF may follow
			}
			if i+1 < len(s.buf) && s.buf[i+1] == '\n' {
				next = i + 2
			}
		}
		line := s.buf[:i]
		if len(line) == 0 {
			if ev := s.dispatch(); ev != nil {
				out = append(out, ev)
			}
		} else if !s.skip {
			s.size += len(line) + 1
			if s.size > maxFilteredBody {
				s.tooLarge()
			} else {
				s.event = append(append(s.event, line...), '\n')
			}
		}
		s.buf, s.scanned = s.buf[next:], 0
	}
}

// tooLarge drops the current event.
func (s *sseFilter) tooLarge() {
	if !s.skip {
		s.f.drop(Drop{Reason: "answer_too_large"})
	}
	s.skip, s.event, s.size = true, nil, 0
}

// dispatch filters the current event at its blank line, and returns it
// written out, or nil when nothing of it may go out.
func (s *sseFilter) dispatch() []byte {
	event, skip := s.event, s.skip
	s.event, s.size, s.skip = nil, 0, false
	if skip || len(event) == 0 {
		return nil
	}
	var (
		data    []byte // the data lines' values, joined by LF
		hasData bool
		kept    bytes.Buffer
	)
	for len(event) > 0 {
		i := bytes.IndexByte(event, '\n')
		l := event[:i]
		event = event[i+1:]
		field, value, colon := bytes.Cut(l, []byte(":"))
		switch {
		case len(field) == 0 && colon:
			// A comment: clients ignore it; it keeps connections alive.
		case string(field) == "data":
			if hasData {
				data = append(data, '\n')
			}
			data = append(data, bytes.TrimPrefix(value, []byte(" "))...)
			hasData = true
			continue
		}
		kept.Write(l)
		kept.WriteByte('\n')
	}
	if hasData {
		filtered, keep := s.f.filterMessage(data)
		if !keep {
			return nil
		}
		for {
			l, rest, more := bytes.Cut(filtered, []byte("\n"))
			kept.WriteString("data: ")
			kept.Write(l)
			kept.WriteByte('\n')
			if !more {
				break
			}
			filtered = rest
		}
	}
	kept.WriteByte('\n')
	return kept.Bytes()
}

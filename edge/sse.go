package edge

import (
	"bytes"
	"errors"

	"github.com/Tahul/caddy-zidane-mcp/internal/sse"
)

// sseFilter reads a server-sent event stream as clients read it (see
// internal/sse), so that what it filters is what a client dispatches. It
// writes each event back out with LF line ends and the data of its
// JSON-RPC message filtered, or drops it whole. What it holds of an
// unfinished event is bounded by maxFilteredBody and reserved in the
// Listing's in-flight budget; an event over either is dropped.
type sseFilter struct {
	f   *Listing
	dec sse.Decoder
	out [][]byte // events completed by the current write
}

func newSSEFilter(f *Listing) *sseFilter {
	s := &sseFilter{f: f}
	s.dec.Max = maxFilteredBody
	if f.Budget != nil {
		// A nil *AnswerBudget holds no limit; as an interface it would
		// not be nil, and each write would pay for the calls.
		s.dec.Budget = f.Budget
	}
	s.dec.OnDrop = f.dropEvent
	return s
}

// dropEvent records an event the filter dropped, err saying why.
func (f *Listing) dropEvent(err error) {
	if errors.Is(err, sse.ErrBudget) {
		f.drop(Drop{Reason: "answer_budget"})
		return
	}
	f.drop(Drop{Reason: "answer_too_large"})
}

// pending is how many bytes of the current, unfinished event the filter
// holds.
func (s *sseFilter) pending() int { return s.dec.Pending() }

// release gives back all the filter holds in the budget.
func (s *sseFilter) release() { s.dec.End() }

// write takes bytes of the stream and returns the events they complete,
// filtered.
func (s *sseFilter) write(p []byte) [][]byte {
	s.out = nil
	s.dec.Write(p, s.dispatch)
	return s.out
}

// end ends the stream. An event without its blank line is never dispatched
// by a client, so it is not passed on.
func (s *sseFilter) end() [][]byte {
	s.dec.End()
	return nil
}

// dispatch filters an event at its blank line: its other lines go out as
// they came, its data, filtered, after them; an event whose message may
// not go out is dropped.
func (s *sseFilter) dispatch(ev sse.Event) {
	var kept bytes.Buffer
	for l := range ev.Lines() {
		if name, _, comment := sse.Field(l); !comment && string(name) == "data" {
			continue
		}
		kept.Write(l)
		kept.WriteByte('\n')
	}
	if data, ok := ev.Data(); ok {
		filtered, keep := s.f.filterMessage(data)
		if !keep {
			return
		}
		kept.Write(sse.AppendData(kept.AvailableBuffer(), filtered))
	}
	kept.WriteByte('\n')
	s.out = append(s.out, kept.Bytes())
}

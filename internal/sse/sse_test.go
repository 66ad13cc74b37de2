package sse

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"
)

// got is what a client sees of one dispatched event.
type got struct {
	Type, Data, LastID string
}

// decodeAll reads stream through a Decoder in pieces of size n (0: whole)
// and returns the events a client dispatches.
func decodeAll(stream []byte, n int) []got {
	var d Decoder
	var out []got
	emit := func(ev Event) {
		data, ok := ev.Data()
		if !ok {
			return
		}
		t := string(ev.Type())
		if t == "" {
			t = "message"
		}
		out = append(out, got{t, string(data), string(d.LastEventID())})
	}
	if n <= 0 {
		n = len(stream) + 1
	}
	for len(stream) > 0 {
		k := min(n, len(stream))
		d.Write(stream[:k], emit)
		stream = stream[k:]
	}
	d.End()
	return out
}

// The examples of the HTML standard's section on event streams, and the
// rules around them: every piece size reads the same events.
func TestDecoderReadsAsTheStandard(t *testing.T) {
	for _, tc := range []struct {
		name   string
		stream string
		want   []got
	}{
		{"three data lines", "data: YHOO\ndata: +2\ndata: 10\n\n",
			[]got{{"message", "YHOO\n+2\n10", ""}}},
		{"comment, ids, one space removed", ": test stream\n\ndata: first event\nid: 1\n\ndata:second event\nid\n\ndata:  third event\n\n",
			[]got{{"message", "first event", "1"}, {"message", "second event", ""}, {"message", " third event", ""}}},
		{"empty data, and a last event never ended", "data\n\ndata\ndata\n\ndata:",
			[]got{{"message", "", ""}, {"message", "\n", ""}}},
		{"one optional space", "data:test\n\ndata: test\n\n",
			[]got{{"message", "test", ""}, {"message", "test", ""}}},
		{"event type", "event: add\ndata: 73857293\n\nevent: remove\ndata: 2153\n\n",
			[]got{{"add", "73857293", ""}, {"remove", "2153", ""}}},
		{"lone CR ends lines", "data: a\rdata: b\r\rdata: c\r\r",
			[]got{{"message", "a\nb", ""}, {"message", "c", ""}}},
		{"CRLF ends lines", "data: a\r\ndata: b\r\n\r\n",
			[]got{{"message", "a\nb", ""}}},
		{"CR LF mixed", "data: a\r\n\ndata: b\n\r\n",
			[]got{{"message", "a", ""}, {"message", "b", ""}}},
		{"a byte-order mark is skipped", "\xEF\xBB\xBFdata: a\n\n",
			[]got{{"message", "a", ""}}},
		{"only the first byte-order mark", "\xEF\xBB\xBF\xEF\xBB\xBFdata: a\n\ndata: b\n\n",
			[]got{{"message", "b", ""}}},
		{"half a byte-order mark is text", "\xEF\xBBdata: a\n\ndata: b\n\n",
			[]got{{"message", "b", ""}}},
		{"a byte-order mark later is data", "data: \xEF\xBB\xBFa\n\n",
			[]got{{"message", "\xEF\xBB\xBFa", ""}}},
		{"an id with NUL is ignored", "id: 7\ndata: a\n\nid: 8\x009\ndata: b\n\n",
			[]got{{"message", "a", "7"}, {"message", "b", "7"}}},
		{"id set by an event without data", "id: 3\n\ndata: a\n\n",
			[]got{{"message", "a", "3"}}},
		{"event type does not carry over", "event: x\n\ndata: a\n\n",
			[]got{{"message", "a", ""}}},
		{"unknown fields and comments", "foo: bar\n:data: no\ndata:a\n\n",
			[]got{{"message", "a", ""}}},
		{"field names are exact", "Data: a\ndata : b\n data: c\n\n", nil},
		{"no data, no dispatch", "event: x\nid: 1\n\n", nil},
		{"ended without its blank line", "data: a\n", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, n := range []int{0, 1, 2, 3, 5} {
				if g := decodeAll([]byte(tc.stream), n); !equal(g, tc.want) {
					t.Errorf("in pieces of %d: %q\nwant %q", n, g, tc.want)
				}
			}
			if g := reference([]byte(tc.stream)); !equal(g, tc.want) {
				t.Errorf("the reference reads %q\nwant %q", g, tc.want)
			}
		})
	}
}

func equal(a, b []got) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestDecoderRetry(t *testing.T) {
	var d Decoder
	d.Write([]byte("retry: 1500\n\nretry: 2x\n\nretry: -3\n\n"), func(Event) {})
	if ms, ok := d.Retry(); !ok || ms != 1500 {
		t.Fatalf("retry = %d, %v; want 1500 (values not all digits are ignored)", ms, ok)
	}
}

// An event over Max is dropped, OnDrop told once, and the stream read on
// from the next blank line; nothing over Max is held.
func TestDecoderDropsAnEventOverMax(t *testing.T) {
	var drops []error
	d := Decoder{Max: 16, OnDrop: func(err error) { drops = append(drops, err) }}
	var events []string
	emit := func(ev Event) {
		data, _ := ev.Data()
		events = append(events, string(data))
	}
	d.Write([]byte("data: short\n\ndata: "), emit)
	for range 100 {
		d.Write([]byte("xxxxxxxxxx"), emit)
		if d.Pending() > 16 {
			t.Fatalf("the decoder holds %d bytes of an event over its bound of 16", d.Pending())
		}
	}
	d.Write([]byte("\ndata: more\n\ndata: after\n\n"), emit)
	var tl *TooLargeError
	if len(drops) != 1 || !errors.As(drops[0], &tl) || tl.Max != 16 {
		t.Fatalf("drops = %v; want one *TooLargeError of 16", drops)
	}
	if want := []string{"short", "after"}; strings.Join(events, ",") != strings.Join(want, ",") {
		t.Fatalf("events = %q; want %q", events, want)
	}
}

// budget is a Budget of a fixed size.
type budget struct{ used, max int64 }

func (b *budget) Take(n int64) bool {
	if b.used+n > b.max {
		return false
	}
	b.used += n
	return true
}
func (b *budget) Give(n int64) { b.used -= n }

func TestDecoderReservesWhatItHolds(t *testing.T) {
	b := &budget{max: 32}
	var drops []error
	d := Decoder{Budget: b, OnDrop: func(err error) { drops = append(drops, err) }}
	var events int
	d.Write([]byte("data: 0123456789"), func(Event) { events++ })
	if b.used != int64(d.Pending()) || b.used == 0 {
		t.Fatalf("reserved %d for %d bytes held", b.used, d.Pending())
	}
	d.Write([]byte("0123456789012345678901234567890"), func(Event) { events++ })
	if len(drops) != 1 || !errors.Is(drops[0], ErrBudget) {
		t.Fatalf("drops = %v; want ErrBudget", drops)
	}
	if b.used != 0 {
		t.Fatalf("a dropped event still holds %d bytes of the budget", b.used)
	}
	d.Write([]byte("\n\ndata: ok\n\ndata: half"), func(Event) { events++ })
	if events != 1 {
		t.Fatalf("%d events; want the one after the dropped one", events)
	}
	d.End()
	if b.used != 0 {
		t.Fatalf("End left %d bytes reserved", b.used)
	}
}

func TestReader(t *testing.T) {
	stream := "\xEF\xBB\xBFevent: message\r\ndata: {\"a\":1}\r\n\r\n: keep-alive\n\ndata: b\rdata: c\r\rdata: cut"
	r := NewReader(iotest.OneByteReader(strings.NewReader(stream)), 0)
	var datas []string
	for {
		ev, err := r.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if d, ok := ev.Data(); ok {
			datas = append(datas, string(d))
		}
	}
	if want := `{"a":1}|b` + "\n" + `c`; strings.Join(datas, "|") != want {
		t.Fatalf("read %q; want %q", strings.Join(datas, "|"), want)
	}
}

func TestReaderFailsAnEventOverMax(t *testing.T) {
	r := NewReader(strings.NewReader("data: ok\n\ndata: "+strings.Repeat("x", 100)+"\n\ndata: after\n\n"), 32)
	ev, err := r.Next()
	if d, _ := ev.Data(); err != nil || string(d) != "ok" {
		t.Fatalf("first event %q, %v", d, err)
	}
	_, err = r.Next()
	var tl *TooLargeError
	if !errors.As(err, &tl) {
		t.Fatalf("err = %v; want *TooLargeError", err)
	}
	if _, err2 := r.Next(); err2 != err {
		t.Fatalf("the reader read on after an event over its bound: %v", err2)
	}
}

func TestAppendData(t *testing.T) {
	for in, want := range map[string]string{
		"x":         "data: x\n",
		"":          "data: \n",
		"a\nb":      "data: a\ndata: b\n",
		"a\r\nb\rc": "data: a\ndata: b\ndata: c\n",
	} {
		out := AppendData(nil, []byte(in))
		if string(out) != want {
			t.Errorf("AppendData(%q) = %q; want %q", in, out, want)
		}
		if in == "a\r\nb\rc" {
			continue
		}
		if g := decodeAll(append(out, '\n'), 0); len(g) != 1 || g[0].Data != in {
			t.Errorf("AppendData(%q) reads back as %q", in, g)
		}
	}
}

// The Splitter ends events where the Decoder does, and so where a client
// does.
func TestSplitterEndsEventsWhereTheDecoderDoes(t *testing.T) {
	for _, stream := range []string{
		"data: a\n\ndata: b\r\n\r\ndata: c\r\rx",
		"\xEF\xBB\xBF\ndata: a\n\n",
		"\xEF\xBB\n\n",
		"data: a\r\n\r\n\r\n",
	} {
		checkSplitter(t, []byte(stream))
	}
}

// checkSplitter checks that the Splitter's ends, found piece by piece, are
// exactly the ends of the blank lines of the stream read as the standard
// says.
func checkSplitter(t *testing.T, stream []byte) {
	t.Helper()
	var blanks []int
	off := 0
	if bytes.HasPrefix(stream, bom) {
		off = len(bom)
	}
	for off < len(stream) {
		i := bytes.IndexAny(stream[off:], "\r\n")
		if i < 0 {
			break
		}
		if i == 0 {
			blanks = append(blanks, off+1)
		}
		off += i + 1
		if stream[off-1] == '\r' && off < len(stream) && stream[off] == '\n' {
			off++
		}
	}
	for _, piece := range []int{1, 2, 7, len(stream) + 1} {
		var s Splitter
		var ends []int
		off := 0
		for p := stream; len(p) > 0; {
			k := min(piece, len(p))
			chunk := p[:k]
			base := off
			for {
				e := s.End(chunk)
				if e < 0 {
					break
				}
				base += e
				ends = append(ends, base)
				chunk = chunk[e:]
			}
			off += k
			p = p[k:]
		}
		if !equalInts(ends, blanks) {
			t.Errorf("%q in pieces of %d: the splitter ends events at %v, the decoder at %v", stream, piece, ends, blanks)
		}
	}
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// reference reads a whole stream as the standard's text says, line by
// line, with nothing of the Decoder's incremental state.
func reference(stream []byte) []got {
	s := string(stream)
	s = strings.TrimPrefix(s, "\uFEFF")
	var lines []string
	complete := false
	for s != "" {
		i := strings.IndexAny(s, "\r\n")
		if i < 0 {
			lines = append(lines, s) // no line end: never processed
			complete = false
			break
		}
		lines = append(lines, s[:i])
		if strings.HasPrefix(s[i:], "\r\n") {
			s = s[i+2:]
		} else {
			s = s[i+1:]
		}
		complete = true
	}
	if !complete && len(lines) > 0 {
		lines = lines[:len(lines)-1]
	}
	var (
		out       []got
		data      strings.Builder
		eventType string
		lastID    string
	)
	for _, line := range lines {
		switch {
		case line == "":
			if data.Len() == 0 {
				eventType = ""
				continue
			}
			d := strings.TrimSuffix(data.String(), "\n")
			if eventType == "" {
				eventType = "message"
			}
			out = append(out, got{eventType, d, lastID})
			data.Reset()
			eventType = ""
			continue
		case line[0] == ':':
			continue
		}
		field, value, found := strings.Cut(line, ":")
		if found {
			value = strings.TrimPrefix(value, " ")
		}
		switch field {
		case "event":
			eventType = value
		case "data":
			data.WriteString(value)
			data.WriteByte('\n')
		case "id":
			if !strings.Contains(value, "\x00") {
				lastID = value
			}
		}
	}
	return out
}

// FuzzDecoder compares the Decoder, fed in pieces of any size, with the
// reference reading of the whole stream, and the Splitter with both.
func FuzzDecoder(f *testing.F) {
	for _, s := range []string{
		"data: a\n\n", "\xEF\xBB\xBFdata:a\r\rdata: b\r\n\r\n", "id: 1\x00\ndata\n\nevent: x\ndata: y\n\n",
		": c\n\ndata:  z\ndata\n\n\n\n", "\xEF\xBBdata: q\n\ndata: r\n\n",
	} {
		f.Add([]byte(s), uint8(1))
		f.Add([]byte(s), uint8(3))
	}
	f.Fuzz(func(t *testing.T, stream []byte, piece uint8) {
		// Both read bytes: a client's UTF-8 decoding replaces invalid
		// bytes, but never with a line end or a colon, so it splits where
		// they do.
		want := reference(stream)
		if g := decodeAll(stream, int(piece)); !equal(g, want) {
			t.Fatalf("in pieces of %d: %q\nreference: %q", piece, g, want)
		}
		checkSplitter(t, stream)
	})
}

// stuck is a reader that never returns anything, nor fails.
type stuck struct{}

func (stuck) Read([]byte) (int, error) { return 0, nil }

func TestReaderGivesUpOnAReaderThatNeverProgresses(t *testing.T) {
	if _, err := NewReader(stuck{}, 0).Next(); !errors.Is(err, io.ErrNoProgress) {
		t.Fatalf("err = %v; want io.ErrNoProgress", err)
	}
}

func TestEventMessage(t *testing.T) {
	for stream, want := range map[string]string{
		"data: a\n\n":                           "a",
		"event: message\ndata: a\n\n":           "a",
		"event:\ndata: a\n\n":                   "a",
		"event: other\ndata: a\n\n":             "",
		"event: message\nevent: x\ndata: a\n\n": "",
		"event: x\nevent: message\ndata: a\n\n": "a",
		"event: message\n\n":                    "",
	} {
		var got []string
		var d Decoder
		d.Write([]byte(stream), func(ev Event) {
			if m, ok := ev.Message(); ok {
				got = append(got, string(m))
			}
		})
		if strings.Join(got, "") != want {
			t.Errorf("%q: messages %q; want %q", stream, got, want)
		}
	}
}

// TestAppendMessage: a message event reads back as its data, whatever
// line ends the data holds.
func TestAppendMessage(t *testing.T) {
	for _, data := range []string{`{"jsonrpc":"2.0","method":"m"}`, "a\nb", "a\r\nb\rc", ""} {
		b := AppendMessage([]byte("x"), []byte(data))
		var got []Event
		var d Decoder
		d.Write(b[1:], func(e Event) { got = append(got, e) })
		want := strings.NewReplacer("\r\n", "\n", "\r", "\n").Replace(data)
		if len(got) != 1 || string(got[0].Type()) != "message" {
			t.Fatalf("%q: events %d", data, len(got))
		}
		if msg, ok := got[0].Message(); !ok || string(msg) != want {
			t.Fatalf("%q read back as %q %v", data, msg, ok)
		}
	}
}

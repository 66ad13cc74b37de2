package policy

import (
	"bytes"
	"encoding/json"
	"io"
)

// maxFilteredBody bounds what a tools/list filter buffers: a JSON answer, or
// one SSE event. Larger ones pass through unfiltered would leak names, so
// they are replaced by a JSON-RPC error instead.
const maxFilteredBody = 8 << 20

// FilterToolsList removes from a JSON-RPC tools/list response every tool
// that visible refuses. msg is one JSON-RPC message or a batch; only
// responses whose id is in ids are touched. It returns msg unchanged when
// nothing was removed.
func FilterToolsList(msg []byte, ids map[string]bool, visible func(string) bool) []byte {
	trimmed := bytes.TrimSpace(msg)
	if len(trimmed) == 0 {
		return msg
	}
	if trimmed[0] == '[' {
		var batch []json.RawMessage
		if json.Unmarshal(trimmed, &batch) != nil {
			return msg
		}
		changed := false
		for i, m := range batch {
			if out, ok := filterOne(m, ids, visible); ok {
				batch[i] = out
				changed = true
			}
		}
		if !changed {
			return msg
		}
		out, _ := json.Marshal(batch)
		return out
	}
	if out, ok := filterOne(trimmed, ids, visible); ok {
		return out
	}
	return msg
}

func filterOne(m json.RawMessage, ids map[string]bool, visible func(string) bool) (json.RawMessage, bool) {
	var resp map[string]json.RawMessage
	if json.Unmarshal(m, &resp) != nil || !ids[string(resp["id"])] {
		return nil, false
	}
	var result map[string]json.RawMessage
	if json.Unmarshal(resp["result"], &result) != nil {
		return nil, false
	}
	var tools []json.RawMessage
	if json.Unmarshal(result["tools"], &tools) != nil {
		return nil, false
	}
	kept := tools[:0]
	for _, t := range tools {
		var named struct {
			Name string `json:"name"`
		}
		if json.Unmarshal(t, &named) == nil && visible(named.Name) {
			kept = append(kept, t)
		}
	}
	// Marshal an empty list as [] rather than null: clients expect an array.
	list, _ := json.Marshal(append([]json.RawMessage{}, kept...))
	result["tools"] = list
	resp["result"], _ = json.Marshal(result)
	out, _ := json.Marshal(resp)
	return out, true
}

// ToolsListFilter rewrites a tools/list answer as it is written through it:
// a JSON body is filtered when it ends (Close), an SSE stream event by
// event, so that streamed events keep flowing.
type ToolsListFilter struct {
	w       io.Writer
	sse     bool
	ids     map[string]bool
	visible func(string) bool
	buf     bytes.Buffer
	over    bool
	flush   func()
}

// NewToolsListFilter returns a filter writing to w. sse says whether the
// answer is text/event-stream; ids are the JSON-RPC ids of the tools/list
// requests (raw JSON, such as `1` or `"a"`); flush, if set, is called after
// each SSE event is written.
func NewToolsListFilter(w io.Writer, sse bool, ids map[string]bool, visible func(string) bool, flush func()) *ToolsListFilter {
	return &ToolsListFilter{w: w, sse: sse, ids: ids, visible: visible, flush: flush}
}

// Write buffers p and passes on what is complete.
func (f *ToolsListFilter) Write(p []byte) (int, error) {
	if f.over {
		return len(p), nil
	}
	f.buf.Write(p)
	if f.buf.Len() > maxFilteredBody {
		f.over = true
		f.buf.Reset()
		return len(p), nil
	}
	if !f.sse {
		return len(p), nil
	}
	for {
		b := f.buf.Bytes()
		end, sep := eventEnd(b)
		if end < 0 {
			return len(p), nil
		}
		event := append([]byte(nil), b[:end]...)
		f.buf.Next(end + sep)
		if _, err := f.w.Write(f.filterEvent(event)); err != nil {
			return len(p), err
		}
		if f.flush != nil {
			f.flush()
		}
	}
}

// Close writes what remains.
func (f *ToolsListFilter) Close() error {
	if f.over {
		_, err := f.w.Write([]byte(`{"jsonrpc":"2.0","id":null,"error":{"code":-32603,"message":"tools/list answer too large to filter"}}`))
		return err
	}
	if f.buf.Len() == 0 {
		return nil
	}
	var out []byte
	if f.sse {
		out = f.filterEvent(f.buf.Bytes())
	} else {
		out = FilterToolsList(f.buf.Bytes(), f.ids, f.visible)
	}
	f.buf.Reset()
	_, err := f.w.Write(out)
	return err
}

// eventEnd finds the blank line that ends an SSE event, returning the index
// where the event's last line ends and the length of the separator.
func eventEnd(b []byte) (int, int) {
	for i := 0; i < len(b); i++ {
		if b[i] != '\n' {
			continue
		}
		switch {
		case i+1 < len(b) && b[i+1] == '\n':
			return i, 2
		case i+2 < len(b) && b[i+1] == '\r' && b[i+2] == '\n':
			return i, 3
		}
	}
	return -1, 0
}

// filterEvent filters the data of one SSE event and returns the event with
// its terminating blank line.
func (f *ToolsListFilter) filterEvent(event []byte) []byte {
	lines := bytes.Split(event, []byte("\n"))
	var data [][]byte
	var other [][]byte
	for _, l := range lines {
		l = bytes.TrimSuffix(l, []byte("\r"))
		if d, ok := bytes.CutPrefix(l, []byte("data:")); ok {
			data = append(data, bytes.TrimPrefix(d, []byte(" ")))
		} else {
			other = append(other, l)
		}
	}
	var out bytes.Buffer
	for _, l := range other {
		out.Write(l)
		out.WriteByte('\n')
	}
	if data != nil {
		filtered := FilterToolsList(bytes.Join(data, []byte("\n")), f.ids, f.visible)
		for _, l := range bytes.Split(filtered, []byte("\n")) {
			out.WriteString("data: ")
			out.Write(l)
			out.WriteByte('\n')
		}
	}
	out.WriteByte('\n')
	return out.Bytes()
}

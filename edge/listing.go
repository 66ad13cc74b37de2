package edge

import (
	"bytes"
	"encoding/json"
	"io"
	"mime"
	"net/http"
	"slices"

	"github.com/Tahul/caddy-zidane-mcp/message"
	"github.com/Tahul/caddy-zidane-mcp/policy"
)

// maxFilteredBody bounds what the listing filter holds: a JSON answer, or
// one SSE event. A larger one cannot be filtered, and passing it on would
// show what the principal may not see, so it is replaced by an error.
const maxFilteredBody = 8 << 20

// listings are the listing methods, with the member of their result that
// holds the list, and the member of each item that names it.
var listings = map[string]struct {
	kind        Kind
	list, named string
}{
	"tools/list":               {KindTool, "tools", "name"},
	"prompts/list":             {KindPrompt, "prompts", "name"},
	"resources/list":           {KindResource, "resources", "uri"},
	"resources/templates/list": {KindResourceTemplate, "resourceTemplates", "uriTemplate"},
}

// Drop reports an answer the listing filter kept from the client.
type Drop struct {
	// Reason is unmatched_answer (an answer with a result whose id is none
	// of the request's), ambiguous_answer (an answer that two JSON readers
	// could read differently) or answer_too_large.
	Reason string
	// ID is the answer's id, when it could be read.
	ID string
}

// Listing is the filter that cuts listing answers (tools/list,
// prompts/list, resources/list, resources/templates/list) down to the
// items a principal may use, as the route's Visible says, whether the
// answer comes as one JSON body or as an SSE stream, event by event.
//
// It matches answers to the requests of the body by id, compared as
// JSON-RPC values (an upstream may answer 7 to 7.0, or "x" to "\u0078"),
// and drops every answer with a result that it cannot match, so that no
// unfiltered listing gets through under an id it does not recognize. On a
// resumed stream (a GET with Last-Event-ID) the answers belong to no
// request of this one, so every answer with a result is filtered by its
// shape instead: whatever list of the four kinds it holds.
type Listing struct {
	route   Route
	p       policy.Principal
	methods map[string]string // request id key -> method, nil on a resumed stream
	onDrop  func(Drop)
}

// NewListing returns the listing filter for a request, or nil when the
// request lists nothing and needs none: a POST whose body holds no listing
// request, or a GET that resumes no stream. onDrop is told of every answer
// kept from the client.
func NewListing(route Route, p policy.Principal, r *http.Request, b *message.Body, onDrop func(Drop)) *Listing {
	switch {
	case r.Method == http.MethodGet && r.Header.Get("Last-Event-ID") != "":
		return &Listing{route: route, p: p, onDrop: onDrop}
	case b == nil || !slices.ContainsFunc(b.Calls, isListing):
		return nil
	}
	f := &Listing{route: route, p: p, onDrop: onDrop, methods: make(map[string]string, len(b.Calls))}
	for _, c := range b.Calls {
		if !c.IsResponse() && !c.ID.IsZero() {
			f.methods[c.ID.Key()] = c.Method
		}
	}
	return f
}

// isListing reports whether c is a listing request.
func isListing(c message.Call) bool {
	_, ok := listings[c.Method]
	return ok && !c.ID.IsZero()
}

// Wrap returns w with the filter in front of its body. Call the returned
// close when the route has written all.
func (f *Listing) Wrap(w http.ResponseWriter) (http.ResponseWriter, func() error) {
	lw := &listingWriter{ResponseWriter: w, f: f}
	return lw, lw.close
}

// filterMessage filters one JSON value an upstream sent: one JSON-RPC
// message or a batch. keep is false when nothing of it may go out.
func (f *Listing) filterMessage(data []byte) (out []byte, keep bool) {
	if len(bytes.TrimSpace(data)) == 0 {
		return data, true
	}
	if err := message.Validate(data); err != nil {
		f.drop(Drop{Reason: "ambiguous_answer"})
		return nil, false
	}
	trimmed := bytes.TrimSpace(data)
	if trimmed[0] != '[' {
		return f.filterOne(trimmed)
	}
	var batch []json.RawMessage
	if json.Unmarshal(trimmed, &batch) != nil {
		f.drop(Drop{Reason: "ambiguous_answer"})
		return nil, false
	}
	kept, changed := batch[:0], false
	for _, m := range batch {
		out, ok := f.filterOne(m)
		if !ok {
			changed = true
			continue
		}
		if !bytes.Equal(out, m) {
			changed = true
		}
		kept = append(kept, out)
	}
	switch {
	case len(kept) == 0:
		return nil, false
	case !changed:
		return data, true
	}
	out, err := json.Marshal(kept)
	return out, err == nil
}

// filterOne filters one JSON-RPC message. Only answers with a result can
// hold a listing: requests and notifications of the server, and errors,
// pass as they are.
func (f *Listing) filterOne(m []byte) ([]byte, bool) {
	var msg map[string]json.RawMessage
	if json.Unmarshal(m, &msg) != nil {
		return m, true // not an object: no listing in it
	}
	result, isAnswer := msg["result"]
	if _, isRequest := msg["method"]; isRequest || !isAnswer {
		return m, true
	}
	id, err := message.ParseID(msg["id"])
	if err != nil {
		f.drop(Drop{Reason: "unmatched_answer"})
		return nil, false
	}
	var lists []string
	if f.methods == nil {
		// A resumed stream: filter every list the result holds.
		for method := range listings {
			lists = append(lists, method)
		}
	} else {
		method, known := f.methods[id.Key()]
		if !known {
			f.drop(Drop{Reason: "unmatched_answer", ID: id.String()})
			return nil, false
		}
		if _, ok := listings[method]; !ok {
			return m, true
		}
		lists = []string{method}
	}
	var res map[string]json.RawMessage
	if json.Unmarshal(result, &res) != nil {
		return m, true // not an object: no list in it
	}
	changed := false
	for _, method := range lists {
		l := listings[method]
		raw, ok := res[l.list]
		if !ok {
			continue
		}
		var items []json.RawMessage
		if json.Unmarshal(raw, &items) != nil {
			// A list member that is not an array shows nothing the
			// client could use; drop it rather than guess.
			delete(res, l.list)
			changed = true
			continue
		}
		kept := make([]json.RawMessage, 0, len(items))
		for _, it := range items {
			var named map[string]json.RawMessage
			var name string
			if json.Unmarshal(it, &named) == nil && json.Unmarshal(named[l.named], &name) == nil &&
				f.route.Visible(f.p, Item{Kind: l.kind, Name: name}) {
				kept = append(kept, it)
			}
		}
		if len(kept) != len(items) {
			list, _ := json.Marshal(kept)
			res[l.list] = list
			changed = true
		}
	}
	if !changed {
		return m, true
	}
	msg["result"], _ = json.Marshal(res)
	out, err := json.Marshal(msg)
	return out, err == nil
}

func (f *Listing) drop(d Drop) {
	if f.onDrop != nil {
		f.onDrop(d)
	}
}

// droppedAnswer replaces a JSON answer of which nothing may go out.
var droppedAnswer = []byte(`{"jsonrpc":"2.0","id":null,"error":{"code":-32603,"message":"the server's answer was withheld: it did not match the request, or could not be read unambiguously; retry the request"}}`)

// tooLargeAnswer replaces an answer over maxFilteredBody.
var tooLargeAnswer = []byte(`{"jsonrpc":"2.0","id":null,"error":{"code":-32603,"message":"the server's listing answer is too large for the gateway to filter; ask the operator to page it"}}`)

// listingWriter runs a response body through the filter: a JSON body when
// it ends, an SSE stream event by event, so streamed events keep flowing.
// Other bodies (an error page, a 202) pass as they are.
type listingWriter struct {
	http.ResponseWriter
	f       *Listing
	wrote   bool
	filter  bool
	sse     bool
	buf     bytes.Buffer
	over    bool
	flusher *http.ResponseController
}

func (w *listingWriter) WriteHeader(status int) {
	if w.wrote {
		return
	}
	w.wrote = true
	mt, _, _ := mime.ParseMediaType(w.Header().Get("Content-Type"))
	if status == http.StatusOK && (mt == "application/json" || mt == "text/event-stream") {
		w.filter, w.sse = true, mt == "text/event-stream"
		w.flusher = http.NewResponseController(w.ResponseWriter)
		// The filtered body has another length.
		w.Header().Del("Content-Length")
	}
	w.ResponseWriter.WriteHeader(status)
}

func (w *listingWriter) Write(p []byte) (int, error) {
	if !w.wrote {
		w.WriteHeader(http.StatusOK)
	}
	if !w.filter {
		return w.ResponseWriter.Write(p)
	}
	if w.over {
		return len(p), nil
	}
	w.buf.Write(p)
	if w.buf.Len() > maxFilteredBody {
		w.over = true
		w.buf.Reset()
		w.f.drop(Drop{Reason: "answer_too_large"})
		return len(p), nil
	}
	if !w.sse {
		return len(p), nil
	}
	for {
		b := w.buf.Bytes()
		end, sep := eventEnd(b)
		if end < 0 {
			return len(p), nil
		}
		event := append([]byte(nil), b[:end]...)
		w.buf.Next(end + sep)
		if out := w.filterEvent(event); out != nil {
			if _, err := w.ResponseWriter.Write(out); err != nil {
				return len(p), err
			}
			_ = w.flusher.Flush()
		}
	}
}

// Flush passes on what the filter has let through; what it holds waits.
func (w *listingWriter) Flush() {
	if !w.wrote {
		w.WriteHeader(http.StatusOK)
	}
	_ = http.NewResponseController(w.ResponseWriter).Flush()
}

// ReadFrom keeps a copy through the filter: the underlying writer's
// ReadFrom would hand the body straight to the connection.
func (w *listingWriter) ReadFrom(r io.Reader) (int64, error) {
	return io.Copy(writerOnly{w}, r)
}

type writerOnly struct{ io.Writer }

// close writes out what the filter still holds.
func (w *listingWriter) close() error {
	if !w.filter {
		return nil
	}
	if w.over {
		out := tooLargeAnswer
		if w.sse {
			out = sseEvent(out)
		}
		_, err := w.ResponseWriter.Write(out)
		return err
	}
	if w.buf.Len() == 0 {
		return nil
	}
	rest := append([]byte(nil), w.buf.Bytes()...)
	w.buf.Reset()
	var out []byte
	if w.sse {
		out = w.filterEvent(rest)
	} else {
		var keep bool
		if out, keep = w.f.filterMessage(rest); !keep {
			out = droppedAnswer
		}
	}
	if out == nil {
		return nil
	}
	_, err := w.ResponseWriter.Write(out)
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
// its terminating blank line, or nil when nothing of it may go out.
func (w *listingWriter) filterEvent(event []byte) []byte {
	var data, other [][]byte
	hasData := false
	for _, l := range bytes.Split(event, []byte("\n")) {
		l = bytes.TrimSuffix(l, []byte("\r"))
		if d, ok := bytes.CutPrefix(l, []byte("data:")); ok {
			hasData = true
			data = append(data, bytes.TrimPrefix(d, []byte(" ")))
		} else {
			other = append(other, l)
		}
	}
	var out bytes.Buffer
	if hasData {
		filtered, keep := w.f.filterMessage(bytes.Join(data, []byte("\n")))
		if !keep {
			return nil
		}
		for _, l := range other {
			out.Write(l)
			out.WriteByte('\n')
		}
		for _, l := range bytes.Split(filtered, []byte("\n")) {
			out.WriteString("data: ")
			out.Write(l)
			out.WriteByte('\n')
		}
	} else {
		for _, l := range other {
			out.Write(l)
			out.WriteByte('\n')
		}
	}
	out.WriteByte('\n')
	return out.Bytes()
}

func sseEvent(data []byte) []byte {
	return append(append([]byte("event: message\ndata: "), data...), '\n', '\n')
}

// Unwrap gives http.ResponseController the writer underneath.
func (w *listingWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

package edge

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/Tahul/caddy-zidane-mcp/broker/answerlimit"

	"github.com/Tahul/caddy-zidane-mcp/message"
	"github.com/Tahul/caddy-zidane-mcp/pins"
	"github.com/Tahul/caddy-zidane-mcp/policy"
)

// maxFilteredBody bounds what the listing filter holds: a JSON answer, or
// one SSE event. A larger one cannot be filtered, and passing it on could
// show what the principal may not see, so it is withheld.
const maxFilteredBody = 8 << 20

// listing is one of the four listing methods: the member of its result that
// holds the list, and the member of each item that names it.
type listing struct {
	kind        Kind
	list, named string
}

var listings = map[string]listing{
	"tools/list":               {KindTool, "tools", "name"},
	"prompts/list":             {KindPrompt, "prompts", "name"},
	"resources/list":           {KindResource, "resources", "uri"},
	"resources/templates/list": {KindResourceTemplate, "resourceTemplates", "uriTemplate"},
}

// shapes are the lists a result may hold, for an answer that is filtered by
// its shape.
var shapes = []listing{listings["tools/list"], listings["prompts/list"], listings["resources/list"], listings["resources/templates/list"]}

// listStems are parts of the four list members' names that hold neither s
// nor k, the letters that fold to a non-ASCII letter (ſ, K): a member
// spelled in any case, or folded, holds one of them in ASCII. mayList looks
// for them.
var listStems = []string{"tool", "prompt", "ource"}

// Drop reports an answer the listing filter kept from the client.
type Drop struct {
	// Reason is unmatched_answer (an answer with a result whose id is none
	// of the request's), ambiguous_answer (an answer that two readers could
	// read differently, by its body or its Content-Type, or that is not a
	// JSON-RPC message),
	// answer_too_large, encoded_answer (a compressed answer, which the
	// filter cannot read), duplicate_item (a listing that holds two
	// items of one name: both are kept from the client, the rest of the
	// answer goes), and on a route that binds task handles task_not_named
	// (an answer or a notification naming a task the request did not
	// name or create) or task_id_invalid (a task id that is not a string
	// of 1 to taskid.MaxUpstream bytes).
	Reason string
	// ID is the answer's id, when it could be read.
	ID string
	// Item is the name of a duplicate_item.
	Item string
	// Approval, for approval_round_refused (the backend's question in an
	// approved call, which the gateway could not bind to a round: see
	// Continuation), names the approval.
	Approval string
}

// Listing is the filter in front of every answer the edge passes back: it
// cuts listings (tools/list, prompts/list, resources/list,
// resources/templates/list) down to the items a principal may use, as the
// route's Visible says, whether the answer comes as one JSON body or as an
// SSE stream, event by event. Every answer goes through it, because a
// server may deliver an answer on another request's stream (one that
// routes answers by id, across requests) or replay one (a resumed GET).
//
//   - An answer with a result to a listing request of the body is filtered
//     by that listing's kind; ids compare as JSON-RPC values (an upstream
//     may answer 7.0 to 7, or "\u0078" to "x").
//   - An answer with a result to another request of the body, and every
//     answer on a GET stream, is filtered by its shape: whichever of the
//     four lists its result holds.
//   - An answer with a result whose id is none of the body's requests' is
//     dropped, and so is one that package message refuses to read (two
//     readers could read it differently), one that spells a list member in
//     another case, one over maxFilteredBody, and a compressed one.
//
// On a route that pins what its upstream gives a model to read (package
// pins), every listed item is decided by its pin, whoever may see it, and
// the answer to an initialize or server/discover of the body has its
// instructions and serverInfo decided too (see pinServerAnswer).
//
// Server requests, notifications and errors pass as they are, but on a
// route that binds task handles, which the filter seals (see tasks.go).
// The input_required answer to a call that an approval let run has its
// requestState replaced by the state of the call's next round (see
// Continuation). Each drop is reported to onDrop.
type Listing struct {
	// Max, when set, bounds what one answer to a POST may hold, in bytes
	// (guard max_response): past it the filter ends the answer with a
	// JSON-RPC error and stops reading the server's. The event stream
	// that answers a subscriptions/listen (MCP 2026-07-28), which lasts as
	// long as the client listens, is bounded per event instead, and a GET
	// stream per event by maxFilteredBody.
	Max int64
	// Budget, when set, is the gateway's in-flight answer budget: a JSON
	// answer the filter holds reserves its bytes there until it is
	// written out, and one that does not fit is replaced by an error
	// that says so.
	Budget *answerlimit.Budget
	// Rounds, when the request is a call that an approval let run, binds
	// its input_required answer to the call's next round (see
	// Continuation).
	Rounds *Continuation

	route  Route
	p      policy.Principal
	ids    []requestID // the body's requests; nil for a GET
	post   bool        // the request had a body
	listen bool        // the body is one subscriptions/listen: Max bounds each event of its stream
	server bool        // the body has an initialize or server/discover, whose answer the pins read
	// info is the pinned serverInfo while a change of the server's waits
	// for approval: every result's _meta then names the server by it
	// (MCP 2026-07-28 puts serverInfo in each result's _meta). Nil, the
	// usual case, reads no answer for it.
	info   json.RawMessage
	first  message.ID // the id of a body's one message (zero for a batch), for an error answer
	onDrop func(Drop)
	one    [1]requestID // room for the one request of most bodies
	lw     listingWriter
	// tasks, on a route whose task handles the edge binds, is what the
	// request's answers need for it (see tasks.go).
	tasks *taskBinding
	// own: the route answers this request itself (see OwnAnswer).
	own bool
}

type requestID struct {
	id     message.ID
	method string
}

// NewListing returns the listing filter of a request: b is its body as the
// edge read it (nil for a GET or DELETE). onDrop is told of every answer
// kept from the client.
func NewListing(route Route, p policy.Principal, b *message.Body, onDrop func(Drop)) *Listing {
	f := &Listing{route: route, p: p, onDrop: onDrop, info: heldServerInfo(route)}
	if b != nil {
		f.post = true
		if !b.Batch {
			f.first = b.Calls[0].ID
			f.listen = b.Calls[0].Method == "subscriptions/listen"
		}
		f.ids = f.one[:0]
		for _, c := range b.Calls {
			if !c.IsResponse() && !c.ID.IsZero() {
				f.ids = append(f.ids, requestID{c.ID, c.Method})
				f.server = f.server || c.Method == "initialize" || c.Method == "server/discover"
			}
		}
	}
	return f
}

// Wrap returns w with the filter in front of its body. Call the returned
// close when the route has written all. A filter wraps one writer: call
// Wrap once.
func (f *Listing) Wrap(w http.ResponseWriter) (http.ResponseWriter, func() error) {
	// The writer lives in the filter: one allocation for both.
	f.lw = listingWriter{ResponseWriter: w, f: f}
	return &f.lw, f.lw.close
}

func (f *Listing) drop(d Drop) {
	if f.onDrop != nil {
		f.onDrop(d)
	}
}

// filterMessage filters one JSON value a server sent: one JSON-RPC message
// or a batch. keep is false when nothing of it may go out.
func (f *Listing) filterMessage(data []byte) (out []byte, keep bool) {
	if len(bytes.TrimSpace(data)) == 0 || (!f.server && f.info == nil && f.Rounds == nil && !mayList(data) && (f.tasks == nil || !mayTask(data))) {
		// Nothing in it could spell a list, in any reader's spelling:
		// whatever its id, it shows no item. Most answers (tool
		// results) end here, unread. The answer to an initialize or
		// server/discover is read whatever it holds: the pins check its
		// instructions and serverInfo.
		return data, true
	}
	b, err := message.ReadAnswer(data)
	if err != nil {
		f.drop(Drop{Reason: "ambiguous_answer"})
		return nil, false
	}
	if !b.Batch {
		return f.filterOne(b.Calls[0])
	}
	kept := make([]json.RawMessage, 0, len(b.Calls))
	changed := false
	for _, c := range b.Calls {
		out, ok := f.filterOne(c)
		if ok {
			kept = append(kept, out)
		}
		changed = changed || !ok || !bytes.Equal(out, c.Raw)
	}
	switch {
	case len(kept) == 0:
		return nil, false
	case !changed:
		return data, true
	}
	out, err = json.Marshal(kept)
	return out, err == nil
}

// filterOne filters one message. Only an answer with a result can hold a
// listing: requests and notifications of the server, and errors, pass.
func (f *Listing) filterOne(c message.Call) ([]byte, bool) {
	if f.Rounds != nil {
		out, changed := f.Rounds.answer(c, f.drop)
		if changed {
			// Read again, as the client will: what follows filters
			// the answer that goes out.
			b, err := message.ReadAnswer(out)
			if err != nil || b.Batch {
				f.drop(Drop{Reason: "ambiguous_answer", ID: clip(c.ID.String())})
				return nil, false
			}
			c = b.Calls[0]
		}
	}
	if f.tasks != nil {
		var method string
		if c.IsResponse() && f.ids != nil {
			method, _ = f.method(c.ID)
		}
		if out, keep, named := f.taskMessage(c, method); named || !keep {
			return out, keep
		}
	}
	if !c.IsResponse() || c.Result == nil || f.own {
		return c.Raw, true
	}
	method, lists, known := f.answered(c)
	if !known {
		return nil, false
	}
	server := method == "initialize" || method == "server/discover"
	info := !server && f.info != nil
	if !server && !info && len(lists) == len(shapes) && !mayList(c.Result) {
		return c.Raw, true
	}
	var res map[string]json.RawMessage
	if json.Unmarshal(c.Result, &res) != nil {
		return c.Raw, true // not an object: no list in it
	}
	if ambiguousKeys(res, server) {
		f.drop(Drop{Reason: "ambiguous_answer", ID: clip(c.ID.String())})
		return nil, false
	}
	changed := false
	if server {
		changed = pinServerAnswer(f.route, method, res)
	}
	if info {
		changed = pinnedMetaInfo(res, f.info)
	}
	for _, l := range lists {
		if f.filterList(c, l, method, res) {
			changed = true
		}
	}
	if !changed {
		return c.Raw, true
	}
	var msg map[string]json.RawMessage
	if json.Unmarshal(c.Raw, &msg) != nil {
		return nil, false
	}
	msg["result"], _ = json.Marshal(res)
	out, err := json.Marshal(msg)
	return out, err == nil
}

// answered is the method of the request c answers and the listings its
// result may hold: the one the method asks for, or, where the filter does
// not know the requests, every shape. known is false (and the answer
// dropped) for an answer to no request of the body. Pins and bindings are
// learned from an answer to a list request of the body only: an answer
// taken for a listing by its shape is the server's to any request, one a
// client could have it echo.
func (f *Listing) answered(c message.Call) (method string, lists []listing, known bool) {
	lists = shapes
	if f.ids == nil {
		return "", lists, true
	}
	method, known = f.method(c.ID)
	if !known {
		f.drop(Drop{Reason: "unmatched_answer", ID: clip(c.ID.String())})
		return "", nil, false
	}
	if l, ok := listings[method]; ok {
		lists = []listing{l}
	}
	return method, lists, true
}

// ambiguousKeys reports whether res has a member that a client reading
// case-insensitively would take for a list (or, in a server's answer, for
// its instructions or serverInfo), where this filter would not.
func ambiguousKeys(res map[string]json.RawMessage, server bool) bool {
	for key := range res {
		for _, l := range shapes {
			if key != l.list && strings.EqualFold(key, l.list) {
				return true
			}
		}
		if server && ((key != "instructions" && strings.EqualFold(key, "instructions")) || (key != "serverInfo" && strings.EqualFold(key, "serverInfo"))) {
			return true
		}
	}
	return false
}

// listedItem is one item of a listing, read for its name.
type listedItem struct {
	raw   json.RawMessage
	named map[string]json.RawMessage
	name  string
}

// filterList filters the list l of res, the result of c (an answer to
// method), in place: it pins every item and keeps those the principal may
// see. It reports whether res changed.
func (f *Listing) filterList(c message.Call, l listing, method string, res map[string]json.RawMessage) bool {
	raw, ok := res[l.list]
	if !ok {
		return false
	}
	var items []json.RawMessage
	if json.Unmarshal(raw, &items) != nil {
		// A list member that is not an array shows nothing a client
		// could use; drop it rather than guess.
		delete(res, l.list)
		return true
	}
	asked := method != "" && listings[method] == l
	kept := make([]json.RawMessage, 0, len(items))
	params := paramsOf(f.route)
	entries := make([]listedItem, 0, len(items))
	count := make(map[string]int, len(items))
	for _, it := range items {
		var named map[string]json.RawMessage
		var name string
		if json.Unmarshal(it, &named) != nil || json.Unmarshal(named[l.named], &name) != nil {
			continue
		}
		entries = append(entries, listedItem{it, named, name})
		count[name]++
	}
	// The namespaces whose tools a whole tools listing held.
	var seen map[string]*pins.Store
	if asked && l.kind == KindTool {
		seen = map[string]*pins.Store{}
	}
	for _, e := range entries {
		it, named, name := e.raw, e.named, e.name
		if count[name] > 1 {
			// Two items of one name: clients keep the first or the
			// last, and the pin and the scopes decide on one of them.
			// Neither goes out.
			f.drop(Drop{Reason: "duplicate_item", ID: clip(c.ID.String()), Item: clip(name)})
			count[name] = -1 // one audit line for the name
			continue
		}
		if count[name] < 0 {
			continue
		}
		if asked && l.kind == KindTool {
			// What its Mcp-Param-* headers carry (see ParamHeaders),
			// learned whoever may see it: a tool's schema is the
			// server's, the same for every principal.
			params.learn(name, named["inputSchema"])
		}
		// Every item is pinned, whoever may see it: the set an
		// upstream lists is the same for every principal, and one
		// that one principal cannot see must not count as new when
		// another lists it.
		shown := pinShown(f.route, l.kind, name, named, asked, seen)
		if shown && f.route.Visible(f.p, Item{Kind: l.kind, Name: name}) {
			kept = append(kept, it)
		}
	}
	if seen != nil && lastPage(res) {
		pinToolSets(f.route, seen)
	}
	if len(kept) == len(items) {
		return false
	}
	list, _ := json.Marshal(kept)
	res[l.list] = list
	return true
}

// lastPage reports whether a listing result is the last page of its
// listing: no nextCursor, or an empty one.
func lastPage(res map[string]json.RawMessage) bool {
	raw, ok := res["nextCursor"]
	if !ok {
		return true
	}
	var cursor *string
	return json.Unmarshal(raw, &cursor) == nil && (cursor == nil || *cursor == "")
}

// method is the method of the body's request with id: ids compare as
// values (see [message.ID]).
func (f *Listing) method(id message.ID) (string, bool) {
	for _, r := range f.ids {
		if r.id == id {
			return r.method, true
		}
	}
	return "", false
}

// mayList reports whether a message or result might hold one of the four
// lists, in any spelling: an escape, or a stem of their names in any case.
// One that holds neither (most tool results, pings) passes unread.
func mayList(result []byte) bool {
	// One pass over the answer, for an escape or the first letter of a
	// stem in either case, then the stem itself (listStems, spelled out).
	for i, c := range result {
		if c == '\\' {
			return true
		}
		switch c | 0x20 {
		case 't':
			if hasFoldAt(result, i, "tool") {
				return true
			}
		case 'p':
			if hasFoldAt(result, i, "prompt") {
				return true
			}
		case 'o':
			if hasFoldAt(result, i, "ource") {
				return true
			}
		}
	}
	return false
}

// hasFoldAt reports whether b holds the lower-case ASCII word at i, in any
// ASCII case.
func hasFoldAt(b []byte, i int, word string) bool {
	if len(b)-i < len(word) {
		return false
	}
	for j := 0; j < len(word); j++ {
		if b[i+j]|0x20 != word[j] {
			return false
		}
	}
	return true
}

// clip keeps an id of the server's short in the audit log.
func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}

// errorAnswer is a JSON-RPC error answer with a null id, JSON-RPC's
// internal error and msg: what the filter sends in place of an answer it
// withholds.
func errorAnswer(msg string) []byte {
	quoted, _ := json.Marshal(msg)
	return fmt.Appendf(nil, `{"jsonrpc":"2.0","id":null,"error":{"code":%d,"message":%s}}`, message.CodeInternalError, quoted)
}

// droppedAnswer replaces a JSON answer of which nothing may go out.
var droppedAnswer = errorAnswer("the server's answer was withheld: it did not match the request, or could not be read unambiguously; retry the request")

// tooLargeAnswer replaces an answer over maxFilteredBody.
var tooLargeAnswer = errorAnswer("the server's answer is too large for the gateway to filter; ask the operator to page it")

// budgetAnswer replaces an answer that did not fit the in-flight budget.
var budgetAnswer = errorAnswer("the gateway holds as many answers at once as its max_inflight_response allows, and this one did not fit; retry the request shortly")

// encodedAnswer replaces a compressed answer.
var encodedAnswer = errorAnswer("the server answered compressed, which the gateway does not pass on; ask the operator to turn compression off for this server")

// ambiguousAnswer replaces an answer whose Content-Type clients could read
// differently.
var ambiguousAnswer = errorAnswer("the server answered with a Content-Type that clients read differently (several values, or JSON and an event stream at once), which the gateway does not pass on; ask the operator to fix the server's Content-Type")

// listingWriter runs a response body through the filter: a JSON body when
// it ends, an SSE stream event by event, so streamed events keep flowing.
// Other bodies (an error page, a 202) pass as they are.
// OwnAnswer is called by a route that answers a request itself with
// nothing an upstream gave, before it writes (the per_user broker route's
// handshake and empty listings for a person not connected yet): the
// answer is neither pinned nor filtered, since pins record what the
// upstream gives a model to read, and an empty list or the gateway's own
// initialize answer taken for the upstream's would hold back the real one
// as a change.
func (lw *listingWriter) OwnAnswer() { lw.f.own = true }

type listingWriter struct {
	http.ResponseWriter
	f     *Listing
	wrote bool
	json  bool // a JSON body, filtered when it ends
	sse   *sseFilter
	// withheld, when set, is what the client gets instead of the body: a
	// JSON-RPC error that says why (compressed, ambiguous).
	withheld []byte
	buf      bytes.Buffer
	over     bool
	rc       *http.ResponseController
	pending  int   // the status of a JSON answer, sent with its filtered body
	n        int64 // bytes of the answer so far, against Listing.Max
	held     int64 // bytes of buf reserved from Listing.Budget
	// overBudget: the answer did not fit the in-flight budget
	overBudget bool
	cut        bool // the answer went over Listing.Max and was ended
	// want is the length a JSON answer's server announced (0: none), and
	// done is set once that much came and the answer went out: see Write.
	want      int
	wantValue []string // the server's Content-Length header, which said want
	done      bool
}

// errAnswerCut is what the writer returns to the route (reverse_proxy) once
// an answer went over Listing.Max, so that it stops reading the server.
var errAnswerCut = errors.New("the server's answer is over the gateway's max_response; the gateway ended it")

func (w *listingWriter) WriteHeader(status int) {
	if w.wrote {
		return
	}
	// An informational answer (103 Early Hints) comes before the real one,
	// which reverse_proxy passes on after it: the filter waits for that.
	if status >= 100 && status < 200 && status != http.StatusSwitchingProtocols {
		w.ResponseWriter.WriteHeader(status)
		return
	}
	w.wrote = true
	// Any 2xx: clients read a listing from every success status.
	if status >= 200 && status < 300 {
		switch answerType(w.Header().Values("Content-Type")) {
		case typeSSE:
			w.sse = newSSEFilter(w.f)
		case typeJSON:
			w.json = true
		case typeAmbiguous:
			// The TypeScript SDK reads every Content-Type value, joined,
			// and looks for an event stream first; go-sdk reads the first
			// value's media type. Where they could disagree, neither gets
			// the body.
			w.json, w.withheld = true, ambiguousAnswer
			w.Header().Set("Content-Type", "application/json")
			w.Header().Del("Content-Length")
			w.f.drop(Drop{Reason: "ambiguous_answer"})
			w.ResponseWriter.WriteHeader(status)
			return
		}
		if w.sse != nil || w.json {
			if cl := w.Header().Get("Content-Length"); w.json && cl != "" {
				if n, err := strconv.Atoi(cl); err == nil && n > 0 && n <= maxFilteredBody {
					w.buf.Grow(n) // the whole answer, without regrowing
					w.want, w.wantValue = n, w.Header()["Content-Length"]
				}
			}
			w.Header().Del("Content-Length") // the filtered body has another length
			if enc := w.Header().Get("Content-Encoding"); enc != "" && !strings.EqualFold(enc, "identity") {
				w.withheld = encodedAnswer
				w.Header().Del("Content-Encoding")
				w.f.drop(Drop{Reason: "encoded_answer"})
			}
		}
		if w.json {
			// The status goes out with the filtered body, which is held
			// whole anyway, and with its length: a client then has the
			// whole answer even if the route's connection to the server
			// is aborted afterwards (reverse_proxy does, when the filter
			// stops an answer over Listing.Max).
			w.pending = status
			return
		}
	}
	w.ResponseWriter.WriteHeader(status)
}

// writePending sends the held status of a JSON answer, with the length of
// the n bytes that will follow.
func (w *listingWriter) writePending(n int) {
	if w.pending == 0 {
		return
	}
	if n == w.want && len(w.wantValue) == 1 && plainDecimal(w.wantValue[0]) {
		// Most answers go out as long as the server said: its own value,
		// when it is spelled as strconv would spell it (Atoi also reads
		// "+78" and "078", which another reader may not).
		w.Header()["Content-Length"] = w.wantValue
	} else {
		w.Header().Set("Content-Length", strconv.Itoa(n))
	}
	w.ResponseWriter.WriteHeader(w.pending)
	w.pending = 0
}

// plainDecimal reports whether s is a positive number in decimal digits
// with no sign and no leading zero.
func plainDecimal(s string) bool {
	if s == "" || s[0] == '0' {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// The kinds of body answerType tells apart.
const (
	typeOther     = iota // neither JSON nor an event stream: MCP clients refuse it, so it passes as it is
	typeJSON             // filtered when it ends
	typeSSE              // filtered event by event
	typeAmbiguous        // read as one by some client and as the other (or nothing) by another: withheld
)

// answerType classifies an answer by its Content-Type values. More than one
// value, or one that names both JSON and an event stream, is ambiguous.
func answerType(values []string) int {
	if len(values) > 1 {
		return typeAmbiguous
	}
	if len(values) == 0 {
		return typeOther
	}
	ct := strings.ToLower(values[0])
	sse, json := strings.Contains(ct, "event-stream"), strings.Contains(ct, "json")
	switch {
	case sse && json:
		return typeAmbiguous
	case sse:
		return typeSSE
	case json:
		return typeJSON
	}
	return typeOther
}

func (w *listingWriter) Write(p []byte) (int, error) {
	if !w.wrote {
		w.WriteHeader(http.StatusOK)
	}
	if w.cut {
		return 0, errAnswerCut
	}
	if w.done {
		// More than the server announced: net/http refuses it too.
		return 0, http.ErrContentLength
	}
	perEvent := w.f.listen && w.sse != nil && w.withheld == nil
	if w.f.Max > 0 && w.f.post && !perEvent {
		if w.n += int64(len(p)); w.n > w.f.Max {
			w.cutOff()
			return 0, errAnswerCut
		}
	}
	switch {
	case w.withheld != nil:
		return len(p), nil
	case w.sse != nil:
		events := w.sse.write(p)
		for _, out := range events {
			if _, err := w.ResponseWriter.Write(out); err != nil {
				return len(p), err
			}
		}
		if len(events) > 0 {
			w.flush()
		}
		if perEvent && w.f.Max > 0 && int64(w.sse.pending()) > w.f.Max {
			// The events before it have gone whole; this one is not.
			w.cutOff()
			return 0, errAnswerCut
		}
		return len(p), nil
	case !w.json:
		return w.ResponseWriter.Write(p)
	}
	if w.over {
		return len(p), nil
	}
	if !w.f.Budget.Take(int64(len(p))) {
		w.over, w.overBudget = true, true
		w.release()
		w.f.drop(Drop{Reason: "answer_budget"})
		return len(p), nil
	}
	w.held += int64(len(p))
	w.buf.Write(p)
	if w.buf.Len() > maxFilteredBody {
		w.over = true
		w.release()
		w.f.drop(Drop{Reason: "answer_too_large"})
	}
	if w.want > 0 && w.buf.Len() == w.want && !w.over {
		// The whole answer the server announced is here (its transport
		// passes on no more than the length it sent): it is filtered and
		// goes out now, and is flushed, so that the client has it while
		// the route and the edge finish behind it. Without this it would
		// wait in the connection's buffer until the handler returns.
		err := w.close()
		w.done = true
		if err != nil {
			return len(p), err
		}
		w.flush()
	}
	return len(p), nil
}

// release drops the JSON answer the filter holds, and gives its bytes back
// to the budget.
func (w *listingWriter) release() {
	w.buf.Reset()
	w.f.Budget.Give(w.held)
	w.held = 0
}

// cutOff ends an answer over Listing.Max: what the filter holds is dropped,
// and the client gets a JSON-RPC error for its request instead, as the
// last event of a stream or as the JSON body (whose status has gone, but
// whose bytes the filter still held). A body of another type just ends.
func (w *listingWriter) cutOff() {
	w.cut = true
	w.f.drop(Drop{Reason: "answer_too_large"})
	id := w.f.first.Raw()
	if len(id) == 0 {
		id = []byte("null")
	}
	what := "in answer to one request"
	if w.f.listen && w.sse != nil {
		what = "in one event of a subscriptions/listen stream"
	}
	msg := fmt.Appendf(nil, `{"jsonrpc":"2.0","id":%s,"error":{"code":%d,"message":"the MCP server behind this gateway sent more than %d bytes %s, its max_response; the gateway ended the answer. Ask the operator to raise guard max_response if such answers are expected"}}`, id, message.CodeUpstream, w.f.Max, what)
	switch {
	case w.sse != nil && w.withheld == nil:
		w.sse.release()
		w.sse = nil
		w.ResponseWriter.Write(sseEvent(msg))
		w.flush()
	case w.json:
		w.release()
		w.writePending(len(msg))
		w.ResponseWriter.Write(msg)
	}
}

// Flush passes on what the filter has let through; what it holds waits.
func (w *listingWriter) Flush() {
	if !w.wrote {
		w.WriteHeader(http.StatusOK)
	}
	w.flush()
}

func (w *listingWriter) flush() {
	if w.pending != 0 {
		return // a JSON answer's status waits for its body
	}
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush() // most writers underneath (the guard's, Caddy's): no controller to allocate
		return
	}
	if w.rc == nil {
		w.rc = http.NewResponseController(w.ResponseWriter)
	}
	_ = w.rc.Flush()
}

// ReadFrom keeps a copy through the filter: the underlying writer's
// ReadFrom would hand the body straight to the connection.
func (w *listingWriter) ReadFrom(r io.Reader) (int64, error) {
	return io.Copy(writerOnly{w}, r)
}

type writerOnly struct{ io.Writer }

// close writes out what the filter still holds.
func (w *listingWriter) close() error {
	if w.cut || w.done {
		return nil
	}
	var out []byte
	switch {
	case w.withheld != nil && w.sse != nil:
		out = sseEvent(w.withheld)
	case w.withheld != nil:
		out = w.withheld
	case w.sse != nil:
		out = bytes.Join(w.sse.end(), nil)
	case !w.json:
		return nil
	case w.overBudget:
		out = budgetAnswer
	case w.over:
		out = tooLargeAnswer
	case w.buf.Len() > 0:
		var keep bool
		if out, keep = w.f.filterMessage(w.buf.Bytes()); !keep {
			out = droppedAnswer
		}
		// out is a new slice, or buf itself: buf is given back once out
		// is written.
		defer w.release()
	}
	w.writePending(len(out))
	if len(out) == 0 {
		return nil
	}
	_, err := w.ResponseWriter.Write(out)
	return err
}

// Unwrap gives http.ResponseController the writer underneath.
func (w *listingWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func sseEvent(data []byte) []byte {
	return append(append([]byte("event: message\ndata: "), data...), '\n', '\n')
}

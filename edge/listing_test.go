package edge

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/http/httputil"
	"net/textproto"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/broker/answerlimit"

	"github.com/Tahul/caddy-zidane-mcp/message"
)

// answerThrough sends answer (with contentType) through the listing
// filter of a request with body, as the aggregated route's b-only
// principal, and returns what the client gets and what was dropped.
func answerThrough(t *testing.T, httpMethod, body string, header http.Header, contentType string, answer ...string) (string, []Drop) {
	return answerThroughWith(t, httpMethod, body, header, nil, http.StatusOK, contentType, answer...)
}

func answerThroughWith(t *testing.T, httpMethod, body string, header, answerHeader http.Header, status int, contentType string, answer ...string) (string, []Drop) {
	t.Helper()
	rt := testRoutes(t)["aggregate"]
	r := httptest.NewRequest(httpMethod, "/mcp", strings.NewReader(body))
	for k, v := range header {
		r.Header[k] = v
	}
	var b *message.Body
	if httpMethod == http.MethodPost {
		var err error
		if b, err = message.Read([]byte(body)); err != nil {
			t.Fatal(err)
		}
	}
	var drops []Drop
	f := NewListing(rt.route, rt.p, b, func(d Drop) { drops = append(drops, d) })
	rec := httptest.NewRecorder()
	for k, v := range answerHeader {
		rec.Header()[k] = v
	}
	w, closeFilter := f.Wrap(rec)
	w.Header().Set("Content-Type", contentType)
	w.WriteHeader(status)
	for _, a := range answer {
		if _, err := w.Write([]byte(a)); err != nil {
			t.Fatal(err)
		}
	}
	if err := closeFilter(); err != nil {
		t.Fatal(err)
	}
	return rec.Body.String(), drops
}

const (
	toolsAnswer = `{"tools":[{"name":"mcp_a_secret","inputSchema":{}},{"name":"mcp_b_echo","inputSchema":{}}]}`
	listTools   = `{"jsonrpc":"2.0","id":7,"method":"tools/list"}`
)

func TestListingFiltersByValueOfID(t *testing.T) {
	// An upstream may spell the id of its answer otherwise than the
	// request did: the filter compares values.
	for _, id := range []string{`7`, `7.0`, `7e0`, `0.7e1`} {
		out, drops := answerThrough(t, http.MethodPost, listTools, nil, "application/json",
			`{"jsonrpc":"2.0","id":`+id+`,"result":`+toolsAnswer+`}`)
		if strings.Contains(out, "mcp_a_secret") || !strings.Contains(out, "mcp_b_echo") || len(drops) != 0 {
			t.Errorf("answer id %s: client got %s, drops %v", id, out, drops)
		}
	}
	body := `{"jsonrpc":"2.0","id":"x","method":"tools/list"}`
	out, _ := answerThrough(t, http.MethodPost, body, nil, "application/json", `{"jsonrpc":"2.0","id":"\u0078","result":`+toolsAnswer+`}`)
	if strings.Contains(out, "mcp_a_secret") || !strings.Contains(out, "mcp_b_echo") {
		t.Errorf(`answer id "\u0078" to "x": %s`, out)
	}
}

func TestListingDropsWhatItCannotMatch(t *testing.T) {
	for _, answer := range []string{
		`{"jsonrpc":"2.0","id":8,"result":` + toolsAnswer + `}`,
		`{"jsonrpc":"2.0","id":"7","result":` + toolsAnswer + `}`,
		`{"jsonrpc":"2.0","id":null,"result":` + toolsAnswer + `}`,
		`{"jsonrpc":"2.0","id":7,"result":` + toolsAnswer + `,"Result":{}}`,
		`{"jsonrpc":"2.0","id":7,"result":{"tools":[{"name":"mcp_b_echo","Name":"mcp_a_secret"}]}}`,
		"{\"jsonrpc\":\"2.0\",\"id\":7,\"result\":{\"tools\":[{\"name\":\"mcp_a_secret\xff\"}]}}",
	} {
		out, drops := answerThrough(t, http.MethodPost, listTools, nil, "application/json", answer)
		if strings.Contains(out, "mcp_a_secret") || len(drops) != 1 {
			t.Errorf("answer %s: client got %s, drops %v", answer, out, drops)
		}
		var e struct {
			Error struct{ Code int } `json:"error"`
		}
		if json.Unmarshal([]byte(out), &e) != nil || e.Error.Code != -32603 {
			t.Errorf("answer %s: the client got %s, want an error in its place", answer, out)
		}
	}
	// An error answer shows no listing and passes.
	out, drops := answerThrough(t, http.MethodPost, listTools, nil, "application/json", `{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"bad"}}`)
	if !strings.Contains(out, `"bad"`) || len(drops) != 0 {
		t.Errorf("an error answer: %s %v", out, drops)
	}
}

func TestListingSSE(t *testing.T) {
	events := []string{
		"id: 1\ndata: \n\n",
		"event: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\",\"params\":{\"level\":\"info\",\"data\":\"mcp_a_secret\"}}\n\n",
		"event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":9,\"result\":" + toolsAnswer + "}\n\n",
		"event: message\nid: 3\ndata: {\"jsonrpc\":\"2.0\",\"id\":7.0,\n",
		"data: \"result\":" + toolsAnswer + "}\n\n",
	}
	out, drops := answerThrough(t, http.MethodPost, listTools, nil, "text/event-stream", events...)
	if !strings.Contains(out, "notifications/message") {
		t.Errorf("a notification was lost: %s", out)
	}
	if strings.Count(out, "mcp_a_secret") != 1 { // the log message's data only
		t.Errorf("an unfiltered listing got through: %s", out)
	}
	if !strings.Contains(out, "mcp_b_echo") || !strings.Contains(out, "id: 3") {
		t.Errorf("the filtered answer is missing: %s", out)
	}
	if len(drops) != 1 || drops[0].Reason != "unmatched_answer" {
		t.Errorf("drops %v, want the answer to id 9", drops)
	}
}

func TestListingBatch(t *testing.T) {
	body := `[{"jsonrpc":"2.0","id":1,"method":"tools/list"},{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"mcp_b_echo"}}]`
	out, drops := answerThrough(t, http.MethodPost, body, nil, "application/json",
		`[{"jsonrpc":"2.0","id":2,"result":{"content":[]}},{"jsonrpc":"2.0","id":1,"result":`+toolsAnswer+`},{"jsonrpc":"2.0","id":3,"result":`+toolsAnswer+`}]`)
	var batch []map[string]json.RawMessage
	if err := json.Unmarshal([]byte(out), &batch); err != nil || len(batch) != 2 {
		t.Fatalf("batch answer: %s (%v)", out, err)
	}
	if strings.Contains(out, "mcp_a_secret") || len(drops) != 1 {
		t.Errorf("batch: %s, drops %v", out, drops)
	}
}

func TestListingResumedStream(t *testing.T) {
	// A GET that resumes a stream replays answers of earlier requests:
	// every listing in them is filtered by its shape.
	prompts := `{"prompts":[{"name":"mcp_a_plan"},{"name":"mcp_b_greet"}],"resources":[{"uri":"file:///a/secret","name":"s"},{"uri":"file:///b/readme","name":"r"}]}`
	out, _ := answerThrough(t, http.MethodGet, "", http.Header{"Last-Event-Id": {"0_3"}}, "text/event-stream",
		"id: 0_4\ndata: {\"jsonrpc\":\"2.0\",\"id\":5,\"result\":"+toolsAnswer+"}\n\n",
		"id: 0_5\ndata: {\"jsonrpc\":\"2.0\",\"id\":6,\"result\":"+prompts+"}\n\n")
	for _, hidden := range []string{"mcp_a_secret", "mcp_a_plan", "file:///a/secret"} {
		if strings.Contains(out, hidden) {
			t.Errorf("a resumed stream showed %s: %s", hidden, out)
		}
	}
	for _, shown := range []string{"mcp_b_echo", "mcp_b_greet", "file:///b/readme"} {
		if !strings.Contains(out, shown) {
			t.Errorf("a resumed stream lost %s: %s", shown, out)
		}
	}
}

// A server that routes answers by id across requests (the TypeScript SDK
// does) may put an earlier request's listing on another request's stream,
// under the id of a request that lists nothing: every answer is filtered by
// its shape all the same.
func TestListingFiltersEveryAnswer(t *testing.T) {
	for _, body := range []string{
		`{"jsonrpc":"2.0","id":5,"method":"ping"}`,
		`{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"mcp_b_echo"}}`,
		`[{"jsonrpc":"2.0","id":5,"method":"ping"},{"jsonrpc":"2.0","id":6,"method":"tools/list"}]`,
	} {
		for _, ct := range []string{"application/json", "text/event-stream"} {
			answer := `{"jsonrpc":"2.0","id":5,"result":` + toolsAnswer + `}`
			if ct == "text/event-stream" {
				answer = "data: " + answer + "\n\n"
			}
			out, _ := answerThrough(t, http.MethodPost, body, nil, ct, answer)
			if strings.Contains(out, "mcp_a_secret") || !strings.Contains(out, "mcp_b_echo") {
				t.Errorf("%s, %s answer: %s", body, ct, out)
			}
		}
	}
	// A tool's result that holds no list passes as it came, byte for byte.
	res := `{"jsonrpc":"2.0","id":5,"result":{"content":[{"type":"text","text":"hello"}]}}`
	if out, drops := answerThrough(t, http.MethodPost, `{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"mcp_b_echo"}}`, nil, "application/json", res); out != res || len(drops) != 0 {
		t.Errorf("a plain tool result: %s %v", out, drops)
	}
}

// The SSE stream is read as clients read it (CR, LF and CRLF line ends, a
// byte-order mark, fields without a space): no spelling of an event gets a
// listing past the filter.
func TestListingSSESpellings(t *testing.T) {
	data := `{"jsonrpc":"2.0","id":7,"result":` + toolsAnswer + `}`
	for name, stream := range map[string]string{
		"CR line ends":     "id: 1\rdata: " + data + "\r\r",
		"CR after comment": ":x\rdata: " + data + "\n\n",
		"CRLF":             "event: message\r\ndata: " + data + "\r\n\r\n",
		"BOM":              "\xEF\xBB\xBFdata: " + data + "\n\n",
		"no space":         "data:" + data + "\n\n",
		"split data lines": "data: {\"jsonrpc\":\"2.0\",\"id\":7,\ndata: \"result\":" + toolsAnswer + "}\n\n",
	} {
		// Sent in one piece and byte by byte.
		for _, pieces := range [][]string{{stream}, strings.Split(stream, "")} {
			out, _ := answerThrough(t, http.MethodPost, listTools, nil, "text/event-stream", pieces...)
			if strings.Contains(out, "mcp_a_secret") || !strings.Contains(out, "mcp_b_echo") {
				t.Errorf("%s (%d pieces): %q", name, len(pieces), out)
			}
		}
	}
}

// Answers some clients read that the filter would read otherwise are
// withheld: a list member in another case, any 2xx status, compressed.
func TestListingHostileAnswers(t *testing.T) {
	for _, answer := range []string{
		`{"jsonrpc":"2.0","id":7,"result":{"Tools":[{"name":"mcp_a_secret"}]}}`,
		`{"jsonrpc":"2.0","id":7,"result":{"toolſ":[{"name":"mcp_a_secret"}]}}`,
		`{"jsonrpc":"2.0","ID":7,"result":` + toolsAnswer + `}`,
		`{"jsonrpc":"2.0","id":7,"Result":` + toolsAnswer + `}`,
	} {
		out, drops := answerThrough(t, http.MethodPost, listTools, nil, "application/json", answer)
		if strings.Contains(out, "mcp_a_secret") || len(drops) != 1 {
			t.Errorf("%s: %s %v", answer, out, drops)
		}
	}
	for _, status := range []int{http.StatusCreated, 203, http.StatusPartialContent} {
		out, _ := answerThroughWith(t, http.MethodPost, listTools, nil, nil, status, "application/json; charset=utf-8",
			`{"jsonrpc":"2.0","id":7,"result":`+toolsAnswer+`}`)
		if strings.Contains(out, "mcp_a_secret") {
			t.Errorf("status %d: %s", status, out)
		}
	}
	out, drops := answerThroughWith(t, http.MethodPost, listTools, nil, http.Header{"Content-Encoding": {"gzip"}}, http.StatusOK, "text/event-stream",
		"\x1f\x8b\x08\x00 compressed bytes")
	if strings.Contains(out, "compressed bytes") || len(drops) != 1 || drops[0].Reason != "encoded_answer" {
		t.Errorf("a compressed stream: %q %v", out, drops)
	}
}

func TestListingTooLarge(t *testing.T) {
	big := `{"jsonrpc":"2.0","id":7,"result":{"tools":[{"name":"mcp_a_secret","description":"` + strings.Repeat("x", maxFilteredBody) + `"}]}}`
	out, drops := answerThrough(t, http.MethodPost, listTools, nil, "application/json", big[:len(big)/2], big[len(big)/2:])
	if strings.Contains(out, "mcp_a_secret") || len(drops) != 1 || drops[0].Reason != "answer_too_large" {
		t.Errorf("a too large answer: %d bytes out, drops %v", len(out), drops)
	}
}

// BenchmarkListingToolResult is the filter's work on the answer of a
// tools/call (what every call through the edge pays), as JSON and as SSE.
func BenchmarkListingToolResult(b *testing.B) {
	rt := testRoutes(b)["guard"]
	body, err := message.Read([]byte(`{"jsonrpc":"2.0","id":17,"method":"tools/call","params":{"name":"test_simple_text","arguments":{"text":"hi"}}}`))
	if err != nil {
		b.Fatal(err)
	}
	answer := []byte(`{"jsonrpc":"2.0","id":17,"result":{"content":[{"type":"text","text":"hello from the benchmark upstream, a short text answer"}]}}`)
	for _, ct := range []string{"application/json", "text/event-stream"} {
		data := answer
		if ct == "text/event-stream" {
			data = append(append([]byte("event: message\nid: 1\ndata: "), answer...), '\n', '\n')
		}
		b.Run(ct, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				rec := httptest.NewRecorder()
				w, done := NewListing(rt.route, rt.p, body, nil).Wrap(rec)
				w.Header().Set("Content-Type", ct)
				w.WriteHeader(http.StatusOK)
				w.Write(data)
				if err := done(); err != nil || rec.Body.Len() == 0 {
					b.Fatal(err)
				}
			}
		})
	}
}

// An upstream may send an informational answer (103 Early Hints) before
// its real one, and a reverse proxy passes both on: the filter must still
// read the real one. Through net/http/httputil's ReverseProxy, which hands
// on 1xx answers as Caddy's reverse_proxy does.
func TestListingAfterAnInformationalAnswer(t *testing.T) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Link", "</style.css>; rel=preload")
		w.WriteHeader(http.StatusEarlyHints)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		w.Write([]byte(`{"jsonrpc":"2.0","id":7,"result":` + toolsAnswer + `}`))
	}))
	defer upstream.Close()
	target, _ := url.Parse(upstream.URL)
	proxy := httputil.NewSingleHostReverseProxy(target)
	front := filteredListTools(t, func(fw http.ResponseWriter, r *http.Request) { proxy.ServeHTTP(fw, r) })
	defer front.Close()
	var informational int
	trace := &httptrace.ClientTrace{Got1xxResponse: func(code int, _ textproto.MIMEHeader) error { informational = code; return nil }}
	req, _ := http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(), trace), http.MethodPost, front.URL, strings.NewReader(listTools))
	resp, err := front.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if informational != http.StatusEarlyHints {
		t.Fatalf("the client got no 103 (got %d): the test does not exercise an informational answer", informational)
	}
	if strings.Contains(string(body), "mcp_a_secret") || !strings.Contains(string(body), "mcp_b_echo") {
		t.Errorf("after a 103, the listing reached the client as %s", body)
	}
}

// A Content-Type that clients read differently is withheld: several values
// (the TypeScript SDK joins them and looks for an event stream first,
// go-sdk reads the first), or one value naming JSON and an event stream.
func TestListingAmbiguousContentType(t *testing.T) {
	answer := `{"jsonrpc":"2.0","id":7,"result":` + toolsAnswer + `}`
	for _, ct := range [][]string{
		{"text/plain", "application/json"},
		{"application/json", "text/event-stream"},
		{"application/json; text/event-stream"},
	} {
		rec, w, closeFilter, dropped := recordedListTools(t)
		w.Header()["Content-Type"] = ct
		w.WriteHeader(http.StatusOK)
		w.Write([]byte(answer))
		if err := closeFilter(); err != nil {
			t.Fatal(err)
		}
		out, drops := rec.Body.String(), dropped()
		if strings.Contains(out, "mcp_b_echo") || !strings.Contains(out, "Content-Type") || len(drops) != 1 || drops[0].Reason != "ambiguous_answer" {
			t.Errorf("Content-Type %q: the client got %q (%v)", ct, out, drops)
		}
		if got := rec.Header().Values("Content-Type"); len(got) != 1 || got[0] != "application/json" {
			t.Errorf("Content-Type %q: the withheld answer is sent as %q", ct, got)
		}
	}
}

// An answer to a POST over Listing.Max (guard max_response) ends with the
// request's JSON-RPC error, and the route is told to stop reading.
func TestListingMax(t *testing.T) {
	rt := testRoutes(t)["guard"]
	call := `{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"test_simple_text"}}`
	note := "event: message\ndata: " + `{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":"` + strings.Repeat("n", 1000) + `"}}` + "\n\n"
	for _, c := range []struct {
		name, contentType, unit string
	}{
		{"event stream of many events", "text/event-stream", note},
		{"one endless event", "text/event-stream", "data: " + strings.Repeat("x", 1000) + "\n"},
		{"json", "application/json", strings.Repeat(" ", 1000)},
		{"another type", "text/plain", strings.Repeat("p", 1000)},
	} {
		t.Run(c.name, func(t *testing.T) {
			b, err := message.Read([]byte(call))
			if err != nil {
				t.Fatal(err)
			}
			var drops []Drop
			f := NewListing(rt.route, rt.p, b, func(d Drop) { drops = append(drops, d) })
			f.Max = 64 << 10
			rec := httptest.NewRecorder()
			w, closeFilter := f.Wrap(rec)
			w.Header().Set("Content-Type", c.contentType)
			w.WriteHeader(http.StatusOK)
			writes := 0
			for ; writes < 1000; writes++ {
				if _, err = w.Write([]byte(c.unit)); err != nil {
					break
				}
			}
			if !errors.Is(err, errAnswerCut) || writes > 70 {
				t.Fatalf("after %d writes of %d bytes: %v; want the cut at 64 KiB", writes, len(c.unit), err)
			}
			if err := closeFilter(); err != nil {
				t.Fatal(err)
			}
			got := rec.Body.String()
			if int64(len(got)) > f.Max+4<<10 {
				t.Errorf("the client got %d bytes, over the limit", len(got))
			}
			if c.contentType == "text/plain" {
				return
			}
			if !strings.Contains(got, `"id":5,"error"`) || !strings.Contains(got, "max_response") {
				t.Errorf("the answer ends with %q; want the request's error naming max_response", got[max(0, len(got)-300):])
			}
			if len(drops) == 0 || drops[len(drops)-1].Reason != "answer_too_large" {
				t.Errorf("drops %v", drops)
			}
		})
	}
}

// JSON answers the filter holds reserve their bytes in the in-flight
// budget until they are written: one that does not fit is replaced by an
// error that names max_inflight_response, and the budget is whole again
// once both are out.
func TestListingBudget(t *testing.T) {
	rt := testRoutes(t)["guard"]
	budget := answerlimit.NewBudget(64 << 10)
	call := `{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"test_simple_text"}}`
	answer := `{"jsonrpc":"2.0","id":5,"result":{"content":[{"type":"text","text":"` + strings.Repeat("a", 48<<10) + `"}]}}`
	open := func() (*httptest.ResponseRecorder, http.ResponseWriter, func() error) {
		b, err := message.Read([]byte(call))
		if err != nil {
			t.Fatal(err)
		}
		f := NewListing(rt.route, rt.p, b, nil)
		f.Budget = budget
		rec := httptest.NewRecorder()
		w, closeFilter := f.Wrap(rec)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		if _, err := w.Write([]byte(answer)); err != nil {
			t.Fatal(err)
		}
		return rec, w, closeFilter
	}
	first, _, closeFirst := open()
	if used := budget.Used(); used != int64(len(answer)) {
		t.Fatalf("the held answer reserves %d bytes, want %d", used, len(answer))
	}
	second, _, closeSecond := open()
	if err := closeSecond(); err != nil {
		t.Fatal(err)
	}
	if body := second.Body.String(); !strings.Contains(body, "max_inflight_response") {
		t.Fatalf("the answer over the budget became %.200q; want the budget's error", body)
	}
	if err := closeFirst(); err != nil {
		t.Fatal(err)
	}
	if body := first.Body.String(); !strings.Contains(body, strings.Repeat("a", 100)) {
		t.Fatalf("the first answer did not go out whole: %.200q", body)
	}
	if used := budget.Used(); used != 0 {
		t.Fatalf("the budget holds %d bytes after both answers went out", used)
	}
}

// An unfinished event the stream filter holds reserves its bytes in the
// budget too: a second one that does not fit is dropped, and everything is
// given back once the events are out and the streams end.
func TestListingSSEBudget(t *testing.T) {
	rt := testRoutes(t)["guard"]
	budget := answerlimit.NewBudget(64 << 10)
	part := "data: " + `{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":"` + strings.Repeat("m", 48<<10)
	open := func() (*httptest.ResponseRecorder, http.ResponseWriter, func() error, *[]Drop) {
		drops := &[]Drop{}
		f := NewListing(rt.route, rt.p, nil, func(d Drop) { *drops = append(*drops, d) })
		f.Budget = budget
		rec := httptest.NewRecorder()
		w, closeFilter := f.Wrap(rec)
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		if _, err := w.Write([]byte(part)); err != nil {
			t.Fatal(err)
		}
		return rec, w, closeFilter, drops
	}
	first, w1, close1, _ := open()
	if used := budget.Used(); used < 48<<10 {
		t.Fatalf("the unfinished event reserves %d bytes", used)
	}
	second, w2, close2, drops := open()
	if len(*drops) != 1 || (*drops)[0].Reason != "answer_budget" {
		t.Fatalf("drops of the event over the budget: %v", *drops)
	}
	for _, w := range []http.ResponseWriter{w1, w2} {
		if _, err := w.Write([]byte(`"}}` + "\n\n")); err != nil {
			t.Fatal(err)
		}
	}
	if !strings.Contains(first.Body.String(), strings.Repeat("m", 100)) {
		t.Errorf("the first event did not go out")
	}
	if strings.Contains(second.Body.String(), "mmmm") {
		t.Errorf("the event over the budget went out")
	}
	if err := errors.Join(close1(), close2()); err != nil {
		t.Fatal(err)
	}
	if used := budget.Used(); used != 0 {
		t.Fatalf("the budget holds %d bytes after both streams ended", used)
	}
}

// The stream that answers a subscriptions/listen lasts as long as the
// client listens: Listing.Max bounds each of its events, not the whole,
// so notifications keep coming past max_response in total, and one event
// over it ends the stream with the request's error.
func TestListingMaxListen(t *testing.T) {
	rt := testRoutes(t)["guard"]
	listen := `{"jsonrpc":"2.0","id":9,"method":"subscriptions/listen","params":{"notifications":{"toolsListChanged":true}}}`
	note := "event: message\ndata: " + `{"jsonrpc":"2.0","method":"notifications/tools/list_changed","params":{"_meta":{"pad":"` + strings.Repeat("n", 1000) + `"}}}` + "\n\n"
	b, err := message.Read([]byte(listen))
	if err != nil {
		t.Fatal(err)
	}
	var drops []Drop
	f := NewListing(rt.route, rt.p, b, func(d Drop) { drops = append(drops, d) })
	f.Max = 16 << 10
	rec := httptest.NewRecorder()
	w, closeFilter := f.Wrap(rec)
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	const events = 200 // 200 KiB in all, twelve times Max
	for i := range events {
		if _, err := w.Write([]byte(note)); err != nil {
			t.Fatalf("event %d of a listen stream, %d bytes in all: %v", i, i*len(note), err)
		}
	}
	if got := strings.Count(rec.Body.String(), "notifications/tools/list_changed"); got != events {
		t.Fatalf("the client got %d of %d events", got, events)
	}
	big := "data: " + strings.Repeat("x", 1000) + "\n"
	writes := 0
	for ; writes < 100; writes++ {
		if _, err = w.Write([]byte(big)); err != nil {
			break
		}
	}
	if !errors.Is(err, errAnswerCut) || writes > 20 {
		t.Fatalf("after %d writes of one endless event: %v; want the cut at 16 KiB", writes, err)
	}
	if err := closeFilter(); err != nil {
		t.Fatal(err)
	}
	got := rec.Body.String()
	if strings.Count(got, "notifications/tools/list_changed") != events || !strings.Contains(got, `"id":9,"error"`) || !strings.Contains(got, "subscriptions/listen") {
		t.Errorf("the stream ends with %q; want every event, then the listen's error", got[max(0, len(got)-300):])
	}
	if len(drops) == 0 || drops[len(drops)-1].Reason != "answer_too_large" {
		t.Errorf("drops %v", drops)
	}
}

// mayListByStems is mayList as its doc says it, stem by stem: an escape, or
// one of listStems in any ASCII case.
func mayListByStems(b []byte) bool {
	if bytes.IndexByte(b, '\\') >= 0 {
		return true
	}
	for _, stem := range listStems {
		for i := 0; i+len(stem) <= len(b); i++ {
			if hasFoldAt(b, i, stem) {
				return true
			}
		}
	}
	return false
}

// mayList's one pass finds what a search for each stem finds.
func FuzzMayList(f *testing.F) {
	for _, seed := range []string{
		`{"content":[{"type":"text","text":"hello"}]}`,
		`{"tools":[]}`, `{"TOOLS":[]}`, `{"Prompts":[]}`, `{"resourceTemplates":[]}`, `{"RESOURCES":[]}`,
		`{"n\u0061me":1}`, `tol`, `promp`, `ourc`, `toOl`, `xxxxprompT`, `ource`, `T`, ``,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if got, want := mayList(b), mayListByStems(b); got != want {
			t.Fatalf("mayList(%q) = %v, searching stem by stem gives %v", b, got, want)
		}
	})
}

// A JSON answer whose server announced its length goes out, filtered, as
// soon as that much has come: the client reads it while the route is still
// running (here, blocked until the client has it), not when the handler
// returns.
func TestListingSendsAnAnnouncedAnswerAtOnce(t *testing.T) {
	answer := `{"jsonrpc":"2.0","id":7,"result":` + toolsAnswer + `}`
	got := make(chan struct{})
	routeDone := make(chan error, 1)
	front := filteredListTools(t, func(fw http.ResponseWriter, r *http.Request) {
		fw.Header().Set("Content-Type", "application/json")
		fw.Header().Set("Content-Length", strconv.Itoa(len(answer)))
		fw.WriteHeader(http.StatusOK)
		// In two writes, as a proxy copying the server's body may.
		fw.Write([]byte(answer[:20]))
		fw.Write([]byte(answer[20:]))
		// The route goes on (reverse_proxy closes the server's body,
		// the edge ends its span) until the client has the answer.
		select {
		case <-got:
		case <-r.Context().Done():
		}
		_, err := fw.Write([]byte("x"))
		routeDone <- err
	})
	defer front.Close()
	client := front.Client()
	client.Timeout = 20 * time.Second // a bound on the failure: the answer waiting for the route, which waits for the client
	resp, err := client.Post(front.URL, "application/json", strings.NewReader(listTools))
	if err != nil {
		close(got)
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	close(got)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(body), "mcp_a_secret") || !strings.Contains(string(body), "mcp_b_echo") {
		t.Errorf("the announced answer reached the client as %s", body)
	}
	if n := resp.Header.Get("Content-Length"); n != strconv.Itoa(len(body)) {
		t.Errorf("Content-Length %q for a filtered body of %d bytes", n, len(body))
	}
	if err := <-routeDone; !errors.Is(err, http.ErrContentLength) {
		t.Errorf("a write past the announced length: %v, want http.ErrContentLength", err)
	}
}

// An answer that goes out as long as its server announced keeps the
// server's Content-Length only when it is spelled as a plain decimal: one
// with a sign or a leading zero, which Atoi reads as the same length and
// another reader may not, goes out spelled plainly.
func TestListingAnnouncedLengthSpelling(t *testing.T) {
	answer := `{"jsonrpc":"2.0","id":7,"error":{"code":-32000,"message":"passes as it is"}}`
	for _, spelled := range []string{strconv.Itoa(len(answer)), "0" + strconv.Itoa(len(answer)), "+" + strconv.Itoa(len(answer))} {
		t.Run(spelled, func(t *testing.T) {
			front := filteredListTools(t, func(fw http.ResponseWriter, r *http.Request) {
				fw.Header().Set("Content-Type", "application/json")
				fw.Header().Set("Content-Length", spelled)
				fw.WriteHeader(http.StatusOK)
				fw.Write([]byte(answer))
			})
			defer front.Close()
			resp, err := front.Client().Post(front.URL, "application/json", strings.NewReader(listTools))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			body, err := io.ReadAll(resp.Body)
			if err != nil || string(body) != answer {
				t.Fatalf("answer %q, %v; want the server's", body, err)
			}
			if got := resp.Header.Values("Content-Length"); len(got) != 1 || got[0] != strconv.Itoa(len(answer)) {
				t.Errorf("Content-Length %q, want %d", got, len(answer))
			}
		})
	}
}

// An answer shorter than it announced waits for the route to end, and is
// filtered then, as one without a length is.
func TestListingShortOfItsAnnouncedLength(t *testing.T) {
	answer := `{"jsonrpc":"2.0","id":7,"result":` + toolsAnswer + `}`
	header := http.Header{"Content-Length": {strconv.Itoa(len(answer) + 10)}}
	out, drops := answerThroughWith(t, http.MethodPost, listTools, nil, header, http.StatusOK, "application/json", answer)
	if strings.Contains(out, "mcp_a_secret") || !strings.Contains(out, "mcp_b_echo") || len(drops) != 0 {
		t.Errorf("got %s, drops %v", out, drops)
	}
}

// recordedListTools is the aggregated route's b-only filter for listTools,
// read by the edge, in front of a recorder; dropped gives the drops so far.
func recordedListTools(t *testing.T) (*httptest.ResponseRecorder, http.ResponseWriter, func() error, func() []Drop) {
	t.Helper()
	rt := testRoutes(t)["aggregate"]
	b, err := message.Read([]byte(listTools))
	if err != nil {
		t.Fatal(err)
	}
	var drops []Drop
	rec := httptest.NewRecorder()
	w, closeFilter := NewListing(rt.route, rt.p, b, func(d Drop) { drops = append(drops, d) }).Wrap(rec)
	return rec, w, closeFilter, func() []Drop { return drops }
}

// filteredListTools is a server that answers every request as listTools,
// read by the edge, with serve behind the aggregated route's b-only filter.
func filteredListTools(t *testing.T, serve func(http.ResponseWriter, *http.Request)) *httptest.Server {
	t.Helper()
	rt := testRoutes(t)["aggregate"]
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := message.Read([]byte(listTools))
		if err != nil {
			t.Error(err)
			return
		}
		fw, closeFilter := NewListing(rt.route, rt.p, b, func(Drop) {}).Wrap(w)
		serve(fw, r)
		closeFilter()
	}))
}

// A hostile server that announces a length ending inside a listing gets
// neither the listing's prefix nor its rest past the filter: the prefix is
// read as what it is (not a whole message) and withheld, and what follows
// it is refused.
func TestListingCutByItsAnnouncedLength(t *testing.T) {
	answer := `{"jsonrpc":"2.0","id":7,"result":` + toolsAnswer + `}`
	cut := strings.Index(answer, "mcp_a_secret") + len("mcp_a_sec")
	rec, w, closeFilter, dropped := recordedListTools(t)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(cut))
	w.WriteHeader(http.StatusOK)
	if _, err := w.Write([]byte(answer[:cut])); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write([]byte(answer[cut:])); !errors.Is(err, http.ErrContentLength) {
		t.Errorf("the bytes past the announced length: %v, want http.ErrContentLength", err)
	}
	if err := closeFilter(); err != nil {
		t.Fatal(err)
	}
	if got := rec.Body.String(); strings.Contains(got, "mcp_a_sec") || got != string(droppedAnswer) {
		t.Errorf("the client got %s", got)
	}
	if drops := dropped(); len(drops) != 1 || drops[0].Reason != "ambiguous_answer" {
		t.Errorf("drops %v, want one ambiguous_answer", drops)
	}
}

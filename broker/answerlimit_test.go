package broker

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// limitedGet serves body with contentType (and Content-Length when
// withLength) and reads it back through an answerLimit of max bytes.
func limitedRead(t *testing.T, method, contentType string, withLength bool, body []byte, max int64, budget *AnswerBudget) ([]byte, error) {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", contentType)
		if !withLength {
			// Flushing first makes the body chunked: no Content-Length.
			w.WriteHeader(http.StatusOK)
			http.NewResponseController(w).Flush()
		}
		w.Write(body)
	}))
	defer srv.Close()
	c := &http.Client{Transport: newAnswerLimit(http.DefaultTransport, "up", max, budget)}
	ctx := context.Background()
	if method == listen {
		method, ctx = http.MethodPost, withEventLimit(ctx)
	}
	req, _ := http.NewRequestWithContext(ctx, method, srv.URL, nil)
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	return io.ReadAll(resp.Body)
}

// listen, as limitedRead's method, is the POST of a subscriptions/listen,
// whose stream the pass-through bounds per event.
const listen = "LISTEN"

func events(n, size int, end string) []byte {
	var b bytes.Buffer
	for range n {
		b.WriteString("data: " + strings.Repeat("e", size) + end + end)
	}
	return b.Bytes()
}

func TestAnswerLimit(t *testing.T) {
	const max = 64 << 10
	over := func(err error, event bool) bool {
		var tl *AnswerTooLargeError
		return errors.As(err, &tl) && tl.Upstream == "up" && tl.Limit == max && tl.Event == event
	}
	cases := []struct {
		name, method, ctype string
		length              bool
		body                []byte
		fail, event         bool
	}{
		{"json under", "POST", "application/json", false, bytes.Repeat([]byte(" "), max), false, false},
		{"json over", "POST", "application/json", false, bytes.Repeat([]byte(" "), max+1), true, false},
		{"json over, length known", "POST", "application/json", true, bytes.Repeat([]byte(" "), max+1), true, false},
		{"post stream, events together over", "POST", "text/event-stream", false, events(40, 2<<10, "\n"), true, false},
		{"get stream, many events under each", "GET", "text/event-stream", false, events(400, 2<<10, "\n"), false, false},
		{"get stream, events end with CRLF", "GET", "text/event-stream", false, events(400, 2<<10, "\r\n"), false, false},
		{"get stream, events end with CR", "GET", "text/event-stream", false, events(400, 2<<10, "\r"), false, false},
		{"get stream, one event of many lines", "GET", "text/event-stream", false, bytes.Repeat([]byte("data: "+strings.Repeat("l", 1<<10)+"\n"), 100), true, true},
		{"get stream, one endless line", "GET", "text/event-stream", false, bytes.Repeat([]byte("d"), max+1), true, true},
		{"get json over", "GET", "application/json", false, bytes.Repeat([]byte(" "), max+1), true, false},
		{"listen stream, many events under each", listen, "text/event-stream", false, events(400, 2<<10, "\n"), false, false},
		{"listen stream, one event over", listen, "text/event-stream", false, bytes.Repeat([]byte("data: "+strings.Repeat("l", 1<<10)+"\n"), 100), true, true},
		{"listen answered with json over", listen, "application/json", false, bytes.Repeat([]byte(" "), max+1), true, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			budget := NewAnswerBudget(1 << 30)
			got, err := limitedRead(t, c.method, c.ctype, c.length, c.body, max, budget)
			switch {
			case c.fail && !over(err, c.event):
				t.Fatalf("read %d bytes, err %v; want the limit's error (event %v)", len(got), err, c.event)
			case !c.fail && (err != nil || !bytes.Equal(got, c.body)):
				t.Fatalf("read %d of %d bytes, err %v", len(got), len(c.body), err)
			}
			if err != nil && !strings.Contains(err.Error(), `"up"`) || err != nil && !strings.Contains(err.Error(), "64 KiB") {
				t.Errorf("error %q should name the upstream and the limit", err)
			}
			if u := budget.Used(); u != 0 {
				t.Errorf("budget holds %d bytes after the answer ended", u)
			}
		})
	}
}

// Two answers that each fit max_response but not the budget together: the
// second fails, and the budget is whole again once both end.
func TestAnswerBudget(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		w.Write(bytes.Repeat([]byte(" "), 48<<10))
		http.NewResponseController(w).Flush()
		<-release
	}))
	defer srv.Close()
	defer close(release)
	budget := NewAnswerBudget(64 << 10)
	c := &http.Client{Transport: newAnswerLimit(http.DefaultTransport, "up", 1<<20, budget)}
	first, err := c.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(first.Body, make([]byte, 48<<10)); err != nil {
		t.Fatal(err)
	}
	second, err := c.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	_, err = io.ReadFull(second.Body, make([]byte, 48<<10))
	var be *AnswerBudgetError
	if !errors.As(err, &be) || !strings.Contains(err.Error(), "64 KiB") {
		t.Fatalf("second answer: %v; want the budget's error", err)
	}
	second.Body.Close()
	if u := budget.Used(); u != 48<<10 {
		t.Fatalf("budget holds %d bytes, want the first answer's %d", u, 48<<10)
	}
	first.Body.Close()
	if u := budget.Used(); u != 0 {
		t.Fatalf("budget holds %d bytes after both answers ended", u)
	}
}

// A GET answer that its reader takes whole is bounded by max_response as a
// whole, however many blank lines it holds: go-sdk's streamable client reads
// the body of a failed GET (a 500 that says text/event-stream) with
// io.ReadAll, and the pass-through reads an answer whose media type is not
// text/event-stream whole, even if its Content-Type holds those words. Only a
// successful event stream, which its reader takes event by event, is bounded
// per event.
func TestAnswerLimitGetReadWhole(t *testing.T) {
	const max = 64 << 10
	blankLines := bytes.Repeat([]byte("x\n\n"), 3*max) // many "events", 3 * max bytes each
	cases := []struct {
		name, ctype string
		status      int
	}{
		{"failed GET that says event stream", "text/event-stream", http.StatusInternalServerError},
		{"event-stream only in a parameter", "application/json; profile=text/event-stream", http.StatusOK},
		{"event-stream only in a suffix", "application/x-text/event-stream", http.StatusOK},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", c.ctype)
				w.WriteHeader(c.status)
				http.NewResponseController(w).Flush()
				w.Write(blankLines)
			}))
			defer srv.Close()
			budget := NewAnswerBudget(1 << 30)
			hc := &http.Client{Transport: newAnswerLimit(http.DefaultTransport, "up", max, budget)}
			resp, err := hc.Get(srv.URL)
			if err != nil {
				t.Fatal(err)
			}
			got, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			var tl *AnswerTooLargeError
			if !errors.As(err, &tl) {
				t.Fatalf("read %d bytes of a %d-byte answer whole (err %v); want the max_response error past %d", len(got), len(blankLines), err, max)
			}
			if u := budget.Used(); u != 0 {
				t.Errorf("budget holds %d bytes after the answer was closed", u)
			}
		})
	}
}

// go-sdk, which reads the answers of the broker's own client (the
// aggregated route's, egress), ends a line at LF only: a stream whose lines
// end with a lone CR is one line to it, which it holds whole. The answer
// limit under it ends events where go-sdk does, so a hostile upstream
// cannot spell one endless event as many small ones: its stream fails at
// max_response, and the budget holds what go-sdk holds meanwhile. (The
// pass-through's answers, which clients read by the HTML standard's rules,
// end events at a lone CR too: see TestAnswerLimit.)
func TestAnswerLimitEndsEventsWhereGoSDKDoes(t *testing.T) {
	const max = 64 << 10
	for _, c := range []struct {
		name   string
		stream []byte
		over   bool
	}{
		{"events split by lone CRs, one line to go-sdk", events(64, 8<<10, "\r"), true},
		{"an all-CR line between, which go-sdk takes as blank", events(64, 8<<10, "\n\r"), false},
		{"events split by LF", events(64, 8<<10, "\n"), false},
		{"events split by CRLF", events(64, 8<<10, "\r\n"), false},
	} {
		t.Run(c.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/event-stream")
				w.WriteHeader(http.StatusOK)
				w.Write(c.stream)
			}))
			defer srv.Close()
			budget := NewAnswerBudget(1 << 30)
			hc, err := connHTTPClient(Upstream{Name: "up", URL: srv.URL, MaxResponse: max}, Upstream{Name: "up", URL: srv.URL, MaxResponse: max},
				ConnOptions{AnswerBudget: budget})
			if err != nil {
				t.Fatal(err)
			}
			resp, err := hc.Get(srv.URL)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			got, err := io.ReadAll(resp.Body)
			var tl *AnswerTooLargeError
			switch {
			case c.over && !(errors.As(err, &tl) && tl.Event):
				t.Fatalf("read %d bytes of one go-sdk line, err %v; want the per-event limit's error past %d bytes", len(got), err, max)
			case !c.over && (err != nil || !bytes.Equal(got, c.stream)):
				t.Fatalf("read %d of %d bytes, err %v", len(got), len(c.stream), err)
			}
			if u := budget.Used(); u != 0 {
				t.Errorf("budget holds %d bytes after the stream ended", u)
			}
		})
	}
}

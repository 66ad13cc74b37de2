package upstream

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/Tahul/caddy-zidane-mcp/broker/answerlimit"
)

// sseEvents is n events of size bytes of data, each line ended by end.
func sseEvents(n, size int, end string) []byte {
	var b bytes.Buffer
	for range n {
		b.WriteString("data: " + strings.Repeat("e", size) + end + end)
	}
	return b.Bytes()
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
		{"events split by lone CRs, one line to go-sdk", sseEvents(64, 8<<10, "\r"), true},
		{"an all-CR line between, which go-sdk takes as blank", sseEvents(64, 8<<10, "\n\r"), false},
		{"events split by LF", sseEvents(64, 8<<10, "\n"), false},
		{"events split by CRLF", sseEvents(64, 8<<10, "\r\n"), false},
	} {
		t.Run(c.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/event-stream")
				w.WriteHeader(http.StatusOK)
				w.Write(c.stream)
			}))
			defer srv.Close()
			budget := answerlimit.NewBudget(1 << 30)
			hc, err := connHTTPClient(Config{Name: "up", URL: srv.URL, MaxResponse: max}, Config{Name: "up", URL: srv.URL, MaxResponse: max},
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
			var tl *answerlimit.TooLargeError
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

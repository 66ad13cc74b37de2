package answerlimit

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
)

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
			budget := NewBudget(1 << 30)
			hc := &http.Client{Transport: NewTransport(http.DefaultTransport, "up", max, budget)}
			resp, err := hc.Get(srv.URL)
			if err != nil {
				t.Fatal(err)
			}
			got, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			var tl *TooLargeError
			if !errors.As(err, &tl) {
				t.Fatalf("read %d bytes of a %d-byte answer whole (err %v); want the max_response error past %d", len(got), len(blankLines), err, max)
			}
			if u := budget.Used(); u != 0 {
				t.Errorf("budget holds %d bytes after the answer was closed", u)
			}
		})
	}
}

package broker

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
)

// An upstream's event is read twice on the aggregated route's go-sdk path:
// by go-sdk, which holds it whole until its blank line, and by the
// notification count under it, which holds it too to read its message as
// a client does. max_inflight_response bounds what the gateway holds of
// upstream answers, so the count's copy is reserved in the budget as the
// answer limit reserves go-sdk's, and the count lets an event go uncounted
// rather than hold it past the budget; the answer itself goes through
// whole, and nothing stays reserved once it is closed, ended or not.
func TestNoteCounterHoldsWithinTheAnswerBudget(t *testing.T) {
	const event = 600 << 10
	for _, c := range []struct {
		name   string
		budget int64
		end    bool // the upstream ends the event before the body is closed
	}{
		{"an event that fits the budget once, not twice", 1 << 20, true},
		{"an event that fits twice, closed before its end", 4 << 20, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			head := append([]byte("data: "), bytes.Repeat([]byte("x"), event)...)
			release := make(chan struct{})
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/event-stream")
				w.WriteHeader(http.StatusOK)
				w.Write(head)
				http.NewResponseController(w).Flush()
				select {
				case <-release:
					io.WriteString(w, "\n\n")
				case <-r.Context().Done():
				}
			}))
			defer srv.Close()
			budget := NewAnswerBudget(c.budget)
			notes := &noteCounter{next: newAnswerLimit(http.DefaultTransport, "up", 4<<20, budget), max: 4 << 20, budget: budget}
			req, _ := http.NewRequest(http.MethodPost, srv.URL, nil)
			req.Header.Set(headerSessionID, "s1")
			resp, err := (&http.Client{Transport: notes}).Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close() // before the server closes, which waits for the request
			// What go-sdk holds of the event until its blank line.
			held := make([]byte, len(head))
			if _, err := io.ReadFull(resp.Body, held); err != nil {
				t.Fatal(err)
			}
			count := int64(resp.Body.(*noteReader).pending())
			if total := int64(len(held)) + count; total > c.budget || budget.Used() < total {
				t.Fatalf("the gateway holds %d bytes of the answer (%d read above, %d in the notification count) with %d reserved, under a budget of %d",
					total, len(held), count, budget.Used(), c.budget)
			}
			if c.end {
				close(release)
				rest, err := io.ReadAll(resp.Body)
				if err != nil || string(rest) != "\n\n" {
					t.Fatalf("the rest of the answer: %q, %v; want its blank line", rest, err)
				}
			}
			resp.Body.Close()
			if u := budget.Used(); u != 0 {
				t.Fatalf("%d bytes stay reserved after the answer was closed", u)
			}
		})
	}
}

package aggregate

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/broker/answerlimit"
	"github.com/Tahul/caddy-zidane-mcp/broker/upstream"
)

// max_inflight_response bounds what the gateway holds of upstream answers.
// On the aggregated route's go-sdk path the notification count holds an
// event until its blank line and hands go-sdk nothing of it before, so what
// it holds is the one copy, which the answer limit under it has reserved:
// the gateway never holds an unreserved copy of an unfinished event, and
// nothing stays reserved once the answer is closed, ended or not.
func TestNoteCounterHoldsWithinTheAnswerBudget(t *testing.T) {
	const event = 600 << 10
	for _, c := range []struct {
		name string
		end  bool // the upstream ends the event before the body is closed
	}{
		{"an event that fits the budget once, not twice", true},
		{"an event closed before its end", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			const budgetMax = 1 << 20
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
			budget := answerlimit.NewBudget(budgetMax)
			notes := &noteCounter{next: answerlimit.NewTransport(http.DefaultTransport, "up", 4<<20, budget), max: 4 << 20}
			req, _ := http.NewRequest(http.MethodPost, srv.URL, nil)
			req.Header.Set(upstream.HeaderSessionID, "s1")
			resp, err := (&http.Client{Transport: notes}).Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close() // before the server closes, which waits for the request
			type read struct {
				b   []byte
				err error
			}
			got := make(chan read, 1)
			go func() {
				b, err := io.ReadAll(resp.Body)
				got <- read{b, err}
			}()
			r := resp.Body.(*noteReader)
			// The count takes the whole head in; what it holds is observable.
			for deadline := time.Now().Add(30 * time.Second); r.pending() < len(head); time.Sleep(time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("the count took in %d of the event's %d bytes", r.pending(), len(head))
				}
			}
			if held, used := int64(r.pending()), budget.Used(); held > used || used > budgetMax {
				t.Fatalf("the count holds %d bytes of an unfinished event with %d reserved, under a budget of %d", held, used, budgetMax)
			}
			if c.end {
				close(release)
				res := <-got
				if res.err != nil || !bytes.Equal(res.b, append(head, "\n\n"...)) {
					t.Fatalf("go-sdk read %d bytes, %v; want the event whole", len(res.b), res.err)
				}
			}
			resp.Body.Close()
			if !c.end {
				<-got
			}
			if u := budget.Used(); u != 0 {
				t.Fatalf("%d bytes stay reserved after the answer was closed", u)
			}
		})
	}
}

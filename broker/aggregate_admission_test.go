package broker

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// markOverLimit stores, on every open upstream session to upstream, the
// failure the answer limit's watcher stores when an answer on it broke
// max_response: the state in which the gateway has dropped that session.
func markOverLimit(t *testing.T, a *Aggregate, upstream string) {
	t.Helper()
	a.mu.Lock()
	var sessions []*aggSession
	for _, s := range a.sessions {
		sessions = append(sessions, s)
	}
	for _, s := range a.principals {
		sessions = append(sessions, s)
	}
	a.mu.Unlock()
	n := 0
	for _, s := range sessions {
		s.mu.Lock()
		c := s.conns[upstream]
		s.mu.Unlock()
		if c != nil {
			err := error(&AnswerTooLargeError{Upstream: upstream, Limit: 4 << 10, Event: true})
			c.overLimit.Store(&err)
			n++
		}
	}
	if n == 0 {
		t.Fatalf("no open upstream session to %q", upstream)
	}
}

// markLoginPending puts tool in the state withdraw leaves it in while its
// upstream waits for an operator's login: withdrawn, and (until withdraw
// takes it off the listing) still registered.
func markLoginPending(a *Aggregate, tool, upstream string) {
	a.mu.Lock()
	if a.withdrawn == nil {
		a.withdrawn = map[string]string{}
	}
	a.withdrawn[tool] = upstream
	a.mu.Unlock()
}

// Both tools/call fast paths admit a call by the same rule: a call to an
// upstream whose session broke its answer limit, or whose login is
// pending, is left to the go-sdk path, which sends nothing on the dropped
// session and tells the caller how to log the upstream in. The attack is a
// 2025-11-25 client calling on as if nothing happened.
func TestAggregateFastPathsAdmitAlike(t *testing.T) {
	states := []struct {
		name string
		set  func(t *testing.T, a *Aggregate)
		// want checks the go-sdk path's answer.
		want func(t *testing.T, text string, isError bool, rec CallRecord)
	}{
		{"upstream session over its answer limit", func(t *testing.T, a *Aggregate) { markOverLimit(t, a, "a") },
			func(t *testing.T, text string, isError bool, rec CallRecord) {
				if rec.Outcome == OutcomeAuthRequired {
					t.Errorf("record %+v", rec)
				}
			}},
		{"login pending", func(t *testing.T, a *Aggregate) { markLoginPending(a, "mcp_a_echo", "a") },
			func(t *testing.T, text string, isError bool, rec CallRecord) {
				if !isError || !strings.Contains(text, "caddy zidane login a") || rec.Outcome != OutcomeAuthRequired {
					t.Errorf("answer %q (isError %v), record %+v: want the login tool error, recorded auth_required", text, isError, rec)
				}
			}},
	}
	for _, st := range states {
		t.Run("2025-11-25/"+st.name, func(t *testing.T) {
			up := newFastUp(t, "a", false)
			rec := &recorder{}
			a, url := aggServe(t, []Upstream{up.config()}, AggregateOptions{OnCall: rec.add})
			cs := aggConnect(t, url, nil)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			call := func() *mcp.CallToolResult {
				res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "mcp_a_echo", Arguments: map[string]any{"text": "hi"}})
				if err != nil {
					t.Fatal(err)
				}
				return res
			}
			// The first call opens the upstream session, the second takes
			// the fast path on it.
			call()
			before := up.fast.Load()
			if res := call(); aggText(t, res) != "a:hi" || up.fast.Load() != before+1 {
				t.Fatalf("warm-up: %q, %d fast calls, want the fast path", aggText(t, res), up.fast.Load()-before)
			}
			st.set(t, a)
			fast := up.fast.Load()
			res := call()
			if n := up.fast.Load() - fast; n != 0 {
				t.Errorf("the fast path sent the call upstream (%d)", n)
			}
			r, _ := rec.last("mcp_a_echo")
			if r.Outcome != OutcomeAuthRequired {
				r, _ = rec.last("echo")
			}
			st.want(t, aggText(t, res), res.IsError, r)
		})
		t.Run("2026-07-28/"+st.name, func(t *testing.T) {
			up := newModernUp(t, "a")
			rec := &recorder{}
			a, url := aggServeEdge(t, []Upstream{{Name: "a", URL: up.url}}, AggregateOptions{OnCall: rec.add})
			cs := modernClient(t, url, "tok-1", nil)
			params := &mcp.CallToolParams{Name: "mcp_a_echo", Arguments: map[string]any{"text": "hi"}}
			callOutcome(t, cs, params)
			before := a.modernFastCalls.Load()
			if got := callOutcome(t, cs, params); !strings.Contains(got, "a:hi@") || a.modernFastCalls.Load() != before+1 {
				t.Fatalf("warm-up: %s, want the fast path", got)
			}
			st.set(t, a)
			fast := a.modernFastCalls.Load()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			res, err := cs.CallTool(ctx, params)
			if err != nil {
				t.Fatal(err)
			}
			if n := a.modernFastCalls.Load() - fast; n != 0 {
				t.Errorf("the fast path took the call (%d)", n)
			}
			r, _ := rec.last("mcp_a_echo")
			if r.Outcome != OutcomeAuthRequired {
				r, _ = rec.last("echo")
			}
			st.want(t, aggText(t, res), res.IsError, r)
		})
	}
}

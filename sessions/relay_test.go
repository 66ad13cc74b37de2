package sessions_test

import (
	"strings"
	"testing"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/sessions"
)

// An orchestrator subscribed to its child token gets each worker's events
// as queued prompts, and keeps pushing its own events to its creator.
func TestRelayDeliversWorkerEventsToOrchestrator(t *testing.T) {
	e, _ := newEngine(t)
	alice := owner("alice")
	orch := create(t, e, alice, "orchestrate")
	waitState(t, e, orch, sessions.StateIdle)
	e.Relay("tok-child", orch)

	child := sessions.Owner{TokenID: "tok-child", TokenName: "child"}
	worker := create(t, e, child, "work item one")
	waitState(t, e, worker, sessions.StateIdle)

	// The worker's finished event runs as the orchestrator's next turn.
	deadline := ctxT(t)
	for {
		tr, err := e.Transcript(looker, orch, 0, true)
		if err != nil {
			t.Fatal(err)
		}
		if len(tr) == 2 {
			p := tr[1].Prompt
			if !strings.HasPrefix(p, `<session-event session="`+worker+`" status="done"`) || !strings.Contains(p, "You said: work item one") {
				t.Fatalf("relayed prompt = %q", p)
			}
			break
		}
		select {
		case <-deadline.Done():
			t.Fatalf("the orchestrator never got its worker's event; transcript %+v", tr)
		default:
		}
		time.Sleep(10 * time.Millisecond)
	}
	v := waitState(t, e, orch, sessions.StateIdle)
	evs := eventsOf(e, orch, "")
	if len(evs) < 2 || evs[0].Target != "mcp-alice" {
		t.Fatalf("orchestrator events = %+v (view %+v); they must still go to its creator", evs, v)
	}
	// Another token's sessions are not relayed.
	other := create(t, e, owner("bob"), "unrelated")
	waitState(t, e, other, sessions.StateIdle)
	if tr, _ := e.Transcript(looker, orch, 0, true); len(tr) != 2 {
		t.Fatalf("an unrelated session reached the orchestrator: %+v", tr)
	}
}

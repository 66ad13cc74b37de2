package sessions_test

import (
	"strings"
	"sync"
	"testing"

	"github.com/Tahul/caddy-zidane-mcp/sessions"
)

func TestEventsFiltersSeqAndSubscribe(t *testing.T) {
	e, _ := newEngine(t)
	o := owner("lee")
	var mu sync.Mutex
	var pushed []sessions.Event
	unsubscribe := e.Subscribe(func(ev sessions.Event) {
		mu.Lock()
		pushed = append(pushed, ev)
		mu.Unlock()
	})
	defer unsubscribe()

	a := create(t, e, o, "Alpha PROJECT")
	waitState(t, e, a, sessions.StateIdle)
	b := create(t, e, o, "fail")
	waitState(t, e, b, sessions.StateIdle)
	if _, err := e.Send(ctxT(t), o, a, "beta"); err != nil {
		t.Fatal(err)
	}
	waitState(t, e, a, sessions.StateIdle)

	all := eventsIn(e, sessions.EventFilter{Limit: 100})
	if len(all) != 3 {
		t.Fatalf("events = %+v", all)
	}
	for i := 1; i < len(all); i++ {
		if all[i-1].Seq <= all[i].Seq {
			t.Fatalf("events not newest first: %+v", all)
		}
	}
	if got := eventsIn(e, sessions.EventFilter{SessionID: a, Limit: 100}); len(got) != 2 || got[0].SessionID != a {
		t.Errorf("session filter = %+v", got)
	}
	failed := eventsIn(e, sessions.EventFilter{Status: sessions.EventError})
	if len(failed) != 1 || failed[0].SessionID != b || failed[0].Kind != "failed" || !strings.Contains(failed[0].Summary, "-32603") {
		t.Errorf("status filter = %+v", failed)
	}
	if got := eventsIn(e, sessions.EventFilter{Text: "alpha project"}); len(got) != 2 {
		t.Errorf("text filter = %+v, want both turns of the Alpha PROJECT session", got)
	}
	if got := eventsIn(e, sessions.EventFilter{Since: all[1].Seq}); len(got) != 1 || got[0].Seq != all[0].Seq {
		t.Errorf("since filter = %+v", got)
	}
	if got := eventsIn(e, sessions.EventFilter{Limit: 1}); len(got) != 1 || got[0].Seq != all[0].Seq {
		t.Errorf("limit = %+v", got)
	}
	// The failed turn leaves the session usable, with the error shown.
	if v, _ := e.Read(looker, b, false); v.State != sessions.StateIdle || !strings.Contains(v.Error, "the last turn failed") {
		t.Errorf("failed-turn session = %+v", v)
	}
	eventually(t, "3 pushed events", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(pushed) == 3
	})
	mu.Lock()
	for i := range pushed {
		if pushed[i].Seq != all[len(all)-1-i].Seq {
			t.Errorf("pushed out of order: %+v", pushed)
		}
	}
	mu.Unlock()
}

package sessions_test

import (
	"slices"
	"testing"

	"github.com/Tahul/caddy-zidane-mcp/sessions"
)

// noted drains what the OnChange hook noted so far.
func noted(ch chan string) []string {
	var out []string
	for {
		select {
		case id := <-ch:
			out = append(out, id)
		default:
			return out
		}
	}
}

// The OnChange hook hears of every change of what Listing gives before the
// verb that made it returns: create, an interaction pending and answered,
// a session dropped; and Listing gives what list and pending show.
func TestOnChangeAndListing(t *testing.T) {
	e, _ := newEngine(t, func(c *sessions.Config) { c.Limits.MaxSessions = 2; c.Limits.MaxSessionsPerToken = 10 })
	ch := make(chan string, 10000)
	stop := e.OnChange(func(id string) { ch <- id })
	o := owner("ida")

	dead := create(t, e, o, "crash")
	if !slices.Contains(noted(ch), dead) {
		t.Fatal("create returned before the hook heard of the session")
	}
	waitState(t, e, dead, sessions.StateError)
	id := create(t, e, o, "approve: ship it", func(r *sessions.CreateRequest) { r.Base = "http://127.0.0.1:9" })
	it := pendingOne(t, e, id)
	if !slices.Contains(noted(ch), id) {
		t.Fatal("the hook did not hear of the interaction")
	}
	l, ok := e.Listing(id)
	if !ok || l.Owner != o.OwnerID() || l.OwnerTokenID != o.TokenID || l.Base != "http://127.0.0.1:9" ||
		len(l.Pending) != 1 || l.Pending[0].RequestID != it.RequestID || l.View.State != sessions.StateBlocked {
		t.Fatalf("listing: %+v", l)
	}
	list, _ := e.List(o, 10)
	if got := sessions.ListedView(l.View, o, l.Owner, l.OwnerTokenID); got.SessionID != list[0].SessionID || got.State != list[0].State ||
		got.Worker != list[0].Worker || got.Foreign != list[0].Foreign || got.LastMessage != list[0].LastMessage {
		t.Fatalf("the listing's view %+v; list gives %+v", got, list[0])
	}
	if err := e.Answer(ctxT(t), o, it.RequestID, sessions.Answer{Decision: "allow"}); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(noted(ch), id) {
		t.Fatal("answer returned before the hook heard of it")
	}
	if l, _ := e.Listing(id); len(l.Pending) != 0 {
		t.Fatalf("the listing after the answer: %+v", l)
	}
	waitState(t, e, id, sessions.StateIdle)
	// A third session drops the ended one (MaxSessions 2).
	noted(ch)
	third := create(t, e, o, "hello")
	if got := noted(ch); !slices.Contains(got, dead) || !slices.Contains(got, third) {
		t.Fatalf("the hook heard of %v; want the dropped %s and the new %s", got, dead, third)
	}
	if _, ok := e.Listing(dead); ok || slices.Contains(e.ListingIDs(), dead) {
		t.Fatal("the dropped session still has a listing")
	}
	if ids := e.ListingIDs(); len(ids) != 2 || !slices.Contains(ids, id) || !slices.Contains(ids, third) {
		t.Fatalf("listing ids: %v", ids)
	}
	waitState(t, e, third, sessions.StateIdle)
	stop()
	noted(ch)
	if _, err := e.Send(ctxT(t), o, third, "again"); err != nil {
		t.Fatal(err)
	}
	if got := noted(ch); len(got) != 0 {
		t.Fatalf("a stopped hook heard of %v", got)
	}
}

// Sees is the one rule of who sees whose sessions.
func TestSees(t *testing.T) {
	sam := sessions.Owner{TokenID: "tok-sam"}
	samToo := sessions.Owner{TokenID: "tok-sam-2", ID: "tok-sam"}
	for _, c := range []struct {
		who          sessions.Owner
		owner        string
		access, need sessions.Access
		want         bool
	}{
		{sam, "tok-sam", sessions.AccessOwn, sessions.AccessRead, true},
		{samToo, "tok-sam", sessions.AccessOwn, sessions.AccessAll, true},
		{sam, "tok-eve", sessions.AccessOwn, sessions.AccessRead, false},
		{sam, "tok-eve", sessions.AccessRead, sessions.AccessRead, true},
		{sam, "tok-eve", sessions.AccessRead, sessions.AccessAll, false},
		{sam, "tok-eve", sessions.AccessAll, sessions.AccessAll, true},
	} {
		if got := sessions.Sees(c.who, c.owner, c.access, c.need); got != c.want {
			t.Errorf("Sees(%+v, %q, %d, %d) = %v, want %v", c.who, c.owner, c.access, c.need, got, c.want)
		}
	}
}

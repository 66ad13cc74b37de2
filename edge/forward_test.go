package edge

import (
	"bytes"
	"crypto/rand"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/broker/sessionid"
	"github.com/Tahul/caddy-zidane-mcp/cluster"
	"github.com/Tahul/caddy-zidane-mcp/policy"
)

// A session id names its node only sealed: an id naming another node,
// made without the key, or sealed for another route, names none.
func TestAggregateSessionIDNamesItsNode(t *testing.T) {
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	ids, err := sessionid.New(key)
	if err != nil {
		t.Fatal(err)
	}
	f := NewForward(ForwardOptions{IDs: ids, Route: hopRoute, CheckNode: cluster.CheckNodeID})
	sid := ids.Seal("node-b/"+rand.Text(), "", hopRoute)
	if node, ok := f.Owner(sid); !ok || node != "node-b" {
		t.Fatalf("owner of a sealed id: %q %v", node, ok)
	}
	otherKey := make([]byte, 32)
	_, _ = rand.Read(otherKey)
	other, _ := sessionid.New(otherKey)
	for name, forged := range map[string]string{
		"another node in plain text":   "node-c/" + rand.Text(),
		"sealed with another key":      other.Seal("node-c/x", "", hopRoute),
		"sealed for another route":     ids.Seal("node-c/x", "", "aggregate-node|/other||a"),
		"a bad node id, sealed":        ids.Seal("../../x/y", "", hopRoute),
		"no node, sealed":              ids.Seal("justrandom", "", hopRoute),
		"a sealed id with a bit moved": flipMiddle(sid),
	} {
		if node, ok := f.Owner(forged); ok {
			t.Errorf("%s: names node %q", name, node)
		}
	}
}

// flipMiddle changes one character in the middle of a base64 id (the
// last one may hold only padding bits).
func flipMiddle(s string) string {
	b := []byte(s)
	i := len(b) / 2
	if b[i] == 'A' {
		b[i] = 'B'
	} else {
		b[i] = 'A'
	}
	return string(b)
}

// The hop carries the forwarded headers only: no Authorization, cookie,
// Origin or X-Forwarded-*; the answer's headers come back by an allowlist,
// and only an answer that carries the hop's tag (from the route the hop
// was for) is relayed at all.
func TestHopCarriesOnlyForwardedHeaders(t *testing.T) {
	k := testHopKey(t)
	var got http.Header
	tagged := true
	owner := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = r.Header.Clone()
		body, _ := io.ReadAll(r.Body)
		c, v := k.Verify(r, r.URL.RequestURI(), body, "b", hopRoute, time.Now())
		if !v.Allowed() {
			t.Errorf("the owner refuses the hop: %+v", v)
		}
		// The client's address as the sender saw it (its connection's,
		// never X-Forwarded-For), for the owner's audit lines.
		if c.Client != "192.0.2.1" {
			t.Errorf("the hop names client %q, want the sender's client 192.0.2.1", c.Client)
		}
		if tagged {
			w.Header().Set(HopAnswerHeader, k.AnswerTag(c))
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Set-Cookie", "x=1")
		_, _ = w.Write([]byte(`{"internal":"page"}`))
	}))
	defer owner.Close()
	f := NewForward(ForwardOptions{Route: hopRoute, Hop: k})
	request := func() *http.Request {
		in := httptest.NewRequest(http.MethodPost, "http://mcp.example/mcp", bytes.NewReader([]byte(`{}`)))
		for name, v := range map[string]string{
			"Authorization": "Bearer secret", "Cookie": "a=b", "Origin": "http://evil", "X-Forwarded-For": "1.2.3.4",
			"X-Forwarded-Host": "evil", "Mcp-Session-Id": hopSID, "Content-Type": "application/json", "Accept": "application/json",
		} {
			in.Header.Set(name, v)
		}
		return in.WithContext(policy.WithPrincipal(in.Context(), policy.Principal{TokenID: "tok_1"}))
	}
	w := httptest.NewRecorder()
	if err := f.sendFrom(w, request(), hopSID, "a", "b", owner.URL); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"Authorization", "Cookie", "Origin", "X-Forwarded-For", "X-Forwarded-Host"} {
		if got.Get(name) != "" {
			t.Errorf("the hop carried %s: %q", name, got.Get(name))
		}
	}
	if got.Get("Mcp-Session-Id") != hopSID || got.Get(HopHeader) == "" {
		t.Errorf("the hop lacks what the owner needs: %v", got)
	}
	if w.Header().Get("Set-Cookie") != "" || w.Header().Get(HopAnswerHeader) != "" {
		t.Errorf("the owner's Set-Cookie or tag reached the client: %v", w.Header())
	}
	if w.Body.String() != `{"internal":"page"}` {
		t.Errorf("the tagged answer was not relayed: %q", w.Body.String())
	}

	tagged = false
	w = httptest.NewRecorder()
	err := f.sendFrom(w, request(), hopSID, "a", "b", owner.URL)
	var re *RefusalError
	if !errors.As(err, &re) || re.Verdict.Reason != "hop_untagged" || w.Body.Len() != 0 {
		t.Fatalf("an untagged answer: %v, %q relayed", err, w.Body.String())
	}
}

// An owner whose replay check is at its memory bound refuses a hop 503
// hop_busy with Retry-After: the client gets 503 with the owner's delay,
// something to retry, not a 502 that blames the cluster's config.
func TestHopBusyOwnerGivesARetry(t *testing.T) {
	k := testHopKey(t)
	owner := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(HopRefusedHeader, "hop_busy")
		w.Header().Set("Retry-After", "2")
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer owner.Close()
	f := NewForward(ForwardOptions{Route: hopRoute, Hop: k})
	in := httptest.NewRequest(http.MethodPost, "http://mcp.example/mcp", strings.NewReader(`{}`))
	in.Header.Set("Mcp-Session-Id", hopSID)
	in = in.WithContext(policy.WithPrincipal(in.Context(), policy.Principal{TokenID: "tok_1"}))
	err := f.sendFrom(httptest.NewRecorder(), in, hopSID, "a", "b", owner.URL)
	var re *RefusalError
	if !errors.As(err, &re) || re.Verdict.Status != http.StatusServiceUnavailable || re.Verdict.Reason != "hop_busy" || re.Verdict.RetryAfter != 2*time.Second {
		t.Fatalf("a busy owner: %v, want 503 hop_busy retrying after 2s", err)
	}
}

// A busy owner's Retry-After is taken within 1 to 60 seconds, else one
// second; any other refusal of the owner's sends the operator to the
// cluster's configuration, with 502.
func TestHopRefusedVerdict(t *testing.T) {
	for ra, want := range map[string]time.Duration{"2": 2 * time.Second, "60": time.Minute, "61": time.Second, "0": time.Second, "-3": time.Second, "soon": time.Second, "": time.Second} {
		if v := hopRefusedVerdict("gw-2", "hop_busy", ra); v.Status != http.StatusServiceUnavailable || v.RetryAfter != want {
			t.Errorf("Retry-After %q: %d %v, want 503 after %v", ra, v.Status, v.RetryAfter, want)
		}
	}
	v := hopRefusedVerdict("gw-2", "hop_stale", "5")
	if v.Status != http.StatusBadGateway || v.Reason != "hop_refused" || v.RetryAfter != 0 || !strings.Contains(v.Message, "synchronized clocks") || !strings.Contains(v.Message, `"gw-2"`) {
		t.Errorf("a refused hop: %+v", v)
	}
}

// thisNode is a registry in which only this node is known: what
// HoldsSession reads of it is Self.
type thisNode string

func (n thisNode) Self() string                      { return string(n) }
func (n thisNode) Lookup(node string) (string, bool) { return "", node == string(n) }

// Hop headers reach only a route that takes forwarded requests, and a
// forwarded request only the node that holds it: a 2025-11-25 session of
// another node is unknown here (404, initialize again), and a 2026-07-28
// request that is no retry of a call held here is misdirected.
func TestHopIsServedOnlyWhereItIsHeld(t *testing.T) {
	if _, v := HopRoute(&Guard{Route: "guard"}); v.Status != http.StatusForbidden || v.Reason != "hop_refused" {
		t.Fatalf("a guard route took a hop: %+v", v)
	}
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	ids, err := sessionid.New(key)
	if err != nil {
		t.Fatal(err)
	}
	f := NewForward(ForwardOptions{IDs: ids, Route: hopRoute, Nodes: thisNode("gw-1"), CheckNode: cluster.CheckNodeID})
	route, v := HopRoute(&ClusterSessions{Sessions: &Sessions{}, Fwd: f})
	if !v.Allowed() {
		t.Fatalf("the cluster's sessions route refuses hops: %+v", v)
	}
	request := func(sid, version string) *http.Request {
		r := httptest.NewRequest(http.MethodPost, "http://mcp.example/mcp", nil)
		if sid != "" {
			r.Header.Set("Mcp-Session-Id", sid)
		}
		if version != "" {
			r.Header.Set("Mcp-Protocol-Version", version)
		}
		return r
	}
	mine, theirs := f.Mint(), ids.Seal("gw-2/"+rand.Text(), "", hopRoute)
	if node, ok := f.Owner(mine); !ok || node != "gw-1" {
		t.Fatalf("a minted id names %q %v", node, ok)
	}
	for _, c := range []struct {
		name   string
		r      *http.Request
		reason string
	}{
		{"this node's session", request(mine, "2025-11-25"), ""},
		{"another node's session", request(theirs, "2025-11-25"), "session_unknown"},
		{"no session", request("", "2025-11-25"), "session_unknown"},
		{"a 2026-07-28 request", request("", "2026-07-28"), "hop_misdirected"},
	} {
		v := HeldHere(route, c.r)
		if v.Reason != c.reason {
			t.Errorf("%s: %+v, want reason %q", c.name, v, c.reason)
		}
	}
}

// servedRoute counts the requests it serves here.
type servedRoute struct {
	Sessions
	served int
}

func (s *servedRoute) Serve(http.ResponseWriter, *http.Request, Next) error {
	s.served++
	return nil
}

// A held call is sent on unsettled only when its route sends it to the
// node that holds its 2025-11-25 session (SettledByOwner reads the
// session id as ServeLegacy does); a call so marked is never served on
// this node, whatever becomes of the registry: its approval would not
// have been settled anywhere.
func TestHeldCallsAreSettledByTheirSessionsNode(t *testing.T) {
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	ids, err := sessionid.New(key)
	if err != nil {
		t.Fatal(err)
	}
	f := NewForward(ForwardOptions{IDs: ids, Route: hopRoute, Nodes: thisNode("gw-1"), CheckNode: cluster.CheckNodeID})
	mine, theirs := f.Mint(), ids.Seal("gw-2/"+rand.Text(), "", hopRoute)
	request := func(sid, version string) *http.Request {
		r := httptest.NewRequest(http.MethodPost, "http://mcp.example/mcp", nil)
		if sid != "" {
			r.Header.Set("Mcp-Session-Id", sid)
		}
		r.Header.Set("Mcp-Protocol-Version", version)
		return r
	}
	local := &servedRoute{}
	cs := &ClusterSessions{Sessions: &local.Sessions, Fwd: f}
	for _, c := range []struct {
		name  string
		route Route
		r     *http.Request
		owner bool
	}{
		{"another node's session", cs, request(theirs, "2025-11-25"), true},
		{"this node's session", cs, request(mine, "2025-11-25"), false},
		{"no session", cs, request("", "2025-11-25"), false},
		{"a session id sealed with another key", cs, request(flipMiddle(theirs), "2025-11-25"), false},
		{"a 2026-07-28 request", cs, request(theirs, "2026-07-28"), false},
		{"a route that forwards nothing", &Guard{Route: "guard"}, request(theirs, "2025-11-25"), false},
	} {
		if got := SettledByOwner(c.route, c.r); got != c.owner {
			t.Errorf("%s: settled by its session's node %v, want %v", c.name, got, c.owner)
		}
	}
	for name, r := range map[string]*http.Request{
		"this node's session": request(mine, "2025-11-25"),
		"no session":          request("", "2025-11-25"),
	} {
		r = r.WithContext(WithOwnerSettles(r.Context()))
		err := f.ServeLegacy(httptest.NewRecorder(), r, nil, local)
		var re *RefusalError
		if !errors.As(err, &re) || re.Verdict.Reason != ReasonApproval || local.served != 0 {
			t.Fatalf("%s, marked for its owner to settle: %v, served %d times here", name, err, local.served)
		}
	}
	if err := f.ServeLegacy(httptest.NewRecorder(), request(mine, "2025-11-25"), nil, local); err != nil || local.served != 1 {
		t.Fatalf("this node's session, unmarked: %v, served %d", err, local.served)
	}
}

// A held call whose 2025-11-25 session id names no node of the route's
// (sealed with another key, for another route, or a node id that is no
// node's) is refused as ServeLegacy refuses it, 404 session_unknown,
// before its approval is settled: settled first, the approval would be
// used up on a call that no replica runs. Any other request goes on.
func TestHeldCallOfNoNodesSessionIsRefusedFirst(t *testing.T) {
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	ids, err := sessionid.New(key)
	if err != nil {
		t.Fatal(err)
	}
	f := NewForward(ForwardOptions{IDs: ids, Route: hopRoute, Nodes: thisNode("gw-1"), CheckNode: cluster.CheckNodeID})
	otherKey := make([]byte, 32)
	_, _ = rand.Read(otherKey)
	other, _ := sessionid.New(otherKey)
	request := func(sid, version string) *http.Request {
		r := httptest.NewRequest(http.MethodPost, "http://mcp.example/mcp", nil)
		if sid != "" {
			r.Header.Set("Mcp-Session-Id", sid)
		}
		r.Header.Set("Mcp-Protocol-Version", version)
		return r
	}
	cs := &ClusterSessions{Sessions: &Sessions{}, Fwd: f}
	theirs := ids.Seal("gw-2/"+rand.Text(), "", hopRoute)
	for _, c := range []struct {
		name    string
		route   Route
		r       *http.Request
		refused bool
	}{
		{"a session id sealed with another key", cs, request(other.Seal("gw-2/x", "", hopRoute), "2025-11-25"), true},
		{"a session id sealed for another route", cs, request(ids.Seal("gw-2/x", "", "aggregate-node|/other||a"), "2025-11-25"), true},
		{"a session id with a character changed", cs, request(flipMiddle(theirs), "2025-11-25"), true},
		{"a session id of a bad node id, sealed", cs, request(ids.Seal("../../x/y", "", hopRoute), "2025-11-25"), true},
		{"another node's session", cs, request(theirs, "2025-11-25"), false},
		{"this node's session", cs, request(f.Mint(), "2025-11-25"), false},
		{"no session", cs, request("", "2025-11-25"), false},
		{"a 2026-07-28 request", cs, request(flipMiddle(theirs), "2026-07-28"), false},
		{"a route that forwards nothing", &Guard{Route: "guard"}, request(flipMiddle(theirs), "2025-11-25"), false},
	} {
		v := UnknownSessionOf(c.route, c.r)
		switch {
		case c.refused && (v.Allowed() || v.Status != http.StatusNotFound || v.Reason != "session_unknown" || !strings.Contains(v.Message, "initializing again")):
			t.Errorf("%s: %+v, want 404 session_unknown saying to initialize again", c.name, v)
		case !c.refused && !v.Allowed():
			t.Errorf("%s: refused %+v, want it to go on", c.name, v)
		}
	}
}

// A held call marked for its session's node to settle is served nowhere
// else: whichever path the cluster routes take it on here (a 2026-07-28
// request on either, a 2025-11-25 one of this node's session or of none on
// the aggregated route), it is refused 403 approval_required, and its
// route never serves it.
func TestMarkedHeldCallIsServedOnNoOtherPath(t *testing.T) {
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	ids, err := sessionid.New(key)
	if err != nil {
		t.Fatal(err)
	}
	f := NewForward(ForwardOptions{IDs: ids, Route: hopRoute, Nodes: thisNode("gw-1"), CheckNode: cluster.CheckNodeID})
	request := func(sid, version string) *http.Request {
		r := httptest.NewRequest(http.MethodPost, "http://mcp.example/mcp", nil)
		if sid != "" {
			r.Header.Set("Mcp-Session-Id", sid)
		}
		r.Header.Set("Mcp-Protocol-Version", version)
		return r.WithContext(WithOwnerSettles(r.Context()))
	}
	theirs := ids.Seal("gw-2/"+rand.Text(), "", hopRoute)
	// Neither route below can serve anything here: reaching one would
	// fail the test (a nil catalog, a nil bridge), as it should.
	sessions := &ClusterSessions{Sessions: &Sessions{}, Fwd: f}
	agg := &ClusterAggregate{Aggregate: &Aggregate{}, Fwd: f}
	for _, c := range []struct {
		name  string
		route Route
		r     *http.Request
	}{
		{"a 2026-07-28 request on the sessions route", sessions, request("", "2026-07-28")},
		{"a 2026-07-28 request naming another node's session, on the sessions route", sessions, request(theirs, "2026-07-28")},
		{"a 2025-11-25 request of this node's session, on the sessions route", sessions, request(f.Mint(), "2025-11-25")},
		{"a 2026-07-28 request on the aggregated route", agg, request("", "2026-07-28")},
		{"a 2026-07-28 request naming another node's session, on the aggregated route", agg, request(theirs, "2026-07-28")},
		{"a 2025-11-25 request of this node's session, on the aggregated route", agg, request(f.Mint(), "2025-11-25")},
		{"a 2025-11-25 request of no session, on the aggregated route", agg, request("", "2025-11-25")},
	} {
		err := c.route.Serve(httptest.NewRecorder(), c.r, nil)
		var re *RefusalError
		if !errors.As(err, &re) || re.Verdict.Status != http.StatusForbidden || re.Verdict.Reason != ReasonApproval || !strings.Contains(re.Verdict.Message, "approval") {
			t.Errorf("%s, marked for its owner to settle: %v, want 403 %s", c.name, err, ReasonApproval)
		}
	}
}

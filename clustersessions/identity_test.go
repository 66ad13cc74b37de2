package clustersessions_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/Tahul/caddy-zidane-mcp/cluster"
	"github.com/Tahul/caddy-zidane-mcp/clustersessions"
	"github.com/Tahul/caddy-zidane-mcp/policy"
	"github.com/Tahul/caddy-zidane-mcp/sessionpage"
	"github.com/Tahul/caddy-zidane-mcp/sessions"
)

// The requests between nodes carry whom a request acts for, never what it
// may do. Here the attacker holds the cluster key (read from a file an
// agent could reach, say) and sends a node requests itself, through the
// cluster's own sealed request/reply.

// attackerRPC is request/reply on the cluster with its key, from a node
// of the attacker's own that serves nothing.
func attackerRPC(t *testing.T, url, service string) *cluster.RPC {
	t.Helper()
	st := keyedStorage(t, url, key)
	rpc, err := st.ServeRPC(service, "gw-evil", func(context.Context, string, json.RawMessage) (json.RawMessage, error) {
		return nil, errors.New("serves nothing")
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rpc.Close)
	return rpc
}

// wireReply is a node's answer as it travels.
type wireReply struct {
	Result json.RawMessage `json:"result"`
	Code   string          `json:"code"`
	Error  string          `json:"error"`
}

// refusals collects what a node reports refused.
type refusals struct {
	mu  sync.Mutex
	got []clustersessions.Refusal
}

func (r *refusals) add(x clustersessions.Refusal) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got = append(r.got, x)
}

// since are the refusals reported after the first n.
func (r *refusals) since(n int) []clustersessions.Refusal {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]clustersessions.Refusal(nil), r.got[n:]...)
}

func (r *refusals) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.got)
}

// Sam's session runs on gw-a and waits for an approval. Eve holds a chat
// token and the cluster key, and asks gw-a, as a replica would, for every
// verb on Sam's session, in every form a replica could write, claiming
// more than her token grants: the earlier release's request, which
// carried the caller's engine access; her token with sessions:any and
// interactions:any; her token with the reach of those scopes; a token no
// replica knows; a token revoked through the store; a read-only token for
// what only chat may do; a JWT subject without its JWT; a session page's
// reader without a capability, or with another session's. Each is refused, with the engine's error
// caller_refused and a report naming why (the earlier release's on this
// release's subject; no node of this release listens on its own), and
// Sam's session is as
// he left it: no prompt of hers, its interaction still waiting, not
// cancelled. Her own token with its own scopes is taken, and the engine
// refuses it Sam's session, as it would on one node.
func TestRequestsCarryIdentityNotAuthority(t *testing.T) {
	natsURL := startNATS(t)
	p := &peers{alive: map[string]bool{}}
	var refused refusals
	a := startNodeWith(t, natsURL, "gw-a", p, nodeConfig{refused: refused.add})
	sam, eve := p.owner(t, "sam"), p.owner(t, "eve")
	c := create(t, a, sam, "approve: ship it")
	ev := eventFor(t, a, c.SessionID, sessions.EventNeedsAttention)

	_, carol, err := p.tokens.Create(ctxT(t), policy.TokenSpec{Name: "carol", Scopes: []string{"chat"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.tokens.Revoke(ctxT(t), carol.ID); err != nil {
		t.Fatal(err)
	}
	_, reader, err := p.tokens.Create(ctxT(t), policy.TokenSpec{Name: "reader", Scopes: []string{"read"}})
	if err != nil {
		t.Fatal(err)
	}

	// The arguments of each verb, on Sam's session or its interaction.
	args := map[string]map[string]any{
		"read":       {"id": c.SessionID, "full": true},
		"transcript": {"id": c.SessionID, "full": true},
		"pending":    {"id": c.SessionID},
		"mark":       {"id": c.SessionID},
		"wait":       {"id": c.SessionID, "wait": int64(time.Second)},
		"send":       {"id": c.SessionID, "text": "eve was here"},
		"steer":      {"id": c.SessionID, "text": "eve steers"},
		"answer":     {"id": ev.RequestID, "answer": sessions.Answer{Decision: "allow"}},
		"cancel":     {"id": c.SessionID},
	}
	// Cancel last: were it served, nothing after it would show anything.
	verbs := []string{"read", "transcript", "pending", "mark", "wait", "send", "steer", "answer", "cancel"}
	with := func(verb string, field string, v any) []byte {
		body := map[string]any{field: v}
		for k, x := range args[verb] {
			body[k] = x
		}
		b, _ := json.Marshal(body)
		return b
	}
	all := sessions.AccessAll
	forms := []struct {
		name   string
		caller any
		reason string
	}{
		{"her token claiming sessions:any and interactions:any",
			clustersessions.Caller{TokenID: eve.TokenID, Scopes: []string{"chat", "sessions:any", "interactions:any"}, Sessions: all, Interactions: all},
			"rpc_scopes"},
		{"her token claiming the reach of sessions:any",
			clustersessions.Caller{TokenID: eve.TokenID, Scopes: eve.Scopes, Sessions: all, Interactions: all},
			"rpc_scopes"},
		{"a token no replica knows",
			clustersessions.Caller{TokenID: "tok_00000000deadbeef", Scopes: []string{"chat"}, Sessions: all, Interactions: all},
			"rpc_principal"},
		{"a revoked token",
			clustersessions.Caller{TokenID: carol.ID, Scopes: []string{"chat"}},
			"rpc_principal"},
		{"her token with a credential",
			clustersessions.Caller{TokenID: eve.TokenID, Scopes: eve.Scopes, Credential: "eyJhbGciOiJub25lIn0.eyJzdWIiOiJzYW0ifQ."},
			"rpc_principal"},
		{"a JWT subject without its JWT",
			clustersessions.Caller{TokenID: "jwt:sam", Scopes: []string{"chat"}},
			"rpc_principal"},
	}
	otherPage, err := url.Parse(pages.Link("https://gw.example", create(t, a, eve, "hello").SessionID))
	if err != nil {
		t.Fatal(err)
	}

	t.Run("the earlier release's request", func(t *testing.T) {
		// A replica before this one sent the caller's engine Owner, access
		// included, on the subject of service "sessions", where no node of
		// this release listens: NATS says at once that none does.
		nc, err := nats.Connect(natsURL)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		if _, err := nc.Request("zidane.rpc.zidane.sessions.gw-a", []byte("sealed or not"), 10*time.Second); !errors.Is(err, nats.ErrNoResponders) {
			t.Fatalf("a request on the earlier release's subject: %v, want no responders", err)
		}
		owner := map[string]any{"TokenID": eve.TokenID, "TokenName": "eve", "ID": eve.OwnerID(),
			"OtherSessions": sessions.AccessAll, "OtherInteractions": sessions.AccessAll}
		now := attackerRPC(t, natsURL, clustersessions.Service)
		for _, verb := range verbs {
			before := refused.count()
			expectRefused(t, now, verb, with(verb, "owner", owner), c.SessionID)
			if got := refused.since(before); len(got) != 1 || got[0].Reason != "rpc_principal" || got[0].Method != verb {
				t.Fatalf("%s in the earlier release's form was reported %+v, want one rpc_principal", verb, got)
			}
		}
	})

	now := attackerRPC(t, natsURL, clustersessions.Service)
	for _, form := range forms {
		t.Run(form.name, func(t *testing.T) {
			for _, verb := range verbs {
				before := refused.count()
				expectRefused(t, now, verb, with(verb, "caller", form.caller), c.SessionID)
				got := refused.since(before)
				if len(got) != 1 || got[0].Reason != form.reason || got[0].Method != verb || got[0].From != "gw-evil" {
					t.Fatalf("%s was reported %+v, want one %s from gw-evil", verb, got, form.reason)
				}
			}
		})
	}
	t.Run("a read-only token for what chat may do", func(t *testing.T) {
		caller := clustersessions.Caller{TokenID: reader.ID, Scopes: []string{"read"}}
		for _, verb := range []string{"send", "steer", "answer", "cancel"} {
			before := refused.count()
			expectRefused(t, now, verb, with(verb, "caller", caller), c.SessionID)
			if got := refused.since(before); len(got) != 1 || got[0].Reason != "rpc_scopes" {
				t.Fatalf("%s for a read token was reported %+v, want one rpc_scopes", verb, got)
			}
		}
	})
	for name, capability := range map[string]string{"without a capability": "", "with another session's capability": otherPage.Query().Get("cap")} {
		t.Run("a session page's reader "+name, func(t *testing.T) {
			page := clustersessions.Caller{Credential: capability, Sessions: sessions.AccessRead, Interactions: sessions.AccessRead}
			for _, verb := range verbs {
				before := refused.count()
				expectRefused(t, now, verb, with(verb, "caller", page), c.SessionID)
				if got := refused.since(before); len(got) != 1 {
					t.Fatalf("%s for a page's reader was reported %+v, want one refusal", verb, got)
				}
			}
		})
	}
	t.Run("her own token, as she holds it", func(t *testing.T) {
		caller := clustersessions.Caller{TokenID: eve.TokenID, Scopes: eve.Scopes}
		raw, err := now.Call(ctxT(t), "gw-a", "read", with("read", "caller", caller))
		if err != nil {
			t.Fatal(err)
		}
		var rep wireReply
		if json.Unmarshal(raw, &rep) != nil || rep.Code != "not_owner" {
			t.Fatalf("eve's own read of sam's session: %s, want the engine's not_owner", raw)
		}
	})

	// Sam's session is as he left it.
	v, err := a.cs.Read(sam, c.SessionID, true)
	if err != nil {
		t.Fatal(err)
	}
	if v.State != sessions.StateBlocked || v.Queued != 0 {
		t.Fatalf("sam's session after eve's requests: %+v; want it blocked on its interaction, with nothing queued", v)
	}
	turns, err := a.cs.Transcript(sam, c.SessionID, 0, true)
	if err != nil {
		t.Fatal(err)
	}
	for _, turn := range turns {
		if strings.Contains(turn.Prompt, "eve") {
			t.Fatalf("eve's prompt reached sam's session: %+v", turns)
		}
	}
	if pending, err := a.cs.Pending(sam, c.SessionID); err != nil || len(pending) != 1 || pending[0].RequestID != ev.RequestID {
		t.Fatalf("sam's interaction after eve's answer: %+v, %v", pending, err)
	}
}

// expectRefused sends verb with body to gw-a and fails unless gw-a
// refuses the caller, saying nothing of session id.
func expectRefused(t *testing.T, rpc *cluster.RPC, verb string, body []byte, id string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	raw, err := rpc.Call(ctx, "gw-a", verb, body)
	if err != nil {
		t.Fatalf("%s: %v, want the node's refusal", verb, err)
	}
	var rep wireReply
	if err := json.Unmarshal(raw, &rep); err != nil {
		t.Fatalf("%s: an answer that does not decode: %s", verb, raw)
	}
	if rep.Code != "caller_refused" || !strings.HasPrefix(rep.Error, sessions.ErrCallerRefused.Error()) {
		t.Fatalf("%s: %s, want it refused caller_refused", verb, raw)
	}
	if len(rep.Result) > 0 || strings.Contains(rep.Error, "ship it") {
		t.Fatalf("%s refused, but answered with sam's session: %s", verb, raw)
	}
}

// A replica's request for a caller its edge authenticated is served, the
// caller established again by the node that runs the session from its own
// token store: a token created on another replica a moment ago is found
// (the node's store loads the token file on a miss), and once the node's
// store has it revoked (the gateway's follows the token file), it is
// refused, whatever the request says.
func TestRequestsOfATokenCreatedOrRevokedElsewhere(t *testing.T) {
	a, b, p, _ := twoNodes(t)
	sam := p.owner(t, "sam")
	c := create(t, a, sam, "hello")
	settle(t, a, sam, c.SessionID)
	// Created after both nodes opened their stores.
	secret, tok, err := p.tokens.Create(ctxT(t), policy.TokenSpec{Name: "sam-laptop", Scopes: []string{"chat"}, Owner: sam.OwnerID()})
	if err != nil {
		t.Fatal(err)
	}
	pr, err := p.tokens.Check(secret, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	laptop := sessions.Owner{TokenID: pr.TokenID, TokenName: pr.Name, ID: pr.OwnerID(), Scopes: pr.Scopes}
	if v, err := b.cs.Read(laptop, c.SessionID, false); err != nil || v.SessionID != c.SessionID {
		t.Fatalf("a token created a moment ago reads its owner's session through gw-b: %+v, %v", v, err)
	}
	if _, err := p.tokens.Revoke(ctxT(t), tok.ID); err != nil {
		t.Fatal(err)
	}
	if err := a.tokens.Sync(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	_, err = b.cs.Read(laptop, c.SessionID, false)
	if !errors.Is(err, sessions.ErrCallerRefused) || !strings.Contains(err.Error(), "revoked") {
		t.Fatalf("a revoked token's read through gw-b: %v, want it refused as revoked", err)
	}
}

// A session page read through another replica carries the link's
// capability, which the node that runs the session checks itself: it
// reads that one session, and nothing else, and acts on none.
func TestAPageReadsOnlyItsSessionThroughAnotherReplica(t *testing.T) {
	a, b, p, _ := twoNodes(t)
	sam := p.owner(t, "sam")
	c := create(t, a, sam, "approve: ship it")
	other := create(t, a, sam, "hello")
	eventFor(t, a, c.SessionID, sessions.EventNeedsAttention)
	link, err := url.Parse(pages.Link("https://gw.example", c.SessionID))
	if err != nil {
		t.Fatal(err)
	}
	reader := sessionpage.Reader(link.Query().Get("cap"))
	if v, err := b.cs.Read(reader, c.SessionID, true); err != nil || v.SessionID != c.SessionID {
		t.Fatalf("the page's read through gw-b: %+v, %v", v, err)
	}
	if turns, err := b.cs.Transcript(reader, c.SessionID, 50, true); err != nil || len(turns) != 1 {
		t.Fatalf("the page's transcript through gw-b: %+v, %v", turns, err)
	}
	if pending, err := b.cs.Pending(reader, c.SessionID); err != nil || len(pending) != 1 {
		t.Fatalf("the page's pending through gw-b: %+v, %v", pending, err)
	}
	if _, err := b.cs.Read(reader, other.SessionID, false); !errors.Is(err, sessions.ErrCallerRefused) {
		t.Fatalf("the page of %s reads %s through gw-b: %v", c.SessionID, other.SessionID, err)
	}
	if _, err := b.cs.Send(ctxT(t), reader, c.SessionID, "from the page"); !errors.Is(err, sessions.ErrCallerRefused) {
		t.Fatalf("the page sends to its session through gw-b: %v", err)
	}
	if err := b.cs.Cancel(ctxT(t), reader, c.SessionID); !errors.Is(err, sessions.ErrCallerRefused) {
		t.Fatalf("the page cancels its session through gw-b: %v", err)
	}
	if v, err := a.cs.Read(sam, c.SessionID, false); err != nil || v.State != sessions.StateBlocked || v.Queued != 0 {
		t.Fatalf("sam's session after the page's requests: %+v, %v", v, err)
	}
}

package cluster

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/Tahul/caddy-zidane-mcp/policy"
)

func shareOn(t *testing.T, url string, key []byte, lim *policy.Limiter) *LimitShare {
	t.Helper()
	nc := connect(t, url)
	s, err := (&Conn{nc: nc}).ShareLimits(key, "limits|/mcp|{20 40}", lim, 10*time.Millisecond, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	// The server has the subscription once a flush returns: what another
	// connection publishes after that reaches it.
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// waitEmpty waits until key's bucket in lim has no event left.
func waitEmpty(t *testing.T, lim *policy.Limiter, key string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !lim.Empty(key, time.Now()) {
		if time.Now().After(deadline) {
			t.Fatalf("%s's bucket was never debited", key)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// What one replica lets through is debited on the others, so a key's
// budget is one budget across them.
func TestSharedLimitsDebitOtherReplicas(t *testing.T) {
	url := startNATS(t)
	limit := policy.Limit{Rate: 1, Burst: 10}
	a, b := policy.NewLimiter(limit), policy.NewLimiter(limit)
	shareOn(t, url, testKey, a)
	shareOn(t, url, testKey, b)
	now := time.Now()
	for i := range 10 {
		if ok, _ := a.Allow("tok_1", now); !ok {
			t.Fatalf("event %d refused on A", i)
		}
	}
	waitEmpty(t, b, "tok_1")
	if ok, _ := b.Allow("tok_1", time.Now()); ok {
		t.Fatal("B let an event through after A used the whole budget")
	}
	if ok, _ := b.Allow("tok_2", time.Now()); !ok {
		t.Fatal("another key's budget was debited")
	}
}

// A message not sealed with the cluster key, or one replayed, debits
// nothing. Each is followed, on the same connection, by an authentic
// message for a marker key: once the marker's debit shows, the message
// before it has been handled.
func TestSharedLimitsRefuseForgedAndReplayed(t *testing.T) {
	url := startNATS(t)
	limit := policy.Limit{Rate: 1, Burst: 5}
	victim := policy.NewLimiter(limit)
	vs := shareOn(t, url, testKey, victim)
	attacker := connect(t, url)

	// Senders of our own: one with the cluster key (for the markers and
	// the message that is replayed), one with another cluster's key.
	good := &bus{nc: attacker, sealer: vs.bus.sealer, subject: vs.bus.subject, node: "good", last: map[string]senderState{}}
	foreign, _ := newBus(attacker, make([]byte, KeySize), "rate-limit usage v1", vs.bus.subject)
	envelopeOf := func(node string, seq uint64, at time.Time, usage map[string]int) []byte {
		body, _ := json.Marshal(usage)
		data, _ := json.Marshal(envelope{Node: node, Seq: seq, At: at.UnixMilli(), Body: body})
		return data
	}
	msg := func(data []byte, sealer *bus) *nats.Msg {
		m := &nats.Msg{Subject: vs.bus.subject, Data: data}
		if sealer != nil {
			m.Data = sealer.seal(data)
		}
		return m
	}
	publish := func(m *nats.Msg) {
		t.Helper()
		if err := attacker.PublishMsg(m); err != nil {
			t.Fatal(err)
		}
	}
	now := time.Now

	publish(msg(envelopeOf("evil", 1, now(), map[string]int{"tok_victim": 100}), nil))     // not sealed
	publish(msg(envelopeOf("evil", 2, now(), map[string]int{"tok_victim": 100}), foreign)) // another cluster's key
	publish(msg(envelopeOf("good", 1, now(), map[string]int{"marker_1": 5}), good))        // authentic
	waitEmpty(t, victim, "marker_1")
	if victim.Empty("tok_victim", time.Now()) {
		t.Fatal("a message not sealed with the cluster key debited a bucket")
	}

	replayed := msg(envelopeOf("good", 2, now(), map[string]int{"tok_victim": 3}), good)
	publish(replayed)
	publish(replayed)                                                               // the same message again
	publish(msg(envelopeOf("good", 3, now(), map[string]int{"marker_2": 5}), good)) // authentic
	waitEmpty(t, victim, "marker_2")
	for i := range 2 { // 5 - 3 = 2 left: the replay took none
		if ok, _ := victim.Allow("tok_victim", time.Now()); !ok {
			t.Fatalf("event %d of the 2 left was refused: the replayed message was debited again", i+1)
		}
	}

	publish(msg(envelopeOf("good", 4, now().Add(-time.Minute), map[string]int{"tok_stale": 5}), good)) // stale
	publish(msg(envelopeOf("good", 5, now(), map[string]int{"marker_3": 5}), good))
	waitEmpty(t, victim, "marker_3")
	if victim.Empty("tok_stale", time.Now()) {
		t.Fatal("a stale message debited a bucket")
	}
}

// A NATS client without the cluster key that listens on the replicas'
// subjects learns nothing of whom they serve: not the JWT subjects and
// token ids that rate-limit usage names, not the client addresses, not
// the upstreams an operator restarts.
func TestBusMessagesAreSealed(t *testing.T) {
	url := startNATS(t)
	limit := policy.Limit{Rate: 1, Burst: 10}
	a := policy.NewLimiter(limit)
	share := shareOn(t, url, testKey, a)
	listener := connect(t, url)
	sub, err := listener.SubscribeSync(share.bus.subject)
	if err != nil {
		t.Fatal(err)
	}
	if err := listener.Flush(); err != nil {
		t.Fatal(err)
	}
	const who = "jwt:alice@example.com"
	if ok, _ := a.Allow(who, time.Now()); !ok {
		t.Fatal("refused")
	}
	m, err := sub.NextMsg(20 * time.Second)
	if err != nil {
		t.Fatalf("no usage message: %v", err)
	}
	if strings.Contains(string(m.Data), "alice") || strings.Contains(fmt.Sprint(m.Header), "alice") {
		t.Fatalf("a listener without the cluster key reads the usage message: %s", m.Data)
	}
}

// Actions announced at once (two operators, two admin requests) all
// reach the other replicas: the sequence numbers go out in order, so the
// replay check drops none of them.
func TestConcurrentAnnouncementsAllArrive(t *testing.T) {
	url := startNATS(t)
	ctx := testCtx(t)
	a, _ := newStorage(t, url, StorageOptions{})
	b, _ := newStorage(t, url, StorageOptions{})
	aNC := connect(t, url)
	a.conn = &Conn{nc: aNC}
	b.conn = &Conn{nc: connect(t, url)}
	got := make(chan string, 1000)
	rb, err := b.Actions(func(act Action) { got <- act.Upstream })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rb.Close)
	if err := b.conn.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	ra, err := a.Actions(func(Action) {})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ra.Close)
	const n = 400
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			if err := ra.Announce(Action{Kind: "restart", Upstream: fmt.Sprintf("u%d", i)}); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if err := aNC.Flush(); err != nil {
		t.Fatal(err)
	}
	// A marker after all of them: once it arrives, every announcement
	// before it has been handled or dropped.
	if err := ra.Announce(Action{Kind: "restart", Upstream: "marker"}); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for {
		select {
		case u := <-got:
			seen[u] = true
		case <-ctx.Done():
			t.Fatal("the marker never arrived")
		}
		if seen["marker"] {
			break
		}
	}
	if len(seen) != n+1 {
		t.Fatalf("%d of %d announcements made at once arrived; the others were dropped as replays", len(seen)-1, n)
	}
}

// A replica that starts (or a limiter a reload makes) knows no sender's
// sequence yet: a message another replica sent a few seconds before it
// started, fresh by its time, that a NATS client recorded and replays to
// it, must not be debited.
func TestReplayToANewReceiverIsRefused(t *testing.T) {
	url := startNATS(t)
	limit := policy.Limit{Rate: 1, Burst: 5}
	victim := policy.NewLimiter(limit)
	vs := shareOn(t, url, testKey, victim)
	attacker := connect(t, url)
	sender := &bus{nc: attacker, sealer: vs.bus.sealer, subject: vs.bus.subject}
	sealed := func(seq uint64, at time.Time, usage map[string]int) *nats.Msg {
		body, _ := json.Marshal(usage)
		data, _ := json.Marshal(envelope{Node: "replica-a", Seq: seq, At: at.UnixMilli(), Body: body})
		return &nats.Msg{Subject: vs.bus.subject, Data: sender.seal(data)}
	}
	recorded := sealed(7, time.Now().Add(-2*time.Second), map[string]int{"tok_victim": 5}) // before vs started
	marker := sealed(8, time.Now(), map[string]int{"marker": 5})
	for _, m := range []*nats.Msg{recorded, marker} {
		if err := attacker.PublishMsg(m); err != nil {
			t.Fatal(err)
		}
	}
	waitEmpty(t, victim, "marker")
	if victim.Empty("tok_victim", time.Now()) {
		t.Fatal("a message sent before this receiver started, replayed to it, was debited")
	}
}

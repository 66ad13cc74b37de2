package cluster

import (
	"encoding/json"
	"log/slog"
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

// A message without the cluster key's MAC, or one replayed, debits
// nothing. Each is followed, on the same connection, by an authentic
// message for a marker key: once the marker's debit shows, the message
// before it has been handled.
func TestSharedLimitsRefuseForgedAndReplayed(t *testing.T) {
	url := startNATS(t)
	limit := policy.Limit{Rate: 1, Burst: 5}
	victim := policy.NewLimiter(limit)
	vs := shareOn(t, url, testKey, victim)
	attacker := connect(t, url)

	// A sender of our own, with the cluster key, to sign the markers and
	// the message that is replayed.
	signer := &LimitShare{mac: vs.mac, subject: vs.subject}
	msg := func(node string, seq uint64, usage map[string]int, sign bool, macKey []byte) *nats.Msg {
		data, _ := json.Marshal(usageMsg{Node: node, Seq: seq, At: time.Now().UnixMilli(), Usage: usage})
		m := &nats.Msg{Subject: vs.subject, Data: data, Header: nats.Header{}}
		if sign {
			s := &LimitShare{mac: macKey, subject: vs.subject}
			m.Header.Set(macHeader, s.sign(data))
		}
		return m
	}
	publish := func(m *nats.Msg) {
		t.Helper()
		if err := attacker.PublishMsg(m); err != nil {
			t.Fatal(err)
		}
	}
	other, _ := Derive(make([]byte, KeySize), "rate-limit usage v1")

	publish(msg("evil", 1, map[string]int{"tok_victim": 100}, false, nil))   // no MAC
	publish(msg("evil", 2, map[string]int{"tok_victim": 100}, true, other))  // another cluster's key
	publish(msg("good", 1, map[string]int{"marker_1": 5}, true, signer.mac)) // authentic
	waitEmpty(t, victim, "marker_1")
	if victim.Empty("tok_victim", time.Now()) {
		t.Fatal("a message without the cluster key's MAC debited a bucket")
	}

	replayed := msg("good", 2, map[string]int{"tok_victim": 3}, true, signer.mac)
	publish(replayed)
	publish(replayed)                                                        // the same message again
	publish(msg("good", 3, map[string]int{"marker_2": 5}, true, signer.mac)) // authentic
	waitEmpty(t, victim, "marker_2")
	for i := range 2 { // 5 - 3 = 2 left: the replay took none
		if ok, _ := victim.Allow("tok_victim", time.Now()); !ok {
			t.Fatalf("event %d of the 2 left was refused: the replayed message was debited again", i+1)
		}
	}

	stale := msg("good", 4, map[string]int{"tok_stale": 5}, true, signer.mac)
	var m usageMsg
	_ = json.Unmarshal(stale.Data, &m)
	m.At = time.Now().Add(-time.Minute).UnixMilli()
	stale.Data, _ = json.Marshal(m)
	stale.Header.Set(macHeader, signer.sign(stale.Data))
	publish(stale)
	publish(msg("good", 5, map[string]int{"marker_3": 5}, true, signer.mac))
	waitEmpty(t, victim, "marker_3")
	if victim.Empty("tok_stale", time.Now()) {
		t.Fatal("a stale message debited a bucket")
	}
}

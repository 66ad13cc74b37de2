package cluster

import (
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// Bounds of a bus.
const (
	busFreshness  = 10 * time.Second // older (or newer) messages are dropped
	maxBusSenders = 256              // replicas remembered for replay checks
)

// bus is an authenticated subject between replicas, on core NATS: each
// message carries its sender, a sequence number and a time, sealed
// (AES-256-GCM, bound to the subject) with a key derived from the cluster
// key for the bus's purpose, so a NATS client without the key neither
// reads what replicas tell each other (token ids, JWT subjects, client
// addresses, upstream names) nor makes a message they accept. A receiver
// drops what does not open (a NATS client without the key), what is over
// busFreshness old, what it sent itself, what a sender already sent (a
// replay), and what a sender it has not heard from yet sent before the
// receiver started (a replay to a replica that just started).
type bus struct {
	nc      *nats.Conn
	sealer  *sealer
	subject string
	node    string

	started time.Time // a sender first heard of must have sent after it

	pubMu sync.Mutex
	seq   uint64 // of the last message published, under pubMu

	mu   sync.Mutex
	last map[string]senderState // node -> its last accepted message
}

type senderState struct {
	seq  uint64
	seen time.Time
}

// envelope is what travels on a bus.
type envelope struct {
	Node string          `json:"n"`
	Seq  uint64          `json:"s"`
	At   int64           `json:"t"` // Unix milliseconds
	Body json.RawMessage `json:"b"`
}

func newBus(nc *nats.Conn, clusterKey []byte, purpose, subject string) (*bus, error) {
	sl, err := newSealer(clusterKey, purpose)
	if err != nil {
		return nil, err
	}
	return &bus{nc: nc, sealer: sl, subject: subject, node: randomHex(8), started: time.Now(), last: map[string]senderState{}}, nil
}

// publish sends body (JSON) to every other replica on the bus.
func (b *bus) publish(body any) error {
	raw, err := json.Marshal(body)
	if err != nil {
		return err
	}
	// Numbered and published under one lock: two messages published at
	// once must leave in the order of their numbers, or the receivers'
	// replay check drops the one numbered first.
	b.pubMu.Lock()
	defer b.pubMu.Unlock()
	b.seq++
	env := envelope{Node: b.node, Seq: b.seq, At: time.Now().UnixMilli(), Body: raw}
	data, _ := json.Marshal(env)
	return b.nc.Publish(b.subject, b.seal(data))
}

// seal seals an envelope for the bus's subject.
func (b *bus) seal(env []byte) []byte { return b.sealer.seal(nil, env, []byte(b.subject)) }

// subscribe calls fn with the body of each authentic, fresh, new message
// another replica sends.
func (b *bus) subscribe(fn func(body json.RawMessage)) (*nats.Subscription, error) {
	sub, err := b.nc.Subscribe(b.subject, func(msg *nats.Msg) {
		if body, ok := b.accept(msg); ok {
			fn(body)
		}
	})
	if err != nil {
		return nil, fmt.Errorf("subscribing to %s: %w", b.subject, err)
	}
	return sub, nil
}

func (b *bus) accept(msg *nats.Msg) (json.RawMessage, bool) {
	data, err := b.sealer.open(msg.Data, []byte(b.subject))
	if err != nil {
		return nil, false // not from a replica of this cluster
	}
	var env envelope
	if json.Unmarshal(data, &env) != nil || env.Node == "" || env.Node == b.node {
		return nil, false
	}
	now := time.Now()
	at := time.UnixMilli(env.At)
	if at.Before(now.Add(-busFreshness)) || at.After(now.Add(busFreshness)) {
		return nil, false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	prev, known := b.last[env.Node]
	if known && env.Seq <= prev.seq {
		return nil, false // a replay
	}
	if !known && env.At < b.started.UnixMilli() {
		// Sent before this receiver started, so it has no sequence of the
		// sender's to check it against: perhaps recorded and replayed. A
		// sender whose clock is behind is heard once it has caught up.
		// Compared in milliseconds, the envelope's resolution: a message
		// sent in the millisecond the receiver started is not older.
		return nil, false
	}
	if !known && len(b.last) >= maxBusSenders {
		for n, st := range b.last {
			if now.Sub(st.seen) > busFreshness {
				delete(b.last, n)
			}
		}
		if len(b.last) >= maxBusSenders {
			return nil, false
		}
	}
	b.last[env.Node] = senderState{seq: env.Seq, seen: now}
	return env.Body, true
}

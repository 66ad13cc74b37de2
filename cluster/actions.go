package cluster

import (
	"encoding/json"
	"fmt"

	"github.com/nats-io/nats.go"
)

// Action is an operator's action on an upstream that every replica carries
// out: "restart" or "retire" (an aggregated route's connections to the
// upstream end; see the admin API).
type Action struct {
	Kind     string `json:"kind"`
	Upstream string `json:"upstream"`
}

// Actions carries operators' actions from the replica that took them to
// every other, authenticated with the cluster key.
type Actions struct {
	bus *bus
	sub *nats.Subscription
}

// Actions starts receiving the actions other replicas announce; fn runs
// each one here.
func (s *Storage) Actions(fn func(Action)) (*Actions, error) {
	if s.conn == nil {
		return nil, fmt.Errorf("admin actions: this storage was not opened on a cluster connection")
	}
	b, err := newBus(s.conn.nc, s.opts.Key, "admin actions v1", "zidane.admin."+s.opts.Bucket)
	if err != nil {
		return nil, err
	}
	sub, err := b.subscribe(func(body json.RawMessage) {
		var a Action
		if json.Unmarshal(body, &a) == nil && (a.Kind == "restart" || a.Kind == "retire") && a.Upstream != "" {
			fn(a)
		}
	})
	if err != nil {
		return nil, fmt.Errorf("admin actions: %w", err)
	}
	return &Actions{bus: b, sub: sub}, nil
}

// Announce tells every other replica to carry out a.
func (a *Actions) Announce(act Action) error { return a.bus.publish(act) }

// Close stops receiving.
func (a *Actions) Close() { _ = a.sub.Unsubscribe() }

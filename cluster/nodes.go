package cluster

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Bounds of the node registry.
const (
	// DefaultNodeTTL is how long a node stays known after its last
	// heartbeat: a node that died is known dead within it.
	DefaultNodeTTL = 5 * time.Second
	// maxNodes bounds the nodes a registry remembers.
	maxNodes = 1024
	// MaxNodeIDLen bounds a node id.
	MaxNodeIDLen = 64
)

// CheckNodeID says whether id may name a node: 1 to 64 of
// [A-Za-z0-9._-], starting with a letter or digit.
func CheckNodeID(id string) error {
	if id == "" || len(id) > MaxNodeIDLen {
		return fmt.Errorf("node id %q: give 1 to %d characters of A-Z a-z 0-9 . _ -, such as gw-1", id, MaxNodeIDLen)
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		alnum := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
		if !alnum && (i == 0 || c != '.' && c != '_' && c != '-') {
			return fmt.Errorf("node id %q: give 1 to %d characters of A-Z a-z 0-9 . _ -, starting with a letter or digit, such as gw-1", id, MaxNodeIDLen)
		}
	}
	return nil
}

// NodeOptions configure this node's entry in the registry.
type NodeOptions struct {
	// Node is this node's id ([CheckNodeID]). Required.
	Node string
	// Advertise is where the other replicas reach this node (a URL).
	// Required.
	Advertise string
	// TTL is how long the others keep this node after its last heartbeat;
	// it heartbeats every third of it. Default DefaultNodeTTL, at least 1s
	// (JetStream expires entries about once a second).
	TTL time.Duration
	// Logger gets the registry's warnings; nil discards them.
	Logger *slog.Logger

	instance string // tests: another process's instance
}

// nodeEntry is what a node's registry entry holds, sealed.
type nodeEntry struct {
	Node      string   `json:"n"`
	Advertise string   `json:"a"`
	Services  []string `json:"s,omitempty"` // the RPC services the node serves (Nodes.Serve)
	Instance  string   `json:"i"`           // random per process: two processes under one id tell each other apart
	At        int64    `json:"t"`           // Unix milliseconds, the heartbeat's time
}

// processInstance tells this process's entries from another process's
// under the same node id; two registries of one process (a config reload
// onto other NATS settings) share it.
var processInstance = randomHex(8)

type nodeSeen struct {
	advertise string
	services  []string
	instance  string
	seen      time.Time // when this node last heartbeat, as this process knows it
}

// Nodes is the node registry: every node that serves sessions other
// replicas may have to forward to writes, every third of the TTL, an entry
// under its id in the KV bucket "<bucket>_nodes", whose entries expire one
// TTL after they were written; each node watches the bucket. An entry is
// sealed (AES-256-GCM, with a key derived from the cluster key for the
// registry, bound to the bucket and the node id), so a NATS user without
// the cluster key cannot add a node, move one's address, or replay one's
// entry under another id; an entry over one TTL old (a replay of an old
// one) is ignored, and a node is known dead one TTL after its last
// heartbeat whatever the bucket holds. Such a user can still delete
// entries, which makes their nodes' sessions unreachable (404) until the
// next heartbeat: NATS permissions must prevent it.
type Nodes struct {
	st       *Storage
	kv       jetstream.KeyValue
	sealer   *sealer
	bucket   string
	self     nodeEntry
	ttl      time.Duration
	log      *slog.Logger
	started  time.Time
	stop     chan struct{}
	done     chan struct{} // the heartbeats ended
	unwatch  context.CancelFunc
	watched  chan struct{} // the watch ended
	closeOne sync.Once
	lastRev  atomic.Uint64 // the revision of this node's last heartbeat

	mu       sync.Mutex
	nodes    map[string]nodeSeen
	services []string  // this node's, in its heartbeats
	dupSeen  time.Time // last time a duplicate of this node's id was logged
}

// StartNodes registers this node in the registry on s, heartbeats for as
// long as the registry is open, and watches the other nodes'. Close
// removes this node's entry.
func (s *Storage) StartNodes(ctx context.Context, opts NodeOptions) (*Nodes, error) {
	if s.js == nil {
		return nil, errors.New("node registry: this storage has no JetStream connection")
	}
	if err := CheckNodeID(opts.Node); err != nil {
		return nil, fmt.Errorf("node registry: %w", err)
	}
	if opts.Advertise == "" {
		return nil, errors.New("node registry: no advertise address")
	}
	if opts.TTL == 0 {
		opts.TTL = DefaultNodeTTL
	}
	if opts.TTL < time.Second {
		return nil, fmt.Errorf("node registry: TTL %v is under 1s", opts.TTL)
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	sl, err := newSealer(s.opts.Key, "node registry v1")
	if err != nil {
		return nil, err
	}
	bucket := s.opts.Bucket + "_nodes"
	kv, err := setUp(ctx, func(ctx context.Context) (jetstream.KeyValue, error) {
		return s.js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
			Bucket: bucket, History: 1, Replicas: s.opts.Replicas, TTL: opts.TTL,
			Description: "caddy-zidane-mcp node registry: each node's address, expiring one TTL after its last heartbeat",
		})
	})
	if err != nil {
		return nil, fmt.Errorf("node registry: KV bucket %q: %w", bucket, err)
	}
	n := &Nodes{
		st: s, kv: kv, sealer: sl, bucket: bucket, ttl: opts.TTL, log: log, started: time.Now(),
		self: nodeEntry{Node: opts.Node, Advertise: opts.Advertise, Instance: cmp.Or(opts.instance, processInstance)},
		stop: make(chan struct{}), done: make(chan struct{}), watched: make(chan struct{}),
		nodes: map[string]nodeSeen{},
	}
	if err := n.beat(ctx); err != nil {
		return nil, fmt.Errorf("node registry: registering node %q: %w", opts.Node, err)
	}
	go n.run()
	wctx, unwatch := context.WithCancel(context.Background())
	n.unwatch = unwatch
	go n.watch(wctx)
	s.nodes.Store(n)
	return n, nil
}

// Nodes is the node registry started on s ([Storage.StartNodes]), or nil.
func (s *Storage) Nodes() *Nodes { return s.nodes.Load() }

func nodeKey(node string) string {
	k, _ := lockKey(node) // one token: a node id has no '/'; '.' is escaped
	return k
}

func (n *Nodes) where(node string) []byte { return where("node", n.bucket, node) }

// beat writes this node's entry.
func (n *Nodes) beat(ctx context.Context) error {
	e := n.self
	e.At = time.Now().UnixMilli()
	n.mu.Lock()
	e.Services = slices.Clone(n.services)
	n.mu.Unlock()
	raw, _ := json.Marshal(e)
	sealed := n.sealer.seal(nil, raw, n.where(e.Node))
	rev, _, err := retry(ctx, func(ctx context.Context) (uint64, error) { return n.kv.Put(ctx, nodeKey(e.Node), sealed) })
	if err == nil {
		n.lastRev.Store(rev)
	}
	return err
}

// watch follows the bucket until the registry closes: a watch of every
// entry, made again when it ends, when the connection comes back after it
// was lost, and when this node's own heartbeat, written a heartbeat ago,
// has not come back through it (its consumer was lost): see keepWatching.
// A new watch brings every entry there is.
func (n *Nodes) watch(ctx context.Context) {
	defer close(n.watched)
	self := nodeKey(n.self.Node)
	var heard, expect uint64 // the revisions of this node's heartbeat the watch brought, and should have
	n.st.keepWatching(ctx, watching{
		name: "the node registry", log: n.log,
		open:  func(ctx context.Context) (jetstream.KeyWatcher, error) { return n.kv.WatchAll(ctx) },
		began: func() { heard, expect = 0, 0 },
		take: func(e jetstream.KeyValueEntry) {
			if e == nil {
				return
			}
			if e.Key() == self {
				heard = max(heard, e.Revision())
			}
			n.apply(e)
		},
		every: n.ttl / 3,
		check: func() bool {
			if expect != 0 && heard < expect {
				return false
			}
			expect = n.lastRev.Load()
			return true
		},
	})
}

func (n *Nodes) run() {
	defer close(n.done)
	t := time.NewTicker(n.ttl / 3)
	defer t.Stop()
	failing := false
	for {
		select {
		case <-n.stop:
			return
		case <-t.C:
			ctx, cancel := context.WithTimeout(context.Background(), n.ttl/3)
			err := n.beat(ctx)
			cancel()
			switch {
			case err != nil && !failing:
				failing = true
				n.log.Warn("node registry: heartbeat failed; the other replicas will take this node for dead, and answer its sessions 404, until it is back", "node", n.self.Node, "error", err)
			case err == nil && failing:
				failing = false
				n.log.Info("node registry: heartbeat back", "node", n.self.Node)
			}
		}
	}
}

// apply takes one watched entry.
func (n *Nodes) apply(entry jetstream.KeyValueEntry) {
	now := time.Now()
	if entry.Operation() != jetstream.KeyValuePut {
		node, err := storageKey(entry.Key())
		if err == nil {
			n.mu.Lock()
			delete(n.nodes, node)
			n.mu.Unlock()
		}
		return
	}
	e, ok := n.open(entry.Key(), entry.Value(), now)
	if !ok {
		return
	}
	// When the heartbeat was written, as the NATS server dates it, but no
	// later than now (an entry read at the watch's start may be up to one
	// TTL old), nor than the time sealed in it: a NATS user without the
	// key who puts an old entry back gets a new server date, not a longer
	// life for a node that died.
	seen := entry.Created()
	if at := time.UnixMilli(e.At); at.Before(seen) {
		seen = at
	}
	if seen.After(now) {
		seen = now
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if e.Node == n.self.Node {
		if e.Instance != n.self.Instance && time.UnixMilli(e.At).After(n.started) && now.Sub(n.dupSeen) > 10*time.Second {
			n.dupSeen = now
			n.log.Error("node registry: another process heartbeats under this node's id; give every replica its own node id (storage zidane_nats's node), or sessions are sent to the wrong one", "node", e.Node, "its_advertise", e.Advertise)
		}
		return
	}
	if _, known := n.nodes[e.Node]; !known && len(n.nodes) >= maxNodes {
		for id, s := range n.nodes {
			if now.Sub(s.seen) > n.ttl {
				delete(n.nodes, id)
			}
		}
		if len(n.nodes) >= maxNodes {
			return
		}
	}
	n.nodes[e.Node] = nodeSeen{advertise: e.Advertise, services: e.Services, instance: e.Instance, seen: seen}
}

// open opens an entry under KV key k: sealed for that node, fresh.
func (n *Nodes) open(k string, sealed []byte, now time.Time) (nodeEntry, bool) {
	node, err := storageKey(k)
	if err != nil || CheckNodeID(node) != nil {
		return nodeEntry{}, false
	}
	raw, err := n.sealer.open(sealed, n.where(node))
	if err != nil {
		return nodeEntry{}, false // not written with this cluster's key, or moved from another id
	}
	var e nodeEntry
	if json.Unmarshal(raw, &e) != nil || e.Node != node || e.Advertise == "" {
		return nodeEntry{}, false
	}
	at := time.UnixMilli(e.At)
	if at.Before(now.Add(-n.ttl)) || at.After(now.Add(n.ttl)) {
		return nodeEntry{}, false // stale: perhaps an old entry put back
	}
	return e, true
}

// Self is this node's id.
func (n *Nodes) Self() string { return n.self.Node }

// Advertise is this node's advertised address.
func (n *Nodes) Advertise() string { return n.self.Advertise }

// TTL is how long a node stays known after its last heartbeat.
func (n *Nodes) TTL() time.Duration { return n.ttl }

// Lookup returns the advertised address of node, if it is alive: it
// heartbeat within the TTL. This node is not in the registry's view.
func (n *Nodes) Lookup(node string) (advertise string, alive bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	s, ok := n.nodes[node]
	if !ok {
		return "", false
	}
	if time.Since(s.seen) > n.ttl {
		delete(n.nodes, node)
		return "", false
	}
	return s.advertise, true
}

// Alive returns the other nodes that heartbeat within the TTL, sorted.
func (n *Nodes) Alive() []string { return n.AliveServing("") }

// AliveServing returns the other nodes that heartbeat within the TTL and
// serve service (any when ""), sorted. What a node serves is in its sealed
// entry: no one without the cluster key can make a node look as if it
// served nothing, where NATS's own "no responders" answer could be forged.
func (n *Nodes) AliveServing(service string) []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []string
	for id, s := range n.nodes {
		if time.Since(s.seen) <= n.ttl && (service == "" || slices.Contains(s.services, service)) {
			out = append(out, id)
		}
	}
	slices.Sort(out)
	return out
}

// Serve adds service to what this node's heartbeats say it serves, and
// heartbeats at once; stop takes it out again.
func (n *Nodes) Serve(service string) (stop func()) {
	n.mu.Lock()
	n.services = append(n.services, service)
	n.mu.Unlock()
	n.beatNow()
	return func() {
		n.mu.Lock()
		if i := slices.Index(n.services, service); i >= 0 {
			n.services = slices.Delete(n.services, i, i+1)
		}
		n.mu.Unlock()
		n.beatNow()
	}
}

func (n *Nodes) beatNow() {
	select {
	case <-n.stop:
		return // closed: its entry is removed, and stays so
	default:
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := n.beat(ctx); err != nil {
		n.log.Warn("node registry: a heartbeat failed; the next one tries again", "error", err)
	}
}

// Close stops heartbeating and removes this node's entry, so the others
// know at once that it is gone; not if another registry of this node (a
// config reload's) wrote it since.
func (n *Nodes) Close() {
	n.closeOne.Do(func() {
		n.st.nodes.CompareAndSwap(n, nil)
		close(n.stop)
		<-n.done
		n.unwatch()
		<-n.watched
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = n.kv.Delete(ctx, nodeKey(n.self.Node), jetstream.LastRevision(n.lastRev.Load()))
	})
}

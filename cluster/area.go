package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// NodeArea is a live copy of what every node keeps in its area of the
// storage: the values under zidane/nodes/<node>/<area>/, which each node
// writes for its own part (through Store and Delete) and every node
// reads. It follows them with one KV watch, so a read costs no round trip
// per value: [NodeArea.Sync] asks the stream's leader for the last
// revision of the area and waits until the watch has brought it, so what
// any node wrote before Sync began is in what Each gives after.
//
// A value is kept only if it opens under the cluster key as the value of
// its own key (so a NATS user without the key can neither forge one nor
// move one from another key, another node's or the same node's), and if
// accept takes it; accept sees the node its key names, and decides what
// the value must say for that node.
type NodeArea struct {
	s       *Storage
	area    string
	filter  string // the KV keys of the area
	subject string // their subjects in the stream
	accept  func(node, name string, value []byte) (any, bool)
	log     *slog.Logger
	cancel  context.CancelFunc
	done    chan struct{}

	mu   sync.Mutex
	cond *sync.Cond // on mu: broadcast when rev or ready move
	vals map[string]areaValue
	rev  uint64 // the stream sequence of the last entry the watch brought
	// ready: the current watch has brought every entry there was when it
	// began (and vals is what it brought).
	ready bool

	// beforeApply, in tests, runs on the watch's goroutine before it takes
	// an entry of key in.
	beforeApply func(key string)
}

type areaValue struct {
	node, name string
	v          any
}

// FollowNodeArea starts following area (one path segment, such as
// "directory"). accept turns the value at zidane/nodes/<node>/<area>/<name>
// into what Each gives, or refuses it; it runs on the watch's goroutine.
// Close stops it.
func (s *Storage) FollowNodeArea(area string, accept func(node, name string, value []byte) (any, bool), log *slog.Logger) (*NodeArea, error) {
	if area == "" || strings.Contains(area, "/") {
		return nil, fmt.Errorf("node area %q: give one path segment", area)
	}
	k, err := kvKey(area)
	if err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	filter := "zidane.nodes.*." + k + ".>"
	a := &NodeArea{
		s: s, area: area, filter: filter, subject: "$KV." + s.opts.Bucket + "." + filter,
		accept: accept, log: log, done: make(chan struct{}), vals: map[string]areaValue{},
	}
	a.cond = sync.NewCond(&a.mu)
	ctx, cancel := context.WithCancel(context.Background())
	a.cancel = cancel
	go a.run(ctx)
	return a, nil
}

// Close stops following.
func (a *NodeArea) Close() {
	a.cancel()
	<-a.done
	a.wake()
}

// NodeKey is the storage key of name in node's area.
func (a *NodeArea) NodeKey(node, name string) string {
	return "zidane/nodes/" + node + "/" + a.area + "/" + name
}

// run keeps a watch on the area, making it again (and reading every value
// again) when it ends, when the connection comes back after it was lost,
// and when it falls behind the stream's leader by a whole WatchCheck (its
// consumer was lost): see keepWatching.
func (a *NodeArea) run(ctx context.Context) {
	defer close(a.done)
	var (
		fresh   map[string]areaValue // the initial values, built up aside
		initial bool                 // the watch is still bringing what there was
		rev     uint64               // the last revision the current watch brought
		missed  uint64               // a revision the last check found and the watch had not brought
	)
	a.s.keepWatching(ctx, watching{
		name: "the nodes' " + a.area + " area", log: a.log,
		open: func(ctx context.Context) (jetstream.KeyWatcher, error) {
			w, err := a.s.data.Watch(ctx, a.filter)
			if err != nil && ctx.Err() == nil {
				a.log.Warn("following the nodes' shared entries failed; trying again", "area", a.area, "error", err)
			}
			return w, err
		},
		began: func() {
			// Until the watch has brought what there was, Each goes on
			// giving the last complete copy, and Sync waits.
			a.mu.Lock()
			a.ready = false
			a.mu.Unlock()
			fresh, initial, rev, missed = map[string]areaValue{}, true, 0, 0
		},
		take: func(e jetstream.KeyValueEntry) {
			if e == nil {
				a.mu.Lock()
				a.vals, a.rev, a.ready = fresh, max(a.rev, rev), true
				a.mu.Unlock()
				a.cond.Broadcast()
				initial = false
				return
			}
			a.mu.Lock()
			hook := a.beforeApply
			a.mu.Unlock()
			if hook != nil {
				hook(e.Key())
			}
			key, v, ok := a.open(ctx, e)
			rev = max(rev, e.Revision())
			if initial {
				put(fresh, key, v, ok)
				return
			}
			a.mu.Lock()
			put(a.vals, key, v, ok)
			a.rev = max(a.rev, rev)
			a.mu.Unlock()
			a.cond.Broadcast()
		},
		every: WatchCheck,
		check: func() bool {
			last, err := a.s.lastRevision(ctx, a.subject)
			if err != nil {
				return true // NATS is away: the reconnection makes the watch again
			}
			if missed != 0 && rev < missed {
				return false
			}
			missed = 0
			if last > rev {
				missed = last
			}
			return true
		},
	})
}

func put(vals map[string]areaValue, key string, v areaValue, ok bool) {
	if key == "" {
		return
	}
	if ok {
		vals[key] = v
	} else {
		delete(vals, key)
	}
}

// open reads e: its storage key, and its value if it is one the area
// keeps (ok false: the key has none, or none that counts).
func (a *NodeArea) open(ctx context.Context, e jetstream.KeyValueEntry) (key string, v areaValue, ok bool) {
	key, err := storageKey(e.Key())
	if err != nil || e.Operation() != jetstream.KeyValuePut {
		return key, v, false
	}
	rest, ok1 := strings.CutPrefix(key, "zidane/nodes/")
	node, rest, ok2 := strings.Cut(rest, "/")
	name, ok3 := strings.CutPrefix(rest, a.area+"/")
	if !ok1 || !ok2 || !ok3 || node == "" || name == "" {
		return key, v, false
	}
	var value []byte
	if raw := e.Value(); len(raw) > 0 && raw[0] == tagBlob {
		// Rare (a value over the inline limit): read it whole.
		lctx, cancel := context.WithTimeout(ctx, blobReadTimeout)
		value, err = a.s.Load(lctx, key)
		cancel()
	} else {
		value, _, err = a.s.decode(ctx, key, raw)
	}
	if err != nil {
		a.log.Warn("a node's shared entry does not open under the cluster key as the value of its key; left out", "key", key, "error", err)
		return key, v, false
	}
	got, ok := a.accept(node, name, value)
	if !ok {
		a.log.Warn("a node's shared entry says what its key does not; left out", "key", key)
		return key, v, false
	}
	return key, areaValue{node: node, name: name, v: got}, true
}

// ErrAreaBehind says the area's copy could not be brought up to date: NATS
// did not answer, or the watch did not catch up in time.
var ErrAreaBehind = errors.New("the nodes' shared entries could not be read up to date (NATS away?)")

// Sync waits, until ctx ends, until the copy holds every value of the area
// written before Sync was called.
func (a *NodeArea) Sync(ctx context.Context) error {
	m, err := a.s.leader.GetLastMsg("KV_"+a.s.opts.Bucket, a.subject, nats.Context(ctx))
	var last uint64
	switch {
	case errors.Is(err, nats.ErrMsgNotFound):
	case err != nil:
		return fmt.Errorf("%w: %w", ErrAreaBehind, err)
	default:
		last = m.Sequence
	}
	stop := context.AfterFunc(ctx, a.wake)
	defer stop()
	a.mu.Lock()
	defer a.mu.Unlock()
	for !a.ready || a.rev < last {
		if ctx.Err() != nil {
			return fmt.Errorf("%w: %w", ErrAreaBehind, ctx.Err())
		}
		a.cond.Wait()
	}
	return nil
}

func (a *NodeArea) wake() {
	a.mu.Lock()
	a.cond.Broadcast()
	a.mu.Unlock()
}

// Each calls fn with every value of the copy that accept took, and the
// node and name of its key, under the copy's lock: fn must not block.
func (a *NodeArea) Each(fn func(node, name string, v any)) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, v := range a.vals {
		fn(v.node, v.name, v.v)
	}
}

package caddymodule

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/Tahul/caddy-zidane-mcp/broker"
	"github.com/Tahul/caddy-zidane-mcp/cluster"
	"github.com/Tahul/caddy-zidane-mcp/pins"
	"github.com/Tahul/caddy-zidane-mcp/storage"
)

// pinsPool holds one pin store per storage backend, across reloads: the
// changes it has not written yet, and its namespaces' watches, outlive a
// config.
var pinsPool = caddy.NewUsagePool()

// pinsState is a pooled pin store and the loop that writes it.
type pinsState struct {
	store  *pins.Store
	cancel context.CancelFunc
	done   chan struct{}
	cs     *cluster.Storage // set on NATS storage: namespaces are watched

	mu      sync.Mutex
	watched map[string]context.CancelFunc
}

// pinsFlushFor bounds how long a stopping server spends writing the pins
// it has not written yet.
const pinsFlushFor = 10 * time.Second

func (p *pinsState) Destruct() error {
	p.mu.Lock()
	for _, stop := range p.watched {
		stop()
	}
	p.mu.Unlock()
	p.cancel()
	<-p.done
	return nil
}

// loadPins returns the pooled pin store of st; release it with
// pinsPool.Delete(key).
func loadPins(st storage.Storage) (*pinsState, string, error) {
	key := "pins|" + storageKey(st)
	v, _, err := pinsPool.LoadOrNew(key, func() (caddy.Destructor, error) {
		log := auditSlog().With("store", "pins")
		ctx, cancel := context.WithCancel(context.Background())
		p := &pinsState{store: pins.NewStore(st, log, auditPinEvent), cancel: cancel, done: make(chan struct{}), watched: map[string]context.CancelFunc{}}
		p.cs, _ = st.(*cluster.Storage)
		go func() {
			defer close(p.done)
			p.store.Run(ctx, pinsFlushFor)
		}()
		return p, nil
	})
	if err != nil {
		return nil, "", err
	}
	return v.(*pinsState), key, nil
}

// open opens namespace ns with policy p for a route. On NATS storage the
// namespace is watched, so an approval on another replica is in force here
// as soon as it is written; the watch starts before the namespace is read,
// and the store's loop reads every namespace again each second (pins.Run),
// so that a write the watch did not deliver (one before it started, one
// while NATS was away) is taken in all the same.
func (p *pinsState) open(ctx context.Context, ns string, pol pins.Policy) {
	if p.cs != nil && pol.Mode != pins.Off {
		p.watch(ns)
	}
	if err := p.store.Open(ctx, ns, pol); err != nil {
		// The namespace withholds what it cannot check until the store's
		// loop reads it (strict) or lets it through (warn).
		auditLogger().Error("reading tool pins; tools of this namespace are withheld (pin strict) until they are read",
			zap.String("namespace", ns), zap.Error(err))
	}
}

func (p *pinsState) watch(ns string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.watched[ns]; ok {
		return
	}
	wctx, stop := context.WithCancel(context.Background())
	p.watched[ns] = stop
	go p.cs.Watch(wctx, pins.Key(ns), func() {
		rctx, cancel := context.WithTimeout(wctx, 15*time.Second)
		defer cancel()
		if err := p.store.Reload(rctx, ns); err != nil && wctx.Err() == nil {
			auditLogger().Warn("reading tool pins after another replica wrote them", zap.String("namespace", ns), zap.Error(err))
		}
	})
}

// auditPinEvent writes a change to the pins as one audit line: its event
// is the kind of item and what happened to it (tool_changed,
// prompt_pinned, server_approved, …), and it names the item (name, and
// tool for a tool).
func auditPinEvent(ev pins.Event) {
	l := auditLogger()
	fields := []zap.Field{
		zap.String("event", ev.Item.String()+"_"+ev.Kind),
		zap.String("namespace", ev.Namespace),
		zap.String("kind", ev.Item.String()),
		zap.String("name", ev.Name),
	}
	if ev.Item == pins.Tool {
		fields = append(fields, zap.String("tool", ev.Name))
	}
	fields = append(fields, zap.String("new_digest", ev.New))
	if ev.Old != "" {
		fields = append(fields, zap.String("old_digest", ev.Old))
	}
	if len(ev.Diff) > 0 {
		fields = append(fields, zap.Strings("changed_fields", pins.ChangedFields(ev.Diff)))
		diff, _ := json.Marshal(clipDiff(ev.Diff))
		fields = append(fields, zap.String("diff", string(diff)))
	}
	switch ev.Kind {
	case "changed":
		l.Warn("a definition changed since it was pinned", fields...)
	case "added":
		l.Warn("a tool new to its upstream's pinned tools is held for approval", fields...)
	case "unrecorded":
		l.Warn("a listing could not be pinned or its change recorded (too large, or past the bounds); with pin strict its use is refused", fields...)
	case "pinned":
		l.Info("a definition was pinned", fields...)
	case "upgraded":
		l.Info("a tool pinned by an older gateway, whose pin covered fewer of its members, is now pinned whole", fields...)
	default:
		l.Info("a pin changed", fields...)
	}
}

// clipDiff keeps each field of a diff in the audit line under 2 KiB; the
// whole is in `caddy zidane tools diff`.
func clipDiff(d []pins.FieldDiff) []pins.FieldDiff {
	const max = 2 << 10
	clip := func(b json.RawMessage) json.RawMessage {
		if len(b) <= max {
			return b
		}
		s, _ := json.Marshal(string(b[:max]) + "…")
		return s
	}
	out := make([]pins.FieldDiff, len(d))
	for i, f := range d {
		out[i] = pins.FieldDiff{Field: f.Field, Old: clip(f.Old), New: clip(f.New)}
	}
	return out
}

// openPins opens namespace ns for this route and returns the store;
// closePins releases what it opened.
func (b *routeBase) openPins(ctx context.Context, ns string, pol pins.Policy) *pins.Store {
	b.site.app.pins.open(ctx, ns, pol)
	b.pinNS = append(b.pinNS, ns)
	return b.site.app.pins.store
}

func (b *routeBase) closePins() {
	for _, ns := range b.pinNS {
		b.site.app.pins.store.Close(ns)
	}
	b.pinNS = nil
}

// pinPolicy is the guard's pin policy: pin (default strict) and new_tools
// (default hold; allow for an upstream URL that the broker's rule takes
// for a local server).
func (g *Guard) pinPolicy() (pins.Policy, error) {
	pol := pins.Policy{Mode: pins.Strict, NewTools: pins.HoldNew}
	var err error
	if g.Pin != "" {
		if pol.Mode, err = pins.ParseMode(g.Pin); err != nil {
			return pol, fmt.Errorf("guard %w", err)
		}
	}
	if g.Upstream != "" && (broker.Upstream{URL: g.Upstream}).Local() {
		pol.NewTools = pins.AllowNew
	}
	if g.NewTools != "" {
		if pol.NewTools, err = pins.ParseNewTools(g.NewTools); err != nil {
			return pol, fmt.Errorf("guard %w", err)
		}
	}
	return pol, nil
}

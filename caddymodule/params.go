package caddymodule

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io/fs"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/Tahul/caddy-zidane-mcp/cluster"
	"github.com/Tahul/caddy-zidane-mcp/edge"
)

// paramsPool keeps each route's learned x-mcp-header bindings (see
// edge.ParamHeaders) across config reloads, keyed by what the route
// fronts: a reload that keeps the route keeps what it learned. On NATS
// storage the key names the storage too, whose connection the sharing
// uses.
var paramsPool = caddy.NewUsagePool()

type paramsEntry struct {
	ph   *edge.ParamHeaders
	stop context.CancelFunc // ends the sharing, on NATS storage
	done chan struct{}
}

func (e *paramsEntry) Destruct() error {
	if e.stop != nil {
		e.stop()
		<-e.done
	}
	return nil
}

// sharedParams returns the pooled bindings store named name; the route
// releases it in Cleanup. On NATS storage, what each replica learns is
// shared with the others (shareParams).
func (b *routeBase) sharedParams(ctx caddy.Context, name string) *edge.ParamHeaders {
	key := name
	cs, shared := ctx.Storage().(*cluster.Storage)
	if shared {
		key += "|" + storageKey(cs)
	}
	v, _, _ := paramsPool.LoadOrNew(key, func() (caddy.Destructor, error) {
		e := &paramsEntry{ph: new(edge.ParamHeaders)}
		if shared {
			sctx, stop := context.WithCancel(context.Background())
			e.stop, e.done = stop, make(chan struct{})
			go func() {
				defer close(e.done)
				shareParams(sctx, cs, paramsStorageKey(name), e.ph, b.site.logger.Named("params"))
			}()
		}
		return e, nil
	})
	b.paramsKey = key
	return v.(*paramsEntry).ph
}

// paramsStorageKey is where the bindings of the route named name are
// shared: every replica whose site fronts the same thing names it alike.
func paramsStorageKey(name string) string {
	sum := sha256.Sum256([]byte(name))
	return "zidane/param-bindings/" + hex.EncodeToString(sum[:16])
}

// Bounds of the sharing: how long one storage operation may take, how
// large a shared document may be (a route's tools with a few bindings
// each are kilobytes), and how often one replica writes it: an upstream
// that changes its tools on every listing costs NATS at most two writes a
// second per route.
const (
	paramsOpTimeout = 15 * time.Second
	paramsMaxShared = 4 << 20
	paramsMinGap    = 500 * time.Millisecond
)

// shareParams shares ph with every replica on st under key until ctx ends:
// it takes in what is stored when it starts and each time another replica
// writes it (a watch, which tells a write it missed within
// cluster.WatchCheck, 2 s, and has it read again every
// cluster.WatchResync, 30 s, whatever happened), and writes ph, with what
// is stored merged in, each time ph learns something (at most once per
// paramsMinGap). Writes are one at a time and after the change that asked
// for them, so the last write holds all that was learned before it; two
// replicas writing at once may each drop what the other just wrote, which
// the next listing on either writes again. Storage errors are logged; the
// bindings this replica learned stay in use.
func shareParams(ctx context.Context, st *cluster.Storage, key string, ph *edge.ParamHeaders, log *zap.Logger) {
	changed := make(chan struct{}, 1)
	ph.OnChange(func() {
		select {
		case changed <- struct{}{}:
		default: // a write is already due, and will hold this change
		}
	})
	load := func() {
		octx, cancel := context.WithTimeout(ctx, paramsOpTimeout)
		defer cancel()
		data, err := st.Load(octx, key)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			return
		case err != nil:
			if ctx.Err() == nil {
				log.Warn("reading the shared x-mcp-header bindings", zap.Error(err))
			}
			return
		case len(data) > paramsMaxShared:
			log.Warn("the shared x-mcp-header bindings are over the size this replica reads; ignored", zap.Int("bytes", len(data)))
			return
		}
		if skipped, err := ph.Merge(data); err != nil {
			log.Warn("the shared x-mcp-header bindings do not read", zap.Error(err))
		} else if skipped > 0 {
			log.Warn("shared x-mcp-header bindings of some tools break the rules and were not taken", zap.Int("tools", skipped))
		}
	}
	load()
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		st.Watch(ctx, key, load)
	}()
	defer func() { <-watched }()
	for {
		select {
		case <-ctx.Done():
			return
		case <-changed:
		}
		load()
		data := ph.Export()
		if len(data) > paramsMaxShared {
			log.Warn("the x-mcp-header bindings are over the size replicas share; not shared", zap.Int("bytes", len(data)))
			continue
		}
		octx, cancel := context.WithTimeout(ctx, paramsOpTimeout)
		err := st.Store(octx, key, data)
		cancel()
		if err != nil && ctx.Err() == nil {
			log.Warn("sharing the x-mcp-header bindings", zap.Error(err))
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(paramsMinGap):
		}
	}
}

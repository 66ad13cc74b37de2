package caddymodule

import (
	"log/slog"
	"testing"

	"github.com/caddyserver/certmagic"

	"github.com/Tahul/caddy-zidane-mcp/broker"
)

// The upstreams given to sessions (session_upstreams) are pinned as every
// route's are: their egress route carries the pin store, under the
// upstream's own namespace (the one the pass-through route uses), in the
// upstream's mode.
func TestEgressRoutesArePinned(t *testing.T) {
	st := &certmagic.FileStorage{Path: t.TempDir()}
	ps, key, err := loadPins(st)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = pinsPool.Delete(key) })
	a := &App{pins: ps, SessionUpstreams: []string{"remote", "local"}, upstreams: map[string]broker.Upstream{}}
	for name, url := range map[string]string{"remote": "https://mcp.example.com/mcp", "local": "http://127.0.0.1:9/mcp"} {
		u, err := broker.Normalize(broker.Upstream{Name: name, URL: url})
		if err != nil {
			t.Fatal(err)
		}
		a.upstreams[name] = u
	}
	routes, err := a.buildEgress(slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	for name, mode := range map[string]string{"remote": "strict", "local": "warn"} {
		r := routes[name]
		if r == nil || r.route.Pins != ps.store {
			t.Fatalf("egress route %s carries no pin store", name)
		}
		list, err := ps.store.List(name)
		if err != nil || len(list) != 1 || list[0].Mode != mode {
			t.Fatalf("namespace %s: %+v %v, want mode %s", name, list, err, mode)
		}
	}
}

package caddymodule

import (
	"log/slog"
	"strings"
	"testing"

	"github.com/Tahul/caddy-zidane-mcp/broker/upstream"

	"github.com/caddyserver/certmagic"

	"github.com/Tahul/caddy-zidane-mcp/pins"
)

// The upstreams given to sessions (session_upstreams) are pinned as every
// route's are: their egress route carries the pin store, under the
// upstream's own namespace (the one the pass-through route uses), in the
// upstream's mode and new_tools.
func TestEgressRoutesArePinned(t *testing.T) {
	st := &certmagic.FileStorage{Path: t.TempDir()}
	ps, key, err := loadPins(st)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = pinsPool.Delete(key) })
	a := &App{pins: ps, SessionUpstreams: []string{"remote", "local"}, upstreams: map[string]upstream.Config{}}
	for name, url := range map[string]string{"remote": "https://mcp.example.com/mcp", "local": "http://127.0.0.1:9/mcp"} {
		u, err := upstream.Normalize(upstream.Config{Name: name, URL: url})
		if err != nil {
			t.Fatal(err)
		}
		a.upstreams[name] = u
	}
	routes, err := a.buildEgress(slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string][2]string{"remote": {"strict", "hold"}, "local": {"warn", "allow"}} {
		r := routes[name]
		if r == nil || r.route.Pins != ps.store {
			t.Fatalf("egress route %s carries no pin store", name)
		}
		list, err := ps.store.List(name)
		if err != nil || len(list) != 1 || list[0].Mode != want[0] || list[0].NewTools != want[1] {
			t.Fatalf("namespace %s: %+v %v, want mode %s, new_tools %s", name, list, err, want[0], want[1])
		}
	}
}

// A guarded site pins strictly and holds new tools by default: behind
// reverse_proxy the guard cannot see where its server is. With an upstream
// of its own on loopback, new tools are pinned on first sight; pin and
// new_tools, when set, are followed, and a bad value is refused.
func TestGuardPinPolicy(t *testing.T) {
	for _, c := range []struct {
		g    Guard
		want pins.Policy
	}{
		{Guard{}, pins.Policy{Mode: pins.Strict, NewTools: pins.HoldNew}},
		{Guard{Upstream: "https://mcp.example.com/mcp"}, pins.Policy{Mode: pins.Strict, NewTools: pins.HoldNew}},
		{Guard{Upstream: "http://127.0.0.1:9000/mcp"}, pins.Policy{Mode: pins.Strict, NewTools: pins.AllowNew}},
		{Guard{Upstream: "http://127.0.0.1:9000/mcp", NewTools: "hold"}, pins.Policy{Mode: pins.Strict, NewTools: pins.HoldNew}},
		{Guard{Pin: "warn", NewTools: "allow"}, pins.Policy{Mode: pins.Warn, NewTools: pins.AllowNew}},
	} {
		got, err := c.g.pinPolicy()
		if err != nil || got != c.want {
			t.Errorf("%+v: %+v %v, want %+v", c.g, got, err, c.want)
		}
	}
	if _, err := (&Guard{NewTools: "trust"}).pinPolicy(); err == nil || !strings.Contains(err.Error(), "use allow or hold") {
		t.Errorf("new_tools trust: %v", err)
	}
}

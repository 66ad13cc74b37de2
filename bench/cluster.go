package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
)

// clusterGateway is a second caddy for -cluster: the same guarded sites as
// the single-node gateway's, on NATS storage (storage zidane_nats) over a
// nats-server with JetStream, so that its rows and the single node's
// guard rows run in the same rounds.
type clusterGateway struct {
	nats, caddy *proc
	routes      []route
}

func (g *clusterGateway) stop() {
	g.caddy.stop()
	g.nats.stop()
}

// startClusterGateway builds nats-server, starts it and a caddy whose
// storage is on it, with a guard site in front of upstream (2025-11-25)
// and one in front of modern (2026-07-28).
func startClusterGateway(ctx context.Context, root, work, caddyBin, upstream, modern string) (*clusterGateway, error) {
	dir := filepath.Join(work, "cluster")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	natsBin, err := build(ctx, root, dir, "nats-server", "github.com/nats-io/nats-server/v2")
	if err != nil {
		return nil, err
	}
	ports := make([]int, 4)
	for i := range ports {
		if ports[i], err = freePort(); err != nil {
			return nil, err
		}
	}
	natsPort, admin, guardPort, modernPort := ports[0], ports[1], ports[2], ports[3]
	nats, err := start(ctx, natsBin, nil, "-a", "127.0.0.1", "-p", fmt.Sprint(natsPort), "-js", "-sd", filepath.Join(dir, "js"))
	if err != nil {
		return nil, err
	}
	if err := waitListening(ctx, fmt.Sprintf("127.0.0.1:%d", natsPort)); err != nil {
		nats.stop()
		return nil, fmt.Errorf("nats-server: %v\n%s", err, nats.logs)
	}
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	guard := func(port int, to string) string {
		return fmt.Sprintf(`
http://127.0.0.1:%d {
	zidane_mcp {
		guard
		rate_limit {
			per_token 1000000/s 1000000
		}
	}
	reverse_proxy %s
}
`, port, to)
	}
	caddyfile := fmt.Sprintf(`{
	admin 127.0.0.1:%d
	log {
		level ERROR
	}
	storage zidane_nats
	zidane {
		cluster {
			url nats://127.0.0.1:%d
		}
	}
}
%s%s`, admin, natsPort, guard(guardPort, upstream), guard(modernPort, modern))
	path := filepath.Join(dir, "Caddyfile")
	if err := os.WriteFile(path, []byte(caddyfile), 0o600); err != nil {
		nats.stop()
		return nil, err
	}
	env := append(caddyEnv(dir, admin), "ZIDANE_CLUSTER_KEY="+base64.StdEncoding.EncodeToString(key))
	p, err := start(ctx, caddyBin, env, "run", "--config", path, "--adapter", "caddyfile")
	if err != nil {
		nats.stop()
		return nil, err
	}
	g := &clusterGateway{nats: nats, caddy: p}
	if err := waitListening(ctx, fmt.Sprintf("127.0.0.1:%d", guardPort)); err != nil {
		g.stop()
		return nil, fmt.Errorf("caddy on NATS storage: %v\n%s", err, p.logs)
	}
	token, err := createToken(ctx, caddyBin, env, "bench", "mcp")
	if err != nil {
		g.stop()
		return nil, err
	}
	pid, adminAddr := p.cmd.Process.Pid, fmt.Sprintf("127.0.0.1:%d", admin)
	g.routes = []route{
		{name: "guard+reverse_proxy on NATS storage", url: fmt.Sprintf("http://127.0.0.1:%d/mcp", guardPort), token: token, pid: pid, admin: adminAddr,
			base: "guard+reverse_proxy"},
		{name: "guard+reverse_proxy on NATS storage " + modernProtocolVersion, url: fmt.Sprintf("http://127.0.0.1:%d/mcp", modernPort),
			token: token, pid: pid, admin: adminAddr, version: modernProtocolVersion, base: "guard+reverse_proxy " + modernProtocolVersion},
	}
	return g, nil
}

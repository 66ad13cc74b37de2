package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// gateway is the caddy process with every route in one config.
type gateway struct {
	p      *proc
	routes []route
}

func (g *gateway) pid() int { return g.p.cmd.Process.Pid }
func (g *gateway) stop()    { g.p.stop() }

// startGateway runs caddy with a site per route, all on loopback, and
// creates the token the guarded routes use. The rate limit is set far above
// what the run sends, so that it is measured but never triggers.
func startGateway(ctx context.Context, bin, work, upstream string) (*gateway, error) {
	ports := make([]int, 3)
	for i := range ports {
		p, err := freePort()
		if err != nil {
			return nil, err
		}
		ports[i] = p
	}
	admin, rpPort, guardPort := ports[0], ports[1], ports[2]
	caddyfile := fmt.Sprintf(`{
	admin 127.0.0.1:%d
	log {
		level ERROR
	}
}

http://127.0.0.1:%d {
	reverse_proxy %s
}

http://127.0.0.1:%d {
	zidane_mcp {
		guard
		rate_limit {
			per_token 1000000/s 1000000
		}
	}
	reverse_proxy %s
}
`, admin, rpPort, upstream, guardPort, upstream)
	path := filepath.Join(work, "Caddyfile")
	if err := os.WriteFile(path, []byte(caddyfile), 0o600); err != nil {
		return nil, err
	}
	env := []string{
		"HOME=" + work,
		"XDG_DATA_HOME=" + filepath.Join(work, "data"),
		"XDG_CONFIG_HOME=" + filepath.Join(work, "config"),
		fmt.Sprintf("CADDY_ADMIN=127.0.0.1:%d", admin),
	}
	p, err := start(ctx, bin, env, "run", "--config", path, "--adapter", "caddyfile")
	if err != nil {
		return nil, err
	}
	g := &gateway{p: p}
	if err := waitListening(ctx, fmt.Sprintf("127.0.0.1:%d", guardPort)); err != nil {
		g.stop()
		return nil, fmt.Errorf("caddy: %v\n%s", err, p.logs)
	}
	cmd := exec.CommandContext(ctx, bin, "zidane", "token", "create", "--name", "bench", "--scope", "mcp")
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.Output()
	if err != nil {
		g.stop()
		return nil, fmt.Errorf("creating the bench token: %v", err)
	}
	token := strings.TrimSpace(string(out))
	g.routes = []route{
		{name: "reverse_proxy", url: fmt.Sprintf("http://127.0.0.1:%d/mcp", rpPort), viaCaddy: true},
		{name: "guard+reverse_proxy", url: fmt.Sprintf("http://127.0.0.1:%d/mcp", guardPort), token: token, viaCaddy: true},
	}
	return g, nil
}

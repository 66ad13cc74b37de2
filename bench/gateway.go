package main

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// gateway is the caddy process with every route in one config.
type gateway struct {
	p      *proc
	routes []route
	admin  string // the admin API's address
}

func (g *gateway) pid() int { return g.p.cmd.Process.Pid }
func (g *gateway) stop()    { g.p.stop() }

// startGateway runs caddy with a site per route, all on loopback, and
// creates the token the guarded routes use. The rate limit is set far above
// what the run sends, so that it is measured but never triggers. zidane
// holds more lines for the global zidane option. modern and modern2, when
// set, are stateless upstreams (MCP 2026-07-28): each route is offered in
// front of them too, for clients that speak 2026-07-28. Each guard site
// has a resource of its own: what a guard keeps of its server is kept
// under it.
func startGateway(ctx context.Context, bin, work, upstream, second, modern, modern2, zidane string, rules bool) (*gateway, error) {
	ports := make([]int, 12)
	for i := range ports {
		p, err := freePort()
		if err != nil {
			return nil, err
		}
		ports[i] = p
	}
	admin, guardPort := ports[0], ports[2]
	caddyfile := gatewayCaddyfile(ports, upstream, second, modern, modern2, zidane)
	path := filepath.Join(work, "Caddyfile")
	if err := os.WriteFile(path, []byte(caddyfile), 0o600); err != nil {
		return nil, err
	}
	env := caddyEnv(work, admin)
	p, err := start(ctx, bin, env, "run", "--config", path, "--adapter", "caddyfile")
	if err != nil {
		return nil, err
	}
	g := &gateway{p: p, admin: fmt.Sprintf("127.0.0.1:%d", admin)}
	if err := waitListening(ctx, fmt.Sprintf("127.0.0.1:%d", guardPort)); err != nil {
		g.stop()
		return nil, fmt.Errorf("caddy: %v\n%s", err, p.logs)
	}
	token, err := createToken(ctx, bin, env, "bench", "mcp")
	if err != nil {
		g.stop()
		return nil, err
	}
	g.routes = gatewayRoutes(g, ports, token, second != "", modern != "")
	if rules {
		g.routes = append(g.routes, route{name: rulesRoute, url: fmt.Sprintf("http://127.0.0.1:%d/mcp", ports[11]), token: token,
			pid: g.pid(), admin: g.admin, base: "guard+reverse_proxy"})
	}
	return g, nil
}

// gatewayCaddyfile is the Caddyfile of the gateway on ports: the admin
// API, then reverse_proxy, guard, broker pass-through, guard upstream and,
// with a second upstream, the aggregated route, in front of upstream; and
// the same in front of modern (and modern2) when there is one.
func gatewayCaddyfile(ports []int, upstream, second, modern, modern2, zidane string) string {
	admin, rpPort, guardPort, brokerPort, aggPort := ports[0], ports[1], ports[2], ports[3], ports[4]
	modernSites, modernUpstreams := "", ""
	if modern != "" {
		modernSites, modernUpstreams = modernCaddyfile(ports, modern, modern2)
	}
	// The aggregated route runs over both upstreams when there is a second.
	second2, aggregated := second, ""
	if second2 == "" {
		second2 = upstream
	} else {
		aggregated = fmt.Sprintf(`
http://127.0.0.1:%d {
	zidane_mcp {
		aggregate bench bench2
		rate_limit {
			per_token 1000000/s 1000000
		}
	}
}
`, aggPort)
	}
	return fmt.Sprintf(`{
	admin 127.0.0.1:%d
	log {
		level ERROR
	}
	zidane {
		upstream bench http://%s/mcp
		upstream bench2 http://%s/mcp
%s%s
	}
}

http://127.0.0.1:%d {
	reverse_proxy %s
}

http://127.0.0.1:%d {
	zidane_mcp {
		guard
		resource http://127.0.0.1:%d/mcp
		rate_limit {
			per_token 1000000/s 1000000
		}
	}
	reverse_proxy %s
}

http://127.0.0.1:%d {
	zidane_mcp {
		broker bench
		rate_limit {
			per_token 1000000/s 1000000
		}
	}
}

http://127.0.0.1:%d {
	zidane_mcp {
		guard {
			upstream http://%s/mcp
		}
		resource http://127.0.0.1:%d/mcp
		rate_limit {
			per_token 1000000/s 1000000
		}
	}
}

http://127.0.0.1:%d {
	zidane_mcp {
		guard
		resource http://127.0.0.1:%d/mcp
		rate_limit {
			per_token 1000000/s 1000000
		}
%s
	}
	reverse_proxy %s
}
%s%s`, admin, upstream, second2, modernUpstreams, zidane, rpPort, upstream, guardPort, guardPort, upstream, brokerPort, ports[9], upstream, ports[9],
		ports[11], ports[11], benchRules, upstream, aggregated, modernSites)
}

// rulesRoute is the guard route with benchRules (-rules), whose ratios are
// to the guard route without them.
const rulesRoute = "guard+reverse_proxy 5 rules"

// benchRules are five rules of the kinds docs/policy.md shows, over the
// tool's name, the token's scopes and an argument (the echo call's
// message, which one rule reads on every call): none holds for the
// benchmark's calls, so each call is decided by all five, and goes on.
const benchRules = `		policy {
			deny "tool.name == 'drop_table'" "dropping tables is not allowed here"
			deny "tool.name == 'deploy' && args.environment == 'production'" "production deploys are not allowed here"
			deny "tool.name == 'echo' && args.message.matches('(?i)\\b(drop|truncate)\\b')" "no destructive statements"
			deny "'readonly' in principal.scopes && tool.name.startsWith('write_')" "this token is read-only"
			allow "'db' in principal.scopes && tool.name == 'run_query'"
		}`

// modernCaddyfile is the part of the gateway's Caddyfile in front of the
// 2026-07-28 upstreams modern and modern2: its sites, and its upstreams
// for the zidane block.
func modernCaddyfile(ports []int, modern, modern2 string) (sites, upstreams string) {
	upstreams = fmt.Sprintf("\t\tupstream benchm http://%s/mcp\n\t\tupstream benchm2 http://%s/mcp\n", modern, cmp.Or(modern2, modern))
	sites = fmt.Sprintf(`
http://127.0.0.1:%d {
	reverse_proxy %s
}

http://127.0.0.1:%d {
	zidane_mcp {
		guard
		resource http://127.0.0.1:%d/mcp
		rate_limit {
			per_token 1000000/s 1000000
		}
	}
	reverse_proxy %s
}

http://127.0.0.1:%d {
	zidane_mcp {
		broker benchm
		rate_limit {
			per_token 1000000/s 1000000
		}
	}
}

http://127.0.0.1:%d {
	zidane_mcp {
		guard {
			upstream http://%s/mcp
		}
		resource http://127.0.0.1:%d/mcp
		rate_limit {
			per_token 1000000/s 1000000
		}
	}
}

http://127.0.0.1:%d {
	zidane_mcp {
		aggregate benchm benchm2
		rate_limit {
			per_token 1000000/s 1000000
		}
	}
}
`, ports[5], modern, ports[6], ports[6], modern, ports[7], ports[10], modern, ports[10], ports[8])
	return sites, upstreams
}

// gatewayRoutes are the routes of the gateway g that gatewayCaddyfile
// wrote on ports, for clients with token.
func gatewayRoutes(g *gateway, ports []int, token string, aggregated, modern bool) []route {
	rpPort, guardPort, brokerPort, aggPort := ports[1], ports[2], ports[3], ports[4]
	routes := []route{
		{name: "reverse_proxy", url: fmt.Sprintf("http://127.0.0.1:%d/mcp", rpPort), pid: g.pid(), admin: g.admin},
		{name: "guard+reverse_proxy", url: fmt.Sprintf("http://127.0.0.1:%d/mcp", guardPort), token: token, pid: g.pid(), admin: g.admin},
		{name: "broker pass-through", url: fmt.Sprintf("http://127.0.0.1:%d/mcp", brokerPort), token: token, pid: g.pid(), admin: g.admin},
		{name: "guard upstream", url: fmt.Sprintf("http://127.0.0.1:%d/mcp", ports[9]), token: token, pid: g.pid(), admin: g.admin},
	}
	if aggregated {
		routes = append(routes, route{name: "aggregated (2 upstreams)", url: fmt.Sprintf("http://127.0.0.1:%d/mcp", aggPort),
			token: token, pid: g.pid(), admin: g.admin, prefix: "mcp_bench_"})
	}
	if modern {
		m := func(name string, port int, token, prefix string) route {
			return route{name: name + " " + modernProtocolVersion, url: fmt.Sprintf("http://127.0.0.1:%d/mcp", port), token: token,
				pid: g.pid(), admin: g.admin, prefix: prefix, version: modernProtocolVersion}
		}
		routes = append(routes, m("reverse_proxy", ports[5], "", ""), m("guard+reverse_proxy", ports[6], token, ""),
			m("broker pass-through", ports[7], token, ""), m("guard upstream", ports[10], token, ""),
			m("aggregated (2 upstreams)", ports[8], token, "mcp_benchm_"))
	}
	return routes
}

// createToken runs `caddy zidane token create` against the running caddy
// whose environment is env, with more flags in extra, and returns the
// token it prints once.
func createToken(ctx context.Context, bin string, env []string, name, scope string, extra ...string) (string, error) {
	cmd := exec.CommandContext(ctx, bin, append([]string{"zidane", "token", "create", "--name", name, "--scope", scope}, extra...)...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("creating the %s token: %v", name, err)
	}
	return strings.TrimSpace(string(out)), nil
}

// caddyEnv keeps a caddy's data, config and admin address inside dir.
func caddyEnv(dir string, admin int) []string {
	return []string{
		"HOME=" + dir,
		"XDG_DATA_HOME=" + filepath.Join(dir, "data"),
		"XDG_CONFIG_HOME=" + filepath.Join(dir, "config"),
		fmt.Sprintf("CADDY_ADMIN=127.0.0.1:%d", admin),
	}
}

// sessionsGateway is the caddy of the session-engine run: one site with the
// sessions endpoint, whose agents are the built-in demo agent, that is this
// same binary.
type sessionsGateway struct {
	p     *proc
	url   string // the MCP endpoint
	admin string // the admin API's address
	token string // a chat token
}

func (g *sessionsGateway) pid() int { return g.p.cmd.Process.Pid }
func (g *sessionsGateway) stop()    { g.p.stop() }

// startSessionsGateway runs caddy with the sessions endpoint, keeping its
// storage in dir, and creates a chat token. The rate limit is set far above
// what the run sends. The run's one token may use all of max_sessions and
// max_agents: it stands for every client of a gateway. zidane holds more
// lines for the global zidane option.
func startSessionsGateway(ctx context.Context, bin, dir string, maxSessions, maxAgents int, idle time.Duration, zidane string) (*sessionsGateway, error) {
	admin, err := freePort()
	if err != nil {
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	caddyfile := fmt.Sprintf(`{
	admin 127.0.0.1:%d
	log {
		level ERROR
	}
	zidane {
		max_sessions %d
		max_agents %d
		max_sessions_per_token %d
		max_agents_per_token %d
		agent_idle_timeout %s
%s
	}
}

http://127.0.0.1:%d {
	zidane_mcp {
		sessions
		rate_limit {
			per_token 1000000/s 1000000
		}
	}
}
`, admin, maxSessions, maxAgents, maxSessions, maxAgents, idle, zidane, port)
	path := filepath.Join(dir, "Caddyfile")
	if err := os.WriteFile(path, []byte(caddyfile), 0o600); err != nil {
		return nil, err
	}
	env := caddyEnv(dir, admin)
	// Not killed with ctx: stop's SIGTERM lets caddy stop its agents, which
	// run in process groups of their own.
	p, err := start(context.WithoutCancel(ctx), bin, env, "run", "--config", path, "--adapter", "caddyfile")
	if err != nil {
		return nil, err
	}
	g := &sessionsGateway{p: p, url: fmt.Sprintf("http://127.0.0.1:%d/mcp", port), admin: fmt.Sprintf("127.0.0.1:%d", admin)}
	if err := waitListening(ctx, fmt.Sprintf("127.0.0.1:%d", port)); err != nil {
		g.stop()
		return nil, fmt.Errorf("caddy: %v\n%s", err, p.logs)
	}
	if g.token, err = createToken(ctx, bin, env, "bench-sessions", "chat"); err != nil {
		g.stop()
		return nil, err
	}
	return g, nil
}

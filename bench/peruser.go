package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/internal/oauthtest"
)

// The rows of the OAuth-protected upstream: one upstream, offered on two
// broker routes that differ only in whose token goes out. The per_user
// row's ratios are to the shared row's, in the same rounds: what looking
// up the calling person's own token costs once it is warm.
const (
	sharedRoute  = "broker shared (oauth)"
	perUserRoute = "broker per_user (oauth)"
)

// The upstream's users whose tokens the two routes send: its whoami tool
// names them, so every call shows which token went out.
const (
	benchOperator = "bench-operator"
	benchPerson   = "bench-person"
)

// perUserGateway is a third caddy for the OAuth rows, with the upstream
// and its authorization server (the project's internal/oauthtest, in this
// process, on loopback): upstream shared logs in once as the operator
// (`caddy zidane login`), upstream peruser holds the person's own token
// (connected through the admin API, as the connect link would). Both
// point at the same MCP server.
type perUserGateway struct {
	p      *proc
	as     *oauthtest.AuthServer
	up     *oauthtest.MCPServer
	routes []route
}

func (g *perUserGateway) stop() {
	g.p.stop()
	g.up.Close()
	g.as.Close()
}

// startPerUserGateway starts the authorization server, the upstream and a
// caddy with a broker site for each upstream, logs the operator in, has
// the person connect, and checks one call on each route runs upstream as
// who it should.
func startPerUserGateway(ctx context.Context, work, caddyBin string) (*perUserGateway, error) {
	dir := filepath.Join(work, "peruser")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	// Tokens that outlive the run: a refresh would be measured, not the
	// warm lookup.
	as := oauthtest.NewAuthServer(oauthtest.AuthServerOptions{AccessTokenTTL: 24 * time.Hour})
	up := oauthtest.NewMCPServer(as, oauthtest.MCPOptions{})
	g := &perUserGateway{as: as, up: up}
	fail := func(err error) (*perUserGateway, error) {
		g.stop()
		return nil, err
	}
	secret := oauthtest.NewSecret("bench-gateway")
	as.AddClient("bench-gateway", secret, nil)
	ports := make([]int, 3)
	for i := range ports {
		p, err := freePort()
		if err != nil {
			up.Close()
			as.Close()
			return nil, err
		}
		ports[i] = p
	}
	admin, sharedPort, perPort := ports[0], ports[1], ports[2]
	site := func(port int, upstream string) string {
		return fmt.Sprintf(`
http://127.0.0.1:%d {
	zidane_mcp {
		broker %s
		rate_limit {
			per_token 1000000/s 1000000
		}
	}
}
`, port, upstream)
	}
	caddyfile := fmt.Sprintf(`{
	admin 127.0.0.1:%[1]d
	log {
		level ERROR
	}
	zidane {
		upstream shared %[2]s {
			oauth {
				client_id bench-gateway
				client_secret ${BENCH_OAUTH_SECRET}
				redirect_url http://127.0.0.1:%[3]d/zidane/oauth/callback/shared
				credentials shared
			}
		}
		upstream peruser %[2]s {
			oauth {
				client_id bench-gateway
				client_secret ${BENCH_OAUTH_SECRET}
				redirect_url http://127.0.0.1:%[4]d/zidane/oauth/callback/peruser
				credentials per_user
			}
		}
	}
}
%[5]s%[6]s`, admin, up.URL, sharedPort, perPort, site(sharedPort, "shared"), site(perPort, "peruser"))
	path := filepath.Join(dir, "Caddyfile")
	if err := os.WriteFile(path, []byte(caddyfile), 0o600); err != nil {
		return fail(err)
	}
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	env := append(caddyEnv(dir, admin), "BENCH_OAUTH_SECRET="+secret, "ZIDANE_UPSTREAM_TOKEN_KEY="+base64.StdEncoding.EncodeToString(key))
	p, err := start(ctx, caddyBin, env, "run", "--config", path, "--adapter", "caddyfile")
	if err != nil {
		return fail(err)
	}
	g.p = p
	if err := waitListening(ctx, fmt.Sprintf("127.0.0.1:%d", perPort)); err != nil {
		return fail(fmt.Errorf("caddy with the OAuth upstreams: %v\n%s", err, p.logs))
	}

	// The operator's login of shared, as `caddy zidane login` runs it.
	cmd := exec.CommandContext(ctx, caddyBin, "zidane", "login", "shared", "--wait", "0")
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.Output()
	if err != nil {
		return fail(fmt.Errorf("zidane login shared: %v", err))
	}
	authURL := ""
	for _, f := range strings.Fields(string(out)) {
		if strings.HasPrefix(f, as.URL+"/authorize?") {
			authURL = f
		}
	}
	q, err := approve(ctx, authURL, benchOperator)
	if err != nil {
		return fail(fmt.Errorf("the operator's login: %w", err))
	}
	if err := getOK(ctx, fmt.Sprintf("http://127.0.0.1:%d/zidane/oauth/callback/shared?%s", sharedPort, q.Encode())); err != nil {
		return fail(fmt.Errorf("the operator's login callback: %w", err))
	}

	// The person connects peruser: the login begun and completed through
	// the admin API with the host's admin key, as the CLI calls it.
	adminKey, err := os.ReadFile(filepath.Join(dir, "data", "caddy", "zidane", "admin.key"))
	if err != nil {
		return fail(fmt.Errorf("the admin key: %w", err))
	}
	adminPost := func(path string, body any, out any) error {
		b, _ := json.Marshal(body)
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, fmt.Sprintf("http://127.0.0.1:%d%s", admin, path), bytes.NewReader(b))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Zidane-Admin-Key "+string(adminKey))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("%s: HTTP %d %s", path, resp.StatusCode, raw)
		}
		if out != nil {
			return json.Unmarshal(raw, out)
		}
		return nil
	}
	var begun struct {
		URL string `json:"authorization_url"`
	}
	if err := adminPost("/zidane/connections/login", map[string]string{"owner": benchPerson, "upstream": "peruser"}, &begun); err != nil {
		return fail(fmt.Errorf("the person's connection: %w", err))
	}
	if q, err = approve(ctx, begun.URL, benchPerson); err != nil {
		return fail(fmt.Errorf("the person's connection: %w", err))
	}
	if err := adminPost("/zidane/connections/callback", map[string]string{"owner": benchPerson, "upstream": "peruser", "query": q.Encode()}, nil); err != nil {
		return fail(fmt.Errorf("the person's connection: %w", err))
	}

	token, err := createToken(ctx, caddyBin, env, "bench-person", "mcp", "--owner", benchPerson)
	if err != nil {
		return fail(err)
	}
	pid, adminAddr := p.cmd.Process.Pid, fmt.Sprintf("127.0.0.1:%d", admin)
	g.routes = []route{
		{name: sharedRoute, url: fmt.Sprintf("http://127.0.0.1:%d/mcp", sharedPort), token: token, pid: pid, admin: adminAddr,
			base: sharedRoute, noDirect: true, tool: "whoami", want: "whoami: " + benchOperator},
		{name: perUserRoute, url: fmt.Sprintf("http://127.0.0.1:%d/mcp", perPort), token: token, pid: pid, admin: adminAddr,
			base: sharedRoute, noDirect: true, tool: "whoami", want: "whoami: " + benchPerson},
	}
	// One call on each warms the person's token (read from storage once)
	// and shows whose token each route sends.
	for _, r := range g.routes {
		sessions, _, closeAll, err := connect(ctx, r, 1)
		if err != nil {
			return fail(fmt.Errorf("%s: %w", r.name, err))
		}
		_, err = call(ctx, sessions[0], r, r.tool, callArgs(r.tool))
		closeAll()
		if err != nil {
			return fail(fmt.Errorf("%s: %w", r.name, err))
		}
	}
	return g, nil
}

// approve has the authorization server (which approves at once) sign user
// in for the authorization URL, and returns the query of its redirect to
// the gateway's callback, not followed.
func approve(ctx context.Context, authURL, user string) (url.Values, error) {
	if authURL == "" {
		return nil, fmt.Errorf("no authorization URL")
	}
	hc := &http.Client{Timeout: 10 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, authURL+"&login_hint="+url.QueryEscape(user), nil)
	if err != nil {
		return nil, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	resp.Body.Close()
	loc, err := url.Parse(resp.Header.Get("Location"))
	if resp.StatusCode != http.StatusFound || err != nil {
		return nil, fmt.Errorf("the authorization server answered %d, Location %q", resp.StatusCode, resp.Header.Get("Location"))
	}
	return loc.Query(), nil
}

// getOK GETs u and wants 200.
func getOK(ctx context.Context, u string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return fmt.Errorf("HTTP %d %s", resp.StatusCode, b)
	}
	return nil
}

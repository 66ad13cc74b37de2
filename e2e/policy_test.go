package e2e

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// policyCaddyfile offers the everything-server through guard (in front of
// reverse_proxy), the broker's pass-through and the aggregated route, each
// with the same rules: a global deny rule over a tool's name, and site
// rules over a call's arguments and a token's scopes.
func policyCaddyfile(ports map[string]int, upstream string) string {
	siteRules := `
		scope narrow tools json_schema_2020_12_tool
		policy {
			deny "tool.name.endsWith('json_schema_2020_12_tool') && args.name == 'production'" "the production name is off limits"
			allow "'narrow' in principal.scopes && tool.name.endsWith('test_image_content')"
		}
		rate_limit {
			per_token 1000/s 1000
			per_ip 1000/s 1000
		}`
	return fmt.Sprintf(`{
	admin %s
	zidane {
		upstream ev %s
		policy {
			deny "tool.name.endsWith('test_simple_text')" "simple text is switched off here"
		}
	}
}

http://127.0.0.1:%d {
	zidane_mcp {
		guard
		resource http://127.0.0.1:%d/mcp
%s
	}
	reverse_proxy %s
}

http://127.0.0.1:%d {
	zidane_mcp {
		broker ev
%s
	}
}

http://127.0.0.1:%d {
	zidane_mcp {
		aggregate ev
		prefix conditional
%s
	}
}

http://127.0.0.1:%d {
	zidane_mcp {
		sessions
		resource http://127.0.0.1:%d/mcp
		policy {
			deny "tool.name == 'sessions' && args.verb == 'create'" "sessions are created from the console here"
		}
	}
}
`, AdminPlaceholder, upstream, ports["guard"], ports["guard"], siteRules, strings.TrimSuffix(strings.TrimPrefix(upstream, "http://"), "/mcp"),
		ports["broker"], siteRules, ports["aggregate"], siteRules, ports["sessions"], ports["sessions"])
}

// TestPolicyRules drives go-sdk clients at both protocol versions through
// the sessions endpoint (a rule over a verb), and guard, broker and
// aggregate in front of a real MCP server: a rule over an
// argument refuses one call (with the rule's message, never its
// expression) and lets its neighbour through; a tool a rule denies
// whatever the arguments is left out of the listing and refused; an allow
// rule grants a tool the token's scopes do not, and lists it; each
// decision is an audit line naming its rule.
func TestPolicyRules(t *testing.T) {
	upstream := startStatelessEverythingServer(t)
	ports := map[string]int{"guard": freePort(t), "broker": freePort(t), "aggregate": freePort(t), "sessions": freePort(t)}
	c := startCaddy(t, policyCaddyfile(ports, upstream))
	full := createToken(t, c, "full", "--scope", "mcp")
	narrow := createToken(t, c, "narrow", "--scope", "narrow")
	chat := createToken(t, c, "chat", "--scope", "chat")

	// The sessions endpoint: a rule over the verb refuses creating a
	// session, and its neighbour (list) goes on.
	for _, version := range []string{modernVersion, legacyVersion} {
		t.Run("sessions/"+version, func(t *testing.T) {
			endpoint := fmt.Sprintf("http://127.0.0.1:%d/mcp", ports["sessions"])
			p, err := connectPeer(t, endpoint, bearerClient(chat, nil), version)
			if err != nil {
				t.Fatalf("connect: %v", err)
			}
			if names := listToolNames(t, p.cs); !slices.Contains(names, "sessions") {
				t.Fatalf("the sessions tool is not listed: %v", names)
			}
			from := c.LogSize()
			_, err = callRouteTool(p.cs, "sessions", map[string]any{"verb": "create", "cwd": t.TempDir(), "prompt": "hello"})
			if err == nil || !strings.Contains(err.Error(), "sessions are created from the console here") {
				t.Fatalf("create: %v, want the rule's message", err)
			}
			c.WaitForLogFrom(t, from, fmt.Sprintf(`"rule":"http://127.0.0.1:%d/mcp policy, rule 1"`, ports["sessions"]), 10*time.Second)
			if res, err := callRouteTool(p.cs, "sessions", map[string]any{"verb": "list"}); err != nil || res.IsError {
				t.Fatalf("list: %s", outcome(res, err))
			}
		})
	}

	for _, route := range []string{"guard", "broker", "aggregate"} {
		for _, version := range []string{modernVersion, legacyVersion} {
			t.Run(route+"/"+version, func(t *testing.T) {
				endpoint := fmt.Sprintf("http://127.0.0.1:%d/mcp", ports[route])
				p, err := connectPeer(t, endpoint, bearerClient(full, nil), version)
				if err != nil {
					t.Fatalf("connect: %v", err)
				}
				if got := p.cs.InitializeResult().ProtocolVersion; got != version {
					t.Fatalf("negotiated %q, want %q", got, version)
				}
				names := listToolNames(t, p.cs)
				if !slices.Contains(names, "json_schema_2020_12_tool") || slices.Contains(names, "test_simple_text") {
					t.Fatalf("the listing does not follow the rules: %v", names)
				}

				from := c.LogSize()
				_, err = callRouteTool(p.cs, "json_schema_2020_12_tool", map[string]any{"name": "production", "email": "ops@example.com"})
				if err == nil || !strings.Contains(err.Error(), "the production name is off limits") || strings.Contains(err.Error(), "args.name") {
					t.Fatalf("the production call: %v, want the rule's message alone", err)
				}
				c.WaitForLogFrom(t, from, `"rule":"`+siteRuleName(route, ports)+`, rule 1"`, 10*time.Second)

				res, err := callRouteTool(p.cs, "json_schema_2020_12_tool", map[string]any{"name": "staging", "email": "ops@example.com"})
				if err != nil || res.IsError || !strings.Contains(outcome(res, err), `"name":"staging"`) {
					t.Fatalf("the neighbouring call: %s", outcome(res, err))
				}

				from = c.LogSize()
				_, err = callRouteTool(p.cs, "test_simple_text", nil)
				if err == nil || !strings.Contains(err.Error(), "simple text is switched off here") {
					t.Fatalf("a tool denied by the global rule: %v", err)
				}
				c.WaitForLogFrom(t, from, `"rule":"global policy, rule 1"`, 10*time.Second)
				checkRuleAudit(t, c, "global policy, rule 1", "deny", "denied_by_rule")

				if route == "aggregate" {
					// An allow rule grants a call of one upstream, and the
					// narrow token may use none here: the listing names
					// none, and is refused.
					return
				}
				q, err := connectPeer(t, endpoint, bearerClient(narrow, nil), version)
				if err != nil {
					t.Fatalf("connect narrow: %v", err)
				}
				names = listToolNames(t, q.cs)
				slices.Sort(names)
				if !slices.Equal(names, []string{"json_schema_2020_12_tool", "test_image_content"}) {
					t.Fatalf("the narrow token lists %v, want its scope's tool and the one the allow rule grants", names)
				}
				from = c.LogSize()
				if res, err := callRouteTool(q.cs, "test_image_content", nil); err != nil || res.IsError {
					t.Fatalf("the tool an allow rule grants: %s", outcome(res, err))
				}
				c.WaitForLogFrom(t, from, `"event":"rule_allowed"`, 10*time.Second)
				checkRuleAudit(t, c, siteRuleName(route, ports)+", rule 2", "allow", "")
				if _, err := callRouteTool(q.cs, "test_error_handling", nil); err == nil || !strings.Contains(err.Error(), "lacks a scope") {
					t.Fatalf("a tool neither the scope nor a rule grants: %v", err)
				}
			})
		}
	}
}

// siteRuleName is how the site's rules are named: by the site's resource.
func siteRuleName(route string, ports map[string]int) string {
	if route == "guard" {
		return fmt.Sprintf("http://127.0.0.1:%d/mcp policy", ports[route])
	}
	return "/mcp policy"
}

func listToolNames(t *testing.T, cs *mcp.ClientSession) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatalf("tools/list: %v", err)
	}
	return toolNamesOf(res)
}

// checkRuleAudit finds the audit line of a decision by rule.
func checkRuleAudit(t *testing.T, c *Caddy, rule, effect, reason string) {
	t.Helper()
	for _, l := range auditLines(c) {
		if l["rule"] == rule && l["effect"] == effect && (reason == "" || l["reason"] == reason) {
			if strings.Contains(fmt.Sprint(l), "ops@example.com") || strings.Contains(fmt.Sprint(l), "endsWith") {
				t.Fatalf("the audit line holds the call's arguments or the rule's expression: %v", l)
			}
			return
		}
	}
	t.Fatalf("no audit line of rule %q (%s)", rule, effect)
}

// TestPolicyRulesAcrossReplicas: two replicas on one NATS storage, each
// with the same rules, decide a call the same: a token made on one is
// refused the same production call on both, with the rule's message, and
// the neighbouring call goes on through both.
func TestPolicyRulesAcrossReplicas(t *testing.T) {
	natsURL := startNATSServer(t)
	upstream := startStatelessEverythingServer(t)
	clusterKey := "ZIDANE_CLUSTER_KEY=" + base64.StdEncoding.EncodeToString([]byte(randomHex(16)))
	replica := func() (*Caddy, string) {
		port := freePort(t)
		c := startCaddy(t, fmt.Sprintf(`{
	admin %s
	storage zidane_nats
	zidane {
		cluster {
			url %s
			lock_ttl 5s
		}
		policy {
			deny "tool.name == 'json_schema_2020_12_tool' && args.name == 'production'" "the production name is off limits"
		}
	}
}

http://127.0.0.1:%d {
	zidane_mcp {
		guard
		resource http://127.0.0.1:%d/mcp
	}
	reverse_proxy %s
}
`, AdminPlaceholder, natsURL, port, port, strings.TrimSuffix(strings.TrimPrefix(upstream, "http://"), "/mcp")), clusterKey)
		return c, fmt.Sprintf("http://127.0.0.1:%d/mcp", port)
	}
	a, urlA := replica()
	b, urlB := replica()
	stdout, stderr, err := a.Run(t, "zidane", "token", "create", "--name", "shared", "--scope", "mcp")
	if err != nil {
		t.Fatalf("token create on A: %v %s", err, stderr)
	}
	token := strings.TrimSpace(stdout)
	waitStatus(t, urlB, token, http.StatusOK, 20*time.Second)

	for _, r := range []struct {
		c   *Caddy
		url string
	}{{a, urlA}, {b, urlB}} {
		for _, version := range []string{modernVersion, legacyVersion} {
			p, err := connectPeer(t, r.url, bearerClient(token, nil), version)
			if err != nil {
				t.Fatalf("%s %s: connect: %v", r.url, version, err)
			}
			from := r.c.LogSize()
			_, err = callRouteTool(p.cs, "json_schema_2020_12_tool", map[string]any{"name": "production", "email": "ops@example.com"})
			if err == nil || !strings.Contains(err.Error(), "the production name is off limits") {
				t.Fatalf("%s %s: the production call: %v", r.url, version, err)
			}
			r.c.WaitForLogFrom(t, from, `"rule":"global policy, rule 1"`, 10*time.Second)
			res, err := callRouteTool(p.cs, "json_schema_2020_12_tool", map[string]any{"name": "staging", "email": "ops@example.com"})
			if err != nil || res.IsError {
				t.Fatalf("%s %s: the neighbouring call: %s", r.url, version, outcome(res, err))
			}
		}
	}
}

// TestPolicyRulesOnSessionsEgress: the global rules decide what a
// session's agent calls through its egress to an upstream, as they decide
// a client's: a rule refuses the agent one tool, and its neighbour goes
// on.
func TestPolicyRulesOnSessionsEgress(t *testing.T) {
	upstream := startEverythingServer(t)
	port := freePort(t)
	c := startCaddy(t, fmt.Sprintf(`{
	admin %s
	zidane {
		upstream everything %s
		session_upstreams everything
		policy {
			deny "principal.kind == 'machine' && upstream == 'everything' && tool.name == 'test_simple_text'" "agents may not call test_simple_text"
		}
	}
}

http://127.0.0.1:%d {
	zidane_mcp {
		sessions
		rate_limit {
			per_token 1000/s 1000
		}
	}
}
`, AdminPlaceholder, upstream, port))
	token := createToken(t, c, "human", "--scope", "chat")
	cs, err := connectGo(t, fmt.Sprintf("http://127.0.0.1:%d/mcp", port), bearerClient(token, nil))
	if err != nil {
		t.Fatal(err)
	}
	_, created, err := callSessions(t, cs, "sessions", map[string]any{"verb": "create", "cwd": t.TempDir(), "prompt": "mcp"})
	if err != nil {
		t.Fatal(err)
	}
	id := created["sessionId"].(string)
	send := func(prompt string) string {
		t.Helper()
		if _, _, err := callSessions(t, cs, "sessions", map[string]any{"verb": "send", "sessionId": id, "prompt": prompt}); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(30 * time.Second)
		for time.Now().Before(deadline) {
			text, _, err := callSessions(t, cs, "sessions", map[string]any{"verb": "transcript", "sessionId": id, "turns": 1, "full": true})
			if err != nil {
				t.Fatal(err)
			}
			if strings.Contains(text, "prompt: "+prompt) && strings.Contains(text, "(end_turn)") {
				return text
			}
			callSessions(t, cs, "sessions", map[string]any{"verb": "wait", "sessionId": id, "timeout": 5})
		}
		t.Fatalf("no answer to %q", prompt)
		return ""
	}
	from := c.LogSize()
	if got := send("mcp: call everything test_simple_text {}"); !strings.Contains(got, "failed") || strings.Contains(got, "Result of test_simple_text") {
		t.Fatalf("the agent called the tool a rule refuses it:\n%s", got)
	}
	c.WaitForLogFrom(t, from, `"rule":"global policy, rule 1"`, 10*time.Second)
	if got := send("mcp: call everything test_embedded_resource {}"); !strings.Contains(got, "Result of test_embedded_resource on everything:") {
		t.Fatalf("the agent could not call the neighbouring tool:\n%s", got)
	}
}

// TestPolicyRulesReadJWTClaims: a rule reads the claims of an identity
// provider's JWT: a token of the release group may call what a rule keeps
// from every other token of the same scopes.
func TestPolicyRulesReadJWTClaims(t *testing.T) {
	upstream := startEverythingServer(t)
	p := startIDP(t)
	port := freePort(t)
	resource := fmt.Sprintf("http://127.0.0.1:%d/mcp", port)
	c := startCaddy(t, fmt.Sprintf(`{
	admin %s
}

http://127.0.0.1:%d {
	zidane_mcp {
		guard
		resource %s
		jwt {
			issuer %s
			jwks_url %s
			algorithms RS256
		}
		policy {
			deny "tool.name == 'test_image_content' && !('release' in claims.?groups.orValue([]))" "images are for the release group"
		}
	}
	reverse_proxy %s
}
`, AdminPlaceholder, port, resource, p.issuer, p.jwksURL, strings.TrimSuffix(strings.TrimPrefix(upstream, "http://"), "/mcp")))
	now := time.Now()
	token := func(groups ...string) string {
		claims := jwt.MapClaims{"iss": p.issuer, "aud": resource, "sub": "alice", "scope": "mcp", "iat": now.Unix(), "exp": now.Add(time.Hour).Unix()}
		if groups != nil {
			claims["groups"] = groups
		}
		return p.token(t, claims)
	}
	for _, tc := range []struct {
		name   string
		token  string
		status int
	}{
		{"the release group", token("eng", "release"), http.StatusOK},
		{"another group", token("eng"), http.StatusForbidden},
		{"no groups claim", token(), http.StatusForbidden},
	} {
		from := c.LogSize()
		a := post(t, resource, tc.token, toolCallBody("test_image_content"))
		if a.status != tc.status {
			t.Fatalf("%s: %d %s, want %d", tc.name, a.status, a.body, tc.status)
		}
		if tc.status == http.StatusForbidden {
			if a.rpc.Error.Data.Reason != "denied_by_rule" || a.rpc.Error.Message != "images are for the release group" {
				t.Fatalf("%s: %s", tc.name, a.body)
			}
			c.WaitForLogFrom(t, from, `"rule":"`+resource+` policy, rule 1"`, 10*time.Second)
		}
	}
}

// TestPolicyAllowNeverOpensEgress: a session_upstream's egress path is for
// the sessions' agents, whose tokens the gateway mints with the upstream's
// scope. A person's token on the sessions site reaching that path directly
// lacks the scope, and a global allow rule written for another route (one
// that holds for the person's scopes and the tool's name) must not grant
// it an upstream no route offers the person.
func TestPolicyAllowNeverOpensEgress(t *testing.T) {
	upstream := startEverythingServer(t)
	port := freePort(t)
	c := startCaddy(t, fmt.Sprintf(`{
	admin %s
	zidane {
		upstream everything %s
		session_upstreams everything
		policy {
			allow "'chat' in principal.scopes && tool.name == 'test_simple_text'"
		}
	}
}

http://127.0.0.1:%d {
	zidane_mcp {
		sessions
	}
}
`, AdminPlaceholder, upstream, port))
	token := createToken(t, c, "human", "--scope", "chat")
	from := c.LogSize()
	cs, err := connectGo(t, fmt.Sprintf("http://127.0.0.1:%d/zidane/upstream/everything/mcp", port), bearerClient(token, nil))
	if err != nil {
		t.Fatal(err)
	}
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "test_simple_text", Arguments: map[string]any{}})
	if err == nil {
		t.Fatalf("a person's token called an egress upstream through an allow rule: %+v", res)
	}
	if !strings.Contains(err.Error(), "lacks a scope") || !strings.Contains(err.Error(), "Forbidden") {
		t.Fatalf("refused, but not for want of a scope: %v", err)
	}
	c.WaitForLogFrom(t, from, `"reason":"insufficient_scope"`, 10*time.Second)
}

package caddymodule

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestLiteralSecretsInJSON: a JSON config (POST /load, or caddy run
// --config x.json) gets the same refusals as a Caddyfile, at Provision;
// placeholders, non-secret headers and names pass.
func TestLiteralSecretsInJSON(t *testing.T) {
	for _, c := range []struct {
		name, app, refused string
	}{
		{"header", `{"upstreams":[{"name":"gh","url":"https://x.example/mcp","headers":{"Authorization":"Bearer ghp_1"}}]}`, "header Authorization of upstream gh"},
		{"header in another case", `{"upstreams":[{"name":"gh","url":"https://x.example/mcp","headers":{"x-api-key":"k"}}]}`, "header x-api-key of upstream gh"},
		{"url password", `{"upstreams":[{"name":"gh","url":"https://u:pw@x.example/mcp"}]}`, "the password in the URL of upstream gh"},
		{"url query key", `{"upstreams":[{"name":"gh","url":"https://x.example/mcp?api_key=abc"}]}`, "query parameter api_key"},
		{"upstream env", `{"upstreams":[{"name":"fs","command":"srv","env":{"GITHUB_TOKEN":"ghp"}}]}`, "env GITHUB_TOKEN of upstream fs"},
		{"client secret", `{"upstreams":[{"name":"i","url":"https://x.example/mcp","oauth":{"grant":"client_credentials","client_id":"c","client_secret":"s"}}]}`, "oauth client_secret of upstream i"},
		{"private key", `{"upstreams":[{"name":"i","url":"https://x.example/mcp","oauth":{"private_key":"-----BEGIN"}}]}`, "oauth private_key of upstream i"},
		{"agent env", `{"agents":{"c":{"command":["c"],"env":{"OPENAI_API_KEY":"sk-1"}}}}`, "env OPENAI_API_KEY of agent c"},
		{"token key", `{"upstream_token_key":"c2VjcmV0"}`, "upstream_token_key holds a literal value"},
		{"placeholders", `{"upstream_token_key":"{env.K}","upstreams":[{"name":"gh","url":"https://x.example/mcp?team=a&token=${T}","headers":{"Authorization":"Bearer ${GH}","X-Key":"${env:K}","Accept":"application/json","User-Agent":"gw/1"},"env":{"DEBUG":"1","API_KEY":"${K:-}"}}],"agents":{"c":{"command":["c"],"env":{"IS_SANDBOX":"1","ANTHROPIC_API_KEY":"${ANTHROPIC_API_KEY}"}}}}`, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			var a App
			if err := json.Unmarshal([]byte(c.app), &a); err != nil {
				t.Fatal(err)
			}
			err := a.checkSecrets()
			switch {
			case c.refused == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case c.refused != "" && (err == nil || !strings.Contains(err.Error(), c.refused) || !strings.Contains(err.Error(), "set VAR in caddy's environment")):
				t.Fatalf("error = %v, want it to name %q and say what to do", err, c.refused)
			}
			if err != nil {
				for _, secret := range []string{"ghp_1", "sk-1", "c2VjcmV0", "abc", ":pw@"} {
					if strings.Contains(err.Error(), secret) {
						t.Errorf("the error quotes the secret: %v", err)
					}
				}
			}
		})
	}
	if err := checkGuardHeaders(map[string]string{"Authorization": "Bearer {env.T}", "Accept": "text/event-stream"}); err != nil {
		t.Errorf("guard placeholders refused: %v", err)
	}
	// Caddy's {file.…} reads absolute paths too, the usual place of a
	// mounted secret.
	if err := checkGuardHeaders(map[string]string{"Authorization": "Bearer {file./run/secrets/upstream-token}"}); err != nil {
		t.Errorf("an absolute {file.…} refused: %v", err)
	}
	for _, v := range []string{"{file./run/secrets/zidane.key}", "{env.ZIDANE_KEY}"} {
		if err := checkTokenKey(v); err != nil {
			t.Errorf("upstream_token_key %s: %v", v, err)
		}
		if !onePlaceholder.MatchString(v) {
			t.Errorf("%s is one placeholder", v)
		}
	}
	for _, v := range []string{"{file./a} b", "x{env.A}", "{file./a b}"} {
		if onePlaceholder.MatchString(v) {
			t.Errorf("%q taken for one placeholder", v)
		}
	}
	if err := checkGuardHeaders(map[string]string{"Authorization": "Bearer ${T}"}); err == nil || !strings.Contains(err.Error(), "{env.VAR}") {
		t.Errorf("a guard header with a broker placeholder, which Caddy's replacer does not expand: %v", err)
	}
}

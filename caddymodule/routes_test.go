package caddymodule

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
)

// routeJSON is a handler's "route" holding route module m, as a config
// gives it.
func routeJSON(m routeModule) json.RawMessage {
	return caddyconfig.JSONModuleObject(m, "mode", m.CaddyModule().ID.Name(), nil)
}

// validateConfig loads, provisions and validates config as `caddy
// validate` does, with its storage and data in t's directory and its logs
// discarded, and cleans it up.
func validateConfig(t *testing.T, config []byte) error {
	t.Helper()
	dir := t.TempDir()
	t.Setenv("XDG_DATA_HOME", filepath.Join(dir, "data"))
	var cfg caddy.Config
	if err := json.Unmarshal(config, &cfg); err != nil {
		t.Fatalf("the config is no Caddy JSON: %v", err)
	}
	cfg.Admin = &caddy.AdminConfig{Disabled: true, Config: &caddy.ConfigSettings{Persist: new(bool)}}
	cfg.StorageRaw = json.RawMessage(`{"module": "file_system", "root": ` + quote(filepath.Join(dir, "storage")) + `}`)
	cfg.Logging = &caddy.Logging{Logs: map[string]*caddy.CustomLog{"default": {
		BaseLog: caddy.BaseLog{WriterRaw: json.RawMessage(`{"output": "discard"}`)}}}}
	return caddy.Validate(&cfg)
}

func quote(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// A handler of each route, given in JSON as the JSON reference gives it,
// loads; a config a person could write wrong gets an error that says what
// to fix.
func TestRoutesInJSON(t *testing.T) {
	t.Setenv("UPSTREAM_TOKEN", "token-for-the-docs-example")
	doc, err := os.ReadFile("../docs/json.md")
	if err != nil {
		t.Fatal(err)
	}
	blocks := regexp.MustCompile("(?s)<!-- docs: loads as JSON -->\n```json\n(.*?)```").FindAllSubmatch(doc, -1)
	if len(blocks) < 5 {
		t.Fatalf("docs/json.md gives %d JSON configs that load, want one per route and the two guards", len(blocks))
	}
	modes := map[string]bool{}
	for i, b := range blocks {
		for _, m := range regexp.MustCompile(`"mode": "(\w+)"`).FindAllSubmatch(b[1], -1) {
			modes[string(m[1])] = true
		}
		if err := validateConfig(t, b[1]); err != nil {
			t.Errorf("the docs' JSON config %d does not load: %v", i+1, err)
		}
	}
	for _, m := range []string{"sessions", "guard", "broker", "aggregate"} {
		if !modes[m] {
			t.Errorf("docs/json.md gives no config that loads with route mode %q", m)
		}
	}

	for _, c := range []struct{ name, handler, want string }{
		{"no route", `{"handler": "zidane_mcp"}`, "choose one mode"},
		{"an unknown mode", `{"handler": "zidane_mcp", "route": {"mode": "proxy"}}`, "unknown module: http.handlers.zidane_mcp.routes.proxy"},
		{"a broker without its upstream", `{"handler": "zidane_mcp", "route": {"mode": "broker"}}`, "name the upstream to offer"},
		{"a broker of no such upstream", `{"handler": "zidane_mcp", "route": {"mode": "broker", "upstream": "nosuch"}}`, `broker "nosuch": no such upstream`},
		{"an aggregate without upstreams", `{"handler": "zidane_mcp", "route": {"mode": "aggregate"}}`, "name the upstreams to offer"},
		{"an aggregate's unknown prefix", `{"handler": "zidane_mcp", "route": {"mode": "aggregate", "upstreams": ["a"], "prefix": "sometimes"}}`, "prefix takes always or conditional"},
		{"a guard's negative max_response", `{"handler": "zidane_mcp", "route": {"mode": "guard", "max_response": -1}}`, "max_response -1 is negative"},
		{"a guard's literal credential", `{"handler": "zidane_mcp", "route": {"mode": "guard", "upstream_headers": {"Authorization": "Bearer abc"}}}`, "holds a literal value"},
		{"a guard's option on the handler", `{"handler": "zidane_mcp", "upstream": "http://127.0.0.1:9000/mcp", "route": {"mode": "guard"}}`, `unknown field "upstream"`},
		{"a route's option of another mode", `{"handler": "zidane_mcp", "route": {"mode": "broker", "upstream": "a", "prefix": "always"}}`, `unknown field "prefix"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			config := `{"apps": {"zidane": {}, "http": {"servers": {"mcp": {"listen": ["127.0.0.1:0"], "routes": [{"handle": [` + c.handler + `]}]}}}}}`
			err := validateConfig(t, []byte(config))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("loading %s: %v, want an error with %q", c.handler, err, c.want)
			}
		})
	}
}

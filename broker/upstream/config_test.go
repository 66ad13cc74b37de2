package upstream

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/pinnedfetch"
	"github.com/Tahul/caddy-zidane-mcp/pins"
)

func TestNormalizeInfersTransport(t *testing.T) {
	tests := []struct {
		name string
		in   Config
		want string
	}{
		{"url means http", Config{Name: "a", URL: "https://mcp.example.com/mcp"}, TransportHTTP},
		{"url ending in /sse means sse", Config{Name: "a", URL: "https://mcp.example.com/sse"}, TransportSSE},
		{"trailing slash after /sse", Config{Name: "a", URL: "https://mcp.example.com/v1/sse/"}, TransportSSE},
		{"query after /sse", Config{Name: "a", URL: "https://mcp.example.com/sse?team=1"}, TransportSSE},
		{"sse only in the query", Config{Name: "a", URL: "https://mcp.example.com/mcp?x=/sse"}, TransportHTTP},
		{"path that merely ends in sse", Config{Name: "a", URL: "https://mcp.example.com/classe"}, TransportHTTP},
		{"url with placeholder", Config{Name: "a", URL: "https://${HOST}/sse"}, TransportSSE},
		{"command means stdio", Config{Name: "a", Command: "npx"}, TransportStdio},
		{"streamable-http spelled out", Config{Name: "a", Transport: "streamable-http", URL: "https://x.example/sse"}, TransportHTTP},
		{"streamableHttp", Config{Name: "a", Transport: "streamableHttp", URL: "https://x.example/mcp"}, TransportHTTP},
		{"upper case", Config{Name: "a", Transport: "SSE", URL: "https://x.example/events"}, TransportSSE},
		{"explicit stdio", Config{Name: "a", Transport: "stdio", Command: "uvx"}, TransportStdio},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Normalize(tt.in)
			if err != nil {
				t.Fatalf("Normalize: %v", err)
			}
			if got.Transport != tt.want {
				t.Fatalf("transport = %q, want %q", got.Transport, tt.want)
			}
		})
	}
}

func TestNormalizeErrors(t *testing.T) {
	tests := []struct {
		name string
		in   Config
		want []string // substrings of the error
	}{
		{"nothing to infer from", Config{Name: "broken", Source: "team.json"},
			[]string{`upstream "broken" (from team.json)`, "set url", "command"}},
		{"url and command", Config{Name: "both", URL: "https://x.example/mcp", Command: "npx"},
			[]string{`upstream "both"`, "both url and command"}},
		{"stdio without command", Config{Name: "s", Transport: "stdio"},
			[]string{`upstream "s"`, "needs command"}},
		{"http without url", Config{Name: "h", Transport: "http"},
			[]string{`upstream "h"`, "needs url"}},
		{"unknown transport", Config{Name: "w", Transport: "websocket", URL: "https://x.example/"},
			[]string{`upstream "w"`, `"websocket"`, "stdio"}},
		{"headers on stdio", Config{Name: "s", Command: "npx", Headers: map[string]string{"A": "b"}},
			[]string{`upstream "s"`, "headers", "env"}},
		{"url on stdio", Config{Name: "s", Transport: "stdio", Command: "npx", URL: "https://x.example/"},
			[]string{`upstream "s"`, "url"}},
		{"env on http", Config{Name: "h", URL: "https://x.example/", Env: map[string]string{"A": "b"}},
			[]string{`upstream "h"`, "env applies to stdio"}},
		{"bad header name", Config{Name: "h", URL: "https://x.example/", Headers: map[string]string{"Bad Header": "x"}},
			[]string{`"Bad Header"`}},
		{"header value with newline", Config{Name: "h", URL: "https://x.example/", Headers: map[string]string{"X": "a\r\nInjected: 1"}},
			[]string{"header X", "line break"}},
		{"bad env name", Config{Name: "s", Command: "x", Env: map[string]string{"A=B": "1"}},
			[]string{`"A=B"`}},
		{"empty tool pattern", Config{Name: "h", URL: "https://x.example/", ToolsDeny: []string{""}},
			[]string{"tools_deny", "empty pattern"}},
		{"bad scope", Config{Name: "h", URL: "https://x.example/", Scope: "a b"},
			[]string{`scope "a b"`}},
		{"negative timeout", Config{Name: "h", URL: "https://x.example/", Timeout: -time.Second},
			[]string{"negative"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Normalize(tt.in)
			if err == nil {
				t.Fatal("Normalize succeeded; want an error")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

func TestNames(t *testing.T) {
	tests := []struct {
		name    string
		ok      bool
		suggest string
	}{
		{"github", true, ""},
		{"my-server_2", true, ""},
		{"A_B-c", true, ""},
		{strings.Repeat("x", 64), true, ""},
		{"", false, "has no name"},
		{"my server", false, `"my_server"`},
		{"a.b", false, `"a_b"`},
		{"café", false, `"caf"`},
		{"a/b", false, `"a_b"`},
		{"${NAME}", false, `"NAME"`},
		{strings.Repeat("x", 65), false, "at most 64"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Normalize(Config{Name: tt.name, URL: "https://x.example/mcp", Source: "a.json"})
			if tt.ok {
				if err != nil {
					t.Fatalf("Normalize: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatal("Normalize succeeded; want an error")
			}
			if tt.name != "" && !strings.Contains(err.Error(), `"`+tt.name+`"`) {
				t.Errorf("error %q does not name %q", err, tt.name)
			}
			if !strings.Contains(err.Error(), tt.suggest) || !strings.Contains(err.Error(), "a.json") {
				t.Errorf("error %q does not contain %q and the source", err, tt.suggest)
			}
		})
	}
}

func TestURLRule(t *testing.T) {
	tests := []struct {
		url string
		ok  bool
	}{
		{"https://api.githubcopilot.com/mcp/", true},
		{"https://10.0.0.1/mcp", true},
		{"https://mcp.example.com:8443/sse", true},
		{"http://localhost:8080/mcp", true},
		{"http://127.0.0.1:3000/mcp", true},
		{"http://127.8.9.10/mcp", true},
		{"http://[::1]:3000/mcp", true},
		{"http://10.0.0.1/mcp", false},
		{"http://192.168.1.10:8080/mcp", false},
		{"http://mcp.example.com/mcp", false},
		{"http://localhost.example.com/mcp", false},
		{"http://2130706433/mcp", false},
		{"file:///etc/passwd", false},
		{"ftp://x.example/mcp", false},
		{"ws://localhost/mcp", false},
		{"https://user:hunter2@x.example/mcp", false},
		{"//x.example/mcp", false},
		{"/mcp", false},
		{"https://x.example/%zz", false},
	}
	for _, tt := range tests {
		t.Run(tt.url, func(t *testing.T) {
			_, err := Normalize(Config{Name: "u", URL: tt.url})
			if tt.ok != (err == nil) {
				t.Fatalf("Normalize(%q) error = %v, want ok=%v", tt.url, err, tt.ok)
			}
			if err != nil && strings.Contains(err.Error(), "hunter2") {
				t.Errorf("error leaks the password: %v", err)
			}
			var ue *pinnedfetch.URLError
			if err != nil && strings.HasPrefix(tt.url, "http") && !strings.Contains(tt.url, "%zz") && !errors.As(err, &ue) {
				t.Errorf("error %v does not wrap *pinnedfetch.URLError", err)
			}
		})
	}
}

func TestURLWithPlaceholderIsCheckedAtTransport(t *testing.T) {
	u, err := Normalize(Config{Name: "p", URL: "http://${MCP_HOST}/mcp?key=${MCP_KEY}"})
	if err != nil {
		t.Fatalf("a URL with placeholders is checked later, not at load: %v", err)
	}
	env := map[string]string{"MCP_HOST": "10.0.0.1", "MCP_KEY": "s3cret"}
	e, _ := u.Expanded(mapLookup(env))
	_, err = e.Endpoint()
	if err == nil {
		t.Fatal("Endpoint accepted http://10.0.0.1 after expansion")
	}
	if strings.Contains(err.Error(), "s3cret") {
		t.Errorf("error leaks the query value: %v", err)
	}

	env["MCP_HOST"] = "127.0.0.1:9000"
	e, _ = u.Expanded(mapLookup(env))
	got, err := e.Endpoint()
	if err != nil {
		t.Fatalf("Endpoint: %v", err)
	}
	if got.Host != "127.0.0.1:9000" || got.Query().Get("key") != "s3cret" {
		t.Errorf("Endpoint = %v", got)
	}
	if u.URL != "http://${MCP_HOST}/mcp?key=${MCP_KEY}" {
		t.Errorf("Expanded changed the original URL to %q", u.URL)
	}

	delete(env, "MCP_HOST")
	e, _ = u.Expanded(mapLookup(env))
	_, err = e.Endpoint()
	if err == nil || !strings.Contains(err.Error(), "set MCP_HOST") {
		t.Fatalf("Endpoint with an unset variable: %v, want it to say to set MCP_HOST", err)
	}
}

func TestMergeUpstreams(t *testing.T) {
	a := []Config{{Name: "github", Source: "Caddy config"}, {Name: "linear", Source: "Caddy config"}}
	b := []Config{{Name: "fs", Source: "/etc/mcp.json"}}
	got, err := MergeUpstreams(a, b)
	if err != nil {
		t.Fatalf("MergeUpstreams: %v", err)
	}
	if names := upstreamNames(got); !reflect.DeepEqual(names, []string{"github", "linear", "fs"}) {
		t.Errorf("names = %v", names)
	}

	c := []Config{{Name: "linear", Source: "/home/me/.cursor/mcp.json"}, {Name: "github", Source: "/home/me/.cursor/mcp.json"}}
	_, err = MergeUpstreams(a, b, c)
	if err == nil {
		t.Fatal("MergeUpstreams accepted duplicate names")
	}
	for _, w := range []string{`"linear"`, `"github"`, "Caddy config", "/home/me/.cursor/mcp.json"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not contain %q", err, w)
		}
	}
}

func TestUpstreamJSON(t *testing.T) {
	shared := false
	want := Config{
		Name: "gh", Transport: "http", URL: "https://x.example/mcp",
		Headers: map[string]string{"Authorization": "Bearer ${GH}"}, ToolsAllow: []string{"get_*"},
		ToolsDeny: []string{"delete_*"}, Scope: "github", Timeout: 90 * time.Second, Shared: &shared,
	}
	tests := []struct {
		name, json string
	}{
		{"duration string", `{"name":"gh","transport":"http","url":"https://x.example/mcp","headers":{"Authorization":"Bearer ${GH}"},"tools_allow":["get_*"],"tools_deny":["delete_*"],"scope":"github","timeout":"1m30s","shared":false}`},
		{"nanoseconds", `{"name":"gh","transport":"http","url":"https://x.example/mcp","headers":{"Authorization":"Bearer ${GH}"},"tools_allow":["get_*"],"tools_deny":["delete_*"],"scope":"github","timeout":90000000000,"shared":false}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got Config
			if err := json.Unmarshal([]byte(tt.json), &got); err != nil {
				t.Fatalf("Unmarshal: %v", err)
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("got %+v\nwant %+v", got, want)
			}
		})
	}
	out, err := json.Marshal(want)
	if err != nil {
		t.Fatal(err)
	}
	var back Config
	if err := json.Unmarshal(out, &back); err != nil || !reflect.DeepEqual(back, want) {
		t.Errorf("round trip: %v, %+v", err, back)
	}
	var bad Config
	if err := json.Unmarshal([]byte(`{"name":"gh","timeout":"soon"}`), &bad); err == nil || !strings.Contains(err.Error(), "30s") {
		t.Errorf("bad timeout: %v", err)
	}
}

func TestAllowsTool(t *testing.T) {
	u := Config{ToolsAllow: []string{"get_*", "list_*", "search"}, ToolsDeny: []string{"get_secret*"}}
	for tool, want := range map[string]bool{
		"get_issue": true, "list_repos": true, "search": true, "search_code": false,
		"get_secret_value": false, "delete_repo": false,
	} {
		if got := u.AllowsTool(tool); got != want {
			t.Errorf("AllowsTool(%q) = %v, want %v", tool, got, want)
		}
	}
	// A server may resolve a tool's name without regard to case (or to
	// Unicode's compatibility forms): a call that would reach a denied
	// tool there is denied under every spelling, while an allowed name
	// is taken as it is spelled.
	d := Config{ToolsDeny: []string{"delete_*", "drop"}}
	for _, tool := range []string{"DELETE_repo", "Delete_Repo", "ＤＥＬＥＴＥ_repo", "DROP", "Drop"} {
		if d.AllowsTool(tool) {
			t.Errorf("AllowsTool(%q) with deny delete_*, drop: allowed", tool)
		}
	}
	if !d.AllowsTool("deleted_items_count") || !d.AllowsTool("dropbox") {
		t.Error("deny patterns match more than their names")
	}
	if u.AllowsTool("GET_issue") {
		t.Error("allow get_* took GET_issue: an allowed name is matched as spelled")
	}
	if !(Config{}).AllowsTool("anything") {
		t.Error("an upstream without patterns should allow every tool")
	}
	if (Config{ToolsDeny: []string{"*"}}).AllowsTool("x") {
		t.Error("deny * should hide every tool")
	}
}

func TestIsShared(t *testing.T) {
	f, tr := false, true
	if !(Config{}).IsShared() || !(Config{Shared: &tr}).IsShared() || (Config{Shared: &f}).IsShared() {
		t.Error("IsShared: want true unless shared is false")
	}
}

func TestNormalizeDoesNotAlias(t *testing.T) {
	in := Config{Name: "s", Command: "x", Args: []string{"a"}, Env: map[string]string{"K": "v"}}
	out, err := Normalize(in)
	if err != nil {
		t.Fatal(err)
	}
	out.Args[0] = "changed"
	out.Env["K"] = "changed"
	if in.Args[0] != "a" || in.Env["K"] != "v" {
		t.Error("Normalize returned slices or maps shared with its input")
	}
}

func upstreamNames(us []Config) []string {
	var names []string
	for _, u := range us {
		names = append(names, u.Name)
	}
	return names
}

func mapLookup(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) {
		v, ok := m[k]
		return v, ok
	}
}

// An upstream's pin policy: strict and new tools held for a remote server,
// warn and new tools allowed for a local one (loopback, stdio); a config
// that sets them is followed, but one from an untrusted source (a session's
// file) gets the defaults whatever it says.
func TestPinPolicyDefaults(t *testing.T) {
	for _, c := range []struct {
		u    Config
		want pins.Policy
	}{
		{Config{URL: "https://mcp.example.com/mcp"}, pins.Policy{Mode: pins.Strict, NewTools: pins.HoldNew}},
		{Config{URL: "http://127.0.0.1:9000/mcp"}, pins.Policy{Mode: pins.Warn, NewTools: pins.AllowNew}},
		{Config{URL: "http://localhost:9000/mcp"}, pins.Policy{Mode: pins.Warn, NewTools: pins.AllowNew}},
		{Config{URL: "http://[::1]:9000/mcp"}, pins.Policy{Mode: pins.Warn, NewTools: pins.AllowNew}},
		// Not loopback: a name under localhost, an IPv4-mapped address, a
		// placeholder that could expand to anything.
		{Config{URL: "http://a.localhost:9000/mcp"}, pins.Policy{Mode: pins.Strict, NewTools: pins.HoldNew}},
		{Config{URL: "http://[::ffff:127.0.0.1]:9000/mcp"}, pins.Policy{Mode: pins.Strict, NewTools: pins.HoldNew}},
		{Config{URL: "http://${HOST}/mcp"}, pins.Policy{Mode: pins.Strict, NewTools: pins.HoldNew}},
		{Config{Transport: TransportStdio, Command: "server"}, pins.Policy{Mode: pins.Warn, NewTools: pins.AllowNew}},
		{Config{URL: "https://mcp.example.com/mcp", Pin: "warn", NewTools: "allow"}, pins.Policy{Mode: pins.Warn, NewTools: pins.AllowNew}},
		{Config{URL: "http://127.0.0.1:9000/mcp", Pin: "strict", NewTools: "hold"}, pins.Policy{Mode: pins.Strict, NewTools: pins.HoldNew}},
		{Config{URL: "https://mcp.example.com/mcp", Pin: "off", NewTools: "allow", FromUntrusted: true}, pins.Policy{Mode: pins.Strict, NewTools: pins.HoldNew}},
	} {
		if got := c.u.PinPolicy(); got != c.want {
			t.Errorf("%+v: %+v, want %+v", c.u, got, c.want)
		}
	}
	if _, err := Normalize(Config{Name: "a", URL: "https://mcp.example.com/mcp", NewTools: "trust"}); err == nil || !strings.Contains(err.Error(), "use allow or hold") {
		t.Errorf("new_tools trust: %v", err)
	}
}

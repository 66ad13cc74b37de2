package upstream

import (
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestLoadMCPJSONShapes(t *testing.T) {
	const src = "mcp.json"
	yes, no := true, false
	tests := []struct {
		name     string
		json     string
		want     []Config
		warnings []string // substrings, one per expected warning, in order
	}{
		{
			name: "list of configs",
			json: `[
				{"name": "github", "url": "https://api.githubcopilot.com/mcp/", "headers": {"Authorization": "Bearer ${GITHUB_TOKEN}"}},
				{"name": "fs", "command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem", "/tmp"]}
			]`,
			want: []Config{
				{Name: "github", Transport: "http", URL: "https://api.githubcopilot.com/mcp/", Headers: map[string]string{"Authorization": "Bearer ${GITHUB_TOKEN}"}, Source: src},
				{Name: "fs", Transport: "stdio", Command: "npx", Args: []string{"-y", "@modelcontextprotocol/server-filesystem", "/tmp"}, Source: src},
			},
		},
		{
			name: "single config",
			json: `{"name": "linear", "type": "sse", "url": "https://mcp.linear.app/events"}`,
			want: []Config{{Name: "linear", Transport: "sse", URL: "https://mcp.linear.app/events", Source: src}},
		},
		{
			name: "name-keyed, bare",
			json: `{
				"remote": {"url": "https://mcp.example.com/mcp"},
				"local": {"command": "node", "args": ["server.js", 8080, true], "env": {"PORT": 3000, "DEBUG": false, "TOKEN": "${TOKEN}"}, "cwd": "/srv/mcp"}
			}`,
			want: []Config{
				{Name: "remote", Transport: "http", URL: "https://mcp.example.com/mcp", Source: src},
				{Name: "local", Transport: "stdio", Command: "node", Args: []string{"server.js", "8080", "true"},
					Env: map[string]string{"PORT": "3000", "DEBUG": "false", "TOKEN": "${TOKEN}"}, Cwd: "/srv/mcp", Source: src},
			},
		},
		{
			name: "under mcpServers (Claude Desktop, Cursor)",
			json: `{"mcpServers": {
				"filesystem": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem", "/Users/me/Desktop"]},
				"github": {"type": "http", "url": "https://api.githubcopilot.com/mcp/", "headers": {"Authorization": "Bearer ${env:GITHUB_PAT}"}}
			}}`,
			want: []Config{
				{Name: "filesystem", Transport: "stdio", Command: "npx", Args: []string{"-y", "@modelcontextprotocol/server-filesystem", "/Users/me/Desktop"}, Source: src},
				{Name: "github", Transport: "http", URL: "https://api.githubcopilot.com/mcp/", Headers: map[string]string{"Authorization": "Bearer ${env:GITHUB_PAT}"}, Source: src},
			},
		},
		{
			name: "under servers (VS Code), inputs ignored",
			json: `{
				"inputs": [{"type": "promptString", "id": "token", "password": true}],
				"servers": {
					"memory": {"type": "stdio", "command": "npx", "args": ["-y", "@modelcontextprotocol/server-memory"], "envFile": "${workspaceFolder}/.env"},
					"remote": {"type": "sse", "url": "https://mcp.example.com/events", "headers": {"X-Key": "${input:token}"}}
				}
			}`,
			want: []Config{
				{Name: "memory", Transport: "stdio", Command: "npx", Args: []string{"-y", "@modelcontextprotocol/server-memory"}, Source: src},
				{Name: "remote", Transport: "sse", URL: "https://mcp.example.com/events", Headers: map[string]string{"X-Key": "${input:token}"}, Source: src},
			},
			warnings: []string{`top-level field "inputs"`, `server "memory": field "envFile"`},
		},
		{
			name: "type and transport spellings",
			json: `{"mcpServers": {
				"a": {"transport": "streamable-http", "url": "https://a.example/sse"},
				"b": {"type": "streamableHttp", "url": "https://b.example/mcp"},
				"c": {"type": "http", "transport": "streamable-http", "url": "https://c.example/mcp"},
				"d": {"transport": "sse", "url": "https://d.example/stream"},
				"e": {"type": "stdio", "command": "uvx", "args": ["mcp-server-git"]}
			}}`,
			want: []Config{
				{Name: "a", Transport: "http", URL: "https://a.example/sse", Source: src},
				{Name: "b", Transport: "http", URL: "https://b.example/mcp", Source: src},
				{Name: "c", Transport: "http", URL: "https://c.example/mcp", Source: src},
				{Name: "d", Transport: "sse", URL: "https://d.example/stream", Source: src},
				{Name: "e", Transport: "stdio", Command: "uvx", Args: []string{"mcp-server-git"}, Source: src},
			},
		},
		{
			name: "httpUrl, sseUrl, url, serverUrl",
			json: `{"mcpServers": {
				"h": {"httpUrl": "https://h.example/sse"},
				"s": {"sseUrl": "https://s.example/events"},
				"u": {"url": "https://u.example/sse"},
				"m": {"url": "https://m.example/mcp"},
				"w": {"serverUrl": "https://w.example/mcp"},
				"l": {"url": "http://localhost:3001/mcp"}
			}}`,
			want: []Config{
				{Name: "h", Transport: "http", URL: "https://h.example/sse", Source: src},
				{Name: "s", Transport: "sse", URL: "https://s.example/events", Source: src},
				{Name: "u", Transport: "sse", URL: "https://u.example/sse", Source: src},
				{Name: "m", Transport: "http", URL: "https://m.example/mcp", Source: src},
				{Name: "w", Transport: "http", URL: "https://w.example/mcp", Source: src},
				{Name: "l", Transport: "http", URL: "http://localhost:3001/mcp", Source: src},
			},
		},
		{
			name: "stdio command as a list, extras, disabled entries",
			json: `{"mcpServers": {
				"git": {"command": ["uvx", "mcp-server-git"], "args": ["--repository", "."], "timeout": 30000, "shared": false,
					"includeTools": ["git_status", "git_log"], "excludeTools": ["git_reset"], "scope": "dev:git"},
				"slow": {"url": "https://slow.example/mcp", "timeout": "2m", "tools_allow": ["read_*"], "toolsDeny": ["read_secret"], "shared": null},
				"off": {"command": "npx", "disabled": true},
				"cline": {"command": "npx", "autoApprove": ["x"], "alwaysAllow": [], "shared": true}
			}}`,
			want: []Config{
				{Name: "git", Transport: "stdio", Command: "uvx", Args: []string{"mcp-server-git", "--repository", "."}, Timeout: 30 * time.Second, Shared: &no,
					ToolsAllow: []string{"git_status", "git_log"}, ToolsDeny: []string{"git_reset"}, Scope: "dev:git", Source: src},
				{Name: "slow", Transport: "http", URL: "https://slow.example/mcp", Timeout: 2 * time.Minute, ToolsAllow: []string{"read_*"}, ToolsDeny: []string{"read_secret"}, Source: src},
				{Name: "cline", Transport: "stdio", Command: "npx", Shared: &yes, Source: src},
			},
			warnings: []string{`server "off" is disabled`, `server "cline": field "alwaysAllow"`, `server "cline": field "autoApprove"`},
		},
		{
			name:     "key wins over a name field",
			json:     `{"mcpServers": {"docs": {"name": "other", "url": "https://docs.example/mcp"}}}`,
			want:     []Config{{Name: "docs", Transport: "http", URL: "https://docs.example/mcp", Source: src}},
			warnings: []string{`"name" "other" is ignored`},
		},
		{
			name: "server named like a config key",
			json: `{"url": {"url": "https://a.example/mcp"}, "command": {"command": "npx"}}`,
			want: []Config{
				{Name: "url", Transport: "http", URL: "https://a.example/mcp", Source: src},
				{Name: "command", Transport: "stdio", Command: "npx", Source: src},
			},
		},
		{
			name: "mcpServers as a list",
			json: `{"mcpServers": [{"name": "a", "url": "https://a.example/mcp"}]}`,
			want: []Config{{Name: "a", Transport: "http", URL: "https://a.example/mcp", Source: src}},
		},
		{name: "empty map", json: `{"mcpServers": {}}`},
		{name: "empty list", json: `[]`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, warnings, err := LoadMCPJSON([]byte(tt.json), src)
			if err != nil {
				t.Fatalf("LoadMCPJSON: %v", err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("upstreams:\n got %+v\nwant %+v", got, tt.want)
			}
			if len(warnings) != len(tt.warnings) {
				t.Fatalf("warnings = %q, want %d matching %q", warnings, len(tt.warnings), tt.warnings)
			}
			for i, w := range tt.warnings {
				if !strings.Contains(warnings[i], w) || !strings.HasPrefix(warnings[i], src+": ") {
					t.Errorf("warning %d = %q, want it to start with the source and contain %q", i, warnings[i], w)
				}
			}
		})
	}
}

func TestLoadMCPJSONErrors(t *testing.T) {
	tests := []struct {
		name string
		json string
		want []string
	}{
		{"cannot infer a transport", `{"mcpServers": {"broken": {"headers": {"X": "y"}}}}`,
			[]string{`upstream "broken" (from team.json)`, "cannot tell how to reach it", "url", "command"}},
		{"list entry without a name", `[{"name": "a", "command": "x"}, {"command": "y"}]`,
			[]string{"team.json: entry 2 has no name"}},
		{"url and command", `{"mcpServers": {"both": {"url": "https://x.example/mcp", "command": "npx"}}}`,
			[]string{`upstream "both"`, "both url and command"}},
		{"two url fields", `{"mcpServers": {"two": {"url": "https://x.example/a", "sseUrl": "https://x.example/b"}}}`,
			[]string{`server "two"`, "url and sseUrl"}},
		{"type and transport disagree", `{"mcpServers": {"c": {"type": "http", "transport": "sse", "url": "https://c.example/"}}}`,
			[]string{`server "c"`, "disagree"}},
		{"sseUrl with type http", `{"mcpServers": {"c": {"type": "http", "sseUrl": "https://c.example/"}}}`,
			[]string{`server "c"`, "sseUrl"}},
		{"stdio without a command", `{"mcpServers": {"s": {"type": "stdio", "args": ["x"]}}}`,
			[]string{`upstream "s"`, "needs command"}},
		{"unknown type", `{"mcpServers": {"w": {"type": "websocket", "url": "wss://w.example/"}}}`,
			[]string{`upstream "w"`, `"websocket"`}},
		{"bad name", `{"mcpServers": {"my server": {"url": "https://x.example/mcp"}}}`,
			[]string{`"my server"`, "letters, digits", `"my_server"`}},
		{"bad name in a list", `[{"name": "a.b", "url": "https://x.example/mcp"}]`,
			[]string{`"a.b"`, `"a_b"`}},
		{"duplicate in a list", `[{"name": "a", "command": "x"}, {"name": "a", "command": "y"}]`,
			[]string{`upstream "a" is defined twice`}},
		{"duplicate key", `{"mcpServers": {"a": {"command": "x"}, "a": {"command": "y"}}}`,
			[]string{`"a" is given twice`}},
		{"http to a private address", `{"mcpServers": {"lan": {"url": "http://10.0.0.1/mcp"}}}`,
			[]string{`upstream "lan"`, "only to localhost"}},
		{"file URL", `{"mcpServers": {"f": {"url": "file:///etc/passwd"}}}`,
			[]string{`upstream "f"`, "scheme"}},
		{"args not strings", `{"mcpServers": {"a": {"command": "x", "args": [{"k": 1}]}}}`,
			[]string{`server "a"`, "args[0]"}},
		{"env not an object", `{"mcpServers": {"a": {"command": "x", "env": ["A=1"]}}}`,
			[]string{`server "a"`, `"env" must be an object`}},
		{"bad timeout", `{"mcpServers": {"a": {"command": "x", "timeout": "soon"}}}`,
			[]string{`server "a"`, "timeout"}},
		{"server is not an object", `{"mcpServers": {"a": "https://x.example/mcp"}}`,
			[]string{`"a" in "mcpServers" is not a server config`}},
		{"every error is reported", `{"mcpServers": {"x y": {"url": "https://a.example/"}, "z": {}}}`,
			[]string{`"x y"`, `upstream "z"`}},
		{"empty", "  \n", []string{"team.json is empty"}},
		{"not an object", `"hello"`, []string{"not a JSON object or array"}},
		{"invalid JSON", `{"mcpServers": {`, []string{"team.json", "not valid JSON"}},
		{"trailing text", `{"a": {"command": "x"}} x`, []string{"not valid JSON"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, _, err := LoadMCPJSON([]byte(tt.json), "team.json")
			if err == nil {
				t.Fatalf("LoadMCPJSON succeeded with %+v; want an error", got)
			}
			if got != nil {
				t.Errorf("LoadMCPJSON returned upstreams with an error: %+v", got)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

func TestLoadMCPJSONKeepsPlaceholdersAndMerges(t *testing.T) {
	a, _, err := LoadMCPJSON([]byte(`{"mcpServers": {"github": {"url": "https://${GH_HOST:-api.githubcopilot.com}/mcp/", "headers": {"Authorization": "Bearer ${GITHUB_TOKEN}"}}}}`), "/etc/zidane/mcp.json")
	if err != nil {
		t.Fatal(err)
	}
	if a[0].URL != "https://${GH_HOST:-api.githubcopilot.com}/mcp/" || a[0].Headers["Authorization"] != "Bearer ${GITHUB_TOKEN}" {
		t.Errorf("placeholders were not kept: %+v", a[0])
	}
	b, _, err := LoadMCPJSON([]byte(`[{"name": "github", "command": "github-mcp-server"}]`), "/home/me/.cursor/mcp.json")
	if err != nil {
		t.Fatal(err)
	}
	_, err = MergeUpstreams(a, b)
	if err == nil || !strings.Contains(err.Error(), "/etc/zidane/mcp.json") || !strings.Contains(err.Error(), "/home/me/.cursor/mcp.json") {
		t.Fatalf("MergeUpstreams error = %v, want both sources named", err)
	}
}

func TestLoadMCPJSONWarningsNeverHoldValues(t *testing.T) {
	_, warnings, err := LoadMCPJSON([]byte(`{"mcpServers": {"a": {"command": "x", "apiKey": "sk-live-123"}}, "token": "sk-live-456"}`), "m.json")
	if err != nil {
		t.Fatal(err)
	}
	if len(warnings) != 2 {
		t.Fatalf("warnings = %q", warnings)
	}
	for _, w := range warnings {
		if strings.Contains(w, "sk-live") {
			t.Errorf("warning leaks a value: %q", w)
		}
	}
}

func TestLoadMCPJSONBounded(t *testing.T) {
	var b strings.Builder
	b.WriteString(`{"mcpServers": {`)
	for i := 0; i <= MaxMCPJSONServers; i++ {
		if i > 0 {
			b.WriteString(",")
		}
		b.WriteString(`"s` + strings.Repeat("x", i%7) + strconv.Itoa(i) + `": {"command": "x"}`)
	}
	b.WriteString(`}}`)
	_, _, err := LoadMCPJSON([]byte(b.String()), "big.json")
	if err == nil || !strings.Contains(err.Error(), "at most") {
		t.Fatalf("err = %v, want a bound", err)
	}
}

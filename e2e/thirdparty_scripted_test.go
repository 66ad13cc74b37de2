package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
)

// scriptedModel is a loopback server that speaks the Anthropic Messages
// API (streaming and not) well enough for claude-agent-acp to run whole
// turns: the model of a real coding agent, scripted. A turn with the Bash
// tool on offer first asks to run Command, then, once the tool's result is
// back, ends with a text that quotes nothing of it. Requests without tools
// (titles, topic checks) get a short text. Every tool result is kept.
type scriptedModel struct {
	Command string

	mu          sync.Mutex
	toolResults []string
}

func (m *scriptedModel) results() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]string(nil), m.toolResults...)
}

func (m *scriptedModel) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || !strings.HasPrefix(r.URL.Path, "/v1/messages") {
		http.Error(w, `{"type":"error","error":{"type":"not_found_error","message":"scripted model: no such route"}}`, http.StatusNotFound)
		return
	}
	if strings.HasSuffix(r.URL.Path, "/count_tokens") {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"input_tokens":10}`)
		return
	}
	var req struct {
		Stream bool `json:"stream"`
		Tools  []struct {
			Name string `json:"name"`
		} `json:"tools"`
		Messages []struct {
			Role    string          `json:"role"`
			Content json.RawMessage `json:"content"`
		} `json:"messages"`
	}
	if err := json.NewDecoder(io.LimitReader(r.Body, 32<<20)).Decode(&req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	hasBash := false
	for _, t := range req.Tools {
		hasBash = hasBash || t.Name == "Bash"
	}
	var toolResult *string
	if n := len(req.Messages); n > 0 && req.Messages[n-1].Role == "user" {
		var blocks []struct {
			Type    string          `json:"type"`
			Content json.RawMessage `json:"content"`
		}
		if json.Unmarshal(req.Messages[n-1].Content, &blocks) == nil {
			for _, b := range blocks {
				if b.Type == "tool_result" {
					s := toolResultText(b.Content)
					toolResult = &s
				}
			}
		}
	}
	var content []map[string]any
	stop := "end_turn"
	switch {
	case toolResult != nil:
		m.mu.Lock()
		m.toolResults = append(m.toolResults, *toolResult)
		m.mu.Unlock()
		content = []map[string]any{{"type": "text", "text": "Scripted model: the command ran."}}
	case hasBash:
		content = []map[string]any{{"type": "tool_use", "id": "toolu_scripted1", "name": "Bash", "input": map[string]any{"command": m.Command, "description": "scripted probe"}}}
		stop = "tool_use"
	default:
		content = []map[string]any{{"type": "text", "text": "ok"}}
	}
	msg := map[string]any{
		"id": "msg_scripted", "type": "message", "role": "assistant", "model": "claude-scripted",
		"content": content, "stop_reason": stop, "stop_sequence": nil,
		"usage": map[string]any{"input_tokens": 10, "output_tokens": 10},
	}
	if !req.Stream {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(msg)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	send := func(event string, data map[string]any) {
		b, _ := json.Marshal(data)
		fmt.Fprintf(w, "event: %s\ndata: %s\n\n", event, b)
	}
	start := map[string]any{}
	for k, v := range msg {
		start[k] = v
	}
	start["content"], start["stop_reason"] = []any{}, nil
	send("message_start", map[string]any{"type": "message_start", "message": start})
	for i, c := range content {
		switch c["type"] {
		case "text":
			send("content_block_start", map[string]any{"type": "content_block_start", "index": i, "content_block": map[string]any{"type": "text", "text": ""}})
			send("content_block_delta", map[string]any{"type": "content_block_delta", "index": i, "delta": map[string]any{"type": "text_delta", "text": c["text"]}})
		case "tool_use":
			input, _ := json.Marshal(c["input"])
			send("content_block_start", map[string]any{"type": "content_block_start", "index": i, "content_block": map[string]any{"type": "tool_use", "id": c["id"], "name": c["name"], "input": map[string]any{}}})
			send("content_block_delta", map[string]any{"type": "content_block_delta", "index": i, "delta": map[string]any{"type": "input_json_delta", "partial_json": string(input)}})
		}
		send("content_block_stop", map[string]any{"type": "content_block_stop", "index": i})
	}
	send("message_delta", map[string]any{"type": "message_delta", "delta": map[string]any{"stop_reason": stop, "stop_sequence": nil}, "usage": map[string]any{"output_tokens": 10}})
	send("message_stop", map[string]any{"type": "message_stop"})
}

// toolResultText is a tool_result's content: a string, or text blocks.
func toolResultText(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var blocks []struct {
		Text string `json:"text"`
	}
	json.Unmarshal(raw, &blocks)
	var b strings.Builder
	for _, x := range blocks {
		b.WriteString(x.Text)
	}
	return b.String()
}

// TestSessionsClaudeAgentACPConfined runs claude-agent-acp through whole
// turns, confined, on a scripted model on a loopback port (the one port
// its sandbox adds to the defaults). The model has it run a shell command
// that writes a file in the session's cwd, which must work, and that tries
// to read the admin key, the tokens and caddy's environment and to reach
// the admin API, which must all fail: the tool's output, which the model
// gets back, holds none of them.
func TestSessionsClaudeAgentACPConfined(t *testing.T) {
	nodeBin := node(t)
	script := packageBin(t, "@agentclientprotocol/claude-agent-acp", "claude-agent-acp")
	model := &scriptedModel{}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &httptest.Server{Listener: ln, Config: &http.Server{Handler: model}}
	srv.Start()
	t.Cleanup(srv.Close)
	modelPort := ln.Addr().(*net.TCPAddr).Port

	const secret = "s3cr3t-claude-confinement-91c2"
	agent := fmt.Sprintf(`		agent claude {
			command %s %s
			env IS_SANDBOX 1
			env DISABLE_TELEMETRY 1
			env CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC 1
			env ANTHROPIC_BASE_URL http://127.0.0.1:%d
			env ANTHROPIC_API_KEY ${ZIDANE_TEST_MODEL_KEY}
			sandbox {
				connect %d
			}
		}
		upstream secretive http://127.0.0.1:9/mcp {
			header Authorization "Bearer ${ZIDANE_TEST_SECRET}"
		}`, nodeBin, script, modelPort, modelPort)
	port := freePort(t)
	c := startCaddy(t, sessionsCaddyfile(port, agent, ""), "ZIDANE_TEST_SECRET="+secret, "ZIDANE_TEST_MODEL_KEY=sk-ant-scripted")
	url := fmt.Sprintf("http://127.0.0.1:%d/mcp", port)
	token := createToken(t, c, "claude-confined", "--scope", "chat")
	g := connectGoSessions(t, url, token, "go-sdk")
	key, err := os.ReadFile(filepath.Join(c.DataDir, "zidane", "admin.key"))
	if err != nil {
		t.Fatal(err)
	}
	model.Command = fmt.Sprintf("echo made-in-the-sandbox > made-by-claude.txt; cat %s %s; tr '\\0' '\\n' < /proc/%d/environ; curl -sS -m 5 http://%s/config/; echo probe-end",
		filepath.Join(c.DataDir, "zidane", "admin.key"), filepath.Join(c.DataDir, "zidane", "tokens.json"), c.proc.cmd.Process.Pid, c.AdminAddr)

	dir := t.TempDir()
	// The project's settings ask for the permission mode that asks before
	// a command runs (else Claude's auto mode asks a classifier, which the
	// scripted model is not).
	if err := os.MkdirAll(filepath.Join(dir, ".claude"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, ".claude", "settings.json"), []byte(`{"permissions":{"defaultMode":"default"}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	id := createSession(t, g, dir, "run the probe", "agent", "claude").SessionID
	v := settleIn(t, g, id, "blocked")
	it := onlyPending(t, g, id)
	if a := answerInteraction(t, g, it.RequestID, map[string]any{"decision": "allow"}); a.IsError {
		t.Fatalf("answering %s: %s", it.Summary, a.Text)
	}
	v = settleIn(t, g, id, "idle")
	if v.Error != "" {
		t.Fatalf("claude-agent-acp on the scripted model: %+v", v)
	}
	if !strings.Contains(v.LastMessage, "Scripted model: the command ran.") {
		t.Fatalf("the turn after the tool: %+v", v)
	}
	made, err := os.ReadFile(filepath.Join(dir, "made-by-claude.txt"))
	if err != nil || strings.TrimSpace(string(made)) != "made-in-the-sandbox" {
		t.Errorf("the confined Bash command did not write in the session's cwd: %q %v", made, err)
	}
	// Claude Code may send one turn's request again (its retry, or its
	// fallback from a stream it finds slow on a loaded machine): the
	// same tool result twice is one result.
	results := slices.Compact(model.results())
	if len(results) != 1 || !strings.Contains(results[0], "probe-end") {
		t.Fatalf("tool results the model got: %q", results)
	}
	out := results[0]
	t.Logf("the Bash tool's output:\n%s", out)
	for what, s := range map[string]string{"the admin key": strings.TrimSpace(string(key)), "caddy's secret": secret, "a token hash": `"sha256"`, "the running config": `"apps"`} {
		if strings.Contains(out, s) {
			t.Errorf("the agent's shell read %s", what)
		}
	}
	for _, refusal := range []string{"Permission denied", "Couldn't connect"} {
		if !strings.Contains(out, refusal) {
			t.Errorf("the tool output lacks %q: the probes did not run as expected", refusal)
		}
	}
}

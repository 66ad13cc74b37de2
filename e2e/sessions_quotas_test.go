package e2e

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestSessionsQuotaIdleAgentsMakeRoom: one token fills max_agents with
// sessions it leaves idle; another token still creates and runs a session,
// because the first token's least recently used idle agent is stopped for
// it, and that session resumes (session/load) at its next prompt.
func TestSessionsQuotaIdleAgentsMakeRoom(t *testing.T) {
	gw := startSessionsGateway(t, "max_agents 3\n\t\tmax_agents_per_token 3\n\t\tagent_idle_timeout 1h", "")
	hog := connectGoSessions(t, gw.url, createToken(t, gw.c, "hog", "--scope", "chat"), "hog")
	other := connectTSSessions(t, gw.url, createToken(t, gw.c, "other", "--scope", "chat"), "other")
	dir := t.TempDir()

	var idle []string
	for i := range 3 {
		id := createSession(t, hog, dir, fmt.Sprintf("hog %d", i)).SessionID
		settleIn(t, hog, id, "idle")
		idle = append(idle, id)
	}
	theirs := createSession(t, other, dir, "other runs").SessionID
	if v := settleIn(t, other, theirs, "idle"); v.LastMessage != "You said: other runs" {
		t.Fatalf("the other token's session: %+v", v)
	}
	gw.c.WaitForLog(t, "idle agent stopped to make room", 10*time.Second)
	if logs := gw.c.Logs(); !strings.Contains(logs, idle[0]) || strings.Count(logs, "idle agent stopped to make room") != 1 {
		t.Fatalf("want one agent stopped for room, the hog's first (%s); logs:\n%s", idle[0], tail(logs, 30))
	}

	sendPrompt(t, hog, idle[0], "back again")
	if v := settleIn(t, hog, idle[0], "idle"); v.LastMessage != "You said: back again" || v.Turns != 2 {
		t.Fatalf("the session whose agent made room, at its next prompt: %+v", v)
	}
	if !strings.Contains(gw.c.Logs(), `"resumed": true`) && !strings.Contains(gw.c.Logs(), `"resumed":true`) {
		t.Errorf("its agent was not relaunched with session/load; logs:\n%s", tail(gw.c.Logs(), 30))
	}
}

// TestSessionsQuotaPerToken: a token whose sessions all run long turns is
// refused at max_agents_per_token, and a token at max_sessions_per_token is
// refused, with quota errors that name the limit; another token creates and
// runs sessions all along.
func TestSessionsQuotaPerToken(t *testing.T) {
	gw := startSessionsGateway(t, "max_agents 6\n\t\tmax_agents_per_token 2\n\t\tmax_sessions_per_token 3\n\t\tagent_idle_timeout 1h", "")
	a := connectGoSessions(t, gw.url, createToken(t, gw.c, "greedy", "--scope", "chat"), "greedy")
	b := connectGoSessions(t, gw.url, createToken(t, gw.c, "modest", "--scope", "chat"), "modest")
	dir := t.TempDir()
	bRuns := func(prompt string) {
		t.Helper()
		id := createSession(t, b, dir, prompt).SessionID
		if v := settleIn(t, b, id, "idle"); v.LastMessage != "You said: "+prompt {
			t.Fatalf("the other token's session: %+v", v)
		}
	}

	busy := []string{createSession(t, a, dir, "sleep: 10m").SessionID, createSession(t, a, dir, "sleep: 10m").SessionID}
	for _, id := range busy {
		awaitMessage(t, a, id, "Sleeping")
	}
	msg := callRefused(t, a, "sessions", map[string]any{"verb": "create", "cwd": dir, "prompt": "a third"}, "quota")
	if !strings.Contains(msg, `token "greedy"`) || !strings.Contains(msg, "max_agents_per_token") {
		t.Errorf("the refusal does not say whose limit or which: %s", msg)
	}
	bRuns("not affected")

	// One of its turns ends: its own idle agent makes room for its third.
	callOK(t, a, "sessions", map[string]any{"verb": "cancel", "sessionId": busy[0]})
	third := createSession(t, a, dir, "a third, now").SessionID
	settleIn(t, a, third, "idle")
	msg = callRefused(t, a, "sessions", map[string]any{"verb": "create", "cwd": dir, "prompt": "a fourth"}, "quota")
	if !strings.Contains(msg, "3 live sessions") || !strings.Contains(msg, "max_sessions_per_token") {
		t.Errorf("the refusal does not name the session limit: %s", msg)
	}
	bRuns("still not affected")
}

// TestSessionsRoots: with roots set, every way out of them is refused with
// the allowed roots in the message, a token's roots narrow the gateway's,
// a reload that changes them applies at once, and an allowed cwd works.
func TestSessionsRoots(t *testing.T) {
	base, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(base, "work")
	project := filepath.Join(root, "project")
	other := filepath.Join(root, "other")
	outside := filepath.Join(base, "outside")
	for _, d := range []string{project, other, outside} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("/etc", filepath.Join(root, "etc")); err != nil {
		t.Fatal(err)
	}
	// A repository inside the root whose git directory is outside it.
	linked := filepath.Join(root, "linked")
	os.MkdirAll(linked, 0o755)
	gitIn(t, linked, "init", "-q", "-b", "main", "--separate-git-dir", filepath.Join(outside, "secret.git"))
	gitIn(t, linked, "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "--allow-empty", "-m", "init")

	port := freePort(t)
	caddyfile := func(roots string) string { return sessionsCaddyfile(port, "roots "+roots, "") }
	c := startCaddy(t, caddyfile(root))
	url := fmt.Sprintf("http://127.0.0.1:%d/mcp", port)
	g := connectGoSessions(t, url, createToken(t, c, "rooted", "--scope", "chat"), "rooted")
	ts := connectTSSessions(t, url, createToken(t, c, "rooted-ts", "--scope", "chat"), "rooted-ts")

	for _, tc := range []struct{ name, cwd, env string }{
		{"/", "/", ""},
		{"/etc", "/etc", ""},
		{"/root", "/root", ""},
		{"/proc/self", "/proc/self", ""},
		{"dot-dot out", root + "/project/../../outside", ""},
		{"a symlink in the root to /etc", filepath.Join(root, "etc"), ""},
		{"a worktree of a repository whose git directory is outside", linked, "worktree"},
	} {
		for _, cl := range []sessionsClient{g, ts} {
			args := map[string]any{"verb": "create", "cwd": tc.cwd, "prompt": "pwd"}
			if tc.env != "" {
				args["environment"] = map[string]any{"kind": tc.env}
			}
			msg := callRefused(t, cl, "sessions", args, "bad_request")
			if !strings.Contains(msg, "outside this gateway's allowed roots ("+root+")") {
				t.Errorf("%s: %s: the refusal does not name the allowed roots: %s", cl.name(), tc.name, msg)
			}
		}
	}
	var l listView
	sessionsCall(t, g, "list", nil).decode(t, &l)
	if len(l.Sessions) != 0 {
		t.Fatalf("refused creates made sessions: %+v", l.Sessions)
	}
	id := createSession(t, g, project, "pwd").SessionID
	if v := settleIn(t, g, id, "idle"); v.LastMessage != project {
		t.Fatalf("a session in %s: its agent runs in %q", project, v.LastMessage)
	}

	t.Run("a token's roots narrow the gateway's", func(t *testing.T) {
		narrow := connectGoSessions(t, url, createToken(t, c, "narrow", "--scope", "chat", "--root", project), "narrow")
		msg := callRefused(t, narrow, "sessions", map[string]any{"verb": "create", "cwd": other, "prompt": "pwd"}, "bad_request")
		if !strings.Contains(msg, "outside your token's allowed roots ("+project+")") {
			t.Errorf("refusal: %s", msg)
		}
		id := createSession(t, narrow, project, "pwd").SessionID
		if v := settleIn(t, narrow, id, "idle"); v.LastMessage != project {
			t.Fatalf("its agent runs in %q", v.LastMessage)
		}
		list, _, err := c.Run(t, "zidane", "token", "list")
		if err != nil || !strings.Contains(list, project) {
			t.Errorf("token list does not show the token's roots: %v\n%s", err, list)
		}
	})

	t.Run("a reload that moves the roots applies at once", func(t *testing.T) {
		c.Reload(t, caddyfile(other))
		msg := callRefused(t, g, "sessions", map[string]any{"verb": "create", "cwd": project, "prompt": "pwd"}, "bad_request")
		if !strings.Contains(msg, "allowed roots ("+other+")") {
			t.Errorf("after the reload: %s", msg)
		}
		createSession(t, g, other, "pwd")
	})

	t.Run("a reload caddy refuses leaves the roots as they were", func(t *testing.T) {
		// Every handler of this config provisions, roots / included; the
		// config is refused when it starts (a sessions site on a unix
		// socket has no address for its agents), and the running config
		// must keep its roots.
		dir, err := os.MkdirTemp("", "zr")
		if err != nil {
			t.Fatal(err)
		}
		defer os.RemoveAll(dir)
		unixSite := fmt.Sprintf("\nhttp://unix.invalid {\n\tbind unix/%s\n\tzidane_mcp {\n\t\tsessions\n\t}\n}\n", filepath.Join(dir, "s.sock"))
		out, err := c.TryReload(t, sessionsCaddyfile(port, "roots /", unixSite))
		if err == nil || !strings.Contains(out, "unix socket") {
			t.Fatalf("the reload was not refused at start (%v):\n%s", err, out)
		}
		msg := callRefused(t, g, "sessions", map[string]any{"verb": "create", "cwd": project, "prompt": "pwd"}, "bad_request")
		if !strings.Contains(msg, "allowed roots ("+other+")") {
			t.Errorf("after the refused reload: %s", msg)
		}
	})
}

// TestMCPSessionIdleTimeout: on the sessions endpoint and on an aggregated
// route, an MCP session that a client opened and left is closed after
// mcp_session_idle_timeout (its id then gets 404), while a client that
// listens on its GET stream keeps its session.
func TestMCPSessionIdleTimeout(t *testing.T) {
	upstream := startEverythingServer(t)
	port, aggPort := freePort(t), freePort(t)
	c := startCaddy(t, sessionsCaddyfile(port, fmt.Sprintf("mcp_session_idle_timeout 2s\n\t\tupstream everything %s", upstream), fmt.Sprintf(`
http://127.0.0.1:%d {
	zidane_mcp {
		aggregate everything
	}
}
`, aggPort)))
	token := createToken(t, c, "idler", "--scope", "chat", "--scope", "upstream:everything")
	for _, route := range []struct{ name, url string }{
		{"sessions endpoint", fmt.Sprintf("http://127.0.0.1:%d/mcp", port)},
		{"aggregated route", fmt.Sprintf("http://127.0.0.1:%d/mcp", aggPort)},
	} {
		t.Run(route.name, func(t *testing.T) {
			// A 2025-11-25 session: go-sdk opens its GET stream (2026-07-28
			// has neither sessions nor that stream).
			listener, err := connectGoAt(t, route.url, bearerClient(token, nil), "2025-11-25")
			if err != nil {
				t.Fatal(err)
			}
			init := post(t, route.url, token, initializeBody)
			sid := init.header.Get("Mcp-Session-Id")
			if init.status != http.StatusOK || sid == "" {
				t.Fatalf("initialize: %d %s", init.status, init.body)
			}
			note := post(t, route.url, token, `{"jsonrpc":"2.0","method":"notifications/initialized"}`, "Mcp-Session-Id", sid, "Mcp-Protocol-Version", "2025-11-25")
			if note.status != http.StatusAccepted {
				t.Fatalf("notifications/initialized: %d %s", note.status, note.body)
			}
			// The left session answers until the timeout has passed
			// after its last request, then gets 404. Each ping is a
			// request, so the next one waits out the timeout.
			deadline := time.Now().Add(30 * time.Second)
			for {
				a := post(t, route.url, token, `{"jsonrpc":"2.0","id":5,"method":"ping"}`, "Mcp-Session-Id", sid, "Mcp-Protocol-Version", "2025-11-25")
				if a.status == http.StatusNotFound {
					break
				}
				if a.status != http.StatusOK || time.Now().After(deadline) {
					t.Fatalf("the left session answers %d %s", a.status, a.body)
				}
				time.Sleep(2500 * time.Millisecond)
			}
			if err := listener.Ping(t.Context(), nil); err != nil {
				t.Fatalf("the session listening on its GET stream was closed too: %v", err)
			}
		})
	}
}

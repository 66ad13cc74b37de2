package e2e

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// confineTargets and the rest mirror confineprobe's Targets and Report.
type (
	confineTargets struct {
		CaddyPID int      `json:"caddyPid"`
		Admin    string   `json:"admin"`
		Read     []string `json:"read"`
		List     []string `json:"list"`
		Write    []string `json:"write"`
	}
	confineProbe struct {
		Name   string `json:"name"`
		Done   bool   `json:"done"`
		Detail string `json:"detail"`
	}
	confineReport struct {
		UID    int               `json:"uid"`
		PPID   int               `json:"ppid"`
		Env    map[string]string `json:"env"`
		Probes []confineProbe    `json:"probes"`
	}
)

// TestAgentConfinement runs a real agent command, confineprobe in front of
// the demo agent, through the gateway with a secret in caddy's environment
// (used by an upstream header), and has it try what attackers' agents did:
// read the gateway's environment and memory through /proc, call the admin
// API (read /config/, create a token, load a config), read autosave.json,
// the tokens and the admin key, and write outside its session. Everything
// must fail, and the session must still answer its prompt; the same as
// `user nobody`. A repository's post-checkout hook must not run when the
// gateway makes a worktree of it. The admin routes that change state
// refuse requests without the admin key, which the CLI sends.
func TestAgentConfinement(t *testing.T) {
	if os.Getenv("ZIDANE_E2E") != "1" {
		if _, err := os.Stat("/proc/self/status"); err != nil {
			t.Skip("the confinement test needs Linux")
		}
	}
	probeDir, err := os.MkdirTemp("", "zidane-confineprobe-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(probeDir) })
	if err := os.Chmod(probeDir, 0o755); err != nil {
		t.Fatal(err)
	}
	probeBin := filepath.Join(probeDir, "confineprobe")
	if err := goBuild(probeBin, "./e2e/confineprobe"); err != nil {
		t.Fatal(err)
	}

	const secret = "s3cr3t-zidane-confinement-7f3a"
	nobody, nobodyErr := user.Lookup("nobody")
	agents := fmt.Sprintf(`		agent probe {
			command %[1]s %[2]s zidane demo-agent
			env PROBE_LABEL root
		}
		upstream secretive http://127.0.0.1:9/mcp {
			header Authorization "Bearer ${ZIDANE_TEST_SECRET}"
		}`, probeBin, caddyBin)
	if nobodyErr == nil && os.Geteuid() == 0 {
		agents += fmt.Sprintf(`
		agent probe-nobody {
			command %[1]s %[2]s zidane demo-agent
			env PROBE_LABEL nobody
			user nobody
		}`, probeBin, caddyBin)
	}
	port := freePort(t)
	c := startCaddy(t, sessionsCaddyfile(port, agents, ""), "ZIDANE_TEST_SECRET="+secret)
	gw := &sessionsGateway{c: c, port: port, base: fmt.Sprintf("http://127.0.0.1:%d", port)}
	gw.url = gw.base + "/mcp"
	token := createToken(t, c, "confined", "--scope", "chat")
	g := connectGoSessions(t, gw.url, token, "go-sdk")
	caddyPID := c.proc.cmd.Process.Pid
	escape := filepath.Join(os.TempDir(), "zidane-escape-"+randomHex(6))
	t.Cleanup(func() { os.Remove(escape) })
	targets := confineTargets{
		CaddyPID: caddyPID,
		Admin:    c.AdminAddr,
		Read: []string{
			filepath.Join(c.ConfigDir, "autosave.json"),
			filepath.Join(c.DataDir, "zidane", "tokens.json"),
			filepath.Join(c.DataDir, "zidane", "admin.key"),
		},
		List:  []string{c.DataDir, c.ConfigDir, c.HomeDir},
		Write: []string{escape, filepath.Join(c.HomeDir, "escaped"), filepath.Join(c.DataDir, "zidane", "escaped")},
	}
	// The secret and the files are really there for the taking: the
	// probes failing means the sandbox stopped them.
	if env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", caddyPID)); err != nil || !strings.Contains(string(env), secret) {
		t.Fatalf("caddy's environment as the test (root) reads it lacks the secret (%v)", err)
	}
	for _, f := range targets.Read {
		if _, err := os.Stat(f); err != nil {
			t.Fatalf("%s should exist for the probe to try: %v", f, err)
		}
	}

	runProbe := func(t *testing.T, agent string, cwd string) confineReport {
		t.Helper()
		tg, _ := json.Marshal(targets)
		if err := os.WriteFile(filepath.Join(cwd, "probe-targets.json"), tg, 0o644); err != nil {
			t.Fatal(err)
		}
		id := createSession(t, g, cwd, "hello from "+agent, "agent", agent).SessionID
		v := settleIn(t, g, id, "idle")
		if v.LastMessage != "You said: hello from "+agent || v.Error != "" {
			t.Fatalf("the confined session did not answer its prompt: %+v", v)
		}
		raw, err := os.ReadFile(filepath.Join(cwd, "probe-report.json"))
		if err != nil {
			t.Fatalf("the probe wrote no report: %v", err)
		}
		var rep confineReport
		if err := json.Unmarshal(raw, &rep); err != nil {
			t.Fatal(err)
		}
		return rep
	}
	checkReport := func(t *testing.T, rep confineReport, label string) {
		t.Helper()
		if rep.PPID != caddyPID {
			t.Errorf("the agent's parent is %d, want caddy (%d): the /proc/$PPID probes read something else", rep.PPID, caddyPID)
		}
		var names []string
		for k, v := range rep.Env {
			names = append(names, k)
			if strings.Contains(v, secret) {
				t.Errorf("the agent's %s holds caddy's secret", k)
			}
		}
		sort.Strings(names)
		if want := []string{"HOME", "LANG", "PATH", "PROBE_LABEL", "TMPDIR"}; !slices.Equal(names, want) {
			t.Errorf("the agent's environment has %v, want exactly %v", names, want)
		}
		if rep.Env["PROBE_LABEL"] != label {
			t.Errorf("PROBE_LABEL = %q, want %q", rep.Env["PROBE_LABEL"], label)
		}
		if home := rep.Env["HOME"]; home == c.HomeDir || strings.HasPrefix(home, c.Dir) {
			t.Errorf("the agent's HOME is the gateway's (%s)", home)
		}
		for _, p := range rep.Probes {
			control := strings.HasPrefix(p.Name, "control: ")
			switch {
			case control && !p.Done:
				t.Errorf("%s failed (%s): the sandbox keeps the agent from what it needs", p.Name, p.Detail)
			case !control && p.Done:
				t.Errorf("%s SUCCEEDED (%s): the agent got out", p.Name, p.Detail)
			default:
				t.Logf("%-70s %v: %s", p.Name, p.Done, p.Detail)
			}
		}
		if len(rep.Probes) < 25 {
			t.Errorf("only %d probes ran", len(rep.Probes))
		}
		for _, f := range targets.Write {
			if _, err := os.Stat(f); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("%s exists: a write outside the session got through (%v)", f, err)
			}
		}
	}

	t.Run("root", func(t *testing.T) {
		rep := runProbe(t, "probe", t.TempDir())
		checkReport(t, rep, "root")
		if rep.UID != os.Geteuid() {
			t.Errorf("the agent runs as uid %d, want caddy's %d", rep.UID, os.Geteuid())
		}
	})

	t.Run("user nobody", func(t *testing.T) {
		if nobodyErr != nil || os.Geteuid() != 0 {
			t.Skipf("needs root and a nobody account (%v)", nobodyErr)
		}
		dir, err := os.MkdirTemp("", "zidane-nobody-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		uid, _ := strconv.Atoi(nobody.Uid)
		gid, _ := strconv.Atoi(nobody.Gid)
		if err := os.Chmod(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		cwd := filepath.Join(dir, "work")
		if err := os.Mkdir(cwd, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(cwd, uid, gid); err != nil {
			t.Fatal(err)
		}
		rep := runProbe(t, "probe-nobody", cwd)
		checkReport(t, rep, "nobody")
		if rep.UID != uid {
			t.Errorf("the agent runs as uid %d, want nobody's %d", rep.UID, uid)
		}
		if fi, err := os.Stat(rep.Env["HOME"]); err != nil {
			t.Errorf("the agent's scratch HOME: %v", err)
		} else if st, ok := fi.Sys().(*syscall.Stat_t); !ok || int(st.Uid) != uid || fi.Mode().Perm() != 0o700 {
			t.Errorf("the agent's scratch HOME %s is mode %v, owned by %v; want 0700 and nobody's", rep.Env["HOME"], fi.Mode().Perm(), fi.Sys())
		}
	})

	t.Run("no hook runs when the gateway makes a worktree", func(t *testing.T) {
		repo := filepath.Join(t.TempDir(), "app")
		if err := os.MkdirAll(repo, 0o755); err != nil {
			t.Fatal(err)
		}
		gitIn(t, repo, "init", "-q", "-b", "main")
		if err := os.WriteFile(filepath.Join(repo, "README"), []byte("hi\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		gitIn(t, repo, "add", ".")
		gitIn(t, repo, "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "-m", "init")
		ran := filepath.Join(t.TempDir(), "hook-ran")
		hook := "#!/bin/sh\nenv > " + ran + "\n"
		if err := os.WriteFile(filepath.Join(repo, ".git", "hooks", "post-checkout"), []byte(hook), 0o755); err != nil {
			t.Fatal(err)
		}
		id := createSession(t, g, repo, "pwd", "agent", "probe", "environment", map[string]any{"kind": "worktree", "branch": "hooked"}).SessionID
		v := settleIn(t, g, id, "idle")
		if want := filepath.Join(filepath.Dir(repo), ".worktrees", "app-hooked"); v.LastMessage != want {
			t.Fatalf("the worktree session works in %q, want %s", v.LastMessage, want)
		}
		// git worktree add has returned (the session runs in the worktree),
		// so a hook would have run by now.
		if _, err := os.Stat(ran); !errors.Is(err, fs.ErrNotExist) {
			out, _ := os.ReadFile(ran)
			t.Fatalf("the repository's post-checkout hook ran as the gateway (%v); it saw the secret: %v", err, strings.Contains(string(out), secret))
		}
	})

	t.Run("the admin routes that change state need the admin key", func(t *testing.T) {
		keyFile := filepath.Join(c.DataDir, "zidane", "admin.key")
		fi, err := os.Stat(keyFile)
		if err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("the admin key file: %v, mode %v; want 0600", err, fi.Mode().Perm())
		}
		key, _ := os.ReadFile(keyFile)
		post := func(header string) (int, string) {
			req, _ := http.NewRequest(http.MethodPost, c.AdminURL("/zidane/tokens"), strings.NewReader(`{"name":"direct","scopes":["chat"]}`))
			req.Header.Set("Content-Type", "application/json")
			if header != "" {
				req.Header.Set("Authorization", "Zidane-Admin-Key "+header)
			}
			resp, err := shortClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			return resp.StatusCode, string(b)
		}
		if code, body := post(""); code != http.StatusForbidden || !strings.Contains(body, "use the `caddy zidane` CLI on this host") {
			t.Errorf("POST /zidane/tokens without the key: %d %s", code, body)
		}
		if code, body := post("wrong"); code != http.StatusForbidden {
			t.Errorf("POST /zidane/tokens with a wrong key: %d %s", code, body)
		}
		for _, path := range []string{"/zidane/upstreams/secretive/restart", "/zidane/upstreams/secretive/login", "/zidane/tokens/confined"} {
			method := http.MethodPost
			if strings.HasPrefix(path, "/zidane/tokens/") {
				method = http.MethodDelete
			}
			req, _ := http.NewRequest(method, c.AdminURL(path), strings.NewReader("{}"))
			resp, err := shortClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusForbidden {
				t.Errorf("%s %s without the key: %s", method, path, resp.Status)
			}
		}
		if code, body := post(strings.TrimSpace(string(key))); code != http.StatusCreated {
			t.Errorf("POST /zidane/tokens with the key: %d %s", code, body)
		}
		list, _, err := c.Run(t, "zidane", "token", "list", "--json")
		if err != nil || !strings.Contains(list, `"direct"`) || strings.Contains(list, `"stolen"`) {
			t.Errorf("token list (through the CLI): %v\n%s", err, list)
		}
	})

	t.Run("config and autosave hold no literal secret", func(t *testing.T) {
		resp, err := shortClient.Get(c.AdminURL("/config/"))
		if err != nil {
			t.Fatal(err)
		}
		cfg, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		autosave, err := os.ReadFile(filepath.Join(c.ConfigDir, "autosave.json"))
		if err != nil {
			t.Fatal(err)
		}
		for name, b := range map[string][]byte{"/config/": cfg, "autosave.json": autosave} {
			if strings.Contains(string(b), secret) || !strings.Contains(string(b), "${ZIDANE_TEST_SECRET}") {
				t.Errorf("%s: holds the secret, or lacks its placeholder:\n%s", name, b)
			}
		}
		literal := strings.Replace(sessionsCaddyfile(port, agents, ""), "${ZIDANE_TEST_SECRET}", secret, 1)
		out, err := c.TryReload(t, literal)
		if err == nil || !strings.Contains(out, "header Authorization of upstream secretive holds a literal value") || strings.Contains(out, secret) {
			t.Errorf("a reload with a literal header: %v\n%s", err, out)
		}
		req, _ := http.NewRequest(http.MethodPost, c.AdminURL("/load"), strings.NewReader(`{"apps":{"zidane":{"upstreams":[{"name":"x","url":"https://x.example/mcp","headers":{"Authorization":"Bearer `+secret+`"}}]}}}`))
		req.Header.Set("Content-Type", "application/json")
		resp, err = shortClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK || !strings.Contains(string(body), "holds a literal value") {
			t.Errorf("POST /load with a literal header: %s %s", resp.Status, body)
		}
	})
}

package sessions_test

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/Tahul/caddy-zidane-mcp/gatewayfiles"
	"github.com/Tahul/caddy-zidane-mcp/sessions"
	"github.com/Tahul/caddy-zidane-mcp/sessions/confine"
)

// confinedEngine is newEngine with the demo agent confined ("demo"), this
// test binary as the confiner, gatewayData as the one denied path and the
// scratch directories under scratch.
func confinedEngine(t *testing.T, gatewayData, scratch string) *sessions.Engine {
	t.Helper()
	if err := confine.Check(); err != nil {
		t.Skipf("no sandbox on this kernel: %v", err)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	e, _ := newEngine(t, func(c *sessions.Config) {
		demo := c.Agents["demo"]
		demo.Sandbox = &sessions.Sandbox{}
		c.Agents["demo"] = demo
		c.Confine = []string{exe, "--confine"}
		c.Deny = func() []gatewayfiles.File {
			return []gatewayfiles.File{{Path: gatewayData, Why: "Caddy's data directory"}}
		}
		c.ScratchRoot = scratch
	})
	return e
}

// TestConfinedAgentSession: a confined agent runs its turns; its scratch
// directory is made at launch, private, and removed when the session ends;
// and a session cannot be pointed at the gateway's own directories.
func TestConfinedAgentSession(t *testing.T) {
	base := t.TempDir()
	home := filepath.Join(base, "gateway-home")
	data := filepath.Join(home, ".local", "share", "caddy")
	project := filepath.Join(home, "project")
	scratch := filepath.Join(base, "scratch")
	for _, d := range []string{data, project} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	e := confinedEngine(t, data, scratch)
	o := owner("cara")

	id := create(t, e, o, "pwd", func(r *sessions.CreateRequest) { r.Cwd = project })
	if v := waitState(t, e, id, sessions.StateIdle); v.LastMessage != project || v.Error != "" {
		t.Fatalf("a confined demo session in %s: %+v", project, v)
	}
	fi, err := os.Stat(filepath.Join(scratch, id))
	if err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o700 {
		t.Fatalf("the session's scratch directory: %v %v", fi, err)
	}
	if _, err := e.Send(ctxT(t), o, id, "crash"); err != nil {
		t.Fatal(err)
	}
	waitState(t, e, id, sessions.StateError)
	eventually(t, "the ended session's scratch directory to go", func() bool {
		_, err := os.Stat(filepath.Join(scratch, id))
		return errors.Is(err, fs.ErrNotExist)
	})

	for _, cwd := range []string{home, data, filepath.Join(data, "..")} {
		_, err := e.Create(ctxT(t), o, sessions.CreateRequest{Cwd: cwd, Prompt: "pwd"})
		wantErr(t, err, sessions.ErrBadRequest, "agents may not work there")
	}
}

// TestConfinedWorktree: the gateway's git runs no hook of the repository,
// and the checkout that runs its filters is confined: a filter that reads
// a denied file gets nothing.
func TestConfinedWorktree(t *testing.T) {
	base := t.TempDir()
	data := filepath.Join(base, "caddy-data")
	if err := os.MkdirAll(data, 0o700); err != nil {
		t.Fatal(err)
	}
	const secret = "s3cr3t-admin-key"
	if err := os.WriteFile(filepath.Join(data, "admin.key"), []byte(secret), 0o600); err != nil {
		t.Fatal(err)
	}
	e := confinedEngine(t, data, filepath.Join(base, "scratch"))
	repo := gitRepo(t)
	ran := filepath.Join(base, "hook-ran")
	hook := filepath.Join(repo, ".git", "hooks", "post-checkout")
	if err := os.WriteFile(hook, []byte("#!/bin/sh\nenv > "+ran+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(repo, ".gitattributes"), []byte("*.txt filter=peek\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(repo, "a.txt"), []byte("plain\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	run(t, repo, "git", "add", ".")
	run(t, repo, "git", "-c", "user.name=test", "-c", "user.email=test@example.com", "commit", "-q", "-m", "filtered")
	run(t, repo, "git", "config", "filter.peek.smudge", "cat "+filepath.Join(data, "admin.key")+" 2>&1; cat")

	c, err := e.Create(ctxT(t), owner("wyn"), sessions.CreateRequest{Cwd: repo, Prompt: "pwd", Environment: sessions.Environment{Kind: "worktree", Branch: "hooked"}})
	if err != nil {
		t.Fatal(err)
	}
	v := waitState(t, e, c.SessionID, sessions.StateIdle)
	if _, err := os.Stat(ran); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the repository's post-checkout hook ran during git worktree add (%v)", err)
	}
	got, err := os.ReadFile(filepath.Join(v.Cwd, "a.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(got), secret) || !strings.Contains(string(got), "plain") {
		t.Errorf("a.txt as the confined smudge filter wrote it: %q; want the file without the denied key", got)
	}
}

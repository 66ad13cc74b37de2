package sessions_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/Tahul/caddy-zidane-mcp/sessions"
)

func gitRepo(t *testing.T) string {
	t.Helper()
	repo := filepath.Join(t.TempDir(), "project")
	if err := os.MkdirAll(filepath.Join(repo, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(repo, "sub", "README"), []byte("hi\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	run(t, repo, "git", "init", "-q", "-b", "main")
	run(t, repo, "git", "add", ".")
	run(t, repo, "git", "-c", "user.name=test", "-c", "user.email=test@example.com", "commit", "-q", "-m", "init")
	return repo
}

func run(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

func TestWorktreeEnvironment(t *testing.T) {
	e, _ := newEngine(t)
	o := owner("vic")
	repo := gitRepo(t)
	worktree := func(branch string) sessions.CreateRequest {
		return sessions.CreateRequest{Cwd: filepath.Join(repo, "sub"), Prompt: "pwd", Environment: sessions.Environment{Kind: "worktree", Branch: branch}}
	}
	c, err := e.Create(ctxT(t), o, worktree("feature/x"))
	if err != nil {
		t.Fatal(err)
	}
	want := filepath.Join(filepath.Dir(repo), ".worktrees", "project-feature-x", "sub")
	v := waitState(t, e, c.SessionID, sessions.StateIdle)
	if v.Cwd != want || v.LastMessage != want {
		t.Errorf("cwd = %s, agent says %q; want %s", v.Cwd, v.LastMessage, want)
	}
	if out := run(t, repo, "git", "worktree", "list"); !strings.Contains(out, "project-feature-x") || !strings.Contains(out, "[feature/x]") {
		t.Errorf("git worktree list:\n%s", out)
	}
	_, err = e.Create(ctxT(t), o, worktree("feature/x"))
	wantErr(t, err, sessions.ErrBadRequest, `branch "feature/x" already exists`)
	_, err = e.Create(ctxT(t), o, worktree("bad..name"))
	wantErr(t, err, sessions.ErrBadRequest, "not a valid git branch name")

	// No branch: one named after the session.
	c, err = e.Create(ctxT(t), o, worktree(""))
	if err != nil {
		t.Fatal(err)
	}
	v = waitState(t, e, c.SessionID, sessions.StateIdle)
	branch := "zidane/" + strings.TrimPrefix(c.SessionID, "ses_")
	if !strings.Contains(v.Cwd, "project-zidane-") || !strings.Contains(run(t, repo, "git", "branch", "--list", branch), branch) {
		t.Errorf("cwd = %s; branches:\n%s", v.Cwd, run(t, repo, "git", "branch"))
	}
}

func TestWorktreeRootConfig(t *testing.T) {
	root := t.TempDir()
	e, _ := newEngine(t, func(c *sessions.Config) { c.WorktreeRoot = root })
	repo := gitRepo(t)
	c, err := e.Create(ctxT(t), owner("wes"), sessions.CreateRequest{Cwd: repo, Prompt: "pwd", Environment: sessions.Environment{Kind: "worktree", Branch: "b1"}})
	if err != nil {
		t.Fatal(err)
	}
	v := waitState(t, e, c.SessionID, sessions.StateIdle)
	if want := filepath.Join(root, "project-b1"); v.Cwd != want || v.LastMessage != want {
		t.Errorf("cwd = %s, agent says %q; want %s", v.Cwd, v.LastMessage, want)
	}
}

func TestLocalBranchIsRefused(t *testing.T) {
	e, _ := newEngine(t)
	_, err := e.Create(ctxT(t), owner("xan"), sessions.CreateRequest{Cwd: t.TempDir(), Prompt: "hi", Environment: sessions.Environment{Kind: "local", Branch: "x"}})
	wantErr(t, err, sessions.ErrBadRequest, "only used by environment kind worktree")
}

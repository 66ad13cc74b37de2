package sessions_test

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/Tahul/caddy-zidane-mcp/sessions"
)

// realTemp is a fresh directory with its symlinks resolved, so that paths
// the agent reports compare equal.
func realTemp(t *testing.T) string {
	t.Helper()
	d, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func mkdir(t *testing.T, parts ...string) string {
	t.Helper()
	d := filepath.Join(parts...)
	if err := os.MkdirAll(d, 0o755); err != nil {
		t.Fatal(err)
	}
	return d
}

func symlink(t *testing.T, target, link string) string {
	t.Helper()
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	return link
}

// TestRootsConfineCwd is what a token holder may try for cwd when the
// gateway has roots: every way out is refused with the allowed roots in the
// message, and nothing is created; every way in works, and the agent runs
// where the check looked.
func TestRootsConfineCwd(t *testing.T) {
	base := realTemp(t)
	root := mkdir(t, base, "work")
	inside := mkdir(t, root, "project")
	outside := mkdir(t, base, "elsewhere")
	sibling := mkdir(t, base, "workshop") // shares root's name as a prefix
	e, _ := newEngine(t, func(c *sessions.Config) { c.Roots = []string{root} })
	o := owner("rita")

	for _, tc := range []struct{ name, cwd string }{
		{"the file system root", "/"},
		{"/etc", "/etc"},
		{"/root", "/root"},
		{"/proc/self", "/proc/self"},
		{"/proc/self/cwd", "/proc/self/cwd"},
		{"a directory outside", outside},
		{"a sibling whose name starts with the root's", sibling},
		{"dot-dot out of the root", root + "/project/../../elsewhere"},
		{"a symlink in the root to /etc", symlink(t, "/etc", filepath.Join(root, "etc-link"))},
		{"a symlink in the root to a directory outside", symlink(t, outside, filepath.Join(root, "out-link"))},
		{"a symlink in the root to /proc/self", symlink(t, "/proc/self", filepath.Join(root, "self-link"))},
		{"a relative symlink climbing out", symlink(t, "../elsewhere", filepath.Join(root, "up-link"))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.Create(ctxT(t), o, sessions.CreateRequest{Cwd: tc.cwd, Prompt: "pwd"})
			wantErr(t, err, sessions.ErrBadRequest, "outside this gateway's allowed roots ("+root+")")
		})
	}
	if list, _ := e.List(o, 100); len(list) != 0 {
		t.Fatalf("refused cwds created sessions: %+v", list)
	}

	for _, tc := range []struct{ name, cwd, runsIn string }{
		{"the root itself", root, root},
		{"a directory inside", inside, inside},
		{"a symlink that stays inside", symlink(t, inside, filepath.Join(root, "in-link")), inside},
		{"dot-dot that stays inside", root + "/project/../project", inside},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := create(t, e, o, "pwd", func(r *sessions.CreateRequest) { r.Cwd = tc.cwd })
			v := waitState(t, e, id, sessions.StateIdle)
			if v.Cwd != tc.runsIn || v.LastMessage != tc.runsIn {
				t.Errorf("cwd %s: the session shows %s and its agent runs in %q; want %s", tc.cwd, v.Cwd, v.LastMessage, tc.runsIn)
			}
		})
	}
}

// TestNoRootsIsTodaysBehaviour: without roots any directory works, / too.
func TestNoRootsIsTodaysBehaviour(t *testing.T) {
	e, _ := newEngine(t)
	id := create(t, e, owner("nora"), "pwd", func(r *sessions.CreateRequest) { r.Cwd = "/" })
	if v := waitState(t, e, id, sessions.StateIdle); v.Cwd != "/" || v.LastMessage != "/" {
		t.Errorf("a session in /: %+v", v)
	}
}

// TestTokenRootsNarrow: a token's roots apply on top of the gateway's; a
// token root outside the gateway's allows nothing there.
func TestTokenRootsNarrow(t *testing.T) {
	base := realTemp(t)
	root := mkdir(t, base, "work")
	mine := mkdir(t, root, "mine")
	theirs := mkdir(t, root, "theirs")
	e, _ := newEngine(t, func(c *sessions.Config) { c.Roots = []string{root} })
	o := owner("tina")
	o.Roots = []string{mine, "/etc"}

	_, err := e.Create(ctxT(t), o, sessions.CreateRequest{Cwd: theirs, Prompt: "hi"})
	wantErr(t, err, sessions.ErrBadRequest, "outside your token's allowed roots ("+mine+", /etc)")
	_, err = e.Create(ctxT(t), o, sessions.CreateRequest{Cwd: "/etc", Prompt: "hi"})
	wantErr(t, err, sessions.ErrBadRequest, "outside this gateway's allowed roots ("+root+")")
	id := create(t, e, o, "pwd", func(r *sessions.CreateRequest) { r.Cwd = mine })
	if v := waitState(t, e, id, sessions.StateIdle); v.LastMessage != mine {
		t.Errorf("agent runs in %q, want %s", v.LastMessage, mine)
	}

	// A token's roots alone confine too.
	free, _ := newEngine(t)
	_, err = free.Create(ctxT(t), o, sessions.CreateRequest{Cwd: theirs, Prompt: "hi"})
	wantErr(t, err, sessions.ErrBadRequest, "outside your token's allowed roots")
}

// TestRootsConfineWorktrees: a worktree environment needs its repository,
// the repository's git directory and the new worktree inside the roots.
func TestRootsConfineWorktrees(t *testing.T) {
	base := realTemp(t)
	root := mkdir(t, base, "work")
	o := owner("wendy")
	worktree := func(cwd, branch string) sessions.CreateRequest {
		return sessions.CreateRequest{Cwd: cwd, Prompt: "pwd", Environment: sessions.Environment{Kind: "worktree", Branch: branch}}
	}

	// A repository that encloses the root: its top level is outside.
	outer := mkdir(t, base, "outer")
	run(t, outer, "git", "init", "-q", "-b", "main")
	run(t, outer, "git", "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "--allow-empty", "-m", "init")
	inOuter := mkdir(t, outer, "allowed")
	e, _ := newEngine(t, func(c *sessions.Config) { c.Roots = []string{root, inOuter}; c.WorktreeRoot = mkdir(t, root, "trees") })
	_, err := e.Create(ctxT(t), o, worktree(inOuter, "b1"))
	wantErr(t, err, sessions.ErrBadRequest, "the repository "+outer+" is outside this gateway's allowed roots")

	// A .git file in the root that points at a repository elsewhere.
	secret := filepath.Join(base, "secret.git")
	linked := mkdir(t, root, "linked")
	run(t, linked, "git", "init", "-q", "-b", "main", "--separate-git-dir", secret)
	run(t, linked, "git", "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "--allow-empty", "-m", "init")
	_, err = e.Create(ctxT(t), o, worktree(linked, "b2"))
	wantErr(t, err, sessions.ErrBadRequest, "git directory "+secret, "outside this gateway's allowed roots")
	if out := run(t, linked, "git", "branch", "--list", "b2"); out != "" {
		t.Errorf("a refused worktree made branch b2 in the outside repository: %q", out)
	}

	// A repository inside, with worktree_root inside: allowed.
	repo := mkdir(t, root, "project")
	run(t, repo, "git", "init", "-q", "-b", "main")
	run(t, repo, "git", "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "--allow-empty", "-m", "init")
	c, err := e.Create(ctxT(t), o, worktree(repo, "b3"))
	if err != nil {
		t.Fatal(err)
	}
	want := filepath.Join(root, "trees", "project-b3")
	if v := waitState(t, e, c.SessionID, sessions.StateIdle); v.LastMessage != want {
		t.Errorf("the worktree's agent runs in %q, want %s", v.LastMessage, want)
	}

	// The default place, next to a repository that is itself a root, is
	// outside: refused, with the way out.
	top, _ := newEngine(t, func(c *sessions.Config) { c.Roots = []string{repo} })
	_, err = top.Create(ctxT(t), o, worktree(repo, "b4"))
	wantErr(t, err, sessions.ErrBadRequest, "the new worktree "+filepath.Join(root, ".worktrees", "project-b4"), "worktree_root inside an allowed root")
}

// TestRootsApplyAtEveryLaunch: roots set after a session was created apply
// when its agent is launched again.
func TestRootsApplyAtEveryLaunch(t *testing.T) {
	var logs syncBuffer
	e, _ := newEngine(t, func(c *sessions.Config) {
		c.Limits.IdleTimeout = 20 * 1000 * 1000 // 20ms: the agent stops, the session stays
		c.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	})
	o := owner("lena")
	cwd := realTemp(t)
	id := create(t, e, o, "first", func(r *sessions.CreateRequest) { r.Cwd = cwd })
	waitState(t, e, id, sessions.StateIdle)
	eventually(t, "the idle agent to be stopped", func() bool {
		return strings.Contains(logs.String(), "agent stopped after being idle")
	})
	elsewhere := realTemp(t)
	if err := e.SetRoots([]string{elsewhere}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Send(ctxT(t), o, id, "second"); err != nil {
		t.Fatal(err)
	}
	v := waitState(t, e, id, sessions.StateError)
	if !strings.Contains(v.Error, "the agent was not started") || !strings.Contains(v.Error, "outside this gateway's allowed roots ("+elsewhere+")") {
		t.Errorf("error = %q", v.Error)
	}
	if err := e.SetRoots([]string{"relative/path"}); err == nil || !strings.Contains(err.Error(), "not an absolute path") {
		t.Errorf("SetRoots(relative) = %v", err)
	}
}

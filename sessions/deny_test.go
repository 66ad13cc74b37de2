package sessions_test

import (
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/Tahul/caddy-zidane-mcp/gatewayfiles"
	"github.com/Tahul/caddy-zidane-mcp/sessions"
)

// denyList is a Config.Deny that a test changes while the engine runs, as
// a config reload changes the gateway's files.
type denyList struct {
	mu    sync.Mutex
	files []gatewayfiles.File
}

func (d *denyList) add(path, why string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.files = append(d.files, gatewayfiles.File{Path: path, Why: why})
}

func (d *denyList) get() []gatewayfiles.File {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]gatewayfiles.File(nil), d.files...)
}

// TestDeniedSessionDirectories: a session whose cwd is, is inside or holds
// a path of the gateway's, through a symlink too, is refused at create
// with ErrDenied and a message that names the path and why; so is a
// worktree that would be made inside one, before git writes anything; a
// path the gateway takes on after the engine started counts at once, at
// create and at the next launch of an agent.
func TestDeniedSessionDirectories(t *testing.T) {
	base := realTemp(t)
	mk := func(p string) string {
		p = filepath.Join(base, p)
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	audit := mk("logs/zidane")
	keys := mk("keys")
	key := filepath.Join(keys, "jwt.pub")
	if err := os.WriteFile(key, []byte("k"), 0o600); err != nil {
		t.Fatal(err)
	}
	project := mk("project")
	link := filepath.Join(base, "to-audit")
	if err := os.Symlink(audit, link); err != nil {
		t.Fatal(err)
	}
	deny := &denyList{}
	deny.add(audit, "the zidane_audit log's directory")
	deny.add(key, "the JWT public_key_file")
	var logs syncBuffer
	e, _ := newEngine(t, func(c *sessions.Config) {
		c.Deny = deny.get
		c.WorktreeRoot = filepath.Join(audit, "worktrees")
		c.Limits.IdleTimeout = 20 * 1000 * 1000 // 20ms: the agent stops, the session stays
		c.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	})
	o := owner("dana")

	for _, c := range []struct {
		cwd  string
		want []string
	}{
		{audit, []string{"cwd " + audit + " is the zidane_audit log's directory"}},
		{mk("logs/zidane/work"), []string{"is inside " + audit}},
		{filepath.Join(base, "logs"), []string{"holds " + audit}},
		{keys, []string{"holds " + key + ", the JWT public_key_file"}},
		{link, []string{link + " (which is " + audit + ") is the zidane_audit log's directory"}},
		{base, []string{"holds "}},
	} {
		_, err := e.Create(ctxT(t), o, sessions.CreateRequest{Cwd: c.cwd, Prompt: "pwd"})
		if !errors.Is(err, sessions.ErrDenied) {
			t.Errorf("create in %s: %v, want ErrDenied", c.cwd, err)
			continue
		}
		wantErr(t, err, sessions.ErrBadRequest, append(c.want, "keeps from agents")...)
	}

	// A worktree that would land in the audit log's directory: refused
	// before git makes it.
	repo := gitRepo(t)
	_, err := e.Create(ctxT(t), o, sessions.CreateRequest{Cwd: repo, Prompt: "pwd", Environment: sessions.Environment{Kind: "worktree", Branch: "b"}})
	wantErr(t, err, sessions.ErrDenied, "the new worktree "+filepath.Join(audit, "worktrees", "project-b")+" is inside "+audit)
	if _, err := os.Stat(filepath.Join(audit, "worktrees")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("git wrote into the denied directory: %v", err)
	}

	// A file the gateway takes on later (a reload names it) counts at once.
	id := create(t, e, o, "first", func(r *sessions.CreateRequest) { r.Cwd = project })
	waitState(t, e, id, sessions.StateIdle)
	secret := filepath.Join(project, "upstream.token")
	if err := os.WriteFile(secret, []byte("s"), 0o600); err != nil {
		t.Fatal(err)
	}
	deny.add(secret, "a file a {file.…} placeholder of the config reads")
	_, err = e.Create(ctxT(t), o, sessions.CreateRequest{Cwd: project, Prompt: "pwd"})
	wantErr(t, err, sessions.ErrDenied, "holds "+secret)
	// The running session's agent stops when idle; its next launch is
	// refused.
	eventually(t, "the idle agent to be stopped", func() bool {
		return strings.Contains(logs.String(), "agent stopped after being idle")
	})
	if _, err := e.Send(ctxT(t), o, id, "second"); err != nil {
		t.Fatal(err)
	}
	v := waitState(t, e, id, sessions.StateError)
	if !strings.Contains(v.Error, "cwd "+project+" holds "+secret) {
		t.Errorf("the relaunch in a directory that became the gateway's: error %q", v.Error)
	}
}

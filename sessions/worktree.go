package sessions

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/gatewayfiles"
	"github.com/Tahul/caddy-zidane-mcp/internal/pathtree"
	"github.com/Tahul/caddy-zidane-mcp/sessions/confine"
)

// gitTimeout bounds each git command of a worktree environment.
const gitTimeout = 60 * time.Second

// checkCwd checks that cwd is an absolute path to a directory.
func checkCwd(cwd string) (string, error) {
	if cwd == "" {
		return "", fmt.Errorf("%w: cwd is empty; give the absolute path of the directory the agent works in", ErrBadRequest)
	}
	if !filepath.IsAbs(cwd) {
		return "", fmt.Errorf("%w: cwd %q is not an absolute path; give it from the root, e.g. /home/me/project", ErrBadRequest, cwd)
	}
	cwd = filepath.Clean(cwd)
	fi, err := os.Stat(cwd)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return "", fmt.Errorf("%w: cwd %s does not exist on this host; create it or give an existing directory", ErrBadRequest, cwd)
	case err != nil:
		return "", fmt.Errorf("%w: cwd %s cannot be used: %v", ErrBadRequest, cwd, err)
	case !fi.IsDir():
		return "", fmt.Errorf("%w: cwd %s is a file, not a directory; give the directory the agent works in", ErrBadRequest, cwd)
	}
	return cwd, nil
}

// worktree is a git worktree made for a session.
type worktree struct {
	repo   string // the repository's top-level directory
	dir    string // the worktree's top-level directory
	cwd    string // where the agent starts: cwd's place inside the worktree
	branch string
}

// addWorktree creates a worktree of the repository at cwd on a new branch:
// `git worktree add -b <branch> <dir>`, from the repository's HEAD. dir is
// <root>/<repository name>-<branch>, where root is WorktreeRoot or else a
// .worktrees directory next to the repository. With roots set, the
// repository, its git directory (which a .git file may place anywhere)
// and dir must lie inside them. The worktree is never removed by the
// engine: it holds the agent's work.
//
// The repository is the agent's to write, so nothing in it may run as the
// gateway: every git gets a scrubbed environment and no hooks (gitArgs),
// and the `worktree add`, which checks files out (and so runs the
// repository's filters), runs as the agent's user in the agent's sandbox,
// with write access to the repository and root only and no network.
func (e *Engine) addWorktree(ctx context.Context, agent, cwd, branch string, roots [2][]string) (worktree, error) {
	ctx, cancel := context.WithTimeout(ctx, gitTimeout)
	defer cancel()
	root := e.cfg.WorktreeRoot
	top, err := git(ctx, cwd, "rev-parse", "--show-toplevel")
	if err != nil {
		return worktree{}, fmt.Errorf("%w: cwd %s is not inside a git repository (%v); a worktree environment needs one: use environment kind local, or run git init there first", ErrBadRequest, cwd, err)
	}
	top = filepath.Clean(top)
	if confined(roots) {
		common, err := git(ctx, top, "rev-parse", "--path-format=absolute", "--git-common-dir")
		if err != nil {
			return worktree{}, fmt.Errorf("%w: the git directory of %s cannot be found (%v)", ErrBadRequest, top, err)
		}
		// What is checked is what is used: the resolved repository.
		if top, err = inRoots(roots, "the repository", top); err != nil {
			return worktree{}, err
		}
		if _, err := inRoots(roots, "the repository's git directory", common); err != nil {
			return worktree{}, err
		}
	}
	if _, err := git(ctx, top, "check-ref-format", "--branch", branch); err != nil {
		return worktree{}, fmt.Errorf("%w: %q is not a valid git branch name (%v)", ErrBadRequest, branch, err)
	}
	if _, err := git(ctx, top, "rev-parse", "--verify", "--quiet", "refs/heads/"+branch); err == nil {
		return worktree{}, fmt.Errorf("%w: branch %q already exists in %s; choose a new branch name, or use environment kind local to work on it", ErrBadRequest, branch, top)
	}
	if _, err := git(ctx, top, "rev-parse", "--verify", "--quiet", "HEAD"); err != nil {
		return worktree{}, fmt.Errorf("%w: the repository at %s has no commit yet; a worktree starts from HEAD, so commit something first", ErrBadRequest, top)
	}
	common, err := git(ctx, top, "rev-parse", "--path-format=absolute", "--git-common-dir")
	if err != nil {
		return worktree{}, fmt.Errorf("finding the git directory of %s: %v", top, err)
	}
	if root == "" {
		root = filepath.Join(filepath.Dir(top), ".worktrees")
	}
	dir := filepath.Join(root, filepath.Base(top)+"-"+slug(branch))
	if dir, err = inRoots(roots, "the new worktree", dir); err != nil {
		return worktree{}, fmt.Errorf("%w (worktrees go to worktree_root, else next to the repository: the operator sets worktree_root inside an allowed root)", err)
	}
	root = filepath.Dir(dir) // the checked, resolved place (unchanged without roots)
	if _, err := os.Lstat(dir); err == nil {
		return worktree{}, fmt.Errorf("%w: %s already exists; choose another branch name, or remove that directory", ErrBadRequest, dir)
	}
	// Before git writes anything: the agent writes the worktree and the
	// git directory, and its git reads the repository.
	deny := e.denied()
	for _, d := range [][2]string{{"the new worktree", dir}, {"the repository", top}, {"the repository's git directory", common}} {
		if err := deniedIn(d[0], d[1], deny); err != nil {
			return worktree{}, err
		}
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		return worktree{}, fmt.Errorf("create the worktree directory %s: %w", root, err)
	}
	cfg := e.cfg.Agents[agent]
	args := []string{"worktree", "add", "-b", branch, dir}
	cmd := gitCommand(ctx, top, args...)
	if cfg.Sandbox != nil {
		p := confine.Policy{Read: []string{top}, Write: []string{top, filepath.Clean(common), root}, Deny: gatewayfiles.Resolved(deny), BestEffort: cfg.Sandbox.BestEffort}
		confined := slices.Concat(e.cfg.Confine, p.Args(), []string{"--"}, cmd.Args)
		cmd = exec.CommandContext(ctx, confined[0], confined[1:]...)
		cmd.Dir, cmd.Env = top, gitEnv()
	}
	if cfg.User != nil {
		if err := runAs(cmd, cfg.User); err != nil {
			return worktree{}, err
		}
	}
	if _, err := runGit(cmd); err != nil {
		return worktree{}, fmt.Errorf("%w: git worktree add -b %s %s failed: %v", ErrBadRequest, branch, dir, err)
	}
	wt := worktree{repo: top, dir: dir, cwd: dir, branch: branch}
	// An agent asked to work in a subdirectory starts in the same place in
	// the worktree.
	if real, err := filepath.EvalSymlinks(cwd); err == nil {
		if realTop, err := filepath.EvalSymlinks(top); err == nil {
			if rel, err := filepath.Rel(realTop, real); err == nil && rel != "." && pathtree.Within(real, realTop) {
				if fi, err := os.Stat(filepath.Join(dir, rel)); err == nil && fi.IsDir() {
					wt.cwd = filepath.Join(dir, rel)
				}
			}
		}
	}
	return wt, nil
}

// gitArgs go before every git command of the gateway's: no hook of the
// repository's runs (a post-checkout hook would run as the gateway), nor
// its fsmonitor command.
var gitArgs = []string{"-c", "core.hooksPath=" + os.DevNull, "-c", "core.fsmonitor=false"}

// gitEnv is the environment of the gateway's git: PATH and LANG, a HOME
// with nothing in it, and no system or global configuration, so that
// neither the gateway's secrets nor its git settings reach a repository's
// filters, and no prompt waits for a terminal.
func gitEnv() []string {
	path := os.Getenv("PATH")
	if path == "" {
		path = "/usr/local/bin:/usr/bin:/bin"
	}
	return []string{
		"PATH=" + path,
		"HOME=" + os.DevNull,
		"LANG=C",
		"LC_ALL=C",
		"GIT_TERMINAL_PROMPT=0",
		"GIT_CONFIG_NOSYSTEM=1",
		"GIT_CONFIG_GLOBAL=" + os.DevNull,
	}
}

func gitCommand(ctx context.Context, dir string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, "git", append(slices.Clone(gitArgs), args...)...)
	cmd.Dir = dir
	cmd.Env = gitEnv()
	return cmd
}

// git runs git in dir and returns its trimmed stdout, or an error holding
// its stderr.
func git(ctx context.Context, dir string, args ...string) (string, error) {
	return runGit(gitCommand(ctx, dir, args...))
}

func runGit(cmd *exec.Cmd) (string, error) {
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(errb.String())
		if msg == "" {
			msg = err.Error()
		}
		return "", errors.New(msg)
	}
	return strings.TrimSpace(out.String()), nil
}

// slug makes a branch name usable as part of a directory name.
func slug(branch string) string {
	var b strings.Builder
	for _, r := range branch {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '_', r == '.':
			b.WriteRune(r)
		default:
			b.WriteByte('-')
		}
	}
	return strings.Trim(b.String(), "-.")
}

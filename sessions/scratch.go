package sessions

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// A session's scratch directory is its agent's HOME, with TMPDIR inside:
// the one place besides its cwd and worktree where a confined agent may
// write, and where agents keep what session/load needs after a restart
// (claude-agent-acp keeps its sessions under ~/.claude). It lives as long
// as the session.

// scratchDir is where session id's scratch directory goes.
func (e *Engine) scratchDir(id string) string {
	return filepath.Join(e.cfg.ScratchRoot, id)
}

// makeScratch creates the scratch directory of session id (once; a
// relaunch finds it) with its tmp inside, 0700 and owned by user when one
// is given. It returns HOME and TMPDIR.
func (e *Engine) makeScratch(id string, user *User) (home, tmp string, err error) {
	if err := secureRoot(e.cfg.ScratchRoot); err != nil {
		return "", "", err
	}
	home = e.scratchDir(id)
	tmp = filepath.Join(home, "tmp")
	for _, d := range []string{home, tmp} {
		if err := os.Mkdir(d, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
			return "", "", fmt.Errorf("the session's scratch directory: %w", err)
		}
		fi, err := os.Lstat(d)
		if err != nil {
			return "", "", fmt.Errorf("the session's scratch directory: %w", err)
		}
		if !fi.IsDir() {
			return "", "", fmt.Errorf("the session's scratch directory %s is not a directory; remove it", d)
		}
		if user != nil {
			if err := os.Lchown(d, int(user.UID), int(user.GID)); err != nil {
				return "", "", fmt.Errorf("giving the session's scratch directory to user %s: %w", user.Name, err)
			}
		}
	}
	return home, tmp, nil
}

// secureRoot makes the directory that holds every scratch directory, or
// checks the one there: a real directory of this process's user that no
// one else may write to, so that nobody can swap a session's scratch for a
// link to somewhere else. 0711 lets an agent of another user reach its
// own scratch without listing the others'.
func secureRoot(root string) error {
	if err := os.MkdirAll(root, 0o711); err != nil {
		return fmt.Errorf("the agents' scratch directory %s: %w", root, err)
	}
	fi, err := os.Lstat(root)
	if err != nil {
		return fmt.Errorf("the agents' scratch directory %s: %w", root, err)
	}
	uid, ok := fileOwner(fi)
	switch {
	case !fi.IsDir():
		return fmt.Errorf("the agents' scratch directory %s is not a directory; remove it", root)
	case fi.Mode().Perm()&0o022 != 0:
		return fmt.Errorf("the agents' scratch directory %s may be written by others (mode %v); remove it, the gateway makes it again", root, fi.Mode().Perm())
	case ok && uid != os.Geteuid():
		return fmt.Errorf("the agents' scratch directory %s belongs to uid %d, not to the gateway's; remove it, the gateway makes it again", root, uid)
	}
	return nil
}

// dropScratch removes session id's scratch directory, if any.
func (e *Engine) dropScratch(id string) {
	dir := e.scratchDir(id)
	if err := os.RemoveAll(dir); err != nil {
		e.log.Warn("removing an ended session's scratch directory failed", "session", id, "dir", dir, "error", err)
	}
}

// Package pathtree answers two questions about file paths: whether one
// lies in the tree below another, and where a path that may not exist yet
// will land. The sandbox's deny list, the sessions' roots and a child
// token's roots all ask them, and must all answer them alike.
package pathtree

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
)

// Within reports whether path is dir or lies below it. Both are absolute;
// they are cleaned first, so "/a/b/../c" is within "/a". It compares
// names only: resolving symlinks, where that matters, is the caller's.
// A sibling whose name merely starts with dir's ("/srv/app2" for
// "/srv/app") is not within it, nor is a child named "..x" outside it.
func Within(path, dir string) bool {
	path, dir = filepath.Clean(path), filepath.Clean(dir)
	if dir == string(filepath.Separator) {
		return filepath.IsAbs(path)
	}
	return path == dir || strings.HasPrefix(path, dir+string(filepath.Separator))
}

// Resolve is filepath.EvalSymlinks for a path whose last elements may not
// exist yet (a worktree about to be made, a log directory made at its
// first record): the longest existing prefix is resolved and the rest
// appended, so that a check sees where the path will land.
func Resolve(path string) (string, error) {
	path = filepath.Clean(path)
	var rest []string
	for {
		real, err := filepath.EvalSymlinks(path)
		if err == nil {
			for i := len(rest) - 1; i >= 0; i-- {
				real = filepath.Join(real, rest[i])
			}
			return real, nil
		}
		if !errors.Is(err, os.ErrNotExist) {
			return "", err
		}
		parent := filepath.Dir(path)
		if parent == path {
			return "", err
		}
		rest = append(rest, filepath.Base(path))
		path = parent
	}
}

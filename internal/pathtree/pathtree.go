// Package pathtree answers one question about file paths: whether one lies
// in the tree below another. The sandbox's deny list, the sessions' roots
// and a child token's roots all ask it, and must all answer it alike.
package pathtree

import (
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

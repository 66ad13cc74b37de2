//go:build unix

package caddymodule

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// lockAuditFile takes the lock that keeps a second process from writing
// the audit log at path: two writers would fork its chain. The lock is a
// file of its own next to the log (hidden, so that a glob of the log's
// files leaves it out), held with flock until release.
func lockAuditFile(path string) (release func(), err error) {
	lockPath := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".lock")
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(lockPath, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("another process writes the audit log %s (%s is locked): give each caddy its own file", path, lockPath)
		}
		return nil, fmt.Errorf("locking %s: %w", lockPath, err)
	}
	return func() { f.Close() }, nil
}

// Package storage is the one narrow interface through which caddy-zidane-mcp
// reads and writes durable state: tokens, sessions, upstream credentials.
//
// Its method set is the subset of certmagic.Storage that the project needs,
// with the same signatures, so Caddy's configured storage (the file system
// under Caddy's data dir by default) satisfies it as it is, and a shared
// engine can back it later when several replicas share state. It never
// interprets what it stores.
package storage

import (
	"context"
	"errors"
	"io/fs"
	"sync"
)

// Storage is a key-value store with advisory locks. Keys are slash-separated
// paths. Load of a missing key returns an error that matches fs.ErrNotExist.
type Storage interface {
	Load(ctx context.Context, key string) ([]byte, error)
	Store(ctx context.Context, key string, value []byte) error
	Delete(ctx context.Context, key string) error
	List(ctx context.Context, path string, recursive bool) ([]string, error)
	// Lock blocks until the named lock is held or ctx ends. Locks are shared
	// by every process that uses the same backing store.
	Lock(ctx context.Context, name string) error
	Unlock(ctx context.Context, name string) error
}

// IsNotExist reports whether err says that a key does not exist.
func IsNotExist(err error) bool { return errors.Is(err, fs.ErrNotExist) }

// Update runs fn on the value at key while holding the lock named after key,
// and stores what fn returns. fn receives nil when the key does not exist.
// When fn returns an error nothing is written, so a read-modify-write never
// loses a concurrent writer's change and a failed change never truncates
// what was stored.
func Update(ctx context.Context, s Storage, key string, fn func(old []byte) ([]byte, error)) error {
	unlock, err := Lock(ctx, s, key)
	if err != nil {
		return err
	}
	defer unlock()
	old, err := s.Load(ctx, key)
	if err != nil && !IsNotExist(err) {
		return err
	}
	next, err := fn(old)
	if err != nil {
		return err
	}
	return s.Store(ctx, key, next)
}

// Lock takes the lock named after key in s, and returns its release.
// Callers in this process also queue on a mutex of their own first:
// certmagic's file lock polls (a waiter sleeps a second between looks),
// and under heavy contention a waiter can take a lock file that is still
// being written for a stale one. The storage lock then only has to
// arbitrate between processes (the CLI and a server, or replicas).
func Lock(ctx context.Context, s Storage, key string) (unlock func(), err error) {
	release := lockKey(key)
	if err := s.Lock(ctx, key); err != nil {
		release()
		return nil, err
	}
	return func() {
		s.Unlock(context.WithoutCancel(ctx), key)
		release()
	}, nil
}

// keyLocks holds the in-process lock of each key an Update is running
// on, counted, and forgets it when the last one returns: the keys are
// often a client's to choose (an approved call's retry names the round
// looked up under it), so an entry kept per key ever seen would grow
// without bound.
var (
	keyLocksMu sync.Mutex
	keyLocks   = map[string]*keyLock{}
)

type keyLock struct {
	mu    sync.Mutex
	users int // Updates holding or waiting for mu; under keyLocksMu
}

// lockKey takes key's in-process lock and returns its release.
func lockKey(key string) (unlock func()) {
	keyLocksMu.Lock()
	l := keyLocks[key]
	if l == nil {
		l = &keyLock{}
		keyLocks[key] = l
	}
	l.users++
	keyLocksMu.Unlock()
	l.mu.Lock()
	return func() {
		l.mu.Unlock()
		keyLocksMu.Lock()
		if l.users--; l.users == 0 {
			delete(keyLocks, key)
		}
		keyLocksMu.Unlock()
	}
}

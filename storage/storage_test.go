package storage_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"

	"github.com/caddyserver/certmagic"

	"github.com/Tahul/caddy-zidane-mcp/storage"
)

// Caddy's default storage must satisfy the interface as it is.
var _ storage.Storage = (*certmagic.FileStorage)(nil)

func TestUpdateSerializesWriters(t *testing.T) {
	s := &certmagic.FileStorage{Path: t.TempDir()}
	ctx := context.Background()
	var wg sync.WaitGroup
	for i := 0; i < 20; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := storage.Update(ctx, s, "counter", func(old []byte) ([]byte, error) {
				n := 0
				if old != nil {
					n, _ = strconv.Atoi(string(old))
				}
				return []byte(strconv.Itoa(n + 1)), nil
			})
			if err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	got, err := s.Load(ctx, "counter")
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != "20" {
		t.Fatalf("counter = %s after 20 concurrent updates, want 20 (an update was lost)", got)
	}
}

func TestUpdateErrorKeepsStoredValue(t *testing.T) {
	s := &certmagic.FileStorage{Path: t.TempDir()}
	ctx := context.Background()
	if err := s.Store(ctx, "k", []byte("kept")); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	if err := storage.Update(ctx, s, "k", func([]byte) ([]byte, error) { return nil, boom }); !errors.Is(err, boom) {
		t.Fatalf("Update error = %v, want boom", err)
	}
	got, _ := s.Load(ctx, "k")
	if string(got) != "kept" {
		t.Fatalf("value = %q after a failed update, want it kept", got)
	}
	if _, err := s.Load(ctx, "missing"); !storage.IsNotExist(err) {
		t.Fatalf("Load(missing) error = %v, want not-exist", err)
	}
}

// TestUpdateLeavesNoLockBehind: Update takes an in-process lock per key,
// and a client chooses keys (a retry's requestState names the round
// looked up under its id, made up or not): each Update's lock is gone once
// it returns, whether it stored, refused, or found nothing, so that keys
// sent by the million cost no memory once answered.
func TestUpdateLeavesNoLockBehind(t *testing.T) {
	s := &certmagic.FileStorage{Path: t.TempDir()}
	ctx := context.Background()
	refused := errors.New("unknown")
	for i := range 300 {
		key := "zidane/approvals/rounds/apr_" + strconv.Itoa(i)
		err := storage.Update(ctx, s, key, func(old []byte) ([]byte, error) {
			if i%2 == 0 {
				return nil, refused
			}
			return []byte("x"), nil
		})
		if (i%2 == 0) != errors.Is(err, refused) || (i%2 == 1 && err != nil) {
			t.Fatalf("update %d: %v", i, err)
		}
	}
	var wg sync.WaitGroup
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = storage.Update(ctx, s, "shared", func(old []byte) ([]byte, error) { return append(old, 'x'), nil })
		}()
	}
	wg.Wait()
	if b, err := s.Load(ctx, "shared"); err != nil || len(b) != 20 {
		t.Fatalf("20 writers of one key stored %q %v, want 20 bytes", b, err)
	}
	if n := storage.KeyLocks(); n != 0 {
		t.Fatalf("%d in-process key locks remain after every Update returned, want none", n)
	}
}

// failingLock is a storage whose lock cannot be taken.
type failingLock struct{ *certmagic.FileStorage }

func (failingLock) Lock(context.Context, string) error { return errors.New("lock refused") }

// TestLockReleasesWhatItTook: Lock's release frees the storage lock and
// the in-process one (the next Lock of the key is taken at once, and no
// in-process lock is left), and a storage lock refused leaves no
// in-process lock held either: were it kept, the next Lock of the key in
// this process would wait forever.
func TestLockReleasesWhatItTook(t *testing.T) {
	ctx := context.Background()
	s := &certmagic.FileStorage{Path: t.TempDir()}
	for range 3 {
		unlock, err := storage.Lock(ctx, s, "zidane/k")
		if err != nil {
			t.Fatal(err)
		}
		unlock()
	}
	if _, err := storage.Lock(ctx, failingLock{s}, "zidane/k"); err == nil || err.Error() != "lock refused" {
		t.Fatalf("a refused storage lock: %v", err)
	}
	if n := storage.KeyLocks(); n != 0 {
		t.Fatalf("%d in-process key locks remain, want none", n)
	}
	unlock, err := storage.Lock(ctx, s, "zidane/k")
	if err != nil {
		t.Fatal(err)
	}
	unlock()
}

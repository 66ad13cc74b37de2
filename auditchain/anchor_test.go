package auditchain

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// memKeeper keeps the latest checkpoint of each chain in memory, as the
// writer keeps it in storage.
type memKeeper struct {
	mu     sync.Mutex
	latest map[string]Anchor
	last   *Anchor
}

func newMemKeeper() *memKeeper { return &memKeeper{latest: map[string]Anchor{}} }

func (k *memKeeper) Keep(a Anchor) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.latest[a.Chain] = a
	k.last = &a
}

func (k *memKeeper) Latest(chain string) (*Anchor, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	a, ok := k.latest[chain]
	if !ok {
		return nil, nil
	}
	return ParseAnchor(a.Line, "the keeper")
}

// Last is the checkpoint kept last, of whatever chain: the keeper serves
// one log.
func (k *memKeeper) Last() (*Anchor, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.last == nil {
		return nil, nil
	}
	return ParseAnchor(k.last.Line, "the keeper")
}

// only is the one chain the keeper holds.
func (k *memKeeper) only(t *testing.T) *Anchor {
	t.Helper()
	k.mu.Lock()
	defer k.mu.Unlock()
	if len(k.latest) != 1 {
		t.Fatalf("the keeper holds %d chains, want 1", len(k.latest))
	}
	for _, a := range k.latest {
		p, err := ParseAnchor(a.Line, "the keeper")
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	return nil
}

// keptChain is fileChain with k keeping its checkpoints.
func keptChain(t testing.TB, path string, s *Signer, k Keeper) *Chain {
	t.Helper()
	c := New(func() (io.Writer, error) {
		return os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	}, func() (Tail, error) { return ReadChainTail(path) }, s)
	c.SetKeeper(k)
	return c
}

// run writes one run of the writer: n entries with a checkpoint after
// every `every`, and the stop checkpoint.
func run(t testing.TB, path string, s *Signer, k Keeper, n, every int) {
	t.Helper()
	c := keptChain(t, path, s, k)
	for i := range n {
		if _, err := c.Write(entry(i)); err != nil {
			t.Fatal(err)
		}
		if every > 0 && (i+1)%every == 0 {
			if err := c.Checkpoint(ReasonInterval); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
}

// lineOfCheckpoint is the 1-based line of the nth (from 0) checkpoint for
// reason in lines.
func lineOfCheckpoint(t *testing.T, lines []string, reason string, nth int) int {
	t.Helper()
	seen := 0
	for i, l := range lines {
		var r struct {
			Checkpoint *struct{ Reason string } `json:"checkpoint"`
		}
		if json.Unmarshal([]byte(l), &r) == nil && r.Checkpoint != nil && r.Checkpoint.Reason == reason {
			if seen == nth {
				return i + 1
			}
			seen++
		}
	}
	t.Fatalf("no %s checkpoint #%d", reason, nth)
	return 0
}

func anchorOpts(k *memKeeper) Options {
	return Options{Anchor: func(chain string) (*Anchor, error) { return k.Latest(chain) }}
}

// The attack: whoever can write the log's file cuts it where it still
// verifies on its own. Against the checkpoint kept outside, each cut fails
// as a cut, naming the seq expected next; the log as written verifies, and
// says where the kept checkpoint is.
func TestCutsBeforeTheKeptCheckpointAreCaught(t *testing.T) {
	s := testSigner(t)
	k := newMemKeeper()
	path := filepath.Join(t.TempDir(), "audit.log")
	run(t, path, s, k, 4, 0) // start, 4 entries, stop (seq 6)
	run(t, path, s, k, 6, 3) // start, 3, interval, 3, interval, stop: seqs 7..16
	lines := readLines(t, path)
	lines = lines[:len(lines)-1] // the "" after the last newline
	if len(lines) != 16 {
		t.Fatalf("%d lines", len(lines))
	}
	rep, err := verifyFiles(s, anchorOpts(k), path)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Anchor == nil || rep.Anchor.Seq != 16 || rep.AnchorAt.Line != 16 || rep.CheckpointsAfter != 0 || rep.Chain == "" {
		t.Fatalf("report %+v", rep)
	}
	oldStop := lineOfCheckpoint(t, lines, ReasonStop, 0)
	interval := lineOfCheckpoint(t, lines, ReasonInterval, 0)
	for _, tc := range []struct {
		name     string
		keep     []string
		expected uint64
	}{
		{"right after an earlier run's stop checkpoint", lines[:oldStop], uint64(oldStop) + 1},
		{"right after an interval checkpoint", lines[:interval], uint64(interval) + 1},
		{"after a plain record", lines[:interval+1], uint64(interval) + 2},
		{"in the middle of a line", append(append([]string(nil), lines[:interval+1]...), lines[interval+1][:30]), uint64(interval) + 2},
		{"the stop checkpoint alone", lines[:15], 16},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "audit.log")
			writeLines(t, p, tc.keep)
			if _, err := verifyFiles(s, Options{}, p); err != nil && !strings.Contains(err.Error(), "cut short") {
				t.Fatalf("on its own, the cut log fails otherwise than by its cut-short line: %v", err)
			}
			_, err := verifyFiles(s, anchorOpts(k), p)
			f, ok := err.(*Failure)
			if !ok || f.Kind != KindCut || !strings.Contains(f.Msg, fmt.Sprintf("expected seq %d next", tc.expected)) || !strings.Contains(f.Msg, "is seq 16") {
				t.Fatalf("got %v, want a cut expecting seq %d", err, tc.expected)
			}
		})
	}
}

// A kept checkpoint that is not the log's record of its seq (the log
// rewritten from there, the chain recomputed, with a checkpoint forged
// by nobody: the record is plain), a forged kept checkpoint, and one of
// another log, each fail.
func TestKeptCheckpointMismatches(t *testing.T) {
	s := testSigner(t)
	k := newMemKeeper()
	path := filepath.Join(t.TempDir(), "audit.log")
	run(t, path, s, k, 4, 2)
	lines := readLines(t, path)
	lines = lines[:len(lines)-1]
	kept := k.only(t)

	t.Run("another record at its seq", func(t *testing.T) {
		// The stop checkpoint cut, and the log written on from there by a
		// writer that keeps its checkpoints elsewhere: another record
		// holds the kept one's seq.
		p := filepath.Join(t.TempDir(), "audit.log")
		writeLines(t, p, lines[:len(lines)-1])
		c := keptChain(t, p, s, newMemKeeper())
		c.Write(entry(99))
		_, err := verifyFiles(s, anchorOpts(k), p)
		f, ok := err.(*Failure)
		if !ok || f.Kind != KindChanged || f.Seq != kept.Seq || !strings.Contains(f.Msg, "not the checkpoint of seq") {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("forged", func(t *testing.T) {
		forged := []byte(strings.Replace(string(kept.Line), `"reason":"stop"`, `"reason":"interval"`, 1))
		_, err := verifyFiles(s, Options{Anchor: func(string) (*Anchor, error) { return ParseAnchor(forged, "forged") }}, path)
		if err == nil || !strings.Contains(err.Error(), "forged") {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("another log's", func(t *testing.T) {
		k2 := newMemKeeper()
		run(t, filepath.Join(t.TempDir(), "other.log"), s, k2, 1, 0)
		_, err := verifyFiles(s, Options{Anchor: func(string) (*Anchor, error) { return k2.only(t), nil }}, path)
		if err == nil || !strings.Contains(err.Error(), "another log's") {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("before the first record given", func(t *testing.T) {
		k3 := newMemKeeper()
		p := filepath.Join(t.TempDir(), "audit.log")
		run(t, p, s, k3, 2, 0)
		a := k3.only(t)
		run(t, p, s, newMemKeeper(), 2, 0) // kept nowhere: the kept one lags
		ls := readLines(t, p)
		writeLines(t, p, ls[a.Seq:])
		rep, err := verifyFiles(s, Options{Partial: true, Anchor: func(string) (*Anchor, error) { return a, nil }}, p)
		if err != nil || !rep.AnchorBefore {
			t.Fatalf("%v %+v", err, rep)
		}
	})
}

// A writer that starts on a file cut while no process wrote it (after its
// last stop, the kept checkpoint further on) goes on writing, and says so
// in its signed start checkpoint: the log fails as cut however long it
// goes on, though the kept checkpoint is now a later one of this run.
func TestARestartOnACutLogSaysSo(t *testing.T) {
	s := testSigner(t)
	k := newMemKeeper()
	path := filepath.Join(t.TempDir(), "audit.log")
	run(t, path, s, k, 3, 0) // seqs 1..5
	run(t, path, s, k, 3, 0) // seqs 6..10
	lines := readLines(t, path)
	writeLines(t, path, lines[:5]) // cut after run 1's stop
	run(t, path, s, k, 2, 0)       // goes on at seq 6
	_, err := verifyFiles(s, anchorOpts(k), path)
	f, ok := err.(*Failure)
	if !ok || f.Kind != KindCut || f.At.Line != 6 || f.Seq != 6 || !strings.Contains(f.Msg, "expected seq 6 to 10") {
		t.Fatalf("got %v", err)
	}
	// Without the keeper it holds on its own, except for what the start
	// checkpoint says.
	if _, err := verifyFiles(s, Options{}, path); err == nil {
		t.Fatal("the start checkpoint's cut went unreported without the kept checkpoint")
	}
}

// A log whose every file is removed while no process writes it: the next
// run finds no record, and begins a new chain at genesis, which holds on
// its own. Its genesis checkpoint says that the keeper holds a later
// checkpoint of this log, of the earlier chain, so the log fails as cut,
// naming that chain and the seq it expected; a first start, with nothing
// kept, says nothing.
func TestARemovedLogSaysSo(t *testing.T) {
	s := testSigner(t)
	k := newMemKeeper()
	path := filepath.Join(t.TempDir(), "audit.log")
	run(t, path, s, k, 3, 0) // seqs 1..5
	if _, err := verifyFiles(s, anchorOpts(k), path); err != nil {
		t.Fatalf("a first start: %v", err)
	}
	run(t, path, s, k, 3, 0) // seqs 6..10
	old := k.only(t)
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	run(t, path, s, k, 2, 0) // a new chain, seqs 1..4
	_, err := verifyFiles(s, anchorOpts(k), path)
	f, ok := err.(*Failure)
	if !ok || f.Kind != KindCut || f.Seq != 1 || !strings.Contains(f.Msg, "seq 10 of chain "+old.Chain) || !strings.Contains(f.Msg, "expected seq 1 to 10") {
		t.Fatalf("got %v", err)
	}
	if _, err := verifyFiles(s, Options{}, path); err == nil {
		t.Fatal("the genesis checkpoint's cut went unreported without the kept checkpoint")
	}
}

// The chain id is chosen at genesis and found again at each restart: in
// the current file's last checkpoint, further back in it, or in the newest
// rotated file when the current one holds no checkpoint.
func TestChainIDLastsAcrossRestarts(t *testing.T) {
	s := testSigner(t)
	dir := t.TempDir()
	path := filepath.Join(dir, "audit.log")
	k := newMemKeeper()
	run(t, path, s, k, 2, 0)
	id := k.only(t).Chain
	if !ValidChainID(id) {
		t.Fatalf("chain id %q", id)
	}
	// A crash after records: the last checkpoint is not the last line.
	c := keptChain(t, path, s, k)
	for i := range 3 {
		c.Write(entry(i))
	}
	run(t, path, s, k, 1, 0)
	// A rotation, then a crash before the new file's first checkpoint.
	rotated := filepath.Join(dir, "audit-2026-01-01T00-00-00.000-size.log")
	if err := os.Rename(path, rotated); err != nil {
		t.Fatal(err)
	}
	c = keptChain(t, path, s, k)
	c.Write(entry(1)) // the start checkpoint
	lines := readLines(t, path)
	writeLines(t, path, lines[1:]) // as a rotation mid-run leaves it: records, no checkpoint
	tail, err := ReadChainTail(path)
	if err != nil || tail.Chain != id {
		t.Fatalf("tail %+v %v, want chain %s", tail, err, id)
	}
	if got := k.only(t).Chain; got != id {
		t.Fatalf("the chain changed id: %s, then %s", id, got)
	}
}

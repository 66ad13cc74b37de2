package caddymodule

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/certmagic"

	"github.com/Tahul/caddy-zidane-mcp/auditchain"
)

// blindAtOpen is the writer's keeper as it is when the storage does not
// answer the look-up the chain makes as it opens its file (NATS failing
// over, a storage read past its time): the chain cannot tell a cut then.
type blindAtOpen struct{ *auditKeeper }

func (blindAtOpen) Latest(string) (*auditchain.Anchor, error) {
	return nil, errors.New("the storage did not answer")
}

// keptRun writes one run of the log at path through a chain whose
// checkpoints k keeps: a start checkpoint, n records, an interval
// checkpoint after each, and the stop checkpoint, all kept once the run
// ends (as at a stop).
func keptRun(t *testing.T, path string, s *auditchain.Signer, k auditchain.Keeper, closeKeeper func(), n int) {
	t.Helper()
	c := auditchain.New(func() (io.Writer, error) {
		return os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	}, func() (auditchain.Tail, error) { return auditchain.ReadChainTail(path) }, s)
	c.SetKeeper(k)
	for i := range n {
		if _, err := c.Write([]byte(`{"event":"test","n":` + string(rune('0'+i)) + "}\n")); err != nil {
			t.Fatal(err)
		}
		if err := c.Checkpoint(auditchain.ReasonInterval); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	closeKeeper()
}

// The attack: the log is cut while caddy is stopped, and the next run
// opens it when the storage does not answer, so its start checkpoint
// cannot say the log was cut. The checkpoints it keeps then come before
// the one kept (same chain, lower seqs): the kept one must not go back to
// them, or the cut log verifies against them.
func TestKeptCheckpointNeverGoesBack(t *testing.T) {
	if caddy.ActiveContext().Context != nil {
		t.Skip("a config runs in this test process")
	}
	seed := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{0x21}, 32))
	s, err := auditchain.ParseSigningKey(seed)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "log", "audit.log")
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	st := &certmagic.FileStorage{Path: filepath.Join(dir, "storage")}
	keeper := func() *auditKeeper {
		k := newAuditKeeper(path)
		k.held = st // no config runs: the keeper writes where it held
		return k
	}

	k1 := keeper()
	keptRun(t, path, s, k1, k1.close, 4) // seqs 1 to 10
	whole, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.SplitAfter(string(whole), "\n")
	kept, err := loadKeptCheckpoint(context.Background(), st, mustChain(t, lines[0]))
	if err != nil || kept == nil || kept.Seq != 10 {
		t.Fatalf("run 1's stop checkpoint is not kept: %+v %v", kept, err)
	}
	// Cut after run 1's first interval checkpoint (seq 3).
	if err := os.WriteFile(path, []byte(strings.Join(lines[:3], "")), 0o600); err != nil {
		t.Fatal(err)
	}
	k2 := keeper()
	keptRun(t, path, s, blindAtOpen{k2}, k2.close, 2) // seqs 4 to 8

	opts := auditchain.Options{Keys: []ed25519.PublicKey{s.Public()}, Anchor: func(chain string) (*auditchain.Anchor, error) {
		return loadKeptCheckpoint(context.Background(), st, chain)
	}}
	_, err = auditchain.Verify([]auditchain.Source{auditchain.FileSource(path)}, opts)
	var f *auditchain.Failure
	if !errors.As(err, &f) || f.Kind != auditchain.KindCut {
		t.Fatalf("verify of the log cut after seq 3 and written on from there: %v; want it reported as cut before the kept seq 10", err)
	}
	t.Logf("verify: %v", err)
}

func mustChain(t *testing.T, line string) string {
	t.Helper()
	a, err := auditchain.ParseAnchor([]byte(line), "line 1")
	if err != nil {
		t.Fatal(err)
	}
	return a.Chain
}

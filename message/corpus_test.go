package message

import (
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

var updateCorpus = flag.Bool("update-corpus", false, "write the fuzz seeds that testdata/fuzz/FuzzRead lacks")

const corpusDir = "testdata/fuzz/FuzzRead"

// readCorpus returns the bodies of the files under testdata/fuzz/FuzzRead:
// the committed seeds and the fuzzer's findings.
func readCorpus(t *testing.T) [][]byte {
	t.Helper()
	entries, err := os.ReadDir(corpusDir)
	if err != nil {
		t.Fatal(err)
	}
	var out [][]byte
	for _, e := range entries {
		data, err := os.ReadFile(filepath.Join(corpusDir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(strings.TrimSpace(string(data)), "\n")
		if len(lines) != 2 || lines[0] != "go test fuzz v1" {
			t.Fatalf("%s: not a fuzz corpus file", e.Name())
		}
		q, pre := strings.CutPrefix(lines[1], "[]byte(")
		q, suf := strings.CutSuffix(q, ")")
		if !pre || !suf {
			t.Fatalf("%s: not a []byte entry", e.Name())
		}
		s, err := strconv.Unquote(q)
		if err != nil {
			t.Fatalf("%s: %v", e.Name(), err)
		}
		out = append(out, []byte(s))
	}
	return out
}

// TestSeedCorpus keeps testdata/fuzz/FuzzRead holding every seed, so that
// the committed corpus and f.Add do not drift apart (go test
// -run TestSeedCorpus -update-corpus writes what is missing). go test runs
// FuzzRead on every file there, findings included.
func TestSeedCorpus(t *testing.T) {
	have := map[string]bool{}
	for _, b := range readCorpus(t) {
		have[string(b)] = true
	}
	for _, s := range fuzzSeeds() {
		if have[s] {
			continue
		}
		if !*updateCorpus {
			t.Errorf("seed %q is not under %s; run go test -run TestSeedCorpus -update-corpus", s, corpusDir)
			continue
		}
		sum := sha256.Sum256([]byte(s))
		name := filepath.Join(corpusDir, "seed-"+hex.EncodeToString(sum[:8]))
		data := fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n", []byte(s))
		if err := os.WriteFile(name, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
		have[s] = true
	}
}

package auditchain

import (
	"bytes"
	"compress/gzip"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

func testSigner(t testing.TB) *Signer {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return NewSigner(priv)
}

// fileChain is a chain on the file at path, as a restart would open it.
func fileChain(t testing.TB, path string, s *Signer) *Chain {
	t.Helper()
	return New(func() (io.Writer, error) {
		return os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	}, func() (Tail, error) { return ReadTail(path) }, s)
}

func entry(i int) []byte {
	return fmt.Appendf(nil, `{"level":"info","ts":1764619200.%06d,"logger":"http.handlers.zidane_mcp.audit","msg":"tool call","event":"tool_call","tool":"tool-%d","token_id":"tok","client_ip":"127.0.0.1"}`+"\n", i, i)
}

// writeLog writes n entries with a checkpoint after every `every`, and
// closes the chain (a stop checkpoint).
func writeLog(t testing.TB, path string, s *Signer, n, every int) {
	t.Helper()
	c := fileChain(t, path, s)
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

func readLines(t testing.TB, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.SplitAfter(string(b), "\n")
}

func writeLines(t testing.TB, path string, lines []string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(strings.Join(lines, "")), 0o600); err != nil {
		t.Fatal(err)
	}
}

func verifyFiles(s *Signer, opts Options, paths ...string) (*Report, error) {
	var srcs []Source
	for _, p := range paths {
		srcs = append(srcs, FileSource(p))
	}
	if s != nil {
		opts.Keys = append(opts.Keys, s.Public())
	}
	return Verify(srcs, opts)
}

func wantFailure(t *testing.T, err error, kind string, line int, seq uint64) *Failure {
	t.Helper()
	var f *Failure
	if !errors.As(err, &f) {
		t.Fatalf("got %v, want a %s failure at line %d", err, kind, line)
	}
	if f.Kind != kind || f.At.Line != line || f.Seq != seq {
		t.Fatalf("got %q (kind %s, line %d, seq %d), want kind %s at line %d, seq %d", f.Error(), f.Kind, f.At.Line, f.Seq, kind, line, seq)
	}
	return f
}

func TestIntactLogVerifies(t *testing.T) {
	s := testSigner(t)
	path := filepath.Join(t.TempDir(), "audit.log")
	writeLog(t, path, s, 10, 4)
	rep, err := verifyFiles(s, Options{}, path)
	if err != nil {
		t.Fatal(err)
	}
	// start + 10 entries + 2 interval checkpoints + stop.
	if rep.Records != 14 || rep.First != 1 || rep.Last != 14 || rep.Checkpoints != 4 || rep.Unsigned != 0 || rep.LastCheckpointReason != ReasonStop {
		t.Fatalf("report %+v", rep)
	}
	for i, l := range readLines(t, path) {
		if l == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("line %d is not JSON: %v", i+1, err)
		}
		if m["seq"] != float64(i+1) {
			t.Fatalf("line %d: seq %v", i+1, m["seq"])
		}
	}
}

func TestTamperingIsCaughtAndLocated(t *testing.T) {
	s := testSigner(t)
	path := filepath.Join(t.TempDir(), "audit.log")
	writeLog(t, path, s, 10, 4)
	orig := readLines(t, path) // lines 1..14 and a final ""
	// Line 1 is the start checkpoint; line k (2..5) is entry k-2; line 6 a checkpoint.
	tamper := func(t *testing.T, f func(lines []string) []string) error {
		t.Helper()
		p := filepath.Join(t.TempDir(), "audit.log")
		writeLines(t, p, f(append([]string(nil), orig...)))
		_, err := verifyFiles(s, Options{}, p)
		return err
	}
	t.Run("a line deleted", func(t *testing.T) {
		err := tamper(t, func(l []string) []string { return append(l[:3], l[4:]...) })
		f := wantFailure(t, err, KindRemoved, 4, 5)
		if !strings.Contains(f.Msg, "seq 4 was removed") {
			t.Fatal(f)
		}
	})
	t.Run("two lines deleted", func(t *testing.T) {
		err := tamper(t, func(l []string) []string { return append(l[:3], l[5:]...) })
		f := wantFailure(t, err, KindRemoved, 4, 6)
		if !strings.Contains(f.Msg, "seqs 4 to 5 were removed") {
			t.Fatal(f)
		}
	})
	t.Run("a field edited", func(t *testing.T) {
		err := tamper(t, func(l []string) []string {
			l[3] = strings.Replace(l[3], `"tool":"tool-2"`, `"tool":"tool-9"`, 1)
			return l
		})
		wantFailure(t, err, KindChanged, 4, 4)
	})
	t.Run("a field edited before a checkpoint", func(t *testing.T) {
		err := tamper(t, func(l []string) []string {
			l[4] = strings.Replace(l[4], `"tool":"tool-3"`, `"tool":"tool-0"`, 1)
			return l
		})
		wantFailure(t, err, KindChanged, 5, 5)
	})
	t.Run("a prev edited", func(t *testing.T) {
		err := tamper(t, func(l []string) []string {
			i := len(`{"seq":4,"prev":"`)
			c := byte('0')
			if l[3][i] == '0' {
				c = '1'
			}
			l[3] = l[3][:i] + string(c) + l[3][i+1:]
			return l
		})
		wantFailure(t, err, KindChanged, 4, 4)
	})
	t.Run("a seq edited", func(t *testing.T) {
		err := tamper(t, func(l []string) []string {
			l[3] = strings.Replace(l[3], `{"seq":4,`, `{"seq":40,`, 1)
			return l
		})
		wantFailure(t, err, KindChanged, 4, 40)
	})
	t.Run("two lines swapped", func(t *testing.T) {
		err := tamper(t, func(l []string) []string {
			l[3], l[4] = l[4], l[3]
			return l
		})
		f := wantFailure(t, err, KindReordered, 4, 5)
		if !strings.Contains(f.Msg, "seq 4 is later, at") {
			t.Fatal(f)
		}
	})
	t.Run("two distant lines swapped", func(t *testing.T) {
		err := tamper(t, func(l []string) []string {
			l[2], l[9] = l[9], l[2]
			return l
		})
		wantFailure(t, err, KindReordered, 3, 10)
	})
	t.Run("a line repeated", func(t *testing.T) {
		err := tamper(t, func(l []string) []string { return append(l[:4], append([]string{l[3]}, l[4:]...)...) })
		wantFailure(t, err, KindReordered, 5, 4)
	})
	t.Run("an edit with the chain recomputed", func(t *testing.T) {
		// Whoever recomputes the hashes after an edit is stopped by the
		// next checkpoint's signature.
		err := tamper(t, func(l []string) []string {
			l[3] = strings.Replace(l[3], `"tool":"tool-2"`, `"tool":"tool-9"`, 1)
			return rechain(t, l, 3)
		})
		wantFailure(t, err, KindSignature, 6, 6)
	})
	t.Run("a checkpoint's signature changed", func(t *testing.T) {
		err := tamper(t, func(l []string) []string {
			i := strings.LastIndex(l[5], `"sig":"`) + len(`"sig":"`)
			c := byte('A')
			if l[5][i] == 'A' {
				c = 'B'
			}
			l[5] = l[5][:i] + string(c) + l[5][i+1:]
			return rechain(t, l, 5)
		})
		wantFailure(t, err, KindSignature, 6, 6)
	})
	t.Run("not JSON", func(t *testing.T) {
		err := tamper(t, func(l []string) []string {
			l[3] = strings.Replace(l[3], `"tool":"tool-2"`, `"tool":tool-2"`, 1)
			return l
		})
		wantFailure(t, err, KindChanged, 4, 4)
	})
	t.Run("the first line deleted", func(t *testing.T) {
		err := tamper(t, func(l []string) []string { return l[1:] })
		wantFailure(t, err, KindStart, 1, 2)
	})
	t.Run("truncated last line", func(t *testing.T) {
		err := tamper(t, func(l []string) []string {
			l[13] = l[13][:40]
			return l[:14]
		})
		f := wantFailure(t, err, KindTruncated, 14, 14)
		if !strings.Contains(f.Msg, "cut short") {
			t.Fatal(f)
		}
	})
	t.Run("lines removed at the end are not caught", func(t *testing.T) {
		// The documented limit: records after the last checkpoint that
		// survives are not signed, and a cut there shows only as a log
		// that does not end with its stop checkpoint.
		p := filepath.Join(t.TempDir(), "audit.log")
		writeLines(t, p, orig[:12])
		rep, err := verifyFiles(s, Options{}, p)
		if err != nil {
			t.Fatal(err)
		}
		if rep.Last != 12 || rep.LastCheckpointSeq != 11 || rep.Unsigned != 1 || rep.LastCheckpointReason == ReasonStop {
			t.Fatalf("report %+v", rep)
		}
	})
	t.Run("another key", func(t *testing.T) {
		p := filepath.Join(t.TempDir(), "audit.log")
		writeLines(t, p, orig)
		_, err := verifyFiles(testSigner(t), Options{}, p)
		f := wantFailure(t, err, KindSignature, 1, 1)
		if !strings.Contains(f.Msg, s.KeyID()) {
			t.Fatal(f)
		}
	})
}

// rechain recomputes seq/prev links from line from on, as a forger would.
func rechain(t testing.TB, lines []string, from int) []string {
	t.Helper()
	for i := from + 1; i < len(lines) && lines[i] != ""; i++ {
		h := HashLine([]byte(strings.TrimSuffix(lines[i-1], "\n")))
		_, old, _, err := parsePrefix([]byte(lines[i]))
		if err != nil {
			t.Fatal(err)
		}
		lines[i] = strings.Replace(lines[i], old.String(), h.String(), 1)
	}
	return lines
}

func TestRestartContinuesTheChain(t *testing.T) {
	s := testSigner(t)
	path := filepath.Join(t.TempDir(), "audit.log")
	writeLog(t, path, s, 3, 0)
	writeLog(t, path, s, 3, 0)
	rep, err := verifyFiles(s, Options{}, path)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Records != 10 || rep.Checkpoints != 4 {
		t.Fatalf("report %+v", rep)
	}
}

// A restart reads back past a last record longer than the tail reader's
// first chunk.
func TestRestartAfterALongRecord(t *testing.T) {
	s := testSigner(t)
	path := filepath.Join(t.TempDir(), "audit.log")
	c := fileChain(t, path, s)
	long := append([]byte(`{"msg":"`), bytes.Repeat([]byte("y"), 300<<10)...)
	long = append(long, `"}`...)
	if _, err := c.Write(long); err != nil {
		t.Fatal(err)
	}
	// No stop checkpoint: the long record is the last line at the restart.
	b, _ := os.ReadFile(path)
	c2 := fileChain(t, path, s)
	if _, err := c2.Write(entry(1)); err != nil {
		t.Fatal(err)
	}
	c2.Close()
	rep, err := verifyFiles(s, Options{}, path)
	if err != nil || rep.Records != 5 || len(b) < 300<<10 {
		t.Fatalf("%v %+v", err, rep)
	}
}

// chainFileChain is fileChain that goes on from rotated files, as the
// writer does.
func chainFileChain(t testing.TB, path string, s *Signer) *Chain {
	t.Helper()
	return New(func() (io.Writer, error) {
		return os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	}, func() (Tail, error) { return ReadChainTail(path) }, s)
}

// A start after a rotation left the current file without a record (moved,
// or cut short by a crash in its first write) goes on from the newest
// rotated file, compressed or not.
func TestRestartAfterRotationGoesOnFromTheRotatedFile(t *testing.T) {
	for _, current := range []string{"missing", "empty", "cut short"} {
		t.Run(current, func(t *testing.T) {
			s := testSigner(t)
			dir := t.TempDir()
			path := filepath.Join(dir, "audit.log")
			writeLog(t, path, s, 3, 0)
			older := filepath.Join(dir, "audit-2026-01-01T00-00-00.000-size.log")
			os.Rename(path, older)
			c := chainFileChain(t, path, s)
			for i := range 2 {
				c.Write(entry(i))
			}
			c.Close()
			newer := filepath.Join(dir, "audit-2026-01-02T00-00-00.000-size.log")
			os.Rename(path, newer)
			raw, _ := os.ReadFile(newer)
			var zb bytes.Buffer
			zw := gzip.NewWriter(&zb)
			zw.Write(raw)
			zw.Close()
			os.WriteFile(newer+".gz", zb.Bytes(), 0o600)
			os.Remove(newer)
			switch current {
			case "empty":
				os.WriteFile(path, nil, 0o600)
			case "cut short":
				os.WriteFile(path, []byte(`{"seq":10,"prev":"00`), 0o600)
			}
			if current == "cut short" {
				// Before the restart, verify names the cut-short file.
				_, err := verifyFiles(s, Options{}, path, older, newer+".gz")
				wantFailure(t, err, KindTruncated, 1, 10)
			}
			c = chainFileChain(t, path, s)
			if _, err := c.Write(entry(9)); err != nil {
				t.Fatal(err)
			}
			c.Close()
			rep, err := verifyFiles(s, Options{}, path, older, newer+".gz")
			if err != nil {
				t.Fatal(err)
			}
			if rep.Records != 5+4+3 || rep.Files[2] != path {
				t.Fatalf("report %+v", rep)
			}
		})
	}
}

func TestCrashRemnantIsAcknowledgedAtRestart(t *testing.T) {
	s := testSigner(t)
	path := filepath.Join(t.TempDir(), "audit.log")
	writeLog(t, path, s, 3, 0)
	c := fileChain(t, path, s)
	if _, err := c.Write(entry(7)); err != nil {
		t.Fatal(err)
	}
	// A crash mid-write: the last record is cut short, and no stop checkpoint.
	b, _ := os.ReadFile(path)
	if err := os.WriteFile(path, b[:len(b)-30], 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := verifyFiles(s, Options{}, path)
	wantFailure(t, err, KindTruncated, 7, 7)

	writeLog(t, path, s, 2, 0)
	rep, err := verifyFiles(s, Options{}, path)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Recovered) != 1 || rep.Recovered[0].Line != 7 || rep.Records != 6+4 {
		t.Fatalf("report %+v", rep)
	}
}

// failingWriter writes the first n bytes of its fail-th Write, and fails.
type failingWriter struct {
	w       io.Writer
	writes  int
	fail, n int
}

func (f *failingWriter) Write(p []byte) (int, error) {
	f.writes++
	if f.writes == f.fail {
		n := f.n
		if n < 0 {
			n = len(p) + n // all but the last -n bytes
		}
		k, _ := f.w.Write(p[:n])
		return k, errors.New("disk full")
	}
	return f.w.Write(p)
}

func TestFailedWriteIsAcknowledged(t *testing.T) {
	// Nothing, a few bytes, most of the record, all of it but its newline.
	for _, n := range []int{0, 25, len(entry(1)) + 70, -1} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			s := testSigner(t)
			var buf bytes.Buffer
			fw := &failingWriter{w: &buf, fail: 3, n: n}
			c := New(func() (io.Writer, error) { return fw, nil }, func() (Tail, error) { return Tail{}, nil }, s)
			for i := range 4 {
				_, err := c.Write(entry(i))
				if (err != nil) != (i == 1) {
					t.Fatalf("write %d: %v", i, err)
				}
			}
			c.Close()
			path := filepath.Join(t.TempDir(), "audit.log")
			if err := os.WriteFile(path, buf.Bytes(), 0o600); err != nil {
				t.Fatal(err)
			}
			rep, err := verifyFiles(s, Options{}, path)
			if err != nil {
				t.Fatalf("%v\n%s", err, buf.String())
			}
			if want := map[bool]int{true: 0, false: 1}[n == 0]; len(rep.Recovered) != want {
				t.Fatalf("recovered %v, want %d", rep.Recovered, want)
			}
		})
	}
}

// rotating writes its records to a new file every `every` Writes.
type rotating struct {
	dir   string
	every int
	n     int
	files []string
	cur   *os.File
}

func (r *rotating) Write(p []byte) (int, error) {
	if r.n%r.every == 0 {
		if r.cur != nil {
			r.cur.Close()
		}
		name := filepath.Join(r.dir, fmt.Sprintf("audit-%02d.log", len(r.files)))
		f, err := os.Create(name)
		if err != nil {
			return 0, err
		}
		r.cur, r.files = f, append(r.files, name)
	}
	r.n++
	return r.cur.Write(p)
}

func TestChainAcrossRotatedFiles(t *testing.T) {
	s := testSigner(t)
	dir := t.TempDir()
	r := &rotating{dir: dir, every: 5}
	c := New(func() (io.Writer, error) { return r, nil }, func() (Tail, error) { return Tail{}, nil }, s)
	for i := range 17 {
		if _, err := c.Write(entry(i)); err != nil {
			t.Fatal(err)
		}
	}
	c.Close()
	r.cur.Close()
	if len(r.files) != 4 {
		t.Fatalf("files %v", r.files)
	}
	// Compress one, as rotation does, and give them out of order.
	gz := r.files[1] + ".gz"
	raw, _ := os.ReadFile(r.files[1])
	var zb bytes.Buffer
	zw := gzip.NewWriter(&zb)
	zw.Write(raw)
	zw.Close()
	os.WriteFile(gz, zb.Bytes(), 0o600)
	files := []string{r.files[3], gz, r.files[0], r.files[2]}
	rep, err := verifyFiles(s, Options{}, files...)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Records != 19 || rep.Files[0] != r.files[0] || rep.Files[1] != gz {
		t.Fatalf("report %+v", rep)
	}
	t.Run("a middle file missing", func(t *testing.T) {
		_, err := verifyFiles(s, Options{}, r.files[0], r.files[2], r.files[3])
		f := wantFailure(t, err, KindRemoved, 1, 11)
		if f.At.File != r.files[2] || !strings.Contains(f.Msg, "seqs 6 to 10 were removed") {
			t.Fatal(f)
		}
	})
	t.Run("the first file rotated away", func(t *testing.T) {
		_, err := verifyFiles(s, Options{}, r.files[1], r.files[2], r.files[3])
		wantFailure(t, err, KindStart, 1, 6)
		rep, err := verifyFiles(s, Options{Partial: true}, r.files[1], r.files[2], r.files[3])
		if err != nil || rep.First != 6 {
			t.Fatalf("%v %+v", err, rep)
		}
	})
}

func TestConcurrentWritesStayChained(t *testing.T) {
	s := testSigner(t)
	path := filepath.Join(t.TempDir(), "audit.log")
	c := fileChain(t, path, s)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 200 {
				if _, err := c.Write(entry(g*1000 + i)); err != nil {
					t.Error(err)
					return
				}
				if i%50 == 0 {
					c.Checkpoint(ReasonInterval)
				}
			}
		})
	}
	wg.Wait()
	c.Close()
	rep, err := verifyFiles(s, Options{}, path)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Records-rep.Checkpoints != 1600 {
		t.Fatalf("report %+v", rep)
	}
	if _, err := c.Write(entry(1)); !errors.Is(err, ErrClosed) {
		t.Fatalf("write after close: %v", err)
	}
}

func TestEntriesOfEveryShapeAreRecorded(t *testing.T) {
	s := testSigner(t)
	path := filepath.Join(t.TempDir(), "audit.log")
	c := fileChain(t, path, s)
	big := append([]byte(`{"msg":"`), bytes.Repeat([]byte("x"), MaxEntry+10)...)
	big = append(big, `"}`...)
	for _, e := range [][]byte{
		[]byte("{}\n"),
		[]byte("plain text, not JSON\n"),
		[]byte(`{"seq":99,"msg":"a field named seq"}`),
		[]byte(`{"checkpoint":{"reason":"stop"},"msg":"looks like a checkpoint"}`),
		[]byte(`{"nested":{"prev":"x"}}`),
		big,
		bytes.Repeat([]byte{1}, MaxEntry/2), // not JSON, and six times longer escaped
	} {
		if _, err := c.Write(e); err != nil {
			t.Fatal(err)
		}
	}
	c.Close()
	rep, err := verifyFiles(s, Options{}, path)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Records != 9 {
		t.Fatalf("report %+v", rep)
	}
	lines := readLines(t, path)
	for i, want := range []string{`}`, `"raw":"plain text`, `"raw":"{\"seq\":99`, `"raw":"{\"checkpoint\"`, `"raw":"{\"nested\"`, `"oversize":{"bytes":`, `"oversize":{"bytes":`} {
		if !strings.Contains(lines[i+1], want) {
			t.Errorf("line %d: %.200s, want %s", i+2, lines[i+1], want)
		}
		if len(lines[i+1]) > MaxLine {
			t.Errorf("line %d is %d bytes", i+2, len(lines[i+1]))
		}
	}
}

func TestReadTailRefusesAForeignFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.log")
	os.WriteFile(path, []byte(`{"level":"info","msg":"written by output file"}`+"\n"), 0o600)
	c := fileChain(t, path, testSigner(t))
	_, err := c.Write(entry(1))
	if err == nil || !strings.Contains(err.Error(), "not an audit record") {
		t.Fatalf("write on a foreign file: %v", err)
	}
}

func TestKeys(t *testing.T) {
	if _, err := ParseSigningKey("c2hvcnQ="); err == nil || strings.Contains(err.Error(), "c2hvcnQ") {
		t.Fatalf("short key: %v", err)
	}
	s, err := ParseSigningKey("AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=")
	if err != nil {
		t.Fatal(err)
	}
	pub, err := ParsePublicKey([]byte(EncodePublicKey(s.Public()) + "\n"))
	if err != nil || KeyID(pub) != s.KeyID() {
		t.Fatalf("%v %s", err, s.KeyID())
	}
	if _, err := ParsePublicKey([]byte("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n")); err == nil || !strings.Contains(err.Error(), "never the signing key") {
		t.Fatalf("private PEM: %v", err)
	}
}

// The chain's own cost per record: the same entry written to io.Discard
// as it is and through a chain.
func BenchmarkChainWrite(b *testing.B) {
	e := entry(1)
	b.Run("discard", func(b *testing.B) {
		b.SetBytes(int64(len(e)))
		for b.Loop() {
			io.Discard.Write(e)
		}
	})
	b.Run("chained", func(b *testing.B) {
		c := New(func() (io.Writer, error) { return io.Discard, nil }, func() (Tail, error) { return Tail{}, nil }, testSigner(b))
		b.SetBytes(int64(len(e)))
		b.ReportAllocs()
		for b.Loop() {
			c.Write(e)
		}
	})
}

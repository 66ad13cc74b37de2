package caddymodule

import (
	"crypto/ed25519"
	"encoding/base64"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/logging"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/Tahul/caddy-zidane-mcp/auditchain"
	"github.com/Tahul/caddy-zidane-mcp/message"
	"github.com/Tahul/caddy-zidane-mcp/policy"
)

func seedOf(b byte) string {
	seed := make([]byte, ed25519.SeedSize)
	for i := range seed {
		seed[i] = b
	}
	return base64.StdEncoding.EncodeToString(seed)
}

func provisionedAuditWriter(t testing.TB, w AuditWriter) *AuditWriter {
	t.Helper()
	if err := w.Provision(caddy.Context{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Cleanup() })
	return &w
}

// auditLoggerOn is a zap logger with the JSON encoder Caddy's `format json`
// uses, writing to w.
func auditLoggerOn(w io.Writer) *zap.Logger {
	enc := zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig())
	return zap.New(zapcore.NewCore(enc, zapcore.AddSync(w), zapcore.InfoLevel)).Named(auditLoggerName)
}

func publicOf(t testing.TB, seed string) ed25519.PublicKey {
	s, err := auditchain.ParseSigningKey(seed)
	if err != nil {
		t.Fatal(err)
	}
	return s.Public()
}

// A reload that changes the key hands the chain over: a checkpoint signed
// with the old key, then the new key; a config only validated writes
// nothing; a writer Caddy kept from an earlier config goes on with the
// chain of the config running now.
func TestAuditWriterReloadHandsTheChainOver(t *testing.T) {
	t.Setenv("AUDIT_KEY_A", seedOf(1))
	t.Setenv("AUDIT_KEY_B", seedOf(2))
	path := filepath.Join(t.TempDir(), "audit.log")

	// Validated only: provisioned, opened and cleaned up, never written.
	v := provisionedAuditWriter(t, AuditWriter{Filename: path, SigningKey: "{env.AUDIT_KEY_A}"})
	if _, err := v.OpenWriter(); err != nil {
		t.Fatal(err)
	}
	v.Cleanup()
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("a writer provisioned and cleaned up without a record touched the file: %v", err)
	}

	a := provisionedAuditWriter(t, AuditWriter{Filename: path, SigningKey: "{env.AUDIT_KEY_A}"})
	wa, err := a.OpenWriter()
	if err != nil {
		t.Fatal(err)
	}
	la := auditLoggerOn(wa)
	p := policy.Principal{TokenID: "t1", Name: "laptop"}
	logToolCall(la, p, message.Call{Tool: "sessions", Verb: "list"}, "127.0.0.1")
	b := provisionedAuditWriter(t, AuditWriter{Filename: path, SigningKey: "{env.AUDIT_KEY_B}"}) // the reload: the new config starts first
	if a.WriterKey() == b.WriterKey() {
		t.Fatal("writers with other keys share a writer key")
	}
	wb, err := b.OpenWriter()
	if err != nil {
		t.Fatal(err)
	}
	lb := auditLoggerOn(wb)
	logToolCall(lb, p, message.Call{Tool: "sessions", Verb: "read"}, "127.0.0.1")
	a.Cleanup()
	logToolCall(la, p, message.Call{Tool: "sessions", Verb: "late"}, "127.0.0.1") // an old request after the reload
	b.Cleanup()

	srcs := []auditchain.Source{auditchain.FileSource(path)}
	both := []ed25519.PublicKey{publicOf(t, seedOf(1)), publicOf(t, seedOf(2))}
	rep, err := auditchain.Verify(srcs, auditchain.Options{Keys: both})
	if err != nil {
		t.Fatal(err)
	}
	// start, call, reload checkpoint, call, late call, stop.
	if rep.Records != 6 || rep.Checkpoints != 3 || len(rep.KeyIDs) != 2 || rep.LastCheckpointReason != auditchain.ReasonStop {
		b, _ := os.ReadFile(path)
		t.Fatalf("report %+v\n%s", rep, b)
	}
	if _, err := auditchain.Verify(srcs, auditchain.Options{Keys: both[:1]}); err == nil || !strings.Contains(err.Error(), "which no --public-key given is") {
		t.Fatalf("verified without the new key: %v", err)
	}

	// A new config on the file: the handle kept from the first writes to it.
	provisionedAuditWriter(t, AuditWriter{Filename: path, SigningKey: "{env.AUDIT_KEY_B}"})
	logToolCall(la, p, message.Call{Tool: "sessions", Verb: "kept"}, "127.0.0.1")
	auditMu.Lock()
	f := auditFiles[path]
	auditMu.Unlock()
	if err := f.instances[0].Cleanup(); err != nil {
		t.Fatal(err)
	}
	rep, err = auditchain.Verify(srcs, auditchain.Options{Keys: both})
	if err != nil || rep.Records != 9 {
		t.Fatalf("%v %+v", err, rep)
	}
	log, _ := os.ReadFile(path)
	if !strings.Contains(string(log), `"verb":"kept"`) {
		t.Fatal("the kept handle's record is not in the log")
	}
	if strings.Contains(string(log), seedOf(1)) || strings.Contains(string(log), seedOf(2)) {
		t.Fatal("the log shows a signing key")
	}
}

func TestAuditWriterRefusesBadKeys(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.log")
	t.Setenv(AuditSigningKeyEnv, "")
	t.Setenv("SHORT", "c2hvcnQ=")
	for _, c := range []struct {
		w    AuditWriter
		want string
	}{
		{AuditWriter{Filename: path, SigningKey: seedOf(1)}, "holds a literal value"},
		{AuditWriter{Filename: path}, AuditSigningKeyEnv + " is empty"},
		{AuditWriter{Filename: path, SigningKey: "{env.SHORT}"}, "must be an Ed25519 seed of 32 bytes"},
		{AuditWriter{Filename: path, SigningKey: "{env.NOPE_UNSET}"}, "is empty"},
		{AuditWriter{SigningKey: "{env.SHORT}"}, "file is missing"},
		{AuditWriter{Filename: t.TempDir(), SigningKey: "{env.SHORT}"}, "not a regular file"},
	} {
		err := c.w.Provision(caddy.Context{})
		c.w.Cleanup()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: got %v, want %q", c.w, err, c.want)
		}
		if err != nil && strings.Contains(err.Error(), "c2hvcnQ") {
			t.Errorf("the error shows the key: %v", err)
		}
	}
}

// The cost of one audited tool call: zap's JSON encoding and the write,
// through the chain and, in the same run, through Caddy's `file` writer
// (both rotating, as by default). The two run in alternating batches, so
// that the load of the machine weighs on both alike; the benchmark reports
// each one's ns per call, the difference and the ratio.
func BenchmarkAuditedToolCall(b *testing.B) {
	b.Setenv("AUDIT_BENCH_KEY", seedOf(3))
	dir := b.TempDir()
	f, err := logging.FileWriter{Filename: filepath.Join(dir, "plain.log")}.OpenWriter()
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	w := provisionedAuditWriter(b, AuditWriter{Filename: filepath.Join(dir, "chained.log"), SigningKey: "{env.AUDIT_BENCH_KEY}"})
	wc, err := w.OpenWriter()
	if err != nil {
		b.Fatal(err)
	}
	benchAuditPair(b, f, wc)
}

// BenchmarkAuditedToolCallNoIO is BenchmarkAuditedToolCall without the
// file: the plain logger writes to io.Discard, the chained one through a
// chain to io.Discard. What differs is the chain's own work, without the
// noise of the write system call.
func BenchmarkAuditedToolCallNoIO(b *testing.B) {
	_, priv, _ := ed25519.GenerateKey(nil)
	c := auditchain.New(func() (io.Writer, error) { return io.Discard, nil }, func() (auditchain.Tail, error) { return auditchain.Tail{}, nil }, auditchain.NewSigner(priv))
	benchAuditPair(b, discardWriter{}, c)
}

type discardWriter struct{}

func (discardWriter) Write(p []byte) (int, error) { return len(p), nil }

func benchAuditPair(b *testing.B, plainW, chainedW io.Writer) {
	p := policy.Principal{TokenID: "tok_0123456789abcdef", Name: "laptop", Kind: "user"}
	call := message.Call{Tool: "sessions", Verb: "list"}
	plain, chained := auditLoggerOn(plainW), auditLoggerOn(chainedW)
	logToolCall(chained, p, call, "127.0.0.1") // opens the file, writes the start checkpoint
	const batch = 256
	var tPlain, tChained time.Duration
	n := 0
	b.ReportAllocs()
	for b.Loop() {
		start := time.Now()
		for range batch {
			logToolCall(plain, p, call, "127.0.0.1")
		}
		mid := time.Now()
		for range batch {
			logToolCall(chained, p, call, "127.0.0.1")
		}
		tChained += time.Since(mid)
		tPlain += mid.Sub(start)
		n += batch
	}
	b.ReportMetric(float64(tPlain.Nanoseconds())/float64(n), "plain-ns/call")
	b.ReportMetric(float64(tChained.Nanoseconds())/float64(n), "chained-ns/call")
	b.ReportMetric(float64(tChained-tPlain)/float64(n), "added-ns/call")
	b.ReportMetric(float64(tChained)/float64(tPlain), "ratio")
	b.ReportMetric(0, "ns/op") // an op is a batch of each: the metrics above are per call
}

// A second writer of the same file (another caddy process) is refused
// rather than forking the chain.
func TestAuditWriterRefusesASecondProcess(t *testing.T) {
	t.Setenv("AUDIT_KEY_A", seedOf(1))
	path := filepath.Join(t.TempDir(), "audit.log")
	release, err := lockAuditFile(path) // what the other process holds
	if err != nil {
		t.Fatal(err)
	}
	w := provisionedAuditWriter(t, AuditWriter{Filename: path, SigningKey: "{env.AUDIT_KEY_A}"})
	h, err := w.OpenWriter()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.Write([]byte(`{"msg":"x"}` + "\n")); err == nil || !strings.Contains(err.Error(), "another process writes the audit log") {
		t.Fatalf("write while another process holds the file: %v", err)
	}
	release()
	if _, err := h.Write([]byte(`{"msg":"x"}` + "\n")); err != nil {
		t.Fatal(err)
	}
	if err := w.Cleanup(); err != nil {
		t.Fatal(err)
	}
	if _, err := auditchain.Verify([]auditchain.Source{auditchain.FileSource(path)}, auditchain.Options{Keys: []ed25519.PublicKey{publicOf(t, seedOf(1))}}); err != nil {
		t.Fatal(err)
	}
	if _, err := lockAuditFile(path); err != nil {
		t.Fatalf("the lock outlives the writer: %v", err)
	}
}

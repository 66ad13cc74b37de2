package e2e

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Bounds of the audit chain test.
const (
	// auditRefusals is how many refused requests the test sends to fill
	// more than one 1 MiB file of the audit log, so that it rotates.
	auditRefusals = 4000
	// auditEventTimeout bounds the wait for a record to reach the file.
	auditEventTimeout = 15 * time.Second
)

func auditChainCaddyfile(site, upstream, file, keyVar string) string {
	up := strings.TrimSuffix(strings.TrimPrefix(upstream, "http://"), "/mcp")
	return fmt.Sprintf(`{
	admin %s
	log audit {
		include http.handlers.zidane_mcp.audit
		output zidane_audit {
			file %s
			checkpoint_every 1s
			signing_key {env.%s}
			roll_size 1MiB
			roll_keep 20
		}
		format json
	}
}

http://%s {
	zidane_mcp {
		guard
		rate_limit {
			per_ip 100000/s 100000
		}
	}
	reverse_proxy %s
}
`, AdminPlaceholder, file, keyVar, site, up)
}

// waitForAuditRecord waits until the audit file holds a line with substr.
func waitForAuditRecord(t *testing.T, path, substr string) {
	t.Helper()
	deadline := time.Now().Add(auditEventTimeout)
	for {
		b, _ := os.ReadFile(path)
		if bytes.Contains(b, []byte(substr)) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the audit log %s holds no %s within %s:\n%s", path, substr, auditEventTimeout, tail(string(b), 4096))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestAuditChain runs caddy with the zidane_audit log writer: refusals
// enough to rotate the file, tool calls, an interval checkpoint, a reload
// to another signing key, a restart, and a crash (SIGKILL, the last record
// then cut short) that the next start recovers. `caddy zidane audit verify`
// passes the whole log, across its rotated (gzip) files, against the
// checkpoint caddy keeps in its storage, and catches a deleted line, an
// edited field, two swapped lines and a cut-short stop checkpoint, each
// with the file, the line and the seq.
func TestAuditChain(t *testing.T) {
	upstream := startEverythingServer(t)
	site := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	dir := t.TempDir()
	auditPath := filepath.Join(dir, "audit.log")
	keyA := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{0xa1}, 32))
	keyB := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{0xb2}, 32))
	c := startCaddy(t, auditChainCaddyfile(site, upstream, auditPath, "E2E_AUDIT_KEY_A"), "E2E_AUDIT_KEY_A="+keyA, "E2E_AUDIT_KEY_B="+keyB)
	url := "http://" + site + "/mcp"

	// Refusals (no token) until the log rotates.
	for i := range auditRefusals {
		resp, err := shortClient.Post(url, "application/json", strings.NewReader(initializeBody))
		if err != nil {
			t.Fatalf("refusal %d: %v", i, err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("refusal %d: %s, want 401", i, resp.Status)
		}
	}
	token := createToken(t, c, "auditor", "--scope", "mcp")
	callTools := func(n int) {
		t.Helper()
		cs, err := connectGo(t, url, bearerClient(token, nil))
		if err != nil {
			t.Fatalf("connect: %v", err)
		}
		defer cs.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		for range n {
			if _, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "test_simple_text"}); err != nil {
				t.Fatalf("tool call: %v", err)
			}
		}
	}
	callTools(3)
	waitForAuditRecord(t, auditPath, `"reason":"interval"`)

	// A reload to another key: a checkpoint with the old key hands over.
	c.Reload(t, auditChainCaddyfile(site, upstream, auditPath, "E2E_AUDIT_KEY_B"))
	waitForAuditRecord(t, auditPath, `"reason":"reload"`)
	callTools(2)
	// A restart goes on with the chain.
	c.Restart(t)
	callTools(2)

	pubA, stderr, err := c.Run(t, "zidane", "audit", "public-key", "--env", "E2E_AUDIT_KEY_A")
	if err != nil {
		t.Fatalf("audit public-key: %v\n%s", err, stderr)
	}
	pubB, _, err := c.Run(t, "zidane", "audit", "public-key", "--env", "E2E_AUDIT_KEY_B")
	if err != nil {
		t.Fatal(err)
	}
	pubAFile := filepath.Join(t.TempDir(), "audit-a.pub")
	if err := os.WriteFile(pubAFile, []byte(pubA), 0o600); err != nil {
		t.Fatal(err)
	}
	var files []string
	verify := func(files ...string) (string, error) {
		args := append([]string{"zidane", "audit", "verify", "--public-key", pubAFile, "--public-key", strings.TrimSpace(pubB)}, files...)
		stdout, stderr, err := c.Run(t, args...)
		return stdout + stderr, err
	}
	logFiles := func() []string {
		t.Helper()
		files, _ := filepath.Glob(filepath.Join(dir, "audit*.log*"))
		if len(files) < 2 || !slices.ContainsFunc(files, func(f string) bool { return strings.HasSuffix(f, ".gz") }) {
			t.Fatalf("the audit log did not rotate into a compressed file: %v", files)
		}
		return files
	}

	// A crash: SIGKILL, and then the last record cut short, as a crash in
	// the middle of its write leaves it.
	c.proc.cmd.Process.Kill()
	<-c.proc.done
	files = logFiles()
	if out, err := verify(files...); err != nil || !strings.Contains(out, "stopped without one (a crash, a kill)") || !strings.Contains(out, "The log holds the latest checkpoint kept outside it") {
		t.Fatalf("verify after a crash: %v\n%s", err, out)
	}
	crashed := []byte(readFile(t, auditPath))
	if err := os.WriteFile(auditPath, crashed[:len(crashed)-25], 0o600); err != nil {
		t.Fatal(err)
	}
	// A crash cuts short a record after the kept checkpoint (truncated);
	// when the cut-short record is that checkpoint, the log fails as cut.
	if out, err := verify(files...); err == nil || !(strings.Contains(out, "FAILED (truncated)") && strings.Contains(out, "cut short") || strings.Contains(out, "FAILED (cut)") && strings.Contains(out, "cut in the middle of a line")) {
		t.Fatalf("verify of a record cut short: %v\n%s", err, out)
	}
	// The restart terminates the cut-short record and acknowledges it.
	c.start(t)
	callTools(1)
	c.Stop(t)
	files = logFiles()
	if out, err := verify(files...); err != nil || !strings.Contains(out, "a record cut short by a crash or a failed write, which the checkpoint after it acknowledges") {
		t.Fatalf("verify after the restart that recovered the cut-short record: %v\n%s", err, out)
	}

	t.Run("the real log verifies", func(t *testing.T) {
		slices.Reverse(files) // any order: verify puts them in order
		out, err := verify(files...)
		if err != nil {
			t.Fatalf("verify: %v\n%s", err, out)
		}
		for _, want := range []string{"OK: ", fmt.Sprintf("in %d file(s)", len(files)), "The log holds the latest checkpoint kept outside it"} {
			if !strings.Contains(out, want) {
				t.Errorf("verify does not say %q:\n%s", want, out)
			}
		}
		current, _ := os.ReadFile(auditPath)
		for _, want := range []string{`"reason":"start"`, `"reason":"interval"`, `"reason":"reload"`, `"reason":"stop"`, `"event":"tool_call"`} {
			if !bytes.Contains(current, []byte(want)) {
				t.Errorf("the current audit file holds no %s", want)
			}
		}
		for _, secret := range []string{keyA, keyB, token} {
			if bytes.Contains(current, []byte(secret)) || strings.Contains(c.Logs(), secret) {
				t.Errorf("a secret is in the audit log or caddy's log")
			}
		}
		if !strings.Contains(c.Logs(), `"reason":"stop"`) && !bytes.Contains(current, []byte(`"reason":"stop"`)) {
			t.Error("no stop checkpoint")
		}
	})
	t.Run("verify needs the new key", func(t *testing.T) {
		stdout, stderr, err := c.Run(t, append([]string{"zidane", "audit", "verify", "--public-key", pubAFile}, files...)...)
		if err == nil || !strings.Contains(stdout+stderr, "which no --public-key given is") {
			t.Fatalf("verify with the old key only: %v\n%s%s", err, stdout, stderr)
		}
	})

	// The tampering cases change a copy of the current file, next to the
	// rotated ones.
	lines := strings.SplitAfter(readFile(t, auditPath), "\n")
	first := slices.IndexFunc(lines, func(l string) bool { return strings.Contains(l, `"event":"tool_call"`) })
	if first < 0 || first+2 >= len(lines) || !strings.Contains(lines[first+1], `"event":"tool_call"`) {
		t.Fatalf("no two tool_call records in a row in %s", auditPath)
	}
	seqOf := func(l string) int {
		var r struct{ Seq int }
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			t.Fatal(err)
		}
		return r.Seq
	}
	seq := seqOf(lines[first])
	rotated := slices.DeleteFunc(slices.Clone(files), func(f string) bool { return f == auditPath })
	tampered := func(t *testing.T, change func([]string) []string) (string, string, error) {
		t.Helper()
		p := filepath.Join(t.TempDir(), "audit.log")
		if err := os.WriteFile(p, []byte(strings.Join(change(slices.Clone(lines)), "")), 0o600); err != nil {
			t.Fatal(err)
		}
		out, err := verify(append(slices.Clone(rotated), p)...)
		if err == nil {
			t.Fatalf("verify passed a tampered log:\n%s", out)
		}
		return p, out, err
	}
	wantSays := func(t *testing.T, out string, want ...string) {
		t.Helper()
		for _, w := range want {
			if !strings.Contains(out, w) {
				t.Errorf("verify does not say %q:\n%s", w, out)
			}
		}
	}
	t.Run("a deleted line", func(t *testing.T) {
		p, out, _ := tampered(t, func(l []string) []string { return slices.Delete(l, first, first+1) })
		wantSays(t, out, fmt.Sprintf("%s:%d: seq %d:", p, first+1, seq+1), fmt.Sprintf("seq %d was removed", seq), "FAILED (removed)")
	})
	t.Run("an edited field", func(t *testing.T) {
		p, out, _ := tampered(t, func(l []string) []string {
			l[first] = strings.Replace(l[first], `"token_name":"auditor"`, `"token_name":"someone"`, 1)
			return l
		})
		wantSays(t, out, fmt.Sprintf("%s:%d: seq %d:", p, first+1, seq), "was changed", "FAILED (changed)")
	})
	t.Run("two swapped lines", func(t *testing.T) {
		p, out, _ := tampered(t, func(l []string) []string {
			l[first], l[first+1] = l[first+1], l[first]
			return l
		})
		wantSays(t, out, fmt.Sprintf("%s:%d: seq %d:", p, first+1, seq+1), "out of order", fmt.Sprintf("seq %d is later, at %s:%d", seq, p, first+2), "FAILED (reordered)")
	})
	t.Run("a cut-short last line", func(t *testing.T) {
		// The last line is the stop checkpoint, which caddy kept outside
		// the log: cut short, it is a cut.
		p, out, _ := tampered(t, func(l []string) []string {
			l = l[:len(l)-1] // the "" after the last newline
			l[len(l)-1] = l[len(l)-1][:50]
			return l
		})
		wantSays(t, out, fmt.Sprintf("%s:%d:", p, len(lines)-1), "cut in the middle of a line", "FAILED (cut)", fmt.Sprintf("expected seq %d next", seqOf(lines[len(lines)-2])))
	})
	t.Run("the rotated files not given", func(t *testing.T) {
		out, err := verify(auditPath)
		if err == nil || !strings.Contains(out, "FAILED (start)") || !strings.Contains(out, "--partial") {
			t.Fatalf("verify of the current file alone: %v\n%s", err, out)
		}
		out, err = verify("--partial", auditPath)
		if err != nil || !strings.Contains(out, "the chain begins at seq") {
			t.Fatalf("verify --partial of the current file alone: %v\n%s", err, out)
		}
	})
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

package e2e

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// auditLine is what the cut tests read of a record of the audit log.
type auditLine struct {
	Seq        uint64 `json:"seq"`
	Checkpoint *struct {
		Reason string `json:"reason"`
	} `json:"checkpoint"`
	Event string `json:"event"`
}

// auditRecords reads the records of the audit file at path, each with the
// byte offset just past its line.
func auditRecords(t *testing.T, path string) (recs []auditLine, ends []int) {
	t.Helper()
	b := []byte(readFile(t, path))
	off := 0
	for len(b) > 0 {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			t.Fatalf("%s ends with a line cut short", path)
		}
		var r auditLine
		if err := json.Unmarshal(b[:i], &r); err != nil || r.Seq == 0 {
			t.Fatalf("%s: not an audit record at byte %d: %q", path, off, b[:i])
		}
		off += i + 1
		recs, ends = append(recs, r), append(ends, off)
		b = b[i+1:]
	}
	return recs, ends
}

// sendRefusals sends n requests without a token to url: n refused audit
// records.
func sendRefusals(t *testing.T, url string, n int) {
	t.Helper()
	for i := range n {
		resp, err := shortClient.Post(url, "application/json", strings.NewReader(initializeBody))
		if err != nil {
			t.Fatalf("refusal %d: %v", i, err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("refusal %d: %s, want 401", i, resp.Status)
		}
	}
}

// TestAuditCutsAreCaught is the attack on a zidane_audit log by someone who
// can write its file (an agent whose session runs in its directory): cut
// the log short at a point where it still verifies on its own. Caddy keeps
// its latest checkpoint in its storage as well, and `audit verify` compares
// the log with it: a log cut right after an earlier run's stop checkpoint
// (the whole later run gone), right after an earlier checkpoint, after a
// plain record mid-file, or in the middle of a line, each fails with
// FAILED (cut) and the seq that was expected next; the log as caddy left
// it verifies, with caddy stopped (the storage read directly) and running
// (through its admin API). The copy kept with checkpoint_copy serves as
// well (--anchor), and a run that writes on after a cut says so in its
// start checkpoint, so the log still fails.
func TestAuditCutsAreCaught(t *testing.T) {
	upstream := startEverythingServer(t)
	site := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	dir := t.TempDir()
	auditPath := filepath.Join(dir, "audit.log")
	copyPath := filepath.Join(t.TempDir(), "elsewhere", "audit.checkpoint")
	key := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{0xc3}, 32))
	config := strings.Replace(auditChainCaddyfile(site, upstream, auditPath, "E2E_AUDIT_KEY"), "\t\t\tcheckpoint_every 1s\n", "\t\t\tcheckpoint_every 1s\n\t\t\tcheckpoint_copy "+copyPath+"\n", 1)
	c := startCaddy(t, config, "E2E_AUDIT_KEY="+key)
	url := "http://" + site + "/mcp"

	// Run 1 ends with its stop checkpoint; run 2 writes on after it, with
	// interval checkpoints, and stops too.
	sendRefusals(t, url, 5)
	c.Stop(t)
	recs, _ := auditRecords(t, auditPath)
	oldStop := len(recs) - 1
	if cp := recs[oldStop].Checkpoint; cp == nil || cp.Reason != "stop" {
		t.Fatalf("run 1 does not end with a stop checkpoint: %+v", recs[oldStop])
	}
	c.start(t)
	sendRefusals(t, url, 5)
	waitForLastCheckpoint(t, auditPath, "interval")
	sendRefusals(t, url, 5)
	c.Stop(t)
	recs, ends := auditRecords(t, auditPath)
	if cp := recs[len(recs)-1].Checkpoint; cp == nil || cp.Reason != "stop" {
		t.Fatalf("run 2 does not end with a stop checkpoint: %+v", recs[len(recs)-1])
	}
	interval, plain := -1, -1
	for i := oldStop + 1; i < len(recs); i++ {
		if cp := recs[i].Checkpoint; cp != nil && cp.Reason == "interval" {
			interval = i
		}
	}
	for i := interval + 1; i < len(recs)-1; i++ {
		if recs[i].Checkpoint == nil && recs[i+1].Checkpoint == nil {
			plain = i
			break
		}
	}
	if interval < 0 || plain < 0 {
		t.Fatalf("run 2 holds no interval checkpoint followed by two plain records: %+v", recs[oldStop+1:])
	}

	pub, stderr, err := c.Run(t, "zidane", "audit", "public-key", "--env", "E2E_AUDIT_KEY")
	if err != nil {
		t.Fatalf("audit public-key: %v\n%s", err, stderr)
	}
	pub = strings.TrimSpace(pub)
	verify := func(args ...string) (string, error) {
		stdout, stderr, err := c.Run(t, append([]string{"zidane", "audit", "verify", "--public-key", pub}, args...)...)
		return stdout + stderr, err
	}
	whole := []byte(readFile(t, auditPath))
	cutCopy := func(t *testing.T, n int) string {
		t.Helper()
		p := filepath.Join(t.TempDir(), "audit.log")
		if err := os.WriteFile(p, whole[:n], 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}

	out, err := verify(auditPath)
	if err != nil || !strings.Contains(out, "OK: ") || !strings.Contains(out, "The log holds the latest checkpoint kept outside it") {
		t.Fatalf("verify of the log as caddy left it: %v\n%s", err, out)
	}
	t.Logf("verify of the log as caddy left it:\n%s", out)
	cuts := []struct {
		name   string
		at     int    // bytes kept
		expect uint64 // the seq verify must name as expected
	}{
		{"right after the stop checkpoint of an earlier run", ends[oldStop], recs[oldStop].Seq + 1},
		{"right after an interval checkpoint", ends[interval], recs[interval].Seq + 1},
		{"after a plain record mid-file", ends[plain], recs[plain].Seq + 1},
		{"in the middle of a line", ends[plain] + 20, recs[plain].Seq + 1},
	}
	for _, cut := range cuts {
		t.Run(cut.name, func(t *testing.T) {
			out, err := verify(cutCopy(t, cut.at))
			if err == nil {
				t.Fatalf("verify passed a log cut %s:\n%s", cut.name, out)
			}
			t.Logf("verify of the log cut %s:\n%s", cut.name, out)
			for _, want := range []string{"FAILED (cut)", fmt.Sprintf("expected seq %d", cut.expect)} {
				if !strings.Contains(out, want) {
					t.Errorf("verify does not say %q:\n%s", want, out)
				}
			}
			if strings.Contains(out, "ends with the checkpoint caddy writes when it stops") {
				t.Errorf("verify presents a stop checkpoint as proof:\n%s", out)
			}
		})
	}

	// With caddy running, verify reads the checkpoint through its admin
	// API; run 3's interval checkpoint is the one kept now.
	c.start(t)
	sendRefusals(t, url, 2)
	waitForLastCheckpoint(t, auditPath, "interval")
	t.Run("caddy running, cut after the old stop", func(t *testing.T) {
		out, err := verify(cutCopy(t, ends[oldStop]))
		if err == nil || !strings.Contains(out, "FAILED (cut)") || !strings.Contains(out, fmt.Sprintf("expected seq %d", recs[oldStop].Seq+1)) {
			t.Fatalf("verify through the admin API of a log cut after the old stop: %v\n%s", err, out)
		}
	})
	t.Run("caddy running, the log as it is", func(t *testing.T) {
		if out, err := verify(auditPath); err != nil || !strings.Contains(out, "OK: ") {
			t.Fatalf("verify of the running log: %v\n%s", err, out)
		}
	})
	c.Stop(t)

	// The copy the writer keeps in another directory (checkpoint_copy)
	// is the stop checkpoint, and verify --anchor compares with it.
	t.Run("checkpoint_copy", func(t *testing.T) {
		lines := strings.SplitAfter(strings.TrimSuffix(readFile(t, auditPath), "\n"), "\n")
		if got := readFile(t, copyPath); got != lines[len(lines)-1]+"\n" {
			t.Fatalf("the copy holds %q, want the log's last line, its stop checkpoint %q", got, lines[len(lines)-1])
		}
		if out, err := verify("--anchor", copyPath, auditPath); err != nil || !strings.Contains(out, "The log holds the latest checkpoint kept outside it ("+copyPath+")") {
			t.Fatalf("verify --anchor of the log: %v\n%s", err, out)
		}
		out, err := verify("--anchor", copyPath, cutCopy(t, ends[oldStop]))
		if err == nil || !strings.Contains(out, "FAILED (cut)") || !strings.Contains(out, fmt.Sprintf("expected seq %d next", recs[oldStop].Seq+1)) {
			t.Fatalf("verify --anchor of a log cut after the old stop: %v\n%s", err, out)
		}
	})

	// Cut while caddy is stopped, then written on by the next run: that
	// run's start checkpoint says the log was found cut, signed, and the
	// log fails however long it goes on.
	t.Run("written on after a cut", func(t *testing.T) {
		if err := os.WriteFile(auditPath, whole[:ends[oldStop]], 0o600); err != nil {
			t.Fatal(err)
		}
		c.start(t)
		sendRefusals(t, url, 2)
		c.Stop(t)
		out, err := verify(auditPath)
		if err == nil || !strings.Contains(out, "FAILED (cut)") || !strings.Contains(out, "caddy found the log cut") || !strings.Contains(out, fmt.Sprintf("expected seq %d to", recs[oldStop].Seq+1)) {
			t.Fatalf("verify of the log written on after a cut: %v\n%s", err, out)
		}
	})
}

// waitForLastCheckpoint waits until the last record of the audit file at
// path is a checkpoint for reason; with nothing more to log, caddy then
// writes nothing until it stops.
func waitForLastCheckpoint(t *testing.T, path, reason string) {
	t.Helper()
	deadline := time.Now().Add(auditEventTimeout)
	for {
		b, _ := os.ReadFile(path)
		lines := bytes.Split(bytes.TrimRight(b, "\n"), []byte("\n"))
		var last auditLine
		if len(b) > 0 && b[len(b)-1] == '\n' && json.Unmarshal(lines[len(lines)-1], &last) == nil && last.Checkpoint != nil && last.Checkpoint.Reason == reason {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the audit log %s does not end with a %s checkpoint within %s:\n%s", path, reason, auditEventTimeout, tail(string(b), 4096))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

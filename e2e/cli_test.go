package e2e

import (
	"encoding/base64"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestCLIHelp: `caddy zidane --help` says what the command manages and
// lists every command an operator runs; the commands only the gateway runs
// (confine, which launches each agent, and demo-agent) are left out of it
// and still run.
func TestCLIHelp(t *testing.T) {
	c := newCaddy(t, "{\n\tadmin {{ADMIN}}\n}\n")
	out, stderr, err := c.Run(t, "zidane", "--help")
	if err != nil {
		t.Fatalf("zidane --help: %v\n%s", err, stderr)
	}
	_, listed, _ := strings.Cut(out, "Available Commands:")
	listed, _, _ = strings.Cut(listed, "Flags:")
	for _, sub := range []string{"token", "upstream", "tools", "login", "logout", "audit", "signin-link"} {
		if !strings.Contains(listed, "\n  "+sub+" ") {
			t.Errorf("zidane --help does not list %s:\n%s", sub, out)
		}
	}
	for _, internal := range []string{"confine", "demo-agent"} {
		if strings.Contains(out, internal) {
			t.Errorf("zidane --help shows the internal command %s:\n%s", internal, out)
		}
	}
	if !strings.Contains(out, "audit log") || !strings.Contains(out, "--json") {
		t.Errorf("zidane --help does not say what the command manages, nor how scripts read it:\n%s", out)
	}

	out, stderr, err = c.Run(t, "zidane", "confine", "--best-effort", "--", "/bin/echo", "ran confined")
	if err != nil || strings.TrimSpace(out) != "ran confined" {
		t.Errorf("zidane confine: %v %q\n%s", err, out, stderr)
	}
	if out, stderr, err = c.Run(t, "zidane", "demo-agent", "--help"); err != nil || !strings.Contains(out, "demo agent") {
		t.Errorf("zidane demo-agent --help: %v\n%s%s", err, out, stderr)
	}
}

// TestCLIPlainOutput: what `caddy zidane` says to a person is plain text,
// not Caddy's JSON log lines: audit verify's verdict on stdout with exit
// status 1, and a command's error as one line on stderr that names the
// command.
func TestCLIPlainOutput(t *testing.T) {
	c := newCaddy(t, "{\n\tadmin {{ADMIN}}\n}\n")
	notALog := filepath.Join(c.Dir, "not-an-audit.log")
	if err := os.WriteFile(notALog, []byte(`{"hello":"world"}`+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	key := base64.StdEncoding.EncodeToString(make([]byte, 32))

	out, stderr, err := c.Run(t, "zidane", "audit", "verify", "--no-anchor", "--public-key", key, notALog)
	if code := exitCode(err); code != 1 || !strings.HasPrefix(out, "FAILED (") || !strings.Contains(out, notALog+":1:") || stderr != "" {
		t.Errorf("audit verify of a file that is no audit log: exit %d, stdout %q, stderr %q; want exit 1, a FAILED line naming FILE:LINE on stdout, nothing on stderr", code, out, stderr)
	}

	out, stderr, err = c.Run(t, "zidane", "audit", "verify", "--public-key", filepath.Join(c.Dir, "missing.pub"), notALog)
	want := "caddy zidane audit verify: --public-key "
	if code := exitCode(err); code != 1 || out != "" || !strings.HasPrefix(stderr, want) || strings.Count(stderr, "\n") != 1 {
		t.Errorf("audit verify with a key file that does not exist: exit %d, stdout %q, stderr %q; want exit 1 and one line on stderr starting %q", code, out, stderr, want)
	}
}

// exitCode is the exit status of a command that ran, 0 on success.
func exitCode(err error) int {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	if err != nil {
		return -1
	}
	return 0
}

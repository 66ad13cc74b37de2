package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"sync"
	"testing"
	"time"
)

// The Tasks extension of MCP 2026-07-28 (SEP-2663) through every route:
// e2e/tasksserver is the upstream (go-sdk has no Tasks), the conformance
// suite's tasks-* scenarios are the client.

// tasksScenarios are the conformance suite's scenarios of the Tasks
// extension (0.2.0-alpha.12). tasks-status-notifications checks nothing
// yet (the suite skips it, pending a rewrite onto subscriptions/listen).
var tasksScenarios = []string{
	"tasks-lifecycle",
	"tasks-capability-negotiation",
	"tasks-wire-fields",
	"tasks-request-state-removal",
	"tasks-mrtr-input",
	"tasks-request-headers",
	"tasks-dispatch-and-envelope",
	"tasks-status-notifications",
	"tasks-required-task-error",
	"tasks-mrtr-composition",
}

var (
	tasksServerOnce sync.Once
	tasksServerBin  string
	tasksServerErr  error
)

// startTasksServer runs e2e/tasksserver (built once per run) on a free
// loopback port and returns its MCP endpoint URL. Cleanup stops it.
func startTasksServer(t testing.TB, flags ...string) (url string) {
	t.Helper()
	tasksServerOnce.Do(func() {
		dir, err := os.MkdirTemp("", "zidane-e2e-tasksserver-")
		if err != nil {
			tasksServerErr = err
			return
		}
		tasksServerBin = filepath.Join(dir, "tasksserver")
		tasksServerErr = goBuild(tasksServerBin, "./e2e/tasksserver")
	})
	if tasksServerErr != nil {
		t.Fatalf("building e2e/tasksserver: %v", tasksServerErr)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	cmd := exec.Command(tasksServerBin, append([]string{"-http", addr}, flags...)...)
	cmd.Dir = t.TempDir()
	p := startProcess(t, "tasksserver", cmd, filepath.Join(cmd.Dir, "tasksserver.log"))
	t.Cleanup(func() {
		p.stop(2 * time.Second)
		p.dumpIfFailed(t)
	})
	waitListening(t, p, addr, startTimeout)
	return "http://" + addr + "/mcp"
}

// scenarioResult is one scenario's line of the suite's summary.
type scenarioResult struct{ passed, failed int }

var scenarioLine = regexp.MustCompile(`(?m)^([✓✗]) ([a-z0-9/_-]+): (\d+) passed, (\d+) failed`)

// runRequirements runs the 0.2.0 conformance suite's server scenarios that
// MCP 2026-07-28 requires (`--requirements 2026-07-28`, which also runs
// the extensions, unscored) against url, and returns each scenario's
// result and the suite's output.
func runRequirements(t testing.TB, url string) (map[string]scenarioResult, string) {
	t.Helper()
	script := filepath.Join(nodeModules(t), "@modelcontextprotocol", "conformance-next", "dist", "index.js")
	if _, err := os.Stat(script); err != nil {
		requireOrSkip(t, "the conformance suite 0.2.0 (conformance-next) is not installed: %v", err)
	}
	outDir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), conformanceTimeout)
	defer cancel()
	output, err := runNodeIn(ctx, t, outDir, script, "server", "--url", url, "--requirements", "2026-07-28", "-o", outDir)
	output = ansiEscape.ReplaceAllString(output, "")
	results := map[string]scenarioResult{}
	for _, m := range scenarioLine.FindAllStringSubmatch(output, -1) {
		passed, _ := strconv.Atoi(m[3])
		failed, _ := strconv.Atoi(m[4])
		results[m[2]] = scenarioResult{passed, failed}
	}
	if len(results) == 0 {
		t.Fatalf("conformance server --url %s --requirements 2026-07-28: no scenario line (%v)\n%s", url, err, tail(output, logDumpLimit))
	}
	return results, output
}

// TestTasksServerDirect: e2e/tasksserver passes every tasks-* scenario of
// the suite on its own, so that a route that fails one broke it.
func TestTasksServerDirect(t *testing.T) {
	results, out := runRequirements(t, startTasksServer(t))
	checks := 0
	for _, s := range tasksScenarios {
		r, ok := results[s]
		if !ok || r.failed != 0 {
			t.Errorf("%s direct: %+v (ran: %v)", s, r, ok)
		}
		checks += r.passed
	}
	if t.Failed() {
		t.Fatalf("suite output:\n%s", tail(out, 8000))
	}
	t.Logf("tasks-* direct against e2e/tasksserver: %d scenarios, %d checks passed, 0 failed", len(tasksScenarios), checks)
}

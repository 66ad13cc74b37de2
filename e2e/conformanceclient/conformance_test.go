package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestConformanceSuite runs every client scenario of the MCP conformance
// suite against this program (the broker's upstream client with
// upstreamauth) and requires all of them to pass, without warnings.
//
// It runs with ZIDANE_E2E=1, ZIDANE_NODE (a Node 22 binary) and
// ZIDANE_E2E_NODE_MODULES (the node_modules holding
// @modelcontextprotocol/conformance).
func TestConformanceSuite(t *testing.T) {
	if os.Getenv("ZIDANE_E2E") != "1" {
		t.Skip("set ZIDANE_E2E=1 (with ZIDANE_NODE and ZIDANE_E2E_NODE_MODULES) to run the MCP conformance suite")
	}
	node := os.Getenv("ZIDANE_NODE")
	modules := os.Getenv("ZIDANE_E2E_NODE_MODULES")
	if node == "" || modules == "" {
		t.Fatal("ZIDANE_E2E=1 needs ZIDANE_NODE (a Node 22 binary) and ZIDANE_E2E_NODE_MODULES (node_modules with @modelcontextprotocol/conformance)")
	}
	suite := filepath.Join(modules, "@modelcontextprotocol", "conformance", "dist", "index.js")
	if _, err := os.Stat(suite); err != nil {
		t.Fatalf("the conformance suite is not installed: %v", err)
	}

	// The suite splits its --command on spaces: build into a directory
	// without any.
	dir, err := os.MkdirTemp("", "zidane-conformance")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	bin := filepath.Join(dir, "conformanceclient")
	if strings.ContainsAny(bin, " \t") {
		t.Fatalf("temporary path %q holds a space; set TMPDIR", bin)
	}
	gobin := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(gobin); err != nil {
		gobin = "go"
	}
	build := exec.Command(gobin, "build", "-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, suite, "client", "--command", bin, "--suite", "all", "-o", filepath.Join(dir, "results"))
	cmd.Dir = dir
	cmd.WaitDelay = 10 * time.Second
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	runErr := cmd.Run()
	out := stdout.String()

	total := regexp.MustCompile(`(?m)^Total: (\d+) passed, (\d+) failed(?:, (\d+) warnings)?$`).FindStringSubmatch(out)
	if total == nil {
		t.Fatalf("no Total line in the suite's output (exit: %v)\nstdout:\n%s\nstderr (tail):\n%s", runErr, out, tail(stderr.String(), 4000))
	}
	t.Log(total[0])
	passed, _ := strconv.Atoi(total[1])
	failed, _ := strconv.Atoi(total[2])
	warnings, _ := strconv.Atoi(total[3])
	var bad []string
	scenarios := 0
	for _, line := range strings.Split(out, "\n") {
		switch {
		case strings.HasPrefix(line, "✓ "):
			scenarios++
		case strings.HasPrefix(line, "✗ "):
			scenarios++
			bad = append(bad, line)
		}
	}
	if failed != 0 || warnings != 0 || len(bad) > 0 || runErr != nil {
		t.Errorf("conformance: %d failed, %d warnings (exit: %v); scenarios not passed:\n%s\n\nsuite output:\n%s", failed, warnings, runErr, strings.Join(bad, "\n"), out)
	}
	// A suite that ran nothing, or scenarios that checked nothing, is not
	// a pass.
	if scenarios < 20 || passed < 5*scenarios {
		t.Errorf("the suite ran %d scenarios with %d passed checks; expected every client scenario (26 in 0.1.16) with their checks\n%s", scenarios, passed, out)
	}
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[len(s)-n:]
}

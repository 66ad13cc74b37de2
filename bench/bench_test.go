package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"
)

// TestSmoke runs the harness in its short mode so that it cannot rot: every
// route must answer every call and appear in the table. It asserts no timing.
func TestSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("builds caddy and drives real MCP sessions")
	}
	cfg, err := parseFlags([]string{"-smoke"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var out bytes.Buffer
	if err := run(ctx, cfg, &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	table := out.String()
	for _, want := range []string{"direct", "reverse_proxy", "guard+reverse_proxy", "vs reverse_proxy"} {
		if !strings.Contains(table, want) {
			t.Errorf("table lacks %q:\n%s", want, table)
		}
	}
	t.Logf("\n%s", table)
}

func TestFlags(t *testing.T) {
	for _, bad := range [][]string{{"-concurrency", "0"}, {"-concurrency", "x"}, {"-tool", "nope"}, {"-calls", "0"}} {
		if _, err := parseFlags(bad); err == nil {
			t.Errorf("parseFlags(%v) accepted", bad)
		}
	}
	cfg, err := parseFlags([]string{"-concurrency", "2,4", "-peer", "http://127.0.0.1:1/mcp", "-peer", "http://127.0.0.1:2/mcp"})
	if err != nil || len(cfg.concurrency) != 2 || len(cfg.peers) != 2 {
		t.Fatalf("%+v %v", cfg, err)
	}
}

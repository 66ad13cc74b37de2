package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"
)

// TestSmoke runs the harness in its short mode so that it cannot rot: every
// route must answer every call and appear in the table, and every session of
// the session-engine run must finish with its event delivered to the client
// that created it. It asserts no timing.
func TestSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("builds caddy and drives real MCP sessions")
	}
	// Four agents at most for 20 sessions: creates are refused while four
	// agents live, so the retry path runs too.
	cfg, err := parseFlags([]string{"-smoke", "-max-agents", "4", "-agent-idle", "500ms"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var out bytes.Buffer
	rep, err := run(ctx, cfg, &out)
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	table := out.String()
	s := rep.sessions
	switch {
	case s == nil:
		t.Errorf("the smoke run has no session-engine section")
	case s.created != cfg.sessions || s.createErrors != 0:
		t.Errorf("created %d of %d sessions, %d create errors (first: %s)", s.created, cfg.sessions, s.createErrors, s.firstError)
	case s.finished != s.created:
		t.Errorf("%d of %d sessions finished with an event (%d without one, %d failed, %d not finished)",
			s.finished, s.created, s.finishedRead, s.failed, s.timedOut)
	case s.delivered != s.created || s.misdirected != 0 || s.duplicates != 0:
		t.Errorf("finished events delivered to their creating client: %d, expected %d (%d to another client, %d duplicates)",
			s.delivered, s.created, s.misdirected, s.duplicates)
	case s.readErrors != 0 || len(s.reads) == 0:
		t.Errorf("%d reads, %d read errors", len(s.reads), s.readErrors)
	case s.retries == 0:
		t.Errorf("no create was refused with %d sessions and max_agents %d", s.created, cfg.maxAgents)
	}
	for _, want := range []string{"direct", "reverse_proxy", "guard+reverse_proxy", "broker pass-through", "vs reverse_proxy",
		"session engine", "create→finished", "finished events delivered / expected", "agent processes at peak"} {
		if !strings.Contains(table, want) {
			t.Errorf("table lacks %q:\n%s", want, table)
		}
	}
	t.Logf("\n%s", table)
}

func TestFlags(t *testing.T) {
	for _, bad := range [][]string{{"-concurrency", "0"}, {"-concurrency", "x"}, {"-tool", "nope"}, {"-calls", "0"},
		{"-only", "nope"}, {"-only", "sessions", "-sessions", "0"}, {"-sessions", "-1"}, {"-session-clients", "0"},
		{"-max-agents", "0"}, {"-agent-idle", "0s"}} {
		if _, err := parseFlags(bad); err == nil {
			t.Errorf("parseFlags(%v) accepted", bad)
		}
	}
	cfg, err := parseFlags([]string{"-concurrency", "2,4", "-peer", "http://127.0.0.1:1/mcp", "-peer", "http://127.0.0.1:2/mcp"})
	if err != nil || len(cfg.concurrency) != 2 || len(cfg.peers) != 2 {
		t.Fatalf("%+v %v", cfg, err)
	}
	for _, c := range []struct {
		args               []string
		calls, sessionsRun bool
		sessions           int
	}{
		{nil, true, true, 1000},
		{[]string{"-smoke"}, true, true, 20},
		{[]string{"-smoke", "-sessions", "0"}, true, false, 0},
		{[]string{"-only", "sessions", "-sessions", "300"}, false, true, 300},
		{[]string{"-only", "calls"}, true, false, 1000},
	} {
		cfg, err := parseFlags(c.args)
		if err != nil || cfg.callsOn() != c.calls || cfg.sessionsOn() != c.sessionsRun || cfg.sessions != c.sessions {
			t.Errorf("parseFlags(%v) = calls %v, sessions %v (%d), %v", c.args, cfg.callsOn(), cfg.sessionsOn(), cfg.sessions, err)
		}
	}
}

package taskid

import (
	"bytes"
	"encoding/base64"
	"errors"
	"strings"
	"testing"

	"github.com/Tahul/caddy-zidane-mcp/broker/sessionid"
)

var taskKey = bytes.Repeat([]byte{9}, sessionid.KeySize)

func newTestTaskIDs(t testing.TB) *Sealer {
	t.Helper()
	ids, err := New(taskKey)
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

func TestTaskIDsRoundTrip(t *testing.T) {
	ids := newTestTaskIDs(t)
	for _, c := range []struct{ upstream, task string }{
		{"", "MTNS73FRSZPOUYUS2AV7ZTEWPT"},
		{"github", "786512e2-9e0d-44bd-8f29-789f320fe840"},
		{"tasks2", strings.Repeat("t", MaxUpstream)},
		{"a", "ünïcode and \"quotes\""},
	} {
		h, err := ids.Seal(c.upstream, c.task, "tok_alice", "broker:tasks")
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(h, c.task) || strings.Trim(h, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_") != "" {
			t.Errorf("handle %q shows the upstream's id, or is not base64url", h)
		}
		up, task, err := ids.Open(h, "tok_alice", "broker:tasks")
		if err != nil || up != c.upstream || task != c.task {
			t.Errorf("Open(Seal(%q, %q)) = %q, %q, %v", c.upstream, c.task, up, task, err)
		}
	}
	a, _ := ids.Seal("", "t-1", "tok_alice", "broker:tasks")
	b, _ := ids.Seal("", "t-1", "tok_alice", "broker:tasks")
	if a == b {
		t.Error("sealing one task twice gave the same handle: the nonce is not fresh")
	}
}

// TestTaskIDsAttacks: what another token, another route, or anyone who
// alters or forges a handle gets: ErrUnknown, never a task id.
func TestTaskIDsAttacks(t *testing.T) {
	ids := newTestTaskIDs(t)
	h, err := ids.Seal("tasks", "t-alice", "tok_alice", "aggregate:/mcp")
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := base64.RawURLEncoding.DecodeString(h)
	otherKey, _ := New(bytes.Repeat([]byte{8}, sessionid.KeySize))
	sessions, _ := sessionid.New(taskKey)
	flip := func(i int) string {
		b := bytes.Clone(raw)
		b[i] ^= 1
		return base64.RawURLEncoding.EncodeToString(b)
	}
	for _, c := range []struct {
		name, handle, principal, route string
		ids                            *Sealer
	}{
		{"another token", h, "tok_bob", "aggregate:/mcp", ids},
		{"another route", h, "tok_alice", "broker:tasks", ids},
		{"the boundary of token and route moved", h, "tok_alic", "eaggregate:/mcp", ids},
		{"another key", h, "tok_alice", "aggregate:/mcp", otherKey},
		{"the version byte changed", flip(0), "tok_alice", "aggregate:/mcp", ids},
		{"a bit of the nonce flipped", flip(3), "tok_alice", "aggregate:/mcp", ids},
		{"a bit of the upstream or task flipped", flip(len(raw) / 2), "tok_alice", "aggregate:/mcp", ids},
		{"a bit of the tag flipped", flip(len(raw) - 1), "tok_alice", "aggregate:/mcp", ids},
		{"truncated", h[:len(h)-2], "tok_alice", "aggregate:/mcp", ids},
		{"extended", h + "AA", "tok_alice", "aggregate:/mcp", ids},
		{"not base64url", h[:10] + "+/=" + h[13:], "tok_alice", "aggregate:/mcp", ids},
		{"the upstream's own id", "t-alice", "tok_alice", "aggregate:/mcp", ids},
		{"a session id of the same key", sessions.Seal("t-alice", "tok_alice", "aggregate:/mcp"), "tok_alice", "aggregate:/mcp", ids},
		{"empty", "", "tok_alice", "aggregate:/mcp", ids},
		{"far too long", strings.Repeat("A", 1<<16), "tok_alice", "aggregate:/mcp", ids},
	} {
		up, task, err := c.ids.Open(c.handle, c.principal, c.route)
		if !errors.Is(err, ErrUnknown) || up != "" || task != "" {
			t.Errorf("%s: Open = %q, %q, %v; want ErrUnknownTask", c.name, up, task, err)
		}
		if err != nil && (strings.Contains(err.Error(), "tok_") || strings.Contains(err.Error(), "t-alice")) {
			t.Errorf("%s: the error %q names the token or the task", c.name, err)
		}
	}
	if _, err := ids.Seal("", "", "tok_alice", "r"); err == nil {
		t.Error("an empty upstream task id was sealed")
	}
	if _, err := ids.Seal("", strings.Repeat("t", MaxUpstream+1), "tok_alice", "r"); err == nil {
		t.Error("a task id over MaxUpstreamTaskID was sealed")
	}
}

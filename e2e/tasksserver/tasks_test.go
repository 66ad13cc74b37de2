package main

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/Tahul/caddy-zidane-mcp/message"
)

// waitFor polls cond every 10 ms for at most 5 seconds.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("not within 5s: %s", what)
}

// blocked is work that runs until its task is cancelled or expires.
func blocked(ctx context.Context, _ asker) (*mcp.CallToolResult, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

func TestStoreBounds(t *testing.T) {
	t.Run("no more tasks than max at once", func(t *testing.T) {
		s := newStore(2, time.Hour)
		for range 2 {
			if _, err := s.start(blocked); err != nil {
				t.Fatal(err)
			}
		}
		_, err := s.start(blocked)
		var re *jsonrpc.Error
		if !errors.As(err, &re) || re.Code != message.CodeInternalError {
			t.Fatalf("third task: %v, want a JSON-RPC error that says the limit", err)
		}
	})

	t.Run("a task goes when its ttl has passed, and its work stops", func(t *testing.T) {
		s := newStore(1, 50*time.Millisecond)
		stopped := make(chan struct{})
		task, err := s.start(func(ctx context.Context, _ asker) (*mcp.CallToolResult, error) {
			<-ctx.Done()
			close(stopped)
			return nil, ctx.Err()
		})
		if err != nil {
			t.Fatal(err)
		}
		<-stopped
		waitFor(t, "the expired task is gone", func() bool {
			_, err := s.detailed(task.id)
			return errors.Is(err, errNotFound)
		})
		if _, err := s.start(blocked); err != nil {
			t.Fatalf("a task after the expired one: %v", err)
		}
	})

	t.Run("partial input keeps the task waiting for the rest", func(t *testing.T) {
		s := newStore(1, time.Hour)
		task, err := s.start(func(ctx context.Context, ask asker) (*mcp.CallToolResult, error) {
			_, err := ask(ctx, mcp.InputRequestMap{"a": &mcp.ElicitParams{Message: "a?"}, "b": &mcp.ElicitParams{Message: "b?"}})
			return text("done"), err
		})
		if err != nil {
			t.Fatal(err)
		}
		waitFor(t, "input_required", func() bool {
			d, _ := s.detailed(task.id)
			return d.Status == statusInputRequired
		})
		answer := json.RawMessage(`{"action":"accept","content":{}}`)
		if err := s.update(task.id, map[string]json.RawMessage{"a": answer, "never-asked": answer}); err != nil {
			t.Fatal(err)
		}
		d, _ := s.detailed(task.id)
		if _, ok := d.InputRequests["b"]; d.Status != statusInputRequired || len(d.InputRequests) != 1 || !ok {
			t.Fatalf("after a partial update: %s with %v", d.Status, d.InputRequests)
		}
		if err := s.update(task.id, map[string]json.RawMessage{"b": answer}); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "completed", func() bool {
			d, _ := s.detailed(task.id)
			return d.Status == statusCompleted
		})
	})
}

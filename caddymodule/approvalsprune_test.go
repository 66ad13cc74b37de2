package caddymodule

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"

	"github.com/Tahul/caddy-zidane-mcp/approvals"
)

// The prune timer deletes an expired approval, with the arguments it
// kept, though nothing else is written; a live one stays.
func TestApprovalPrunerDeletesExpired(t *testing.T) {
	st := &certmagic.FileStorage{Path: t.TempDir()}
	ctx := context.Background()
	call := func(owner string) approvals.Call {
		return approvals.Call{Rule: "rule 1", Message: "needs a second person", Site: "https://mcp.example.com/mcp", Route: "guard",
			Method: "tools/call", Tool: "deploy", Owner: owner, Credential: "tok_" + owner, Arguments: []byte(`{"secret":"s3"}`)}
	}
	// An approval held two days ago (its 30 minutes long past), and one
	// held now.
	past, err := approvals.New(approvals.Options{Store: st, Now: func() time.Time { return time.Now().Add(-48 * time.Hour) }})
	if err != nil {
		t.Fatal(err)
	}
	old, err := past.Hold(ctx, call("alice"))
	if err != nil {
		t.Fatal(err)
	}
	now, err := approvals.New(approvals.Options{Store: st})
	if err != nil {
		t.Fatal(err)
	}
	live, err := now.Hold(ctx, call("bob"))
	if err != nil {
		t.Fatal(err)
	}
	key, err := provisionApprovalPruner(st, 10*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := now.Get(ctx, old.ID); errors.Is(err, approvals.ErrUnknown) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the expired approval was never pruned by the timer")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got, err := now.Get(ctx, live.ID); err != nil || got.State != approvals.Pending {
		t.Errorf("the live approval: %+v %v", got, err)
	}
	if deleted, err := approvalPrunePool.Delete(key); !deleted || err != nil {
		t.Errorf("releasing the last hold on the pruner: %v %v", deleted, err)
	}
}

package policy

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"
)

// A token's roots reach its principal, and a child token's roots are its
// parent's or narrower, however it is minted.
func TestTokenRoots(t *testing.T) {
	ctx := context.Background()
	_, s := newFileStore(t)
	secret, parent, err := s.Create(ctx, TokenSpec{Name: "confined", Scopes: []string{"chat"}, Roots: []string{"/srv/work/", "/home/me/code"}})
	if err != nil {
		t.Fatal(err)
	}
	p, err := s.Check(secret, time.Now())
	if err != nil || fmt.Sprint(p.Roots) != "[/srv/work /home/me/code]" {
		t.Fatalf("principal roots = %v (%v), want the token's, cleaned", p.Roots, err)
	}

	for i, tc := range []struct {
		name  string
		roots []string
		want  string // the child's roots, or a part of the refusal
	}{
		{"none asked: the parent's", nil, "[/srv/work /home/me/code]"},
		{"inside one of the parent's", []string{"/srv/work/app"}, "[/srv/work/app]"},
		{"the parent's own", []string{"/home/me/code"}, "[/home/me/code]"},
		{"outside them", []string{"/etc"}, "not inside the parent token's roots (/srv/work, /home/me/code)"},
		{"climbing out", []string{"/srv/work/../../etc"}, "not inside the parent token's roots"},
		{"a sibling sharing a prefix", []string{"/srv/workshop"}, "not inside the parent token's roots"},
		{"one in, one out", []string{"/srv/work/a", "/"}, "root / is not inside"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, child, err := s.CreateChild(ctx, ChildSpec{Parent: parent.Principal(), Session: fmt.Sprintf("ses_%d", i), Purpose: PurposeOrchestrator, Scopes: []string{"sessions:create"}, Roots: tc.roots})
			if strings.HasPrefix(tc.want, "[") {
				if err != nil || fmt.Sprint(child.Roots) != tc.want {
					t.Fatalf("child roots = %v (%v), want %s", child.Roots, err, tc.want)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("child with roots %v: err = %v, want %q", tc.roots, err, tc.want)
			}
		})
	}

	// An unconfined parent's child is unconfined, unless it asks.
	_, free, _ := s.Create(ctx, TokenSpec{Name: "free", Scopes: []string{"chat"}})
	if _, c, err := s.CreateChild(ctx, ChildSpec{Parent: free.Principal(), Session: "ses_free", Purpose: PurposeEgress, Scopes: []string{"upstream:github"}}); err != nil || c.Roots != nil {
		t.Fatalf("child of an unconfined parent: roots %v (%v)", c.Roots, err)
	}
	if err := ValidateSpec(TokenSpec{Name: "rel", Scopes: []string{"chat"}, Roots: []string{"projects"}}); err == nil || !strings.Contains(err.Error(), "absolute path") {
		t.Fatalf("a relative root: %v", err)
	}
}

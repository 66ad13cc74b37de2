package edge

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/caddyserver/certmagic"

	"github.com/Tahul/caddy-zidane-mcp/approvals"
	"github.com/Tahul/caddy-zidane-mcp/policy"
	"github.com/Tahul/caddy-zidane-mcp/policy/rules"
)

const approvalSite = "https://mcp.example.com/mcp"

func approvalRoute(t *testing.T) (*Guard, *Approvals) {
	t.Helper()
	set, err := rules.Compile([]rules.Spec{
		{Effect: rules.Approve, Expr: "tool.name == 'deploy' && args.environment == 'production'", Message: "production deploys need a second person", Where: "site policy, rule 1"},
		{Effect: rules.Deny, Expr: "tool.name == 'deploy' && args.environment == 'moon'", Message: "no deploys to the moon", Where: "site policy, rule 2"},
	})
	if err != nil {
		t.Fatal(err)
	}
	scopes, err := policy.NewScopeMap([]policy.Rule{{Scope: "ops", Tools: []string{"deploy"}}}, true)
	if err != nil {
		t.Fatal(err)
	}
	st, err := approvals.New(approvals.Options{Store: &certmagic.FileStorage{Path: t.TempDir()}})
	if err != nil {
		t.Fatal(err)
	}
	return &Guard{Scopes: scopes, Rules: set}, &Approvals{Store: st, Site: approvalSite}
}

func caller() policy.Principal {
	return policy.Principal{TokenID: "tok_alice", Owner: "alice", Name: "alice", Kind: policy.KindUser, Scopes: []string{"ops"}}
}

var prodDeploy = call("deploy", `{"environment":"production","version":"1.2.3"}`)

// TestApprovalHoldsTheCall: a call an approve rule holds is answered with
// a tool error naming its approval; once approved, the same call runs
// once; every other attempt is refused with a word of why.
func TestApprovalHoldsTheCall(t *testing.T) {
	g, ap := approvalRoute(t)
	ctx := context.Background()
	decide := func(p policy.Principal, body string) Verdict {
		d := Decide(g, p, http.MethodPost, http.Header{}, []byte(body))
		if d.Allowed() || d.Reason != ReasonApproval {
			return d.Verdict
		}
		return ap.Settle(ctx, d)
	}
	v := decide(caller(), prodDeploy)
	if v.Allowed() || !v.ToolError || v.Reason != ReasonApproval || !strings.Contains(v.Message, "apv_") ||
		!strings.Contains(v.Message, "production deploys need a second person") || v.Rule != "site policy, rule 1" {
		t.Fatalf("held: %+v", v)
	}
	id := "apv_" + strings.SplitN(strings.SplitN(v.Message, "apv_", 2)[1], " ", 2)[0]
	id = strings.TrimRight(id, ".,;)")
	a, err := ap.Store.Get(ctx, id)
	if err != nil || a.Site != approvalSite || a.Route != RuleRouteGuard || a.Tool != "deploy" || a.Owner != "alice" || a.Credential != "tok_alice" {
		t.Fatalf("the approval %q: %+v %v", id, a, err)
	}
	if v := decide(caller(), prodDeploy); !v.ToolError || !strings.Contains(v.Message, id) {
		t.Fatalf("the call again, before an answer: %+v", v)
	}
	if v := decide(caller(), call("deploy", `{"environment":"staging"}`)); !v.Allowed() {
		t.Fatalf("a call no approve rule holds: %+v", v)
	}
	if v := decide(caller(), call("deploy", `{"environment":"moon"}`)); v.Reason != ReasonRule {
		t.Fatalf("a deny rule still denies: %+v", v)
	}
	if _, err := ap.Store.Answer(ctx, id, approvals.Answerer{Owner: "bob", Credential: "tok_bob"}, true, func(approvals.Approval) bool { return true }); err != nil {
		t.Fatal(err)
	}
	mallory := caller()
	mallory.Owner, mallory.TokenID = "mallory", "tok_mallory"
	if v := decide(mallory, prodDeploy); v.Allowed() || !strings.Contains(v.Message, "apv_") || strings.Contains(v.Message, id) {
		t.Fatalf("another principal's same call: %+v, want it held on its own approval", v)
	}
	changed := call("deploy", `{"environment":"production","version":"1.2.4"}`)
	if v := decide(caller(), changed); v.Allowed() || strings.Contains(v.Message, id) {
		t.Fatalf("a changed argument: %+v, want it held anew", v)
	}
	if v := decide(caller(), prodDeploy); !v.Allowed() {
		t.Fatalf("the approved call: %+v", v)
	}
	if v := decide(caller(), prodDeploy); v.Allowed() || strings.Contains(v.Message, id) {
		t.Fatalf("the approved call replayed: %+v, want it held anew", v)
	}
}

// TestApprovalRefusals: a denied approval is a clear refusal; a batch
// cannot carry a held call.
func TestApprovalRefusals(t *testing.T) {
	g, ap := approvalRoute(t)
	ctx := context.Background()
	d := Decide(g, caller(), http.MethodPost, http.Header{}, []byte(prodDeploy))
	v := ap.Settle(ctx, d)
	list, _ := ap.Store.List(ctx, func(approvals.Approval) bool { return true })
	if len(list) != 1 {
		t.Fatalf("pending: %+v (%+v)", list, v)
	}
	if _, err := ap.Store.Answer(ctx, list[0].ID, approvals.Answerer{Owner: "bob", Credential: "tok_bob"}, false, func(approvals.Approval) bool { return true }); err != nil {
		t.Fatal(err)
	}
	v = ap.Settle(ctx, Decide(g, caller(), http.MethodPost, http.Header{}, []byte(prodDeploy)))
	if v.Allowed() || v.Reason != ReasonApprovalRefused || !strings.Contains(v.Message, "denied") || !strings.Contains(v.Message, list[0].ID) {
		t.Fatalf("a denied call: %+v", v)
	}
	batch := "[" + prodDeploy + "," + strings.Replace(call("deploy", `{"environment":"staging"}`), `"id":1`, `"id":2`, 1) + "]"
	d = Decide(g, caller(), http.MethodPost, http.Header{}, []byte(batch))
	if d.Allowed() || d.Reason != ReasonRule || !strings.Contains(d.Message, "on its own") {
		t.Fatalf("a held call in a batch: %+v", d.Verdict)
	}
	if ap.Settle(ctx, d).Reason != ReasonRule {
		t.Fatal("Settle changed a refusal that is not a hold")
	}
	var none *Approvals
	if v := none.Settle(ctx, Decide(g, caller(), http.MethodPost, http.Header{}, []byte(prodDeploy))); v.Allowed() || !strings.Contains(v.Message, "cannot") {
		t.Fatalf("a gateway without approvals: %+v", v)
	}
}

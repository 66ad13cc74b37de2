package edge

import (
	"bytes"
	"io"
	"net/http/httptest"

	"context"
	"github.com/Tahul/caddy-zidane-mcp/message"
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

// modernHeader is the headers of a 2026-07-28 tools/call of deploy.
func modernHeader() http.Header {
	return http.Header{"Mcp-Protocol-Version": {"2026-07-28"}, "Mcp-Method": {"tools/call"}, "Mcp-Name": {"deploy"}}
}

// modernCall is a 2026-07-28 tools/call of tool with args; extra, when
// set, is more members of params (a retry's requestState and
// inputResponses).
func modernCall(tool, args, extra string) string {
	if extra != "" {
		extra = "," + extra
	}
	return `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"` + tool + `","arguments":` + args +
		`,"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{"elicitation":{}}}` + extra + `}}`
}

// retryOf is params' members of the retry that follows the input_required
// answer v: its requestState and an accepting inputResponses.
func retryOf(t *testing.T, v Verdict) string {
	t.Helper()
	state, _ := v.Result["requestState"].(string)
	if state == "" {
		t.Fatalf("no requestState in %+v", v)
	}
	id, _ := strings.CutPrefix(state, approvalStatePrefix)
	return `"requestState":"` + state + `","inputResponses":{"` + id + `":{"action":"accept"}}`
}

// TestApprovalInputRequired: at 2026-07-28 a held call is answered with an
// input_required result whose requestState names the approval; its retry
// runs once approved, with the approved arguments only. The attacks on the
// retry are each refused with a word of why.
func TestApprovalInputRequired(t *testing.T) {
	g, ap := approvalRoute(t)
	ctx := context.Background()
	const args = `{"environment":"production","version":"1.2.3"}`
	decide := func(p policy.Principal, body string) Verdict {
		d := Decide(g, p, http.MethodPost, modernHeader(), []byte(body))
		if d.Allowed() || d.Reason != ReasonApproval {
			return d.Verdict
		}
		return ap.Settle(ctx, d)
	}
	v := decide(caller(), modernCall("deploy", args, ""))
	if v.Allowed() || v.Result == nil || v.Result["resultType"] != "input_required" || v.Reason != ReasonApproval {
		t.Fatalf("held at 2026-07-28: %+v, want input_required", v)
	}
	retry := retryOf(t, v)
	id := strings.TrimPrefix(v.Result["requestState"].(string), approvalStatePrefix)
	if _, err := ap.Store.Get(ctx, id); err != nil {
		t.Fatalf("the requestState names %q, no approval: %v", id, err)
	}
	reqs, _ := v.Result["inputRequests"].(map[string]any)
	if _, ok := reqs[id]; !ok || len(reqs) != 1 {
		t.Fatalf("inputRequests: %+v, want one keyed by the approval", v.Result["inputRequests"])
	}
	if v := decide(caller(), modernCall("deploy", args, retry)); v.Result == nil || v.Result["resultType"] != "input_required" || v.Result["requestState"] != "zidane-approval."+id {
		t.Fatalf("the retry while pending: %+v, want input_required again for the same approval", v)
	}
	if _, err := ap.Store.Answer(ctx, id, approvals.Answerer{Owner: "bob", Credential: "tok_bob"}, true, func(approvals.Approval) bool { return true }); err != nil {
		t.Fatal(err)
	}
	mallory := caller()
	mallory.Owner, mallory.TokenID = "mallory", "tok_mallory"
	forged := `"requestState":"zidane-approval.apv_AAAAAAAAAAAAAAAAAAAAAA","inputResponses":{"apv_AAAAAAAAAAAAAAAAAAAAAA":{"action":"accept"}}`
	for _, a := range []struct {
		name string
		p    policy.Principal
		body string
		word string
	}{
		{"another principal's requestState", mallory, modernCall("deploy", args, retry), "not issued to you"},
		{"a forged requestState", caller(), modernCall("deploy", args, forged), "not issued to you"},
		{"a retry with a changed argument", caller(), modernCall("deploy", `{"environment":"production","version":"6.6.6"}`, retry), "not the call that was approved"},
		{"a retry with the arguments respelled", caller(), modernCall("deploy", `{"version":"1.2.3","environment":"production"}`, retry), "not the call that was approved"},
	} {
		v := decide(a.p, a.body)
		if v.Allowed() || v.Result != nil || v.Status != http.StatusForbidden || !strings.Contains(v.Message, a.word) {
			t.Errorf("%s: %+v, want a 403 saying %q", a.name, v, a.word)
		}
	}
	if v := decide(caller(), modernCall("deploy", args, retry)); !v.Allowed() || !v.StripState {
		t.Fatalf("the approved retry: %+v, want it run with its requestState stripped", v)
	}
	if v := decide(caller(), modernCall("deploy", args, retry)); v.Allowed() || v.Status != http.StatusForbidden || !strings.Contains(v.Message, "used already") {
		t.Fatalf("the retry replayed after it ran: %+v, want a refusal saying it was used", v)
	}
}

// TestApprovalInputRequiredDenied: the retry of a denied call is a tool
// error that says so; a declined input request ends the call.
func TestApprovalInputRequiredDenied(t *testing.T) {
	g, ap := approvalRoute(t)
	ctx := context.Background()
	const args = `{"environment":"production"}`
	d := Decide(g, caller(), http.MethodPost, modernHeader(), []byte(modernCall("deploy", args, "")))
	v := ap.Settle(ctx, d)
	retry := retryOf(t, v)
	id := strings.TrimPrefix(v.Result["requestState"].(string), approvalStatePrefix)
	declined := strings.Replace(retry, "accept", "cancel", 1)
	d = Decide(g, caller(), http.MethodPost, modernHeader(), []byte(modernCall("deploy", args, declined)))
	if v := ap.Settle(ctx, d); v.Allowed() || !v.ToolError || !strings.Contains(v.Message, "not made") {
		t.Fatalf("a cancelled wait: %+v, want a tool error saying the call was not made", v)
	}
	if _, err := ap.Store.Answer(ctx, id, approvals.Answerer{Owner: "bob", Credential: "tok_bob"}, false, func(approvals.Approval) bool { return true }); err != nil {
		t.Fatal(err)
	}
	d = Decide(g, caller(), http.MethodPost, modernHeader(), []byte(modernCall("deploy", args, retry)))
	if v := ap.Settle(ctx, d); v.Allowed() || !v.ToolError || v.Reason != ReasonApprovalRefused || !strings.Contains(v.Message, "denied") {
		t.Fatalf("the retry of a denied call: %+v", v)
	}
}

// TestWithoutRequestState: the retry that runs reaches the backend without
// the gateway's requestState and inputResponses, every other member's
// bytes as sent (the approved arguments, spaced as the client spaced them).
func TestWithoutRequestState(t *testing.T) {
	const args = `{ "environment" :"production",  "version":"1.2.3" }`
	body := modernCall("deploy", args, `"requestState":"zidane-approval.apv_AAAAAAAAAAAAAAAAAAAAAA","inputResponses":{"apv_AAAAAAAAAAAAAAAAAAAAAA":{"action":"accept"}}`)
	r := httptest.NewRequest(http.MethodPost, "/mcp", strings.NewReader(body))
	raw, v := ReadBody(r, 1<<20)
	if !v.Allowed() {
		t.Fatal(v)
	}
	b, err := message.Read(raw)
	if err != nil {
		t.Fatal(err)
	}
	nb, err := WithoutRequestState(r, b)
	if err != nil {
		t.Fatal(err)
	}
	sent, _ := io.ReadAll(r.Body)
	if !bytes.Equal(sent, nb.Raw) || int64(len(sent)) != r.ContentLength {
		t.Fatalf("the body forwarded %q is not the one read again %q", sent, nb.Raw)
	}
	c := nb.Calls[0]
	if c.InputResponses || c.RequestState != "" || bytes.Contains(sent, []byte("zidane-approval")) || bytes.Contains(sent, []byte("inputResponses")) {
		t.Fatalf("the retry kept the gateway's state: %s", sent)
	}
	if string(c.Arguments) != args || c.Name() != "deploy" || c.MetaVersion != "2026-07-28" || c.ID != b.Calls[0].ID {
		t.Fatalf("the call changed: %s", sent)
	}
}

// TestApprovalInputRequiredPrompt: a held prompts/get at 2026-07-28 is
// answered input_required as a tools/call is, and its approved retry runs
// once.
func TestApprovalInputRequiredPrompt(t *testing.T) {
	set, err := rules.Compile([]rules.Spec{{Effect: rules.Approve, Expr: "prompt.name == 'release' && args.target == 'prod'", Message: "prod releases need a second person", Where: "site policy, rule 1"}})
	if err != nil {
		t.Fatal(err)
	}
	scopes, err := policy.NewScopeMap([]policy.Rule{{Scope: "ops", Methods: []string{"prompts/get"}}}, true)
	if err != nil {
		t.Fatal(err)
	}
	_, ap := approvalRoute(t)
	g := &Guard{Scopes: scopes, Rules: set}
	ctx := context.Background()
	h := http.Header{"Mcp-Protocol-Version": {"2026-07-28"}, "Mcp-Method": {"prompts/get"}, "Mcp-Name": {"release"}}
	body := func(extra string) []byte {
		return []byte(strings.Replace(modernCall("release", `{"target":"prod"}`, extra), "tools/call", "prompts/get", 1))
	}
	v := ap.Settle(ctx, Decide(g, caller(), http.MethodPost, h, body("")))
	if v.Result == nil || v.Result["resultType"] != "input_required" {
		t.Fatalf("a held prompt: %+v", v)
	}
	retry := retryOf(t, v)
	id := strings.TrimPrefix(v.Result["requestState"].(string), approvalStatePrefix)
	if _, err := ap.Store.Answer(ctx, id, approvals.Answerer{Owner: "bob", Credential: "tok_bob"}, true, func(approvals.Approval) bool { return true }); err != nil {
		t.Fatal(err)
	}
	if v := ap.Settle(ctx, Decide(g, caller(), http.MethodPost, h, body(retry))); !v.Allowed() || !v.StripState {
		t.Fatalf("the approved prompt: %+v", v)
	}
	if v := ap.Settle(ctx, Decide(g, caller(), http.MethodPost, h, body(retry))); v.Allowed() || !strings.Contains(v.Message, "used already") {
		t.Fatalf("the prompt's retry replayed: %+v", v)
	}
}

// TestApprovalStatusPage: with a status page (the gateway signs people
// in), a client that declares URL elicitation is sent there: at
// 2025-11-25 with the -32042 error whose elicitation is the page, at
// 2026-07-28 with an input_required whose input request is; a client
// without it reads the page's address in the tool error.
func TestApprovalStatusPage(t *testing.T) {
	g, ap := approvalRoute(t)
	ap.StatusPage = func(id string) string { return "https://signin.example.com/zidane/approvals/" + id }
	ctx := context.Background()

	d := Decide(g, caller(), http.MethodPost, http.Header{}, []byte(prodDeploy))
	d.URLElicitation = true
	v := ap.Settle(ctx, d)
	els, _ := v.Data["elicitations"].([]map[string]any)
	if v.Allowed() || v.Code != message.CodeURLElicitationRequired || v.ToolError || len(els) != 1 || els[0]["mode"] != "url" ||
		!strings.HasPrefix(els[0]["url"].(string), "https://signin.example.com/zidane/approvals/apv_") || els[0]["elicitationId"] == "" {
		t.Fatalf("2025-11-25 with URL elicitation: %+v", v)
	}
	id := els[0]["elicitationId"].(string)
	if !strings.HasSuffix(els[0]["url"].(string), id) || !strings.Contains(v.Message, "approval") {
		t.Fatalf("the elicitation names another approval than the page: %+v", v)
	}

	d = Decide(g, caller(), http.MethodPost, http.Header{}, []byte(prodDeploy))
	if v := ap.Settle(ctx, d); !v.ToolError || !strings.Contains(v.Message, "https://signin.example.com/zidane/approvals/"+id) {
		t.Fatalf("2025-11-25 without URL elicitation: %+v, want the page in the tool error", v)
	}

	urlCaps := strings.Replace(modernCall("deploy", `{"environment":"production"}`, ""), `"elicitation":{}`, `"elicitation":{"url":{}}`, 1)
	v = ap.Settle(ctx, Decide(g, caller(), http.MethodPost, modernHeader(), []byte(urlCaps)))
	reqs, _ := v.Result["inputRequests"].(map[string]any)
	if len(reqs) != 1 {
		t.Fatalf("2026-07-28 with URL elicitation: %+v", v)
	}
	for key, r := range reqs {
		params := r.(map[string]any)["params"].(map[string]any)
		if params["mode"] != "url" || params["url"] != "https://signin.example.com/zidane/approvals/"+key || params["elicitationId"] != key {
			t.Fatalf("2026-07-28 with URL elicitation: %+v", params)
		}
	}
}

package edge

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"

	"github.com/Tahul/caddy-zidane-mcp/approvals"
	"github.com/Tahul/caddy-zidane-mcp/message"
	"github.com/Tahul/caddy-zidane-mcp/policy"
	"github.com/Tahul/caddy-zidane-mcp/policy/rules"
)

// roundsClock is the approvals' clock in the rounds tests.
type roundsClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *roundsClock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *roundsClock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// roundsFixture is a guard whose approve rule holds deploy and rollback,
// on approvals with a clock of the test's.
type roundsFixture struct {
	g     *Guard
	ap    *Approvals
	clock *roundsClock
	fs    *certmagic.FileStorage
}

func newRoundsFixture(t *testing.T) *roundsFixture {
	t.Helper()
	set, err := rules.Compile([]rules.Spec{{Effect: rules.Approve, Expr: "tool.name in ['deploy', 'rollback']", Message: "changes need a second person", Where: "site policy, rule 1"}})
	if err != nil {
		t.Fatal(err)
	}
	scopes, err := policy.NewScopeMap([]policy.Rule{{Scope: "ops", Tools: []string{"deploy", "rollback"}}}, true)
	if err != nil {
		t.Fatal(err)
	}
	clock := &roundsClock{t: time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)}
	fs := &certmagic.FileStorage{Path: t.TempDir()}
	st, err := approvals.New(approvals.Options{Store: fs, Now: clock.now})
	if err != nil {
		t.Fatal(err)
	}
	return &roundsFixture{g: &Guard{Scopes: scopes, Rules: set}, ap: &Approvals{Store: st, Site: approvalSite}, clock: clock, fs: fs}
}

// decide is the edge's decision on a 2026-07-28 call of tool by p, settled
// as the handler settles it; the body that would reach the backend is
// returned with an allowed verdict.
func (fx *roundsFixture) decide(t *testing.T, p policy.Principal, tool, body string) (Verdict, string) {
	t.Helper()
	h := http.Header{"Mcp-Protocol-Version": {"2026-07-28"}, "Mcp-Method": {"tools/call"}, "Mcp-Name": {tool}}
	d := Decide(fx.g, p, http.MethodPost, h, []byte(body))
	if d.Reason == ReasonApproval {
		d.Verdict = fx.ap.Settle(context.Background(), d)
	}
	if !d.Allowed() {
		return d.Verdict, ""
	}
	r := httptest.NewRequest(http.MethodPost, "/mcp", strings.NewReader(body))
	var err error
	switch {
	case d.Round != nil:
		_, err = RestoreRequestState(r, d.Body, *d.Round)
	case d.StripState:
		_, err = WithoutRequestState(r, d.Body)
	}
	if err != nil {
		t.Fatal(err)
	}
	sent, _ := io.ReadAll(r.Body)
	return d.Verdict, string(sent)
}

// approve holds deploy(args) for alice, has bob approve it, and returns
// the verdict of its approved retry and the retry's call.
func (fx *roundsFixture) approve(t *testing.T, args string) (Verdict, message.Call) {
	t.Helper()
	ctx := context.Background()
	v, _ := fx.decide(t, caller(), "deploy", modernCall("deploy", args, ""))
	id := strings.TrimPrefix(v.Result["requestState"].(string), approvalStatePrefix)
	if _, err := fx.ap.Store.Answer(ctx, id, approvals.Answerer{Owner: "bob", Credential: "tok_bob"}, true, func(approvals.Approval) bool { return true }); err != nil {
		t.Fatal(err)
	}
	body := modernCall("deploy", args, retryOf(t, v))
	v, _ = fx.decide(t, caller(), "deploy", body)
	if !v.Allowed() || v.Grant == nil || v.Grant.Approval != id {
		t.Fatalf("the approved retry: %+v, want it allowed with its approval's grant", v)
	}
	b, err := message.Read([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	return v, b.Calls[0]
}

// answer passes the backend's answer (a JSON body, or one SSE event)
// through the listing filter of the approved call c, with the round
// binding of v, and returns what the client gets and the drops.
func (fx *roundsFixture) answer(t *testing.T, v Verdict, c message.Call, sse bool, max int64, backend string) (string, []Drop) {
	t.Helper()
	b, err := message.Read(c.Raw)
	if err != nil {
		t.Fatal(err)
	}
	var drops []Drop
	f := NewListing(fx.g, caller(), b, func(d Drop) { drops = append(drops, d) })
	f.Max = max
	f.Rounds = fx.ap.Continuation(context.Background(), v.Grant, c)
	if f.Rounds == nil {
		t.Fatal("no round binding for an approved 2026-07-28 call")
	}
	rec := httptest.NewRecorder()
	w, done := f.Wrap(rec)
	if sse {
		w.Header().Set("Content-Type", "text/event-stream")
		backend = "event: message\ndata: " + backend + "\n\n"
	} else {
		w.Header().Set("Content-Type", "application/json")
	}
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write([]byte(backend))
	_ = done()
	out := rec.Body.String()
	if sse {
		out = strings.TrimSuffix(strings.TrimPrefix(out, "event: message\ndata: "), "\n\n")
	}
	return out, drops
}

func inputRequired(state string) string {
	if state != "" {
		state = `,"requestState":` + state
	}
	return `{"jsonrpc":"2.0","id":7,"result":{"resultType":"input_required","inputRequests":{"step1":{"method":"elicitation/create","params":{"mode":"form","message":"Which region?","requestedSchema":{"type":"object"}}}}` + state + `}}`
}

// roundOf is the gateway's state in an answer the client got.
func roundOf(t *testing.T, out string) string {
	t.Helper()
	var m struct {
		Result struct {
			ResultType    string          `json:"resultType"`
			RequestState  string          `json:"requestState"`
			InputRequests json.RawMessage `json:"inputRequests"`
		} `json:"result"`
	}
	if json.Unmarshal([]byte(out), &m) != nil || m.Result.ResultType != "input_required" || !strings.Contains(string(m.Result.InputRequests), "Which region?") ||
		!strings.HasPrefix(m.Result.RequestState, approvalStatePrefix+"apr_") {
		t.Fatalf("the client got %s, want the backend's question under a round's state", out)
	}
	return m.Result.RequestState
}

// TestApprovedCallRounds: the backend's input_required answer to an
// approved call, as JSON or as an SSE event, reaches the client with a
// round's state in place of the backend's; the retry that brings it runs
// without a new approval, with the backend's state back and the client's
// inputResponses as sent, and binds the next round. Every other use of the
// round is refused with a word of why.
func TestApprovedCallRounds(t *testing.T) {
	for _, sse := range []bool{false, true} {
		name := "json"
		if sse {
			name = "sse"
		}
		t.Run(name, func(t *testing.T) {
			fx := newRoundsFixture(t)
			const args = `{"environment":"production"}`
			v, c := fx.approve(t, args)
			out, drops := fx.answer(t, v, c, sse, 0, inputRequired(`"backend-S1"`))
			state := roundOf(t, out)
			if strings.Contains(out, "backend-S1") || len(drops) != 0 {
				t.Fatalf("the client got the backend's state, or drops %v: %s", drops, out)
			}
			round := strings.TrimPrefix(state, approvalStatePrefix)
			retry := func(args, state string) string {
				return modernCall("deploy", args, `"requestState":"`+state+`","inputResponses":{"step1":{"action":"accept","content":{"region":"eu"}}}`)
			}
			mallory := caller()
			mallory.Owner, mallory.TokenID = "mallory", "tok_mallory"
			laptop := caller()
			laptop.TokenID = "tok_alice_laptop"
			for _, a := range []struct {
				name   string
				p      policy.Principal
				tool   string
				body   string
				status int
				word   string
			}{
				{"the round with a changed argument", caller(), "deploy", retry(`{"environment":"moon"}`, state), http.StatusForbidden, "not the call that was approved"},
				{"the round with the arguments respelled", caller(), "deploy", retry(`{ "environment":"production"}`, state), http.StatusForbidden, "not the call that was approved"},
				{"another principal's use of the round", mallory, "deploy", retry(args, state), http.StatusForbidden, "not issued to you"},
				{"the same owner's other credential", laptop, "deploy", retry(args, state), http.StatusForbidden, "not issued to you"},
				{"a made-up round", caller(), "deploy", retry(args, approvalStatePrefix+"apr_AAAAAAAAAAAAAAAAAAAAAA"), http.StatusForbidden, "not issued to you"},
				{"a round of the wrong shape", caller(), "deploy", retry(args, approvalStatePrefix+"apr_x"), http.StatusForbidden, "not issued to you"},
				{"the round on another held tool", caller(), "rollback", strings.Replace(retry(args, state), `"name":"deploy"`, `"name":"rollback"`, 1), http.StatusForbidden, "not the call that was approved"},
			} {
				v, sent := fx.decide(t, a.p, a.tool, a.body)
				if v.Allowed() || v.Status != a.status || !strings.Contains(v.Message, a.word) || sent != "" {
					t.Errorf("%s: %+v, want %d saying %q", a.name, v, a.status, a.word)
				}
			}
			// The backend's own state, without the gateway's: a new call,
			// held for a new approval.
			raw := retry(args, "backend-S1")
			if v, _ := fx.decide(t, caller(), "deploy", raw); v.Allowed() || v.Result == nil || v.Reason != ReasonApproval {
				t.Errorf("the backend's raw state: %+v, want it held for a new approval", v)
			}

			v, sent := fx.decide(t, caller(), "deploy", retry(args, state))
			if !v.Allowed() || v.Round == nil || v.Round.ID != round || v.Grant == nil || v.Grant.Rounds != 1 {
				t.Fatalf("the round's retry: %+v, want it allowed", v)
			}
			var m struct {
				Params struct {
					Arguments      json.RawMessage `json:"arguments"`
					RequestState   string          `json:"requestState"`
					InputResponses json.RawMessage `json:"inputResponses"`
				} `json:"params"`
			}
			if json.Unmarshal([]byte(sent), &m) != nil || m.Params.RequestState != "backend-S1" || string(m.Params.Arguments) != args ||
				string(m.Params.InputResponses) != `{"step1":{"action":"accept","content":{"region":"eu"}}}` || strings.Contains(sent, "zidane-approval") {
				t.Fatalf("the backend got %s, want its state back, the arguments and the client's inputResponses as sent", sent)
			}
			if v, _ := fx.decide(t, caller(), "deploy", retry(args, state)); v.Allowed() || v.Status != http.StatusForbidden || !strings.Contains(v.Message, "used already") {
				t.Errorf("the round replayed after it ran: %+v, want 403 saying used already", v)
			}

			// The next round, with no state of the backend's: the retry
			// reaches it without one.
			b, _ := message.Read([]byte(retry(args, state)))
			out, _ = fx.answer(t, v, b.Calls[0], sse, 0, inputRequired(""))
			state2 := roundOf(t, out)
			if v, sent := fx.decide(t, caller(), "deploy", retry(args, state2)); !v.Allowed() || v.Grant.Rounds != 2 || strings.Contains(sent, "requestState") || !strings.Contains(sent, `"inputResponses"`) {
				t.Fatalf("the second round: %+v, the backend got %s", v, sent)
			}

			// A round past the approval's approved lifetime.
			b, _ = message.Read([]byte(retry(args, state2)))
			out, _ = fx.answer(t, v, b.Calls[0], sse, 0, inputRequired(`"backend-S3"`))
			state3 := roundOf(t, out)
			fx.clock.add(approvals.DefaultApprovedLifetime)
			if v, _ := fx.decide(t, caller(), "deploy", retry(args, state3)); v.Allowed() || v.Status != http.StatusForbidden || !strings.Contains(v.Message, "expired") {
				t.Errorf("a round past the approval's lifetime: %+v, want 403 saying expired", v)
			}
		})
	}
}

// TestApprovedCallRoundAnswers: what the filter does with the backend's
// answers to an approved call: a complete result passes as it is; an
// input_required one whose state the gateway does not keep, or that a
// client could read another way, is refused with an error that says why
// (and a drop naming the approval), and binds no round; one over the
// answer bound is cut, and binds no round.
func TestApprovedCallRoundAnswers(t *testing.T) {
	big := `"` + strings.Repeat("s", approvals.MaxStateBytes+1) + `"`
	for _, a := range []struct {
		name    string
		max     int64
		backend string
		word    string // in what the client gets
		drop    string
		// dropped: as an SSE event the answer is left out whole (the
		// client gets nothing of it), as JSON replaced by the word.
		dropped bool
	}{
		{"a complete result", 0, `{"jsonrpc":"2.0","id":7,"result":{"content":[{"type":"text","text":"deployed"}],"requestState":"s"}}`, `"requestState":"s"`, "", false},
		{"a state over the bound", 0, inputRequired(big), "over 65536 bytes", "approval_round_refused", false},
		{"a state that is no string", 0, inputRequired(`{"round":1}`), "not a string", "approval_round_refused", false},
		{"a case-variant requestState", 0, strings.Replace(inputRequired(`"s"`), `"requestState"`, `"RequestState"`, 1), "another case", "approval_round_refused", false},
		{"a case-variant resultType", 0, strings.Replace(inputRequired(`"s"`), `"resultType"`, `"ResultType"`, 1), "another case", "approval_round_refused", false},
		{"resultType twice, input_required last", 0, strings.Replace(inputRequired(`"S-secret"`), `"resultType":"input_required"`, `"resultType":"complete","resultType":"input_required"`, 1), "unambiguously", "ambiguous_answer", true},
		{"resultType twice, input_required first", 0, strings.Replace(inputRequired(`"S-secret"`), `"resultType":"input_required"`, `"resultType":"input_required","resultType":"complete"`, 1), "unambiguously", "ambiguous_answer", true},
		{"requestState twice, one escaped", 0, strings.Replace(inputRequired(`"S-secret"`), `"inputRequests"`, `"request\u0053tate":"t","inputRequests"`, 1), "unambiguously", "ambiguous_answer", true},
		{"a state with a lone surrogate", 0, inputRequired(`"\ud800S-secret"`), "unambiguously", "ambiguous_answer", true},
		{"the call's id as a string (read as the call's by the TypeScript SDK)", 0, strings.Replace(inputRequired(`"S-secret"`), `"id":7`, `"id":"7"`, 1), "did not match the request", "unmatched_answer", true},
		{"another request's id", 0, strings.Replace(inputRequired(`"S-secret"`), `"id":7`, `"id":8`, 1), "did not match the request", "unmatched_answer", true},
		{"an answer over max_response", 256, inputRequired(`"` + strings.Repeat("s", 512) + `"`), "max_response", "answer_too_large", false},
	} {
		for _, sse := range []bool{false, true} {
			t.Run(a.name, func(t *testing.T) {
				fx := newRoundsFixture(t)
				v, c := fx.approve(t, `{"environment":"production"}`)
				out, drops := fx.answer(t, v, c, sse, a.max, a.backend)
				word := a.word
				if sse && a.dropped {
					word = ""
				}
				if !strings.Contains(out, word) || strings.Contains(out, "apr_") || strings.Contains(out, "S-secret") {
					t.Errorf("the client got %.300s, want it to say %q and name no round nor hold the backend's state", out, word)
				}
				if a.drop == "" && len(drops) != 0 || a.drop != "" && (len(drops) != 1 || drops[0].Reason != a.drop) {
					t.Errorf("drops %+v, want %q", drops, a.drop)
				}
				if a.drop == "approval_round_refused" && drops[0].Approval != v.Grant.Approval {
					t.Errorf("the drop names %q, want the approval %s", drops[0].Approval, v.Grant.Approval)
				}
				if keys, _ := fx.fs.List(context.Background(), strings.TrimSuffix(approvals.RoundKeyPrefix, "/"), false); len(keys) != 0 {
					t.Errorf("rounds stored: %v, want none", keys)
				}
			})
		}
	}
}

// TestApprovedCallTwoAnswers: a server that answers the approved call
// twice on its event stream binds one round: the second answer is refused,
// so that it makes no more rounds than the client makes retries.
func TestApprovedCallTwoAnswers(t *testing.T) {
	fx := newRoundsFixture(t)
	v, c := fx.approve(t, `{"environment":"production"}`)
	out, drops := fx.answer(t, v, c, true, 0, inputRequired(`"s1"`)+"\n\nevent: message\ndata: "+inputRequired(`"s2"`))
	if strings.Count(out, "apr_") != 1 || !strings.Contains(out, "more than once") || len(drops) != 1 || drops[0].Reason != "approval_round_refused" {
		t.Fatalf("the client got %s, drops %+v; want one round and the second answer refused", out, drops)
	}
	if keys, _ := fx.fs.List(context.Background(), strings.TrimSuffix(approvals.RoundKeyPrefix, "/"), false); len(keys) != 1 {
		t.Fatalf("rounds stored: %v, want one", keys)
	}
}

// TestRestoreRequestState: the retry of a round reaches the backend with
// the backend's own state, character for character (quotes, markup,
// non-ASCII), the client's inputResponses and every other member's bytes
// as sent; with no state of the backend's, with none.
func TestRestoreRequestState(t *testing.T) {
	const args = `{ "environment" :"production" }`
	const inputs = `{"step1":{"action":"accept","content":{"region":"eu"}}}`
	body := modernCall("deploy", args, `"requestState":"zidane-approval.apr_AAAAAAAAAAAAAAAAAAAAAA","inputResponses":`+inputs)
	for _, tc := range []struct {
		round approvals.Round
		want  string // the requestState member the backend gets, "" for none
	}{
		{approvals.Round{HasState: true, State: `a"<b>&c é`}, `"requestState":"a\"<b>&c é"`},
		{approvals.Round{HasState: true, State: ""}, `"requestState":""`},
		{approvals.Round{}, ""},
	} {
		r := httptest.NewRequest(http.MethodPost, "/mcp", strings.NewReader(body))
		b, err := message.Read([]byte(body))
		if err != nil {
			t.Fatal(err)
		}
		nb, err := RestoreRequestState(r, b, tc.round)
		if err != nil {
			t.Fatal(err)
		}
		sent, _ := io.ReadAll(r.Body)
		s := string(sent)
		if string(nb.Raw) != s || nb.Calls[0].RequestState != tc.round.State || string(nb.Calls[0].Arguments) != args ||
			!strings.Contains(s, `"inputResponses":`+inputs) || strings.Contains(s, "zidane-approval") ||
			(tc.want != "" && !strings.Contains(s, tc.want)) || (tc.want == "" && strings.Contains(s, "requestState")) {
			t.Errorf("state %+v: the backend got %s", tc.round, s)
		}
	}
}

// TestApprovedRoundRefusedBeforeUse: a retry of a round that the edge
// refuses before it is settled (headers that disagree with the body, a
// version header that disagrees with _meta, a batch, a duplicate or
// case-variant requestState) is refused with its reason and does not use
// the round up: the caller's proper retry still runs, once.
func TestApprovedRoundRefusedBeforeUse(t *testing.T) {
	fx := newRoundsFixture(t)
	const args = `{"environment":"production"}`
	v, c := fx.approve(t, args)
	out, _ := fx.answer(t, v, c, false, 0, inputRequired(`"backend-S1"`))
	state := roundOf(t, out)
	retry := modernCall("deploy", args, `"requestState":"`+state+`","inputResponses":{"step1":{"action":"accept"}}`)
	h := func(kv ...string) http.Header {
		h := http.Header{"Mcp-Protocol-Version": {"2026-07-28"}, "Mcp-Method": {"tools/call"}, "Mcp-Name": {"deploy"}}
		for i := 0; i+1 < len(kv); i += 2 {
			h.Set(kv[i], kv[i+1])
		}
		return h
	}
	for _, a := range []struct {
		name   string
		h      http.Header
		body   string
		status int
		reason string
		word   string
	}{
		{"Mcp-Name naming another tool", h("Mcp-Name", "rollback"), retry, http.StatusBadRequest, "header_mismatch", "Mcp-Name"},
		{"Mcp-Method naming another method", h("Mcp-Method", "prompts/get"), retry, http.StatusBadRequest, "header_mismatch", "Mcp-Method"},
		{"a 2025-11-25 header on a 2026-07-28 body", h("Mcp-Protocol-Version", "2025-11-25"), retry, http.StatusBadRequest, "header_mismatch", "protocolVersion"},
		{"the round in a batch", h(), "[" + retry + "]", http.StatusForbidden, ReasonRule, "not in a batch"},
		{"a second requestState, escaped", h(), strings.Replace(retry, `"inputResponses"`, `"requestStat\u0065":"backend-S1","inputResponses"`, 1), http.StatusBadRequest, "ambiguous_body", "same key"},
		{"a case-variant requestState", h(), strings.Replace(retry, `"inputResponses"`, `"RequestState":"backend-S1","inputResponses"`, 1), http.StatusBadRequest, "ambiguous_body", "case is folded"},
	} {
		d := Decide(fx.g, caller(), http.MethodPost, a.h, []byte(a.body))
		if d.Reason == ReasonApproval {
			d.Verdict = fx.ap.Settle(context.Background(), d)
		}
		if d.Allowed() || d.Status != a.status || (a.reason != "" && d.Reason != a.reason) || !strings.Contains(d.Message, a.word) {
			t.Errorf("%s: %d %s %q, want %d %s saying %q", a.name, d.Status, d.Reason, d.Message, a.status, a.reason, a.word)
		}
	}
	v, sent := fx.decide(t, caller(), "deploy", retry)
	if !v.Allowed() || v.Round == nil || !strings.Contains(sent, `"requestState":"backend-S1"`) {
		t.Fatalf("the proper retry after the refused ones: %+v, the backend got %s; want it run with the backend's state", v, sent)
	}
	if v, _ := fx.decide(t, caller(), "deploy", retry); v.Allowed() || !strings.Contains(v.Message, "used already") {
		t.Fatalf("the round again: %+v, want it used already", v)
	}
}

package mcpendpoint

import (
	"strings"
	"testing"

	"github.com/Tahul/caddy-zidane-mcp/sessions"
)

func TestPendingAndAnswer(t *testing.T) {
	h := newHarness(t)
	alice := h.connect("alice-token", nil, nil)
	phone := h.connect("phone-token", nil, nil)
	ids := h.engine.seed(2, "tok-alice")
	for _, id := range ids {
		h.engine.Send(t.Context(), harnessOwner, id, "work")
	}
	approval, _ := h.engine.ask(ids[0], sessions.KindApproval, "run `rm -rf build`?",
		map[string]any{"toolCall": map[string]any{"title": "rm -rf build"}, "options": []map[string]any{{"optionId": "allow", "kind": "allow_once"}}})
	question, _ := h.engine.ask(ids[1], sessions.KindQuestion, "which database?",
		map[string]any{"message": "which database?", "requestedSchema": map[string]any{"type": "object"}})

	var p pendingResult
	res := call(t, alice, "interactions", map[string]any{"verb": "pending"})
	ok(t, res, &p)
	if len(p.Interactions) != 2 || h.engine.lastPendingFor != "" {
		t.Fatalf("pending: %+v", p.Interactions)
	}
	for _, want := range []string{approval, question, "approval", "question", "rm -rf build", "which database?"} {
		if !strings.Contains(text(res), want) {
			t.Errorf("pending text lacks %q: %s", want, text(res))
		}
	}
	ok(t, call(t, alice, "interactions", map[string]any{"verb": "pending", "sessionId": ids[1]}), &p)
	if len(p.Interactions) != 1 || p.Interactions[0].RequestID != question || p.Interactions[0].Kind != sessions.KindQuestion {
		t.Errorf("pending for %s: %+v", ids[1], p.Interactions)
	}

	var a answerResult
	ok(t, call(t, alice, "interactions", map[string]any{"verb": "answer", "requestId": approval, "decision": "allow"}), &a)
	if !a.Answered || h.engine.lastAnswer.Decision != "allow" || h.engine.state(ids[0]) != sessions.StateRunning {
		t.Errorf("answer: %+v, engine got %+v, state %s", a, h.engine.lastAnswer, h.engine.state(ids[0]))
	}

	// Someone answered first (alice, on her other token): the later
	// answer is told so.
	res = call(t, phone, "interactions", map[string]any{"verb": "answer", "requestId": approval, "optionId": "reject"})
	failed(t, res, "someone answered \""+approval+"\" first", "yours was not applied", "interactions pending")
	if code := errorCodeOf(res); code != "already_answered" {
		t.Errorf("error code %q, want already_answered", code)
	}

	ok(t, call(t, alice, "interactions", map[string]any{
		"verb": "answer", "requestId": question, "action": "accept", "content": map[string]any{"db": "postgres"},
	}), &a)
	if got := string(h.engine.lastAnswer.Content); got != `{"db":"postgres"}` || h.engine.lastAnswer.Action != "accept" {
		t.Errorf("question answer reached the engine as %+v", h.engine.lastAnswer)
	}
	ok(t, call(t, alice, "interactions", map[string]any{"verb": "pending"}), &p)
	if len(p.Interactions) != 0 {
		t.Errorf("still pending: %+v", p.Interactions)
	}
}

func TestInteractionsErrors(t *testing.T) {
	h := newHarness(t)
	cs := h.connect("alice-token", nil, nil)
	id := h.engine.seed(1, "tok-alice")[0]
	h.engine.Send(t.Context(), harnessOwner, id, "work")
	question, _ := h.engine.ask(id, sessions.KindQuestion, "name?", map[string]any{"message": "name?"})

	for _, tc := range []struct {
		name string
		args map[string]any
		code string
		want []string
	}{
		{"no verb", map[string]any{"requestId": question}, "bad_input", []string{"`verb` is required", "pending, answer"}},
		{"unknown verb", map[string]any{"verb": "reply"}, "bad_input", []string{`unknown verb "reply"`}},
		{"missing requestId", map[string]any{"verb": "answer", "decision": "allow"}, "bad_input", []string{"`requestId` is required"}},
		{"no answer", map[string]any{"verb": "answer", "requestId": question}, "bad_input", []string{"say how to answer", "optionId", "action"}},
		{"mixed kinds", map[string]any{"verb": "answer", "requestId": question, "action": "accept", "decision": "allow"}, "bad_input", []string{"not both"}},
		{"option and decision", map[string]any{"verb": "answer", "requestId": question, "optionId": "a", "decision": "allow"}, "bad_input", []string{"optionId or decision, not both"}},
		{"bad decision", map[string]any{"verb": "answer", "requestId": question, "decision": "maybe"}, "bad_input", []string{"`decision` must be \"allow\" or \"reject\""}},
		{"bad action", map[string]any{"verb": "answer", "requestId": question, "action": "ok"}, "bad_input", []string{"`action` must be"}},
		{"content without accept", map[string]any{"verb": "answer", "requestId": question, "action": "decline", "content": map[string]any{}}, "bad_input", []string{"content goes only with action \"accept\""}},
		{"content not object", map[string]any{"verb": "answer", "requestId": question, "action": "accept", "content": "bob"}, "bad_input", []string{"`content` must be a JSON object"}},
		{"pending takes no requestId", map[string]any{"verb": "pending", "requestId": question}, "bad_input", []string{"does not take `requestId`", "it takes: sessionId"}},
		{"unknown request", map[string]any{"verb": "answer", "requestId": "r99", "decision": "allow"}, "no_interaction", []string{`no pending interaction "r99"`, "interactions pending"}},
		{"engine refuses the kind", map[string]any{"verb": "answer", "requestId": question, "decision": "allow"}, "bad_request", []string{"refused to answer", "fix the arguments"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := call(t, cs, "interactions", tc.args)
			failed(t, res, tc.want...)
			if code := errorCodeOf(res); code != tc.code {
				t.Errorf("error code %q, want %q", code, tc.code)
			}
		})
	}
}

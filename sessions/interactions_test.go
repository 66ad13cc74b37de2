package sessions_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/Tahul/caddy-zidane-mcp/sessions"
)

func TestFirstAnswerWins(t *testing.T) {
	e, _ := newEngine(t)
	o := owner("gus")
	id := create(t, e, o, "approve: ship it")
	it := pendingOne(t, e, id)
	answers := []sessions.Answer{{Decision: "allow"}, {OptionID: "reject"}}
	errs := make([]error, len(answers))
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i, a := range answers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			errs[i] = e.Answer(ctxT(t), o, it.RequestID, a)
		}()
	}
	close(start)
	wg.Wait()
	winner := -1
	for i, err := range errs {
		switch {
		case err == nil && winner < 0:
			winner = i
		case err == nil:
			t.Fatalf("both answers won: %v", errs)
		case !errors.Is(err, sessions.ErrAlreadyAnswered):
			t.Fatalf("losing answer error = %v, want ErrAlreadyAnswered", err)
		}
	}
	if winner < 0 {
		t.Fatalf("no answer won: %v", errs)
	}
	waitState(t, e, id, sessions.StateIdle)
	want := map[int]string{0: "Allowed: ship it", 1: "Rejected: ship it"}[winner]
	if msg := lastMessage(t, e, id); msg != want {
		t.Errorf("last message = %q, want %q (answer %d won)", msg, want, winner)
	}
	wantErr(t, e.Answer(ctxT(t), o, it.RequestID, sessions.Answer{Decision: "allow"}), sessions.ErrAlreadyAnswered)
	wantErr(t, e.Answer(ctxT(t), o, "req_nonexistent", sessions.Answer{Decision: "allow"}), sessions.ErrNoInteraction)
}

func TestQuestionMappingAndAnswer(t *testing.T) {
	e, _ := newEngine(t)
	o := owner("hal")
	id := create(t, e, o, "ask: What colour should the button be?")
	it := pendingOne(t, e, id)
	if it.Kind != sessions.KindQuestion || it.SessionID != id || !strings.HasPrefix(it.RequestID, "req_") || it.Summary != "Question: What colour should the button be?" {
		t.Fatalf("interaction = %+v", it)
	}
	var p struct {
		Message         string `json:"message"`
		RequestedSchema struct {
			Properties map[string]any `json:"properties"`
			Required   []string       `json:"required"`
		} `json:"requestedSchema"`
	}
	if err := json.Unmarshal(it.Payload, &p); err != nil {
		t.Fatal(err)
	}
	if p.Message != "What colour should the button be?" || p.RequestedSchema.Properties["answer"] == nil || fmt.Sprint(p.RequestedSchema.Required) != "[answer]" {
		t.Fatalf("payload = %s", it.Payload)
	}
	v, _ := e.Read(looker, id, false)
	if v.State != sessions.StateBlocked {
		t.Fatalf("state = %s, want blocked", v.State)
	}
	attention := eventsOf(e, id, sessions.EventNeedsAttention)
	if len(attention) != 1 || attention[0].RequestID != it.RequestID || attention[0].Kind != "needs-attention" {
		t.Fatalf("needs-attention events = %+v", attention)
	}
	wantErr(t, e.Answer(ctxT(t), o, it.RequestID, sessions.Answer{Action: "accept", Content: json.RawMessage(`{"other":"x"}`)}), sessions.ErrBadRequest, "answer")
	wantErr(t, e.Answer(ctxT(t), o, it.RequestID, sessions.Answer{Action: "maybe"}), sessions.ErrBadRequest, "accept, decline or cancel")
	wantErr(t, e.Answer(ctxT(t), o, it.RequestID, sessions.Answer{Content: json.RawMessage(`"blue"`)}), sessions.ErrBadRequest, "JSON object")
	if err := e.Answer(ctxT(t), o, it.RequestID, sessions.Answer{Action: "accept", Content: json.RawMessage(`{"answer":"blue"}`)}); err != nil {
		t.Fatal(err)
	}
	waitState(t, e, id, sessions.StateIdle)
	if msg := lastMessage(t, e, id); msg != "You answered: blue" {
		t.Errorf("last message = %q", msg)
	}
	// Decline.
	if _, err := e.Send(ctxT(t), o, id, "ask: Again?"); err != nil {
		t.Fatal(err)
	}
	it = pendingOne(t, e, id)
	if err := e.Answer(ctxT(t), o, it.RequestID, sessions.Answer{Action: "decline"}); err != nil {
		t.Fatal(err)
	}
	waitState(t, e, id, sessions.StateIdle)
	if msg := lastMessage(t, e, id); msg != "You declined to answer." {
		t.Errorf("last message = %q", msg)
	}
}

func TestPlanMappingAndAnswer(t *testing.T) {
	e, _ := newEngine(t)
	o := owner("ivy")
	id := create(t, e, o, "plan: 1. write the test 2. make it pass")
	it := pendingOne(t, e, id)
	if it.Kind != sessions.KindPlan || it.Summary != "Plan approval: 1. write the test 2. make it pass" {
		t.Fatalf("interaction = %+v", it)
	}
	var p struct {
		Plan    string `json:"plan"`
		Options []struct {
			OptionID string `json:"optionId"`
			Kind     string `json:"kind"`
		} `json:"options"`
	}
	if err := json.Unmarshal(it.Payload, &p); err != nil {
		t.Fatal(err)
	}
	if p.Plan != "1. write the test 2. make it pass" || len(p.Options) != 3 || p.Options[0].OptionID != "acceptEdits" {
		t.Fatalf("payload = %s", it.Payload)
	}
	wantErr(t, e.Answer(ctxT(t), o, it.RequestID, sessions.Answer{OptionID: "yolo"}), sessions.ErrBadRequest, "acceptEdits", "default", "plan")
	wantErr(t, e.Answer(ctxT(t), o, it.RequestID, sessions.Answer{}), sessions.ErrBadRequest, "optionId")
	// reject picks the first reject_ option: "plan" (keep planning).
	if err := e.Answer(ctxT(t), o, it.RequestID, sessions.Answer{Decision: "reject"}); err != nil {
		t.Fatal(err)
	}
	waitState(t, e, id, sessions.StateIdle)
	if msg := lastMessage(t, e, id); msg != "Plan rejected: I keep planning." {
		t.Errorf("last message = %q", msg)
	}
}

func TestApprovalMappingAndAnswer(t *testing.T) {
	e, _ := newEngine(t)
	o := owner("jo")
	id := create(t, e, o, "approve: go test ./...")
	it := pendingOne(t, e, id)
	if it.Kind != sessions.KindApproval || it.Summary != "Approval: execute go test ./..." {
		t.Fatalf("interaction = %+v", it)
	}
	var p struct {
		ToolCall struct {
			Title string         `json:"title"`
			Kind  string         `json:"kind"`
			Input map[string]any `json:"input"`
		} `json:"toolCall"`
		Options []struct {
			OptionID, Name, Kind string
		} `json:"options"`
	}
	if err := json.Unmarshal(it.Payload, &p); err != nil {
		t.Fatal(err)
	}
	if p.ToolCall.Title != "go test ./..." || p.ToolCall.Kind != "execute" || p.ToolCall.Input["command"] != "go test ./..." {
		t.Fatalf("payload = %s", it.Payload)
	}
	var ids []string
	for _, o := range p.Options {
		ids = append(ids, o.OptionID+"/"+o.Kind)
	}
	if fmt.Sprint(ids) != "[allow_always/allow_always allow/allow_once reject/reject_once]" {
		t.Fatalf("options = %v", ids)
	}
	wantErr(t, e.Answer(ctxT(t), o, it.RequestID, sessions.Answer{Decision: "maybe"}), sessions.ErrBadRequest, "allow or reject")
	if err := e.Answer(ctxT(t), o, it.RequestID, sessions.Answer{OptionID: "allow"}); err != nil {
		t.Fatal(err)
	}
	waitState(t, e, id, sessions.StateIdle)
	if msg := lastMessage(t, e, id); msg != "Allowed: go test ./..." {
		t.Errorf("last message = %q", msg)
	}
}

package mcpendpoint

import (
	"context"
	"fmt"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/Tahul/caddy-zidane-mcp/policy"
	"github.com/Tahul/caddy-zidane-mcp/sessions"
)

// interactionsArgs are the arguments each verb of the interactions tool
// takes; its verbs and their order are policy's table.
var interactionsArgs = map[string][]string{
	"pending": {"sessionId"},
	"answer":  {"requestId", "optionId", "decision", "action", "content"},
}

var interactionsVerbs = verbsOf("interactions", interactionsArgs)

const interactionsDescription = `Answer the questions, plan approvals and permission prompts that coding-agent sessions wait on (a session in state blocked, or a <session-event status="needs-attention">). Set ` + "`verb`" + `:

- pending {sessionId?}: the prompts waiting for an answer, for one of your sessions or all of them: requestId, sessionId, kind (question, plan, approval, or call: another caller's call that a rule holds for a person's approval, listed when you hold the approve scope for its site), summary and payload (a question's message and requested fields; a plan's text; an approval's tool call and its options; a held call's site, tool and arguments).
- answer {requestId, …}: answer one by its requestId. For an approval or a plan, pass optionId (one of the options in its payload) or decision "allow" or "reject" (the first option of that kind); a held call (requestId apv_…) takes decision "allow" or "reject". For a question, pass action "accept" with content (an object with the requested fields), or action "decline" or "cancel". The first answer wins: if someone answered first, you are told so and yours is not applied.`

func interactionsTool() *mcp.Tool {
	return &mcp.Tool{
		Name:        "interactions",
		Title:       "Pending questions and approvals of coding-agent sessions",
		Description: interactionsDescription,
		InputSchema: map[string]any{
			"type":     "object",
			"required": []string{"verb"},
			"properties": map[string]any{
				"verb":      schemaEnum("What to do: pending lists, answer answers.", policy.VerbNames("interactions")...),
				"sessionId": schemaString("pending: only this session's prompts. Leave it out for all sessions."),
				"requestId": schemaString("answer: the requestId of the prompt, as pending or a needs-attention <session-event> gave it."),
				"optionId":  schemaString("answer, approval or plan: the id of one of the options in the payload."),
				"decision":  schemaEnum("answer, approval or plan: allow or reject, for the first option of that kind.", "allow", "reject"),
				"action":    schemaEnum("answer, question: accept (with content), decline or cancel.", "accept", "decline", "cancel"),
				"content": map[string]any{
					"type":        "object",
					"description": "answer, question with action accept: the answer, an object with the fields the question's payload requests.",
				},
			},
		},
	}
}

func (e *Endpoint) callInteractions(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	c, err := callerOf(req)
	if err != nil {
		return result(reply{}, err), nil
	}
	a, err := parseArgs("interactions", req.Params.Arguments, interactionsVerbs)
	if err != nil {
		return result(reply{}, err), nil
	}
	var r reply
	if a.verb == "pending" {
		r, err = e.pending(ctx, c, a)
	} else {
		r, err = e.answer(ctx, c, a)
	}
	e.reportRefusal(c, a, err)
	return result(r, err), nil
}

type pendingResult struct {
	Interactions []sessions.Interaction `json:"interactions"`
}

func (e *Endpoint) pending(ctx context.Context, c caller, a *args) (reply, error) {
	id, err := a.str("sessionId")
	if err != nil {
		return reply{}, err
	}
	list, err := e.engine.Pending(c.owner, id)
	if err != nil {
		return reply{}, explainOn("interactions", err, "list the pending interactions of", id)
	}
	if list == nil {
		list = []sessions.Interaction{}
	}
	if id == "" {
		held, err := e.heldCalls(ctx, c)
		if err != nil {
			return reply{}, fmt.Errorf("the held calls could not be listed (%v); try again", err)
		}
		list = append(list, held...)
	}
	var b strings.Builder
	switch {
	case len(list) == 0 && id != "":
		fmt.Fprintf(&b, "Nothing waits for an answer in session %s.", id)
	case len(list) == 0:
		b.WriteString("Nothing waits for an answer.")
	default:
		fmt.Fprintf(&b, "%d prompts wait for an answer (answer each by requestId):", len(list))
	}
	for _, in := range list {
		if in.Kind == KindCall {
			fmt.Fprintf(&b, "\n- requestId %s, a held call: %s", in.RequestID, in.Summary)
		} else {
			fmt.Fprintf(&b, "\n- requestId %s, session %s, %s: %s", in.RequestID, in.SessionID, in.Kind, in.Summary)
		}
		if in.Unreachable {
			b.WriteString(" (unreachable: its replica is down; it cannot be answered now, and it ends if that replica restarts)")
		}
		if len(in.Payload) > 0 {
			fmt.Fprintf(&b, "\n  payload: %s", in.Payload)
		}
	}
	return reply{text: b.String(), data: pendingResult{Interactions: list}}, nil
}

type answerResult struct {
	RequestID string `json:"requestId"`
	Answered  bool   `json:"answered"`
}

func (e *Endpoint) answer(ctx context.Context, c caller, a *args) (reply, error) {
	id, err := a.required("requestId", "pass the requestId that pending or a needs-attention <session-event> gave")
	if err != nil {
		return reply{}, err
	}
	var ans sessions.Answer
	if ans.OptionID, err = a.str("optionId"); err != nil {
		return reply{}, err
	}
	if ans.Decision, err = a.str("decision"); err != nil {
		return reply{}, err
	}
	if ans.Action, err = a.str("action"); err != nil {
		return reply{}, err
	}
	if ans.Content, err = a.object("content"); err != nil {
		return reply{}, err
	}
	if err := checkAnswer(ans); err != nil {
		return reply{}, err
	}
	if isHeldCall(id) {
		return e.answerHeld(ctx, c, id, ans.Decision)
	}
	if err := e.engine.Answer(ctx, c.owner, id, ans); err != nil {
		return reply{}, explainOn("interactions", err, "answer", id)
	}
	return reply{
		text: fmt.Sprintf("Answered %s; the session carries on. A <session-event> arrives when it finishes, fails or needs another decision.", id),
		data: answerResult{RequestID: id, Answered: true},
	}, nil
}

// checkAnswer refuses answers of no recognisable shape. Whether the shape
// fits the interaction's kind is the engine's call.
func checkAnswer(ans sessions.Answer) error {
	const how = `for an approval or a plan pass optionId or decision "allow"/"reject"; for a question pass action "accept" with content, or action "decline"/"cancel"`
	switch {
	case ans.OptionID == "" && ans.Decision == "" && ans.Action == "":
		return badInput("say how to answer: %s", how)
	case ans.Action != "" && (ans.OptionID != "" || ans.Decision != ""):
		return badInput("action answers a question, optionId and decision answer an approval or a plan: pass one kind of answer, not both")
	case ans.OptionID != "" && ans.Decision != "":
		return badInput("pass optionId or decision, not both")
	case ans.Decision != "" && ans.Decision != "allow" && ans.Decision != "reject":
		return badInput("`decision` must be \"allow\" or \"reject\"; got %q", ans.Decision)
	case ans.Action != "" && ans.Action != "accept" && ans.Action != "decline" && ans.Action != "cancel":
		return badInput("`action` must be \"accept\", \"decline\" or \"cancel\"; got %q", ans.Action)
	case ans.Content != nil && ans.Action != "accept":
		return badInput("content goes only with action \"accept\": %s", how)
	}
	return nil
}

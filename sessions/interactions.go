package sessions

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	acp "github.com/coder/acp-go-sdk"
)

// interaction is a pending permission request or question. The engine's
// lock guards it; reply has room for the one answer.
type interaction struct {
	Interaction
	s       *session
	options []acp.PermissionOption // approvals and plans
	require []string               // a question's required fields
	reply   chan reply
}

type reply struct {
	perm acp.RequestPermissionResponse
	elic acp.UnstableCreateElicitationResponse
}

func cancelledPermission() acp.RequestPermissionResponse {
	return acp.RequestPermissionResponse{Outcome: acp.RequestPermissionOutcome{Cancelled: &acp.RequestPermissionOutcomeCancelled{Outcome: "cancelled"}}}
}

func cancelledElicitation() acp.UnstableCreateElicitationResponse {
	return acp.UnstableCreateElicitationResponse{Cancel: &acp.UnstableCreateElicitationCancel{Action: "cancel"}}
}

func (it *interaction) cancelled() reply {
	return reply{perm: cancelledPermission(), elic: cancelledElicitation()}
}

// resolution is how an interaction stopped being pending; the engine
// remembers the last maxResolved of them so that a late answer gets a
// precise error.
type resolution struct {
	answered bool
	why      string
	owner    string // of the session, so that a stranger learns nothing
}

const maxResolved = 10000

// maxPayloadText bounds each text an agent puts in an interaction (a plan,
// a question, a tool call's content): the payload is shown to people.
const maxPayloadText = 256 << 10

func capText(s string) string {
	if c, cut := cutBytes(s, maxPayloadText); cut {
		return c + "\n[… cut: longer than 256 KiB]"
	}
	return s
}

type optionView struct {
	OptionID string `json:"optionId"`
	Name     string `json:"name"`
	Kind     string `json:"kind"`
}

func optionViews(opts []acp.PermissionOption) []optionView {
	out := make([]optionView, len(opts))
	for i, o := range opts {
		out[i] = optionView{OptionID: string(o.OptionId), Name: o.Name, Kind: string(o.Kind)}
	}
	return out
}

// permissionInteraction maps session/request_permission: a switch_mode
// tool call (Claude's ExitPlanMode) is a plan to approve, anything else an
// approval.
func permissionInteraction(req acp.RequestPermissionRequest) *interaction {
	tc := req.ToolCall
	title := ""
	if tc.Title != nil {
		title = *tc.Title
	}
	kind := ""
	if tc.Kind != nil {
		kind = string(*tc.Kind)
	}
	it := &interaction{options: req.Options}
	if kind == string(acp.ToolKindSwitchMode) {
		plan := capText(planText(tc))
		it.Kind = KindPlan
		it.Summary = "Plan approval: " + firstLine(plan, 200)
		it.Payload, _ = json.Marshal(map[string]any{
			"plan":    plan,
			"title":   title,
			"options": optionViews(req.Options),
		})
		return it
	}
	it.Kind = KindApproval
	it.Summary = strings.TrimSpace("Approval: " + strings.TrimSpace(kind+" "+firstLine(title, 200)))
	it.Payload, _ = json.Marshal(map[string]any{
		"toolCall": map[string]any{
			"toolCallId": string(tc.ToolCallId),
			"title":      title,
			"kind":       kind,
			"input":      tc.RawInput,
			"content":    capText(contentText(tc.Content)),
		},
		"options": optionViews(req.Options),
	})
	return it
}

// planText is the plan a switch_mode tool call carries: its text content,
// or else rawInput.plan as Claude's ExitPlanMode sends it.
func planText(tc acp.ToolCallUpdate) string {
	if text := contentText(tc.Content); text != "" {
		return text
	}
	if m, ok := tc.RawInput.(map[string]any); ok {
		if p, ok := m["plan"].(string); ok {
			return p
		}
	}
	if tc.Title != nil {
		return *tc.Title
	}
	return ""
}

func contentText(content []acp.ToolCallContent) string {
	var parts []string
	for _, c := range content {
		switch {
		case c.Content != nil && c.Content.Content.Text != nil:
			parts = append(parts, c.Content.Content.Text.Text)
		case c.Diff != nil:
			parts = append(parts, fmt.Sprintf("(diff of %s)", c.Diff.Path))
		}
	}
	return strings.Join(parts, "\n")
}

func questionInteraction(form acp.UnstableCreateElicitationForm) *interaction {
	it := &interaction{require: form.RequestedSchema.Required}
	it.Kind = KindQuestion
	it.Summary = "Question: " + firstLine(form.Message, 200)
	it.Payload, _ = json.Marshal(map[string]any{
		"message":         capText(form.Message),
		"requestedSchema": form.RequestedSchema,
	})
	return it
}

// ask makes it pending on s and blocks until it is answered or cancelled,
// or ctx ends (the agent withdrew the request or went away).
func (e *Engine) ask(ctx context.Context, s *session, gen int, it *interaction) reply {
	it.reply = make(chan reply, 1)
	it.s = s
	it.SessionID = s.rec.ID
	it.RequestID = e.newID("req")
	it.Created = time.Now().UTC()

	e.mu.Lock()
	switch {
	case e.closed || s.dead() || s.gen != gen:
		e.mu.Unlock()
		return it.cancelled()
	case s.turn != nil && s.turn.cancel != "":
		// The turn is being cancelled: whatever it asks now is cancelled too.
		e.mu.Unlock()
		return it.cancelled()
	case len(s.pending) >= e.lim.MaxPending:
		e.mu.Unlock()
		e.log.Warn("an agent asked more questions than the limit allows at once; answering cancelled", "session", s.rec.ID, "limit", e.lim.MaxPending)
		return it.cancelled()
	}
	s.pending = append(s.pending, it)
	e.pending[it.RequestID] = it
	e.stopIdle(s)
	e.recordLocked(s, Event{
		Status:    EventNeedsAttention,
		Kind:      "needs-attention",
		Summary:   fmt.Sprintf("%s: needs attention: %s", s.rec.Title, it.Summary),
		RequestID: it.RequestID,
	})
	e.changedLocked(s)
	e.mu.Unlock()
	e.persist(s, saveEvents)

	select {
	case r := <-it.reply:
		return r
	case <-ctx.Done():
		e.mu.Lock()
		if e.takeLocked(it, resolution{why: "the agent withdrew it"}) {
			e.changedLocked(s)
		}
		e.mu.Unlock()
		select {
		case r := <-it.reply: // answered just before the withdrawal
			return r
		default:
			return it.cancelled()
		}
	}
}

// takeLocked removes it from the pending ones and remembers how it ended.
// It reports false when it was no longer pending.
func (e *Engine) takeLocked(it *interaction, res resolution) bool {
	if _, ok := e.pending[it.RequestID]; !ok {
		return false
	}
	delete(e.pending, it.RequestID)
	s := it.s
	for i, p := range s.pending {
		if p == it {
			s.pending = append(s.pending[:i:i], s.pending[i+1:]...)
			break
		}
	}
	res.owner = it.s.rec.Owner
	e.resolved[it.RequestID] = res
	e.resolvedOrder = append(e.resolvedOrder, it.RequestID)
	if len(e.resolvedOrder) > maxResolved {
		delete(e.resolved, e.resolvedOrder[0])
		e.resolvedOrder = e.resolvedOrder[1:]
	}
	return true
}

// cancelPendingLocked ends every pending interaction of s as cancelled:
// permission requests get outcome cancelled, questions action cancel.
func (e *Engine) cancelPendingLocked(s *session, why string) {
	for _, it := range append([]*interaction(nil), s.pending...) {
		if e.takeLocked(it, resolution{why: why}) {
			it.reply <- it.cancelled()
		}
	}
}

// Pending lists the interactions waiting for an answer, oldest first: the
// session's, or those of every session owner sees when sessionID is "". A
// session of another owner that OtherInteractions does not reach gets
// ErrNotOwner.
func (e *Engine) Pending(owner Owner, sessionID string) ([]Interaction, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []Interaction
	if sessionID != "" {
		s := e.sessions[sessionID]
		if s == nil {
			return nil, nil
		}
		if err := reach(s, owner, owner.OtherInteractions, AccessRead); err != nil {
			return nil, err
		}
		for _, it := range s.pending {
			out = append(out, it.Interaction)
		}
		return out, nil
	}
	for _, it := range e.pending {
		if reach(it.s, owner, owner.OtherInteractions, AccessRead) == nil {
			out = append(out, it.Interaction)
		}
	}
	SortInteractions(out)
	return out, nil
}

// Answer answers a pending interaction of a session owner may act on (its
// owner's, or any with OtherInteractions AccessAll; else ErrNotOwner). The
// first valid answer wins; a later one gets ErrAlreadyAnswered. An answer
// that does not fit the interaction gets ErrBadRequest and leaves it
// pending.
func (e *Engine) Answer(_ context.Context, owner Owner, requestID string, a Answer) error {
	e.mu.Lock()
	it := e.pending[requestID]
	if it != nil {
		if err := reach(it.s, owner, owner.OtherInteractions, AccessAll); err != nil {
			e.mu.Unlock()
			return fmt.Errorf("%w (interaction %s)", err, requestID)
		}
	}
	if it == nil {
		res, known := e.resolved[requestID]
		e.mu.Unlock()
		switch {
		case known && res.owner != owner.OwnerID() && owner.OtherInteractions < AccessAll:
			return fmt.Errorf("%w (interaction %s)", ErrNotOwner, requestID)
		case !known:
			return fmt.Errorf("%w: %q; list the pending ones with interactions list", ErrNoInteraction, requestID)
		case res.answered:
			return fmt.Errorf("%w: %s was already answered (%s)", ErrAlreadyAnswered, requestID, res.why)
		default:
			return fmt.Errorf("%w: %s was cancelled: %s", ErrNoInteraction, requestID, res.why)
		}
	}
	r, how, err := it.answer(a)
	if err != nil {
		e.mu.Unlock()
		return err
	}
	who := owner.TokenName
	if who == "" {
		who = owner.TokenID
	}
	if who != "" {
		how += " by " + who
	}
	e.takeLocked(it, resolution{answered: true, why: how})
	it.reply <- r
	e.changedLocked(it.s)
	e.mu.Unlock()
	return nil
}

// answer checks a against the interaction and builds the reply to the
// agent, and says in words what was chosen.
func (it *interaction) answer(a Answer) (reply, string, error) {
	if it.Kind == KindQuestion {
		return it.answerQuestion(a)
	}
	var chosen *acp.PermissionOption
	switch {
	case a.OptionID != "":
		for i := range it.options {
			if string(it.options[i].OptionId) == a.OptionID {
				chosen = &it.options[i]
				break
			}
		}
		if chosen == nil {
			return reply{}, "", fmt.Errorf("%w: option %q is not one of those offered: %s", ErrBadRequest, a.OptionID, it.describeOptions())
		}
	case a.Decision == "allow" || a.Decision == "reject":
		for i := range it.options {
			if strings.HasPrefix(string(it.options[i].Kind), a.Decision+"_") {
				chosen = &it.options[i]
				break
			}
		}
		if chosen == nil {
			return reply{}, "", fmt.Errorf("%w: no offered option is an %s; choose an optionId: %s", ErrBadRequest, a.Decision, it.describeOptions())
		}
	case a.Decision != "":
		return reply{}, "", fmt.Errorf("%w: decision %q: use allow or reject, or name an optionId: %s", ErrBadRequest, a.Decision, it.describeOptions())
	default:
		return reply{}, "", fmt.Errorf("%w: an %s needs optionId (one of %s) or decision allow/reject", ErrBadRequest, it.Kind, it.describeOptions())
	}
	r := reply{perm: acp.RequestPermissionResponse{Outcome: acp.RequestPermissionOutcome{
		Selected: &acp.RequestPermissionOutcomeSelected{Outcome: "selected", OptionId: chosen.OptionId},
	}}}
	return r, fmt.Sprintf("option %s", chosen.OptionId), nil
}

func (it *interaction) describeOptions() string {
	parts := make([]string, len(it.options))
	for i, o := range it.options {
		parts[i] = fmt.Sprintf("%s (%s, %q)", o.OptionId, o.Kind, o.Name)
	}
	return strings.Join(parts, ", ")
}

func (it *interaction) answerQuestion(a Answer) (reply, string, error) {
	action := a.Action
	if action == "" && len(a.Content) > 0 {
		action = "accept"
	}
	switch action {
	case "decline":
		return reply{elic: acp.UnstableCreateElicitationResponse{Decline: &acp.UnstableCreateElicitationDecline{Action: "decline"}}}, "declined", nil
	case "cancel":
		return reply{elic: cancelledElicitation()}, "cancelled", nil
	case "accept":
	case "":
		return reply{}, "", fmt.Errorf("%w: a question needs action accept (with content holding the answer fields), decline or cancel", ErrBadRequest)
	default:
		return reply{}, "", fmt.Errorf("%w: action %q: use accept, decline or cancel", ErrBadRequest, action)
	}
	content := map[string]any{}
	if len(a.Content) > 0 {
		if err := json.Unmarshal(a.Content, &content); err != nil || content == nil {
			return reply{}, "", fmt.Errorf("%w: content must be a JSON object of answer fields, such as {\"answer\": \"yes\"}", ErrBadRequest)
		}
	}
	var missing []string
	for _, f := range it.require {
		if _, ok := content[f]; !ok {
			missing = append(missing, f)
		}
	}
	if len(missing) > 0 {
		return reply{}, "", fmt.Errorf("%w: content lacks the required field(s) %s; see the question's requestedSchema", ErrBadRequest, strings.Join(missing, ", "))
	}
	return reply{elic: acp.UnstableCreateElicitationResponse{Accept: &acp.UnstableCreateElicitationAccept{Action: "accept", Content: content}}}, "accepted", nil
}

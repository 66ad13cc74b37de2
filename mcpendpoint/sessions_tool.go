package mcpendpoint

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/Tahul/caddy-zidane-mcp/policy"
	"github.com/Tahul/caddy-zidane-mcp/sessions"
)

// sessionsArgs are the arguments each verb of the sessions tool takes;
// its verbs and their order are policy's table.
var sessionsArgs = map[string][]string{
	"create":     {"cwd", "prompt", "agent", "environment", "title", "tools", "subscribe"},
	"send":       {"sessionId", "prompt"},
	"steer":      {"sessionId", "text"},
	"cancel":     {"sessionId"},
	"read":       {"sessionId", "full"},
	"list":       {"limit"},
	"transcript": {"sessionId", "turns", "full"},
	"wait":       {"sessionId", "timeout"},
	"events":     {"sessionId", "status", "text", "since", "limit"},
}

var sessionsVerbs = verbsOf("sessions", sessionsArgs)

const sessionsDescription = `Start and drive coding-agent sessions on this host. Set ` + "`verb`" + ` and the arguments that verb takes:

- create {cwd, prompt, agent?, environment?, title?, tools?, subscribe?}: start a session that works in directory cwd on a first prompt. Returns sessionId and link at once; the agent works in the background. Do NOT wait: do not call wait or read in a loop after create. You will receive a <session-event> when the session finishes, fails or needs a decision; carry on with other work meanwhile. environment defaults to {"kind":"local"} (work in cwd itself); {"kind":"worktree","branch":"fix/login"} gives the session its own git worktree of the repository at cwd, on a new branch. For an orchestrator session, tools lists the verbs of these tools it may call itself (only verbs you may call yourself), and subscribe: true delivers its workers' events to it as prompts.
- send {sessionId, prompt}: give a session a new prompt. It runs at once if the session is idle, or is queued behind the running turn (the answer says which). Do not wait afterwards either.
- steer {sessionId, text}: add guidance to the current run; the agent sees it at its next turn boundary. The answer says whether the agent took it as steering or it went to the head of the prompt queue.
- cancel {sessionId}: interrupt the running turn. Its pending interactions end as cancelled.
- read {sessionId, full?}: title, cwd, state (idle, running, blocked = waiting for an answer, ended, error), turn count, link, and the last agent message, cut at 600 characters unless full is true.
- list {limit?}: your sessions, newest first, with live state (every owner's on a host that shares them; foreign: true marks another owner's). limit defaults to 30, at most 100; partial: true means more exist. worker: true marks the sessions you created; in a cluster, unreachable: true marks a session whose replica is down, shown as it last was.
- transcript {sessionId, turns?, full?}: the last turns (default 10, at most 50) as plain text, each prompt and answer cut at 1200 characters unless full is true.
- wait {sessionId, timeout?}: return once the session is idle or blocked, or after timeout seconds (default 30, at most 50). Only when you have nothing else to do: <session-event> notifications make polling unnecessary.
- events {sessionId?, status?, text?, since?, limit?}: what happened, newest first. status is done (a turn finished), error, cancelled or needs-attention (an answer is awaited); text searches the summaries; since returns only events after that seq; limit defaults to 20, at most 100.

A session in state blocked, or a needs-attention event, waits for an answer: use the interactions tool.

A session belongs to the owner of the token that created it: only that owner's tokens (an orchestrator's included) may act on it or see it, unless a token holds sessions:any, or the host shares sessions for reading.`

func sessionsTool(agents []string) *mcp.Tool {
	agent := schemaString("create: the configured agent to run; leave it out for the default agent.")
	if len(agents) > 0 {
		agent = schemaEnum("create: the configured agent to run ("+strings.Join(agents, ", ")+"); leave it out for the default agent.", agents...)
	}
	verbs := policy.VerbNames("sessions")
	return &mcp.Tool{
		Name:        "sessions",
		Title:       "Coding-agent sessions",
		Description: sessionsDescription,
		InputSchema: map[string]any{
			"type":     "object",
			"required": []string{"verb"},
			"properties": map[string]any{
				"verb":      schemaEnum("What to do; the tool description says which arguments each verb takes.", verbs...),
				"sessionId": schemaString("The session to act on, as create or list returned it. Required by send, steer, cancel, read, transcript and wait; a filter for events."),
				"cwd":       schemaString("create: absolute path of the directory the agent works in (for a worktree, a directory of the git repository)."),
				"prompt":    schemaString("create, send: the task or message for the agent."),
				"text":      schemaString("steer: the guidance to inject. events: text to search for in event summaries."),
				"agent":     agent,
				"environment": map[string]any{
					"type":                 "object",
					"description":          `create: where the agent runs. Default {"kind":"local"}: in cwd itself. {"kind":"worktree","branch":"fix/login"}: in a new git worktree of the repository at cwd, on a new branch.`,
					"required":             []string{"kind"},
					"additionalProperties": false,
					"properties": map[string]any{
						"kind":   schemaEnum("local or worktree.", "local", "worktree"),
						"branch": schemaString("worktree: the branch to create for the session."),
					},
				},
				"title": schemaString("create: a short title; derived from the prompt when left out."),
				"tools": map[string]any{
					"type":        "array",
					"items":       map[string]any{"type": "string", "enum": policy.VerbNames("")},
					"description": "create, orchestrator: the verbs of the sessions and interactions tools the new session may call itself.",
				},
				"subscribe": schemaBool("create, orchestrator: deliver the events of the sessions it creates to it as prompts."),
				"full":      schemaBool("read: the whole last message. transcript: whole turns. Default false (cut)."),
				"limit":     schemaInt("list: how many sessions (default 30, at most 100). events: how many events (default 20, at most 100).", 1, listMax),
				"turns":     schemaInt("transcript: how many of the last turns (default 10, at most 50).", 1, transcriptMax),
				"timeout":   schemaInt("wait: seconds to wait at most (default 30, at most 50).", 1, waitMax),
				"status":    schemaEnum("events: only events of this status.", "done", "error", "cancelled", "needs-attention"),
				"since":     map[string]any{"type": "integer", "minimum": 0, "description": "events: only events after this seq (the seq of a <session-event>)."},
			},
		},
	}
}

func (e *Endpoint) callSessions(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	c, err := callerOf(req)
	if err != nil {
		return result(reply{}, err), nil
	}
	a, err := parseArgs("sessions", req.Params.Arguments, sessionsVerbs)
	if err != nil {
		return result(reply{}, err), nil
	}
	var do func(context.Context, caller, *args) (reply, error)
	switch a.verb {
	case "create":
		do = e.create
	case "send":
		do = e.send
	case "steer":
		do = e.steer
	case "cancel":
		do = e.cancel
	case "read":
		do = e.read
	case "list":
		do = e.list
	case "transcript":
		do = e.transcript
	case "wait":
		do = e.wait
	case "events":
		do = e.events
	}
	r, err := do(ctx, c, a)
	e.reportRefusal(c, a, err)
	return result(r, err), nil
}

// createdModern is what create answers a 2026-07-28 caller: also the
// session's events resource, to listen to.
type createdModern struct {
	sessions.Created
	EventsResource string `json:"eventsResource"`
}

// eventHint says how the caller learns of session id's next event: pushed
// to a 2025-11-25 session, or its events resource for a 2026-07-28 caller.
func eventHint(c caller, id string) string {
	if c.modern {
		return fmt.Sprintf("its events resource %s is updated when it finishes, fails or needs a decision (subscribe to it with subscriptions/listen)", EventsURI(id))
	}
	return "a <session-event> arrives when it finishes, fails or needs a decision"
}

const sessionIDHint = "pass the id that create or list returned"

func (e *Endpoint) create(ctx context.Context, c caller, a *args) (reply, error) {
	cwd, err := a.required("cwd", "the absolute path of the directory the agent should work in")
	if err != nil {
		return reply{}, err
	}
	prompt, err := a.required("prompt", "the first task for the agent")
	if err != nil {
		return reply{}, err
	}
	agent, err := a.str("agent")
	if err != nil {
		return reply{}, err
	}
	if agent != "" && len(e.agents) > 0 && !slices.Contains(e.agents, agent) {
		return reply{}, badInput("unknown agent %q: use one of %s, or leave agent out for the default", agent, strings.Join(e.agents, ", "))
	}
	env, err := environment(a)
	if err != nil {
		return reply{}, err
	}
	title, err := a.str("title")
	if err != nil {
		return reply{}, err
	}
	tools, err := a.stringList("tools")
	if err != nil {
		return reply{}, err
	}
	for _, t := range tools {
		if _, ok := policy.VerbTool(t); !ok {
			return reply{}, badInput("unknown verb %q in tools: list verbs of the sessions and interactions tools (%s)", t, strings.Join(policy.VerbNames(""), ", "))
		}
	}
	if err := checkTools(c, tools); err != nil {
		return reply{}, err
	}
	subscribe, err := a.boolean("subscribe")
	if err != nil {
		return reply{}, err
	}
	created, err := e.engine.Create(ctx, c.owner, sessions.CreateRequest{
		Cwd: cwd, Prompt: prompt, Agent: agent, Environment: env,
		Title: title, Tools: tools, Subscribe: subscribe, Base: BaseFrom(ctx),
	})
	if err != nil {
		return reply{}, explain(err, "create the session", cwd)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "Started session %s", created.SessionID)
	if created.Link != "" {
		fmt.Fprintf(&b, " (%s)", created.Link)
	}
	if c.modern {
		// MCP 2026-07-28: nothing is pushed to a request; the events are a
		// resource the client listens to.
		fmt.Fprintf(&b, ". It works in the background. Its events are the resource %s: subscribe to it with subscriptions/listen "+
			"and you are told (notifications/resources/updated) when it finishes, fails or needs a decision; then read the resource or call events. "+
			"Without a subscription, call wait when you have nothing else to do.", EventsURI(created.SessionID))
		return reply{text: b.String(), data: createdModern{Created: created, EventsResource: EventsURI(created.SessionID)}}, nil
	}
	fmt.Fprintf(&b, ". It works in the background. Do NOT wait, poll, or call wait or read for it now: "+
		"you will receive a <session-event session=%q> when it finishes, fails or needs a decision. Carry on with other work meanwhile.", created.SessionID)
	return reply{text: b.String(), data: created}, nil
}

// environment is create's environment argument, {"kind":"local"} by default.
func environment(a *args) (sessions.Environment, error) {
	raw, err := a.object("environment")
	if err != nil || raw == nil {
		return sessions.Environment{Kind: "local"}, err
	}
	var env sessions.Environment
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&env); err != nil {
		return env, badInput(`environment must be {"kind":"local"} or {"kind":"worktree","branch":"<new branch>"}: %v`, err)
	}
	switch env.Kind {
	case "local":
		if env.Branch != "" {
			return env, badInput(`environment.branch applies only to {"kind":"worktree"}: drop it, or use kind worktree for a session on its own branch`)
		}
	case "worktree":
	default:
		return env, badInput(`environment.kind must be "local" or "worktree"; got %q`, env.Kind)
	}
	return env, nil
}

type sendResult struct {
	SessionID string `json:"sessionId"`
	Queued    bool   `json:"queued"`
}

func (e *Endpoint) send(ctx context.Context, c caller, a *args) (reply, error) {
	id, err := a.required("sessionId", sessionIDHint)
	if err != nil {
		return reply{}, err
	}
	prompt, err := a.required("prompt", "the message for the agent")
	if err != nil {
		return reply{}, err
	}
	queued, err := e.engine.Send(ctx, c.owner, id, prompt)
	if err != nil {
		return reply{}, explain(err, "send to", id)
	}
	text := fmt.Sprintf("Session %s started on your prompt.", id)
	if queued {
		text = fmt.Sprintf("Session %s is busy: your prompt is queued behind the running turn and runs after it.", id)
	}
	text += " Do not wait: " + eventHint(c, id) + "."
	return reply{text: text, data: sendResult{SessionID: id, Queued: queued}}, nil
}

type steerResult struct {
	SessionID string `json:"sessionId"`
	Mode      string `json:"mode"`
}

func (e *Endpoint) steer(ctx context.Context, c caller, a *args) (reply, error) {
	id, err := a.required("sessionId", sessionIDHint)
	if err != nil {
		return reply{}, err
	}
	text, err := a.required("text", "the guidance to inject into the current run")
	if err != nil {
		return reply{}, err
	}
	mode, err := e.engine.Steer(ctx, c.owner, id, text)
	if err != nil {
		return reply{}, explain(err, "steer", id)
	}
	var msg string
	switch mode {
	case "steering":
		msg = fmt.Sprintf("The agent of session %s took your guidance as steering: it sees it at its next turn boundary, within the current run.", id)
	case "queued-first":
		msg = fmt.Sprintf("The agent of session %s cannot take guidance mid-run, so it went to the head of the prompt queue: it runs right after the current turn.", id)
	default:
		msg = fmt.Sprintf("Session %s took your guidance (%s).", id, mode)
	}
	return reply{text: msg, data: steerResult{SessionID: id, Mode: mode}}, nil
}

type cancelResult struct {
	SessionID string `json:"sessionId"`
	Cancelled bool   `json:"cancelled"`
}

func (e *Endpoint) cancel(ctx context.Context, c caller, a *args) (reply, error) {
	id, err := a.required("sessionId", sessionIDHint)
	if err != nil {
		return reply{}, err
	}
	if err := e.engine.Cancel(ctx, c.owner, id); err != nil {
		return reply{}, explain(err, "cancel", id)
	}
	return reply{
		text: fmt.Sprintf("Cancelled the running turn of session %s; its pending interactions ended as cancelled.", id),
		data: cancelResult{SessionID: id, Cancelled: true},
	}, nil
}

func (e *Endpoint) read(_ context.Context, c caller, a *args) (reply, error) {
	id, err := a.required("sessionId", sessionIDHint)
	if err != nil {
		return reply{}, err
	}
	full, err := a.boolean("full")
	if err != nil {
		return reply{}, err
	}
	v, err := e.engine.Read(c.owner, id, full)
	if err != nil {
		return reply{}, explain(err, "read", id)
	}
	if !full {
		v = cutView(v)
	}
	return reply{text: renderView(v), data: v}, nil
}

// cutView cuts v's last message to lastMessageChars.
func cutView(v sessions.SessionView) sessions.SessionView {
	var cutNow bool
	v.LastMessage, cutNow = cut(v.LastMessage, lastMessageChars)
	v.Truncated = v.Truncated || cutNow
	return v
}

func renderView(v sessions.SessionView) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Session %s %q is %s.\n", v.SessionID, v.Title, v.State)
	agent := v.Agent
	if agent == "" {
		agent = "default"
	}
	fmt.Fprintf(&b, "cwd: %s; agent: %s; turns: %d; queued prompts: %d\n", v.Cwd, agent, v.Turns, v.Queued)
	if v.Link != "" {
		fmt.Fprintf(&b, "link: %s\n", v.Link)
	}
	if v.Error != "" {
		fmt.Fprintf(&b, "error: %s\n", v.Error)
	}
	switch {
	case v.LastMessage == "":
		b.WriteString("No agent message yet.")
	case v.Truncated:
		fmt.Fprintf(&b, "Last message (cut at %d characters; read with full: true for all of it):\n%s", lastMessageChars, v.LastMessage)
	default:
		fmt.Fprintf(&b, "Last message:\n%s", v.LastMessage)
	}
	return b.String()
}

type listResult struct {
	Sessions []sessions.SessionView `json:"sessions"`
	Partial  bool                   `json:"partial"`
	Limit    int                    `json:"limit"`
	Notes    []string               `json:"notes,omitempty"`
}

func (e *Endpoint) list(_ context.Context, c caller, a *args) (reply, error) {
	limit, note, err := a.integer("limit", listDefault, 1, listMax, "")
	if err != nil {
		return reply{}, err
	}
	views, partial := e.engine.List(c.owner, limit)
	if len(views) > limit {
		views, partial = views[:limit], true
	}
	cutViews := make([]sessions.SessionView, len(views))
	for i, v := range views {
		cutViews[i] = cutView(v)
	}
	views = cutViews
	res := listResult{Sessions: views, Partial: partial, Limit: limit, Notes: notes(note)}

	var b strings.Builder
	fmt.Fprintf(&b, "%d sessions, newest first", len(views))
	if partial {
		fmt.Fprintf(&b, " (partial: more exist beyond the limit of %d)", limit)
	}
	b.WriteString(":")
	for _, v := range views {
		fmt.Fprintf(&b, "\n- %s [%s] %q in %s, %d turns", v.SessionID, v.State, v.Title, v.Cwd, v.Turns)
		if v.Worker {
			b.WriteString(", worker (you created it)")
		}
		if v.Unreachable {
			b.WriteString(", unreachable (its replica is down: as it last was; verbs on it fail until the replica is back)")
		}
	}
	return reply{text: withNotes(b.String(), res.Notes), data: res}, nil
}

// transcriptTurn is a turn, cut unless full.
type transcriptTurn struct {
	sessions.Turn
	Truncated bool `json:"truncated,omitempty"`
}

type transcriptResult struct {
	SessionID string           `json:"sessionId"`
	Turns     []transcriptTurn `json:"turns"`
	Truncated bool             `json:"truncated,omitempty"`
	Notes     []string         `json:"notes,omitempty"`
}

func (e *Endpoint) transcript(_ context.Context, c caller, a *args) (reply, error) {
	id, err := a.required("sessionId", sessionIDHint)
	if err != nil {
		return reply{}, err
	}
	n, note, err := a.integer("turns", transcriptDefault, 1, transcriptMax, "")
	if err != nil {
		return reply{}, err
	}
	full, err := a.boolean("full")
	if err != nil {
		return reply{}, err
	}
	// Whole turns from the engine: the 1200-character cut, and whether it
	// cut, are this endpoint's to apply and report.
	turns, err := e.engine.Transcript(c.owner, id, n, true)
	if err != nil {
		return reply{}, explain(err, "read the transcript of", id)
	}
	if len(turns) > n {
		turns = turns[len(turns)-n:]
	}
	res := transcriptResult{SessionID: id, Turns: make([]transcriptTurn, len(turns)), Notes: notes(note)}
	var b strings.Builder
	fmt.Fprintf(&b, "Last %d turns of session %s", len(turns), id)
	if !full {
		fmt.Fprintf(&b, " (each prompt and answer cut at %d characters; full: true for whole turns)", turnTextChars)
	}
	b.WriteString(":")
	for i, t := range turns {
		tt := transcriptTurn{Turn: t}
		if !full {
			var cp, ca bool
			tt.Prompt, cp = cut(t.Prompt, turnTextChars)
			tt.Answer, ca = cut(t.Answer, turnTextChars)
			tt.Truncated = cp || ca
			res.Truncated = res.Truncated || tt.Truncated
		}
		res.Turns[i] = tt
		fmt.Fprintf(&b, "\n\n--- turn %d", tt.Index)
		if tt.StopReason != "" {
			fmt.Fprintf(&b, " (%s)", tt.StopReason)
		}
		if tt.Truncated {
			b.WriteString(" [cut]")
		}
		fmt.Fprintf(&b, " ---\nprompt: %s\nanswer: %s", tt.Prompt, tt.Answer)
	}
	return reply{text: withNotes(b.String(), res.Notes), data: res}, nil
}

type waitResult struct {
	sessions.SessionView
	// Settled is false when the timeout passed with the session still
	// running.
	Settled bool     `json:"settled"`
	Timeout int      `json:"timeoutSeconds"`
	Notes   []string `json:"notes,omitempty"`
}

func (e *Endpoint) wait(ctx context.Context, c caller, a *args) (reply, error) {
	id, err := a.required("sessionId", sessionIDHint)
	if err != nil {
		return reply{}, err
	}
	secs, note, err := a.integer("timeout", waitDefault, 1, waitMax, " seconds")
	if err != nil {
		return reply{}, err
	}
	v, err := e.engine.Wait(ctx, c.owner, id, time.Duration(secs)*time.Second)
	if err != nil {
		return reply{}, explain(err, "wait for", id)
	}
	v = cutView(v)
	res := waitResult{SessionView: v, Settled: v.State != sessions.StateRunning, Timeout: secs, Notes: notes(note)}
	text := renderView(v)
	if !res.Settled {
		text = fmt.Sprintf("Session %s is still running after %d seconds. Do not wait again: %s.\n", id, secs, eventHint(c, id)) + text
	}
	return reply{text: withNotes(text, res.Notes), data: res}, nil
}

type eventsResult struct {
	Events []sessions.Event `json:"events"`
	Limit  int              `json:"limit"`
	Notes  []string         `json:"notes,omitempty"`
}

func (e *Endpoint) events(_ context.Context, c caller, a *args) (reply, error) {
	var f sessions.EventFilter
	var err error
	if f.SessionID, err = a.str("sessionId"); err != nil {
		return reply{}, err
	}
	status, err := a.str("status")
	if err != nil {
		return reply{}, err
	}
	switch s := sessions.EventStatus(status); s {
	case "", sessions.EventDone, sessions.EventError, sessions.EventCancelled, sessions.EventNeedsAttention:
		f.Status = s
	default:
		return reply{}, badInput("`status` must be done, error, cancelled or needs-attention; got %q", status)
	}
	if f.Text, err = a.str("text"); err != nil {
		return reply{}, err
	}
	since, _, err := a.integer("since", 0, 0, math.MaxInt, "")
	if err != nil {
		return reply{}, err
	}
	f.Since = int64(since)
	limit, note, err := a.integer("limit", eventsDefault, 1, eventsMax, "")
	if err != nil {
		return reply{}, err
	}
	f.Limit = limit
	evs, err := e.engine.Events(c.owner, f)
	if err != nil {
		return reply{}, explain(err, "read the events of", f.SessionID)
	}
	if len(evs) > limit {
		evs = evs[:limit]
	}
	if evs == nil {
		evs = []sessions.Event{}
	}
	res := eventsResult{Events: evs, Limit: limit, Notes: notes(note)}
	var b strings.Builder
	fmt.Fprintf(&b, "%d events, newest first", len(evs))
	if len(evs) == limit {
		fmt.Fprintf(&b, " (the limit; older ones may exist)")
	}
	b.WriteString(":")
	for _, ev := range evs {
		fmt.Fprintf(&b, "\n%s", ev.Render())
	}
	return reply{text: withNotes(b.String(), res.Notes), data: res}, nil
}

package sessions

import (
	"context"
	"encoding/json"
	"errors"
	"html"
	"strconv"
	"strings"
	"time"
)

// State is what a session is doing, as `read` and `list` report it.
type State string

const (
	StateIdle    State = "idle"    // no turn running, queue empty
	StateRunning State = "running" // a turn is running
	StateBlocked State = "blocked" // a turn waits on a pending interaction
	StateEnded   State = "ended"   // the agent process is gone (crash, restart without session/load, close)
	StateError   State = "error"   // the agent failed; Error says why
)

// EventStatus classifies a session event for `events` filters.
type EventStatus string

const (
	EventDone           EventStatus = "done"            // a turn finished
	EventError          EventStatus = "error"           // a turn or the agent failed
	EventCancelled      EventStatus = "cancelled"       // a turn was cancelled
	EventNeedsAttention EventStatus = "needs-attention" // an interaction is pending
)

// InteractionKind classifies what a pending interaction asks for.
type InteractionKind string

const (
	KindQuestion InteractionKind = "question" // ACP elicitation/create
	KindPlan     InteractionKind = "plan"     // permission request for a switch_mode tool call (plan approval)
	KindApproval InteractionKind = "approval" // any other session/request_permission
)

// Owner is who acts on the engine: the credential behind an MCP call, and
// the owner it acts for. A session belongs to the owner that created it:
// the engine lets only that owner's credentials act on it, and shows it
// only to them, unless the caller's Access reaches further.
type Owner struct {
	TokenID   string
	TokenName string
	// ID is the owner the credential acts for (a token's owner, a JWT's
	// "jwt:<sub>"); credentials with the same ID share their sessions.
	// Empty means TokenID.
	ID string
	// MCPSession is the MCP session id of the caller, where events for the
	// sessions it creates, or sends to as their owner, are pushed.
	MCPSession string
	// Scopes are the caller's credential's scopes: a JWT's as of its latest
	// call, kept for the tokens minted for its sessions' agents, which may
	// hold no more.
	Scopes []string
	// Quota is the credential whose per-token quotas the sessions this
	// caller creates count against: the top of a derived token's chain.
	// Empty means TokenID.
	Quota string
	// Roots are the token's own directory trees: the sessions it creates
	// must lie inside one of them as well as inside Config.Roots. Nil
	// means Config.Roots alone.
	Roots []string
	// Expires and Issued are the caller's credential's (a JWT's exp and
	// iat). The tokens the gateway derives for the agents of the sessions
	// it creates expire no later, and a revocation of the credential's
	// subject after Issued applies to them.
	Expires, Issued *time.Time
	// OtherSessions is how far the caller's sessions verbs reach into
	// other owners' sessions; OtherInteractions the same for pending and
	// answer. The zero value reaches only the caller's own owner's.
	OtherSessions, OtherInteractions Access
	// Credential is what the node that runs a session for another replica
	// of a cluster verifies itself to know the caller (package
	// clustersessions): a JWT principal's access token, or the capability
	// of a session page's link. Empty for a token of the store, which that
	// node looks up by TokenID. The engine never stores, logs or shows it.
	Credential string
}

// OwnerID is the owner o acts for: ID, or TokenID when ID is empty.
func (o Owner) OwnerID() string {
	if o.ID != "" {
		return o.ID
	}
	return o.TokenID
}

// QuotaID is the credential whose quotas o's new sessions count against.
func (o Owner) QuotaID() string {
	if o.Quota != "" {
		return o.Quota
	}
	return o.TokenID
}

// Access is how far a caller reaches into other owners' sessions.
type Access uint8

const (
	// AccessOwn reaches only the caller's owner's sessions.
	AccessOwn Access = iota
	// AccessRead also reads every owner's sessions (list, read,
	// transcript, wait, events; pending), but acts only on its owner's: a
	// host whose every token is one person's (share_sessions), or a
	// session page, which a link bound to one session opens.
	AccessRead
	// AccessAll also acts on them (send, steer, cancel; answer): a token
	// with scope sessions:any (interactions:any).
	AccessAll
)

// Environment says where a session's agent runs.
type Environment struct {
	// Kind is "local" (run in Cwd) or "worktree" (a new git worktree of the
	// repository at Cwd, on Branch).
	Kind   string `json:"kind"`
	Branch string `json:"branch,omitempty"`
}

// CreateRequest starts a session.
type CreateRequest struct {
	Cwd         string
	Prompt      string
	Agent       string // configured agent name; "" means the default agent
	Environment Environment
	Title       string // optional; default derived from the prompt
	// Tools and Subscribe make an orchestrator session (see the sessions
	// issue): Tools lists the sessions/interactions verbs its child token
	// may use; Subscribe delivers its workers' events to it as prompts.
	Tools     []string
	Subscribe bool
	// Base is where the session's agent reaches this gateway,
	// scheme://host:port: from the configured resource, or the listener
	// the request arrived on, never from the request's Host. The agent's
	// MCP server URLs (which carry tokens) and the session's link are built
	// on it. Empty gives the agent no MCP servers and the session no link.
	Base string
}

// Created is what create returns at once.
type Created struct {
	SessionID string `json:"sessionId"`
	Link      string `json:"link,omitempty"`
}

// SessionView is `read`.
type SessionView struct {
	SessionID   string    `json:"sessionId"`
	Title       string    `json:"title"`
	Cwd         string    `json:"cwd"`
	Agent       string    `json:"agent"`
	State       State     `json:"state"`
	LastMessage string    `json:"lastMessage"`
	Truncated   bool      `json:"truncated,omitempty"` // LastMessage was cut
	Turns       int       `json:"turns"`
	Queued      int       `json:"queued"`
	Error       string    `json:"error,omitempty"`
	Link        string    `json:"link,omitempty"`
	Created     time.Time `json:"created"`
	Updated     time.Time `json:"updated"`
	Worker      bool      `json:"worker,omitempty"` // created by the caller (list)
	// Foreign marks a session of another owner, which the caller sees by
	// share_sessions or sessions:any (list).
	Foreign bool `json:"foreign,omitempty"`
	// Unreachable marks, in a cluster, a session whose replica is not
	// alive: list shows it as its replica last wrote it to the cluster's
	// directory, and every verb on it answers that the replica does not
	// answer (ErrUnreachable) until it is back.
	Unreachable bool `json:"unreachable,omitempty"`
}

// Turn is one prompt and what the agent answered, for `transcript`.
type Turn struct {
	Index      int       `json:"index"`
	Prompt     string    `json:"prompt"`
	Answer     string    `json:"answer"`
	StopReason string    `json:"stopReason,omitempty"`
	Started    time.Time `json:"started"`
	Ended      time.Time `json:"ended,omitempty"`
}

// Event is a `<session-event>`: recorded with a sequence number so that
// `events` and `wait` see it, and pushed to the MCP session of the owner
// that created the session, or of the owner's credential that last sent
// to it.
type Event struct {
	Seq       int64       `json:"seq"`
	SessionID string      `json:"sessionId"`
	Status    EventStatus `json:"status"`
	Kind      string      `json:"kind"` // finished, failed, cancelled, needs-attention
	Summary   string      `json:"summary"`
	RequestID string      `json:"requestId,omitempty"`
	Time      time.Time   `json:"time"`
	// Target is the MCP session id the event is pushed to.
	Target string `json:"-"`
	// Owner is the owner of the session, who sees the event.
	Owner string `json:"-"`
	// Creator is the token that created the session, whose orchestrator,
	// if it has one, gets the event as a prompt (Engine.Relay).
	Creator string `json:"-"`
}

// Render is the text a model reads for ev:
// <session-event session="…" status="…" seq="…">summary</session-event>.
// Everything in it is escaped, so an agent's output cannot close the tag.
func (ev Event) Render() string {
	var b strings.Builder
	b.WriteString(`<session-event session="`)
	b.WriteString(html.EscapeString(ev.SessionID))
	b.WriteString(`" status="`)
	b.WriteString(html.EscapeString(string(ev.Status)))
	b.WriteString(`" seq="`)
	b.WriteString(strconv.FormatInt(ev.Seq, 10))
	b.WriteString(`"`)
	if ev.RequestID != "" {
		b.WriteString(` request="`)
		b.WriteString(html.EscapeString(ev.RequestID))
		b.WriteString(`"`)
	}
	b.WriteString(">")
	b.WriteString(html.EscapeString(ev.Summary))
	b.WriteString("</session-event>")
	return b.String()
}

// EventFilter selects events, newest first.
type EventFilter struct {
	SessionID string
	Status    EventStatus
	Text      string
	Since     int64 // only events with Seq > Since
	Limit     int   // default 20
}

// Interaction is a prompt waiting for an answer.
type Interaction struct {
	RequestID string          `json:"requestId"`
	SessionID string          `json:"sessionId"`
	Kind      InteractionKind `json:"kind"`
	Summary   string          `json:"summary"`
	// Payload: for a question, the message and requested schema; for a
	// plan, the plan text; for an approval, the tool call (title, kind,
	// input) and the options.
	Payload json.RawMessage `json:"payload"`
	Created time.Time       `json:"created"`
	// Unreachable marks, in a cluster, an interaction whose session's
	// replica is not alive: an answer is refused (ErrUnreachable) while
	// it is away, and a replica that restarts has ended its interactions.
	Unreachable bool `json:"unreachable,omitempty"`
}

// Answer answers an interaction. For approvals and plans, OptionID names
// one of the offered ACP permission options (or Decision "allow"/"reject"
// picks the first option of that kind); for questions, Action is
// accept/decline/cancel and Content holds the answer fields.
type Answer struct {
	OptionID string          `json:"optionId,omitempty"`
	Decision string          `json:"decision,omitempty"`
	Action   string          `json:"action,omitempty"`
	Content  json.RawMessage `json:"content,omitempty"`
}

// Errors the engine returns; the MCP endpoint maps them to tool errors.
var (
	ErrNoSession       = errors.New("no such session")
	ErrNoInteraction   = errors.New("no such pending interaction")
	ErrAlreadyAnswered = errors.New("someone answered first")
	ErrNotRunning      = errors.New("session is not running")
	ErrEnded           = errors.New("session has ended")
	ErrBadRequest      = errors.New("bad request")
	// ErrNotOwner says the session belongs to another owner and the
	// caller's Access does not reach it. The message names no token.
	ErrNotOwner = errors.New("the session belongs to another owner")
	// ErrBusy says the gateway runs as many agent processes as it allows
	// (max_agents). It passes: idle agents stop after agent_idle_timeout.
	ErrBusy = errors.New("the gateway is at its agent limit")
	// ErrQuota says the calling token has as many live sessions
	// (max_sessions_per_token) or busy agents (max_agents_per_token) as
	// one token may; other tokens are not affected.
	ErrQuota = errors.New("the token is at its quota")
	// ErrUnreachable says the replica of a cluster that runs the session
	// does not answer; it comes with ErrNoSession, since as far as this
	// replica can tell the session is gone until its node is back.
	ErrUnreachable = errors.New("the replica that runs the session does not answer")
	// ErrCallerRefused says the replica of a cluster that runs the session
	// refused whom the request acts for: a token it does not know, or
	// knows revoked or expired, a JWT it does not take, or a claim of more
	// than the credential grants there.
	ErrCallerRefused = errors.New("the replica that runs the session refused the caller")
	// ErrDenied says a session's directory is, holds or is inside a path
	// of Config.Deny; it comes with ErrBadRequest.
	ErrDenied = errors.New("the gateway keeps this path from agents")
)

// Sessions is what the MCP endpoint needs from the engine. Every method is
// safe for concurrent use; none blocks longer than its ctx, except Wait,
// which returns at the latest after timeout. Each takes the caller, and
// refuses a session of another owner with ErrNotOwner unless the caller's
// Access reaches it: reading verbs need AccessRead, send, steer and cancel
// AccessAll in OtherSessions; pending and answer the same in
// OtherInteractions.
type Sessions interface {
	Create(ctx context.Context, owner Owner, req CreateRequest) (Created, error)
	// Send queues prompt; it runs at once when the session is idle.
	// queued reports whether it waits behind a running turn.
	Send(ctx context.Context, owner Owner, sessionID, prompt string) (queued bool, err error)
	// Steer injects guidance at the next turn boundary. mode is
	// "steering" when the agent's _session/steering extension took it, or
	// "queued-first" when it went to the head of the queue.
	Steer(ctx context.Context, owner Owner, sessionID, text string) (mode string, err error)
	// Cancel interrupts the running turn; pending interactions of the
	// session end as cancelled.
	Cancel(ctx context.Context, owner Owner, sessionID string) error
	Read(owner Owner, sessionID string, full bool) (SessionView, error)
	// List returns the sessions owner sees, newest first, at most limit,
	// and whether more exist. Worker is set on the ones owner's token
	// created.
	List(owner Owner, limit int) (list []SessionView, partial bool)
	Transcript(owner Owner, sessionID string, turns int, full bool) ([]Turn, error)
	// Wait returns once the session is idle, blocked, ended or errored, or
	// after timeout.
	Wait(ctx context.Context, owner Owner, sessionID string, timeout time.Duration) (SessionView, error)
	// Events returns the events of the sessions owner sees; a sessionID
	// in filter that owner does not reach gets ErrNotOwner.
	Events(owner Owner, filter EventFilter) ([]Event, error)
	// Pending lists the interactions of one session, or of every session
	// owner sees when sessionID is "".
	Pending(owner Owner, sessionID string) ([]Interaction, error)
	Answer(ctx context.Context, owner Owner, requestID string, answer Answer) error
	// Subscribe calls fn for every new event, in Seq order, until the
	// returned function is called. fn must not block.
	Subscribe(fn func(Event)) (unsubscribe func())
	// RevokeToken cancels the running sessions that tokenID created and
	// ends their pending interactions.
	RevokeToken(tokenID string)
}

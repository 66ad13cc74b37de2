package mcpendpoint

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/Tahul/caddy-zidane-mcp/policy"
	"github.com/Tahul/caddy-zidane-mcp/sessions"
)

// Output limits. The engine may apply them too; the endpoint enforces them
// whatever it gets back.
const (
	lastMessageChars  = 600  // read, list, wait: the last message unless full
	turnTextChars     = 1200 // transcript: each prompt and answer unless full
	listDefault       = 30
	listMax           = 100
	transcriptDefault = 10
	transcriptMax     = 50
	waitDefault       = 30 // seconds
	waitMax           = 50 // seconds: below common client request timeouts
	eventsDefault     = 20
	eventsMax         = 100
)

const serverInstructions = `This server runs coding-agent sessions on its host. Use the sessions tool to start one (verb create), give it more work (send, steer), stop it (cancel) and look at it (read, list, transcript, events). Sessions run in the background: after create or send, do not wait or poll. A <session-event session="…" status="…" seq="…">summary</session-event> notification arrives when a session finishes, fails or needs a decision; answer decisions with the interactions tool.`

// verb is one verb of a tool: its name and the arguments it takes, besides
// verb itself.
type verb struct {
	name string
	args []string
}

// verbsOf is tool's verbs as policy's table lists them, each with the
// arguments args gives it.
func verbsOf(tool string, args map[string][]string) []verb {
	var out []verb
	for _, name := range policy.VerbNames(tool) {
		out = append(out, verb{name: name, args: args[name]})
	}
	return out
}

// args are the arguments of one tool call, checked against the verb.
type args struct {
	tool string
	verb string
	m    map[string]json.RawMessage
}

// inputError is bad input; its message says what to do.
type inputError struct{ msg string }

func (e *inputError) Error() string { return e.msg }

func badInput(format string, a ...any) error {
	return &inputError{fmt.Sprintf(format, a...)}
}

func verbNames(verbs []verb) string {
	names := make([]string, len(verbs))
	for i, v := range verbs {
		names[i] = v.name
	}
	return strings.Join(names, ", ")
}

// parseArgs decodes raw, finds the verb, and refuses arguments the verb does
// not take, so a misspelt or misplaced argument is never silently ignored.
func parseArgs(tool string, raw json.RawMessage, verbs []verb) (*args, error) {
	a := &args{tool: tool, m: map[string]json.RawMessage{}}
	if len(bytes.TrimSpace(raw)) > 0 && !bytes.Equal(bytes.TrimSpace(raw), []byte("null")) {
		if err := json.Unmarshal(raw, &a.m); err != nil {
			return nil, badInput(`the arguments must be a JSON object, like {"verb": %q}`, verbs[0].name)
		}
	}
	rawVerb, ok := a.m["verb"]
	if !ok || isNull(rawVerb) {
		return nil, badInput("`verb` is required: set it to one of %s (the tool description says what each does)", verbNames(verbs))
	}
	if err := json.Unmarshal(rawVerb, &a.verb); err != nil {
		return nil, badInput("`verb` must be a string: one of %s", verbNames(verbs))
	}
	i := slices.IndexFunc(verbs, func(v verb) bool { return v.name == a.verb })
	if i < 0 {
		return nil, badInput("unknown verb %q for the %s tool: use one of %s", a.verb, tool, verbNames(verbs))
	}
	allowed := verbs[i].args
	var unknown []string
	for name := range a.m {
		if name != "verb" && !slices.Contains(allowed, name) {
			unknown = append(unknown, name)
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		takes := "no other argument"
		if len(allowed) > 0 {
			takes = strings.Join(allowed, ", ")
		}
		return nil, badInput("%s %s does not take `%s`; it takes: %s", tool, a.verb, strings.Join(unknown, "`, `"), takes)
	}
	return a, nil
}

func isNull(raw json.RawMessage) bool {
	return bytes.Equal(bytes.TrimSpace(raw), []byte("null"))
}

// present reports whether name was given a non-null value.
func (a *args) present(name string) bool {
	raw, ok := a.m[name]
	return ok && !isNull(raw)
}

// str returns the string argument name, "" when absent.
func (a *args) str(name string) (string, error) {
	if !a.present(name) {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(a.m[name], &s); err != nil {
		return "", badInput("`%s` must be a string; got %s", name, preview(a.m[name]))
	}
	return s, nil
}

// required returns the non-blank string argument name; hint says where a
// value comes from.
func (a *args) required(name, hint string) (string, error) {
	s, err := a.str(name)
	if err != nil {
		return "", err
	}
	if strings.TrimSpace(s) == "" {
		return "", badInput("`%s` is required for %s %s: %s", name, a.tool, a.verb, hint)
	}
	return s, nil
}

// boolean returns the boolean argument name, false when absent.
func (a *args) boolean(name string) (bool, error) {
	if !a.present(name) {
		return false, nil
	}
	var b bool
	if err := json.Unmarshal(a.m[name], &b); err != nil {
		return false, badInput("`%s` must be true or false; got %s", name, preview(a.m[name]))
	}
	return b, nil
}

// integer returns the whole-number argument name: def when absent, an error
// below lo, and hi with a note when above hi.
func (a *args) integer(name string, def, lo, hi int, unit string) (int, string, error) {
	if !a.present(name) {
		return def, "", nil
	}
	var n json.Number
	dec := json.NewDecoder(bytes.NewReader(a.m[name]))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err == nil {
		n, _ = v.(json.Number)
	}
	f, err := strconv.ParseFloat(string(n), 64)
	if n == "" || err != nil || f != math.Trunc(f) {
		span := fmt.Sprintf("from %d to %d%s", lo, hi, unit)
		if hi == math.MaxInt {
			span = fmt.Sprintf("of at least %d%s", lo, unit)
		}
		return 0, "", badInput("`%s` must be a whole number %s; got %s", name, span, preview(a.m[name]))
	}
	switch {
	case f < float64(lo):
		return 0, "", badInput("`%s` must be at least %d%s; got %s", name, lo, unit, n)
	case f > float64(hi):
		return hi, fmt.Sprintf("`%s` %s is above the maximum: used %d%s", name, n, hi, unit), nil
	}
	return int(f), "", nil
}

// stringList returns the array-of-strings argument name.
func (a *args) stringList(name string) ([]string, error) {
	if !a.present(name) {
		return nil, nil
	}
	var l []string
	if err := json.Unmarshal(a.m[name], &l); err != nil {
		return nil, badInput("`%s` must be an array of strings; got %s", name, preview(a.m[name]))
	}
	return l, nil
}

// object returns the JSON-object argument name, nil when absent.
func (a *args) object(name string) (json.RawMessage, error) {
	if !a.present(name) {
		return nil, nil
	}
	raw := bytes.TrimSpace(a.m[name])
	if len(raw) == 0 || raw[0] != '{' {
		return nil, badInput("`%s` must be a JSON object; got %s", name, preview(a.m[name]))
	}
	return raw, nil
}

// preview is a short rendering of a bad value for an error message.
func preview(raw json.RawMessage) string {
	s, _ := cut(string(bytes.TrimSpace(raw)), 60)
	return s
}

// cut returns s limited to n characters and whether it was cut.
func cut(s string, n int) (string, bool) {
	if utf8.RuneCountInString(s) <= n {
		return s, false
	}
	i := 0
	for j := range s {
		if i == n {
			return s[:j], true
		}
		i++
	}
	return s, false
}

// caller is who makes a tool call: the principal the edge authenticated,
// the engine's Owner for it, and the route's rules.
type caller struct {
	p      policy.Principal
	owner  sessions.Owner
	access Access
	// modern is set for a request without an MCP session (MCP
	// 2026-07-28, stateless): nothing is pushed to it, and its events are
	// at the session's events resource.
	modern bool
}

// callerOf is the caller of a tool call. The identity comes from the token
// info of this very HTTP request (go-sdk's RequestExtra), never from the
// handler's context, which belongs to the request that opened the session.
func callerOf(req *mcp.CallToolRequest) (caller, error) {
	return callerFrom(req.Extra, req.Session)
}

// callerFrom is the caller of any request, from its RequestExtra: the same
// reading for tool calls, resource reads and subscriptions, at every
// protocol version. ss is the request's MCP session: a 2025-11-25 client's,
// where its events are pushed, or the temporary session of a 2026-07-28
// POST, whose id is empty, so that such a caller moves no session's events.
func callerFrom(extra *mcp.RequestExtra, ss *mcp.ServerSession) (caller, error) {
	if extra == nil || extra.TokenInfo == nil || extra.TokenInfo.UserID == "" {
		return caller{}, errors.New("this call carries no authenticated caller; reconnect through the zidane_mcp edge with your token")
	}
	ti := extra.TokenInfo
	c := caller{owner: sessions.Owner{TokenID: ti.UserID}}
	c.access, _ = ti.Extra["access"].(Access)
	if p, ok := ti.Extra["principal"].(policy.Principal); ok {
		c.p = p
		c.owner = OwnerOf(p, c.access.ShareSessions)
		c.owner.Credential, _ = ti.Extra["jwt"].(string)
	}
	if ss != nil {
		c.owner.MCPSession = ss.ID()
	}
	c.modern = c.owner.MCPSession == ""
	return c, nil
}

// OwnerOf is the engine's Owner for the principal p, on a host that
// shares sessions (share_sessions) when share is set: its owner, quota,
// scopes, roots and lifetime, and how far its verbs reach into other
// owners' sessions. Every caller of the endpoint is made so, and the node
// of a cluster that runs a session for another replica makes its caller
// so again, from the principal it establishes itself (package
// clustersessions).
func OwnerOf(p policy.Principal, share bool) sessions.Owner {
	return sessions.Owner{
		TokenID: p.TokenID, TokenName: p.Name, ID: p.OwnerID(), Quota: p.QuotaID(),
		Scopes: p.Scopes, Expires: p.Expires, Issued: p.Issued, Roots: p.Roots,
		OtherSessions:     reach(p, "sessions", share),
		OtherInteractions: reach(p, "interactions", share),
	}
}

// reach is how far p's verbs of tool reach into other owners' sessions: all
// of them with tool's any-owner scope, reading them on a host that shares
// sessions, else only p's owner's.
func reach(p policy.Principal, tool string, share bool) sessions.Access {
	switch {
	case p.Kind != policy.KindMachine && p.HasScope(policy.AnyOwnerScope(tool)):
		return sessions.AccessAll
	case share:
		return sessions.AccessRead
	}
	return sessions.AccessOwn
}

// reply is what a verb answers: a short text for the model and the same
// outcome as structured content.
type reply struct {
	text string
	data any
}

// result turns a verb's outcome into a tool result. Errors become isError
// results with a message that says what to do, never protocol errors.
func result(r reply, err error) *mcp.CallToolResult {
	if err != nil {
		code := errorCode(err)
		return &mcp.CallToolResult{
			IsError:           true,
			Content:           []mcp.Content{&mcp.TextContent{Text: err.Error()}},
			StructuredContent: map[string]string{"error": code, "message": err.Error()},
		}
	}
	return &mcp.CallToolResult{
		Content:           []mcp.Content{&mcp.TextContent{Text: r.text}},
		StructuredContent: r.data,
	}
}

// errorCode is a stable name for an error, for callers that branch on it.
func errorCode(err error) string {
	var ie *inputError
	switch {
	case errors.As(err, &ie):
		return "bad_input"
	case errors.Is(err, sessions.ErrUnreachable):
		return "node_unreachable"
	case errors.Is(err, sessions.ErrNoSession):
		return "no_session"
	case errors.Is(err, sessions.ErrNoInteraction):
		return "no_interaction"
	case errors.Is(err, sessions.ErrAlreadyAnswered):
		return "already_answered"
	case errors.Is(err, sessions.ErrNotRunning):
		return "not_running"
	case errors.Is(err, sessions.ErrEnded):
		return "ended"
	case errors.Is(err, sessions.ErrDenied):
		return "denied_path"
	case errors.Is(err, sessions.ErrBadRequest):
		return "bad_request"
	case errors.Is(err, sessions.ErrBusy):
		return "busy"
	case errors.Is(err, sessions.ErrQuota):
		return "quota"
	case errors.Is(err, sessions.ErrNotOwner):
		return "not_owner"
	case errors.Is(err, sessions.ErrCallerRefused):
		return "caller_refused"
	case errors.Is(err, errToolsBeyondScope):
		return "tools_beyond_scope"
	default:
		return "engine"
	}
}

// engineError is err from the engine, worded for the model that acted on
// id (a session id or a request id) with verb.
type engineError struct {
	err error
	msg string
}

func (e *engineError) Error() string { return e.msg }
func (e *engineError) Unwrap() error { return e.err }

func explain(err error, verb, id string) error {
	return explainOn("sessions", err, verb, id)
}

// explainOn is explain for a verb of tool, which names the scope that
// reaches other owners' sessions with that tool.
func explainOn(tool string, err error, verb, id string) error {
	var msg string
	switch {
	case errors.Is(err, sessions.ErrNotOwner):
		subject := fmt.Sprintf("session %q belongs to another owner", id)
		if verb == "answer" {
			subject = fmt.Sprintf("interaction %q is of a session that belongs to another owner", id)
		}
		msg = fmt.Sprintf("%s, so you may not %s it: only the tokens of the owner who created the session may. "+
			"A token with scope %s reaches every owner's sessions with the verbs it holds; on a host where one person holds every token, "+
			"the operator can set share_sessions to let every token read them. Ask the operator if you should have either",
			subject, verb, policy.AnyOwnerScope(tool))
	case errors.Is(err, sessions.ErrUnreachable):
		what := "session"
		if verb == "answer" {
			what = "interaction"
		}
		msg = fmt.Sprintf("%s %q runs on replica %q, which does not answer (it is down, or restarting); try again once it is back, or create a new session", what, id, sessions.NodeOf(id))
	case errors.Is(err, sessions.ErrCallerRefused):
		msg = fmt.Sprintf("replica %q, which runs %q, refused to act for you: %v", sessions.NodeOf(id), id, err)
	case errors.Is(err, sessions.ErrNoSession):
		msg = fmt.Sprintf("no session %q: check the id with sessions list", id)
	case errors.Is(err, sessions.ErrEnded):
		msg = fmt.Sprintf("session %q has ended (its agent process is gone), so it cannot %s: read it for its last state, or create a new session", id, verb)
	case errors.Is(err, sessions.ErrNotRunning):
		msg = fmt.Sprintf("session %q is not running, so there is nothing to %s: use send to give it a new prompt", id, verb)
	case errors.Is(err, sessions.ErrNoInteraction):
		msg = fmt.Sprintf("no pending interaction %q: it was answered, cancelled, or never existed; call interactions pending for what still waits", id)
	case errors.Is(err, sessions.ErrAlreadyAnswered):
		msg = fmt.Sprintf("someone answered %q first, and their answer stands; yours was not applied. Call interactions pending for what still waits", id)
	case errors.Is(err, sessions.ErrBadRequest):
		msg = fmt.Sprintf("the session engine refused to %s: %v; fix the arguments and call again", verb, err)
	case errors.Is(err, sessions.ErrBusy), errors.Is(err, sessions.ErrQuota):
		msg = fmt.Sprintf("cannot %s now: %v", verb, err)
	default:
		msg = fmt.Sprintf("the session engine failed to %s %s: %v; try again, and read the session if it persists", verb, id, err)
	}
	return &engineError{err: err, msg: msg}
}

// withNotes puts notes (such as a clamped limit) in front of text.
func withNotes(text string, notes []string) string {
	if len(notes) == 0 {
		return text
	}
	return "Note: " + strings.Join(notes, "; ") + ".\n" + text
}

// notes collects the non-empty notes.
func notes(ns ...string) []string {
	var out []string
	for _, n := range ns {
		if n != "" {
			out = append(out, n)
		}
	}
	return out
}

// JSON Schema builders for the tools' input schemas.

func schemaString(desc string) map[string]any {
	return map[string]any{"type": "string", "description": desc}
}

func schemaEnum(desc string, values ...string) map[string]any {
	return map[string]any{"type": "string", "enum": values, "description": desc}
}

func schemaBool(desc string) map[string]any {
	return map[string]any{"type": "boolean", "description": desc}
}

func schemaInt(desc string, lo, hi int) map[string]any {
	return map[string]any{"type": "integer", "minimum": lo, "maximum": hi, "description": desc}
}

// errToolsBeyondScope marks a create whose tools the caller may not call.
var errToolsBeyondScope = errors.New("tools beyond the caller's scopes")

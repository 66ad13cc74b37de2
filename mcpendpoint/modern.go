package mcpendpoint

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/Tahul/caddy-zidane-mcp/message"
	"github.com/Tahul/caddy-zidane-mcp/policy"
	"github.com/Tahul/caddy-zidane-mcp/sessions"
)

// MCP 2026-07-28 (stateless) beside 2025-11-25 (stateful): see doc.go.

const (
	// ModernVersion is the first protocol version served statelessly.
	ModernVersion = "2026-07-28"
	// protocolVersionHeader names the request's protocol version.
	protocolVersionHeader = "Mcp-Protocol-Version"

	// eventsURIPrefix and eventsURISuffix frame a session's events
	// resource: zidane://sessions/<id>/events.
	eventsURIPrefix = "zidane://sessions/"
	eventsURISuffix = "/events"
	// EventsURITemplate is the resource template of the sessions' events.
	EventsURITemplate = eventsURIPrefix + "{sessionId}" + eventsURISuffix

	// MaxListensPerToken bounds the subscriptions/listen streams one token
	// holds open at once on this endpoint.
	MaxListensPerToken = 16
	// MaxURIsPerListen bounds the resources one subscriptions/listen
	// stream subscribes to: the default max_sessions_per_token.
	MaxURIsPerListen = 100
	// updateQueue bounds the resource updates waiting to be sent. When
	// listeners are so slow that it fills, an update is dropped: the event
	// stays in the engine's log for `events`, `wait` and resources/read.
	updateQueue = 1024
)

// EventsURI is the events resource of session id.
func EventsURI(id string) string { return eventsURIPrefix + id + eventsURISuffix }

// sessionOfEventsURI is the session id of an events resource URI, in the one
// spelling EventsURI gives: no percent-encoding, query, fragment, dot
// segment or other case, so that two spellings never name one session and
// the URI a subscription was authorized for is the one its updates carry.
func sessionOfEventsURI(uri string) (string, bool) {
	id, ok := strings.CutPrefix(uri, eventsURIPrefix)
	if !ok {
		return "", false
	}
	if id, ok = strings.CutSuffix(id, eventsURISuffix); !ok || id == "" || len(id) > 128 {
		return "", false
	}
	for _, r := range id {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-' || r == '.') {
			return "", false
		}
	}
	// A dot only as a cluster's session ids have it, before their node.
	if strings.Contains(id, ".") && sessions.NodeOf(id) == "" {
		return "", false
	}
	return id, true
}

// isModern reports whether r is served statelessly: its
// Mcp-Protocol-Version is 2026-07-28 or later, compared as go-sdk compares
// versions. Every 2026-07-28 request carries the header (the edge refuses
// one whose _meta names a version without it, -32020); anything else, an
// initialize without the header included, is 2025-11-25's.
func isModern(r *http.Request) bool {
	v := r.Header.Get(protocolVersionHeader)
	return v != "" && v >= ModernVersion
}

// newModernServer is the go-sdk server of 2026-07-28 requests: the same
// tools, and the sessions' events as resources a client subscribes to
// through subscriptions/listen. It declares no logging and no
// claude/channel: nothing is pushed to a stateless request.
func (e *Endpoint) newModernServer() *mcp.Server {
	s := mcp.NewServer(&mcp.Implementation{
		Name:    "zidane-sessions",
		Title:   "Coding-agent sessions",
		Version: "1",
	}, &mcp.ServerOptions{
		Instructions: modernInstructions,
		// go-sdk logs a session's connection and end at info: once per
		// POST here, which would bury the log.
		Logger: quietLogger(e.log),
		// Resource subscriptions come only through subscriptions/listen,
		// which the gate authorized (see modernGate); a bare
		// resources/subscribe never reaches here.
		SubscribeHandler: func(ctx context.Context, req *mcp.SubscribeRequest) error {
			if allowed, _ := ctx.Value(listenKey{}).(map[string]bool); req.Params != nil && allowed[req.Params.URI] {
				return nil
			}
			return refused("subscribe_refused", "subscribe to a session's events with subscriptions/listen (notifications.resourceSubscriptions)")
		},
		UnsubscribeHandler: func(context.Context, *mcp.UnsubscribeRequest) error { return nil },
	})
	tool := sessionsTool(e.agents)
	tool.Description = modernDescription(tool.Description)
	s.AddTool(tool, e.callSessions)
	s.AddTool(interactionsTool(), e.callInteractions)
	s.AddResourceTemplate(&mcp.ResourceTemplate{
		URITemplate: EventsURITemplate,
		Name:        "session-events",
		Title:       "A session's events",
		Description: "The latest events of one coding-agent session, newest first, as `sessions events` returns them. " +
			"Subscribe to it with subscriptions/listen to be told of each new one (notifications/resources/updated), then read it.",
		MIMEType: "application/json",
	}, e.readEvents)
	s.AddReceivingMiddleware(e.modernGate)
	return s
}

// modernDescription is the sessions tool's description for a 2026-07-28
// client, to which nothing is pushed: events are told through the
// session's events resource.
func modernDescription(d string) string {
	for _, r := range [][2]string{
		{"You will receive a <session-event> when the session finishes, fails or needs a decision; carry on with other work meanwhile.",
			"Its events are the resource create returns as eventsResource (zidane://sessions/<sessionId>/events): subscribe to it with subscriptions/listen to be told when the session finishes, fails or needs a decision, then read it; carry on with other work meanwhile."},
		{"Only when you have nothing else to do: <session-event> notifications make polling unnecessary.",
			"Only when you have nothing else to do and listen to no events resource: a subscription makes polling unnecessary."},
	} {
		d = strings.Replace(d, r[0], r[1], 1)
	}
	return d
}

const modernInstructions = `This server runs coding-agent sessions on its host. Use the sessions tool to start one (verb create), give it more work (send, steer), stop it (cancel) and look at it (read, list, transcript, events). Sessions run in the background. Each session's events are the resource zidane://sessions/<sessionId>/events: subscribe to it with subscriptions/listen to be told when the session finishes, fails or needs a decision, then read it. Without a subscription, call sessions wait when you have nothing else to do. Answer decisions with the interactions tool.`

// quietLogger is log without its records below warning.
func quietLogger(log *slog.Logger) *slog.Logger {
	return slog.New(minLevel{log.Handler()})
}

type minLevel struct{ slog.Handler }

func (h minLevel) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= slog.LevelWarn && h.Handler.Enabled(ctx, l)
}
func (h minLevel) WithAttrs(as []slog.Attr) slog.Handler { return minLevel{h.Handler.WithAttrs(as)} }
func (h minLevel) WithGroup(g string) slog.Handler       { return minLevel{h.Handler.WithGroup(g)} }

// listenKey carries, in a subscriptions/listen request's context, the
// resource URIs the gate authorized for it.
type listenKey struct{}

// listens counts the open subscriptions/listen streams, per token and per
// session subscribed to.
type listens struct {
	mu       sync.Mutex
	perToken map[string]int
	perID    map[string]int  // session id → streams subscribed to its events
	cancel   map[*int]func() // open streams, ended by Close
	closed   bool
}

func newListens() *listens {
	return &listens{perToken: map[string]int{}, perID: map[string]int{}, cancel: map[*int]func(){}}
}

// open registers a stream of token subscribed to ids; release ends it.
func (l *listens) open(token string, ids []string, cancel func()) (release func(), err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil, errors.New("the sessions endpoint is shutting down: listen again in a moment")
	}
	if l.perToken[token] >= MaxListensPerToken {
		return nil, &jsonrpc.Error{Code: message.CodeRateLimited, Message: fmt.Sprintf(
			"this token already holds %d subscriptions/listen streams on this endpoint, the most it may: close one, or subscribe one stream to several sessions (up to %d)",
			MaxListensPerToken, MaxURIsPerListen), Data: reasonData("listen_limit")}
	}
	l.perToken[token]++
	for _, id := range ids {
		l.perID[id]++
	}
	key := new(int)
	l.cancel[key] = cancel
	var once sync.Once
	return func() {
		once.Do(func() {
			l.mu.Lock()
			defer l.mu.Unlock()
			delete(l.cancel, key)
			if l.perToken[token]--; l.perToken[token] <= 0 {
				delete(l.perToken, token)
			}
			for _, id := range ids {
				if l.perID[id]--; l.perID[id] <= 0 {
					delete(l.perID, id)
				}
			}
		})
	}, nil
}

// listened reports whether a stream is subscribed to session id's events.
func (l *listens) listened(id string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.perID[id] > 0
}

// count is the number of open streams.
func (l *listens) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.cancel)
}

// closeAll ends every stream and refuses new ones.
func (l *listens) closeAll() {
	l.mu.Lock()
	l.closed = true
	var ends []func()
	for _, end := range l.cancel {
		ends = append(ends, end)
	}
	l.mu.Unlock()
	for _, end := range ends {
		end()
	}
}

func reasonData(reason string) json.RawMessage {
	raw, _ := json.Marshal(map[string]string{"reason": reason})
	return raw
}

// refused is a JSON-RPC refusal with the edge's code for 403.
func refused(reason, msg string) error {
	return &jsonrpc.Error{Code: message.CodeForbidden, Message: msg, Data: reasonData(reason)}
}

// modernGate is the receiving middleware of the 2026-07-28 server. It
// authorizes each resource a subscriptions/listen stream asks for, on the
// params go-sdk decoded and acts on, bounds the streams, and refuses the
// legacy resources/subscribe and resources/unsubscribe, which 2026-07-28
// replaced by subscriptions/listen.
func (e *Endpoint) modernGate(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		switch method {
		case "resources/subscribe", "resources/unsubscribe":
			return nil, refused("subscribe_refused",
				"this endpoint takes resource subscriptions through subscriptions/listen (MCP 2026-07-28): "+
					"list the resources in notifications.resourceSubscriptions, and end the stream to unsubscribe")
		case "subscriptions/listen":
			return e.listen(ctx, req, next)
		}
		return next(ctx, method, req)
	}
}

// listen authorizes and serves one subscriptions/listen stream.
func (e *Endpoint) listen(ctx context.Context, req mcp.Request, next mcp.MethodHandler) (mcp.Result, error) {
	ss, _ := req.GetSession().(*mcp.ServerSession)
	c, err := callerFrom(req.GetExtra(), ss)
	if err != nil {
		return nil, refused("unauthenticated", err.Error())
	}
	params, _ := req.GetParams().(*mcp.SubscriptionsListenParams)
	var uris []string
	if params != nil && params.Notifications != nil {
		uris = params.Notifications.ResourceSubscriptions
	}
	if len(uris) > MaxURIsPerListen {
		return nil, &jsonrpc.Error{Code: message.CodeRateLimited, Message: fmt.Sprintf(
			"subscriptions/listen asks for %d resources; one stream takes at most %d: split them over streams", len(uris), MaxURIsPerListen),
			Data: reasonData("listen_limit")}
	}
	allowed := make(map[string]bool, len(uris))
	var ids []string
	for _, uri := range uris {
		if allowed[uri] {
			continue
		}
		id, err := e.authorizeEvents(c, uri)
		if err != nil {
			return nil, err
		}
		allowed[uri] = true
		ids = append(ids, id)
	}
	ctx, cancel := context.WithCancel(context.WithValue(ctx, listenKey{}, allowed))
	defer cancel()
	release, err := e.listening.open(c.owner.TokenID, ids, cancel)
	if err != nil {
		return nil, err
	}
	defer release()
	return next(ctx, "subscriptions/listen", req)
}

// authorizeEvents decides whether c may see the events resource uri, as it
// decides `sessions events {sessionId}`: the route's scope map must grant
// c the events verb, and the engine must let c's owner read the session.
// It returns the session id.
func (e *Endpoint) authorizeEvents(c caller, uri string) (string, error) {
	id, ok := sessionOfEventsURI(uri)
	if !ok {
		// MCP's resource not found is Invalid Params since SEP-2164.
		return "", &jsonrpc.Error{Code: message.CodeInvalidParams, Message: fmt.Sprintf(
			"no resource %q on this endpoint: a session's events are %s, with the id that create or list returned", truncateURI(uri), EventsURITemplate),
			Data: reasonData("no_resource")}
	}
	if c.p.Kind == policy.KindMachine || !c.access.Scopes.GrantsVerb(c.p, "sessions", "events") {
		return "", refused("insufficient_scope", fmt.Sprintf(
			"token %q may not call sessions events, which a session's events resource needs: ask the operator for a token with scope read or chat (or sessions:events)", c.p.Name))
	}
	if _, err := e.engine.Read(c.owner, id, false); err != nil {
		err = explain(err, "read the events of", id)
		e.reportRefusal(c, &args{tool: "sessions", verb: "events", m: map[string]json.RawMessage{"sessionId": jsonString(id)}}, err)
		reason := errorCode(err)
		return "", refused(reason, err.Error())
	}
	return id, nil
}

func jsonString(s string) json.RawMessage {
	raw, _ := json.Marshal(s)
	return raw
}

// truncateURI keeps an unknown URI short in a message.
func truncateURI(uri string) string {
	s, cutNow := cut(uri, 200)
	if cutNow {
		s += "…"
	}
	return s
}

// readEvents serves resources/read of a session's events: what
// `sessions events {sessionId}` returns (its latest 20), authorized the
// same way, each event with its <session-event> text.
func (e *Endpoint) readEvents(ctx context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
	c, err := callerFrom(req.Extra, req.Session)
	if err != nil {
		return nil, refused("unauthenticated", err.Error())
	}
	id, err := e.authorizeEvents(c, req.Params.URI)
	if err != nil {
		return nil, err
	}
	r, err := e.events(ctx, c, &args{tool: "sessions", verb: "events", m: map[string]json.RawMessage{"sessionId": jsonString(id)}})
	if err != nil {
		return nil, refused(errorCode(err), err.Error())
	}
	// Each event as a 2025-11-25 client gets it pushed: the event and the
	// <session-event> text a model reads.
	res := r.data.(eventsResult)
	out := resourceEvents{Events: make([]eventData, len(res.Events)), Limit: res.Limit}
	for i, ev := range res.Events {
		out.Events[i] = eventData{Event: ev, Text: ev.Render()}
	}
	data, err := json.Marshal(out)
	if err != nil {
		return nil, err
	}
	return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{
		{URI: req.Params.URI, MIMEType: "application/json", Text: string(data)},
	}}, nil
}

// resourceEvents is the content of a session's events resource.
type resourceEvents struct {
	Events []eventData `json:"events"`
	Limit  int         `json:"limit"`
}

// queueUpdate hands session id's new event to the update sender, when a
// stream listens to it. It must not block: it runs in the engine's
// subscription.
func (e *Endpoint) queueUpdate(id string) {
	if !e.listening.listened(id) {
		return
	}
	select {
	case e.updates <- id:
	default:
		e.log.Warn("mcpendpoint: resource update queue full, event left in the engine's log", "session", id)
	}
}

// sendUpdates sends notifications/resources/updated to the streams that
// listen to each queued session's events, until Close.
func (e *Endpoint) sendUpdates() {
	defer e.wg.Done()
	for {
		select {
		case <-e.stopSweep:
			return
		case id := <-e.updates:
			ctx, cancel := context.WithTimeout(context.Background(), pushTimeout)
			if err := e.modern.ResourceUpdated(ctx, &mcp.ResourceUpdatedNotificationParams{URI: EventsURI(id)}); err != nil {
				e.log.Debug("mcpendpoint: resource update failed, event left in the engine's log", "session", id, "error", err)
			}
			cancel()
		}
	}
}

// Held is what the endpoint holds for MCP clients between their requests:
// go-sdk's live sessions of each server, the sessions events are pushed to
// (peers), the sessions the idle timeout tracks, and the open
// subscriptions/listen streams. A 2026-07-28 client with no request in
// flight adds to none of them.
type Held struct {
	LegacySessions, ModernSessions, Peers, IdleTracked, Listens int
}

// Held counts what the endpoint holds for MCP clients right now.
func (e *Endpoint) Held() Held {
	var st Held
	for range e.server.Sessions() {
		st.LegacySessions++
	}
	for range e.modern.Sessions() {
		st.ModernSessions++
	}
	e.mu.Lock()
	st.Peers = len(e.peers)
	e.mu.Unlock()
	st.IdleTracked = e.idle.Len()
	st.Listens = e.listening.count()
	return st
}

package passthrough

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/broker/answerlimit"
	connectlink "github.com/Tahul/caddy-zidane-mcp/broker/connect"
	"github.com/Tahul/caddy-zidane-mcp/broker/sessionid"
	"github.com/Tahul/caddy-zidane-mcp/broker/upstream"
	"github.com/Tahul/caddy-zidane-mcp/broker/upstreamauth"
	"github.com/Tahul/caddy-zidane-mcp/message"
	"github.com/Tahul/caddy-zidane-mcp/policy"
	"github.com/Tahul/caddy-zidane-mcp/storage"
)

// A person who has not connected their own account at a per_user upstream
// (credentials per_user) cannot reach it: the upstream's OAuth client
// refuses to send their requests ([upstreamauth.ConnectRequiredError])
// before any byte leaves, and nobody else's token may go instead. The
// route then answers the handshake and the listings itself, so that the
// client connects and meets the connect link at the first call that needs
// the upstream (a tool call, a prompt, a resource), where MCP's URL
// elicitation carries it:
//
//   - initialize (2025-11-25) gets the gateway's own answer with a pending
//     session ([pendingSession], sealed in the session id like an upstream
//     one); server/discover (2026-07-28) gets the gateway's own answer;
//   - the listings (tools, prompts, resources, templates) are empty, ping
//     is answered, notifications are taken (202);
//   - a GET stream is held until the person connects, and then carries
//     notifications/elicitation/complete for each of their elicitations and
//     notifications/tools/list_changed, so that a 2025-11-25 client retries
//     its call and lists again; a GET stream that comes once they have
//     connected, before the session started, carries the same first;
//   - once the person has connected, the first request of a pending session
//     starts the upstream session as them (initialize with the client's own
//     parameters, then notifications/initialized) and the pending session
//     goes on with it.
//
// Why the gateway answers, and with no upstream data: every byte the
// upstream gives needs a credential, and the only credential the caller
// may use is their own, which they do not have yet. Capabilities or lists
// seen by another person would be data obtained with that person's
// credential, and an empty list followed by list_changed once connected is
// what MCP offers for a list that changes. So the answers name only tools,
// with listChanged at 2025-11-25 (the GET stream carries it); a client
// learns the upstream's real capabilities when it initializes after
// connecting, or from the listings.

// Marks of a sealed session id's payload: an upstream's session id is
// visible ASCII (sessionid.Valid), so no upstream id starts with either.
const (
	// markURL heads an upstream session id whose client declared URL
	// elicitation in its initialize: a later call that needs its person
	// to connect gets -32042, where another client gets a tool error.
	markURL = '\x01'
	// markPending heads a pending session: JSON of [pendingSession].
	markPending = '\x02'
)

// pendingSession is a 2025-11-25 session the gateway answered the
// initialize of, for a person not connected yet: its id, and the client's
// initialize params, to start the upstream session with once connected.
type pendingSession struct {
	ID     string          `json:"i"`
	Params json.RawMessage `json:"p"`
	// URL: the client declared URL elicitation.
	URL bool `json:"u,omitempty"`
}

// maxPendingParams bounds the initialize params a pending session keeps,
// so that its sealed id stays within sessionid.MaxUpstream.
const maxPendingParams = 400

// legacyVersions are the versions before 2026-07-28 an initialize may ask
// for; another gets the latest of them, as the spec has a server answer.
var legacyVersions = []string{"2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"}

// pendingLifetime bounds how long a pending session's upstream session
// id is kept in storage: as long as a client keeps a session it does not
// use, at most.
const pendingLifetime = 24 * time.Hour

// maxPendingMemory bounds the pending sessions' upstream ids held in
// memory; past it the table starts again, and storage answers.
const maxPendingMemory = 4096

// holdFor bounds how long a GET stream of a person not connected is held;
// the client then opens it again.
const holdFor = 10 * time.Minute

// openPayload reads what a session id opened to: the upstream's session
// id, whether its client declared URL elicitation, or a pending session.
func openPayload(payload string) (upstreamSID string, url bool, pending *pendingSession) {
	switch {
	case payload == "":
		return "", false, nil
	case payload[0] == markURL:
		return payload[1:], true, nil
	case payload[0] == markPending:
		var ps pendingSession
		if json.Unmarshal([]byte(payload[1:]), &ps) != nil || ps.ID == "" {
			return "", false, nil
		}
		return "", ps.URL, &ps
	}
	return payload, false, nil
}

// initializeCall returns the params of the initialize r carries (its one
// message), and whether its client declares URL elicitation.
func initializeCall(r *http.Request) (params []byte, url bool) {
	b, ok := message.FromContext(r.Context())
	if !ok || b.Batch || len(b.Calls) != 1 || b.Calls[0].Method != "initialize" {
		return nil, false
	}
	caps, _ := message.Lookup(b.Calls[0].Params, []string{"capabilities"})
	return b.Calls[0].Params, connectlink.URLCapable(caps)
}

// onlyCall is the one call of a POST's body, as the edge read it.
func onlyCall(r *http.Request) (message.Call, bool) {
	b, ok := message.FromContext(r.Context())
	if !ok || b.Batch || len(b.Calls) != 1 {
		return message.Call{}, false
	}
	return b.Calls[0], true
}

// unconnected answers ex, which could not be sent because the calling
// person has not connected their account at the upstream.
func (pt *PassThrough) unconnected(w http.ResponseWriter, r *http.Request, p policy.Principal, ex exchange, cre *upstreamauth.ConnectRequiredError) {
	switch r.Method {
	case http.MethodGet:
		pt.hold(w, r, p, ex)
		return
	case http.MethodDelete:
		// Nothing upstream to end: the session never reached it.
		w.WriteHeader(http.StatusOK)
		return
	}
	c, single := onlyCall(r)
	if !single {
		pt.connect(w, r, ex.rpcID, ex.method, cre, ex.initCaps())
		return
	}
	modern := c.HasMetaVersion && c.MetaVersion >= message.ModernVersion
	result := func(v map[string]any) {
		if modern {
			v["resultType"] = "complete"
		}
		writeJSON(w, http.StatusOK, nil, map[string]any{"jsonrpc": "2.0", "id": c.ID.Raw(), "result": v})
	}
	switch {
	case c.ID.IsZero() && c.Method != "":
		w.WriteHeader(http.StatusAccepted)
	case c.Method == "initialize" && !modern:
		pt.initializePending(w, r, p, c)
	case c.Method == "server/discover" && pt.legacy.Load():
		// The upstream answered another person's server/discover
		// without 2026-07-28: the client must take the initialize of
		// 2025-11-25 (a pending session) rather than learn a version its
		// calls could not use once connected.
		writeJSON(w, http.StatusOK, nil, map[string]any{"jsonrpc": "2.0", "id": c.ID.Raw(), "error": map[string]any{
			"code": message.CodeMethodNotFound, "message": fmt.Sprintf("%s speaks no 2026-07-28: initialize with 2025-11-25", pt.name)}})
	case c.Method == "server/discover":
		result(map[string]any{"supportedVersions": []string{message.ModernVersion},
			"capabilities": map[string]any{"tools": map[string]any{}}, "instructions": pt.notConnectedInstructions()})
	case c.Method == "ping":
		result(map[string]any{})
	case c.Method == "tools/list":
		result(map[string]any{"tools": []any{}})
	case c.Method == "prompts/list":
		result(map[string]any{"prompts": []any{}})
	case c.Method == "resources/list":
		result(map[string]any{"resources": []any{}})
	case c.Method == "resources/templates/list":
		result(map[string]any{"resourceTemplates": []any{}})
	default:
		pt.connect(w, r, ex.rpcID, ex.method, cre, ex.initCaps())
	}
}

func (pt *PassThrough) notConnectedInstructions() string {
	return fmt.Sprintf("The tools of %s act with your own account there, which is not connected to this gateway yet: the first call that needs it gives you a link to connect it.", pt.name)
}

// initializePending answers an initialize itself: the gateway's answer and
// a pending session.
func (pt *PassThrough) initializePending(w http.ResponseWriter, r *http.Request, p policy.Principal, c message.Call) {
	params, url := initializeCall(r)
	version := legacyVersions[0]
	if v, ok := message.Lookup(params, []string{"protocolVersion"}); ok {
		if s, isString, ok := message.Scalar(v); ok && isString && slices.Contains(legacyVersions, s) {
			version = s
		}
	}
	id := make([]byte, 16)
	rand.Read(id)
	ps := pendingSession{ID: base64.RawURLEncoding.EncodeToString(id), Params: trimParams(params, version), URL: url}
	payload, _ := json.Marshal(ps)
	if len(payload) >= sessionid.MaxUpstream {
		// Escaping grew the params past what a sealed id holds.
		ps.Params = trimParams(nil, version)
		payload, _ = json.Marshal(ps)
	}
	sid := pt.ids.Seal(string(markPending)+string(payload), p.TokenID, pt.route)
	writeJSON(w, http.StatusOK, http.Header{upstream.HeaderSessionID: {sid}}, map[string]any{"jsonrpc": "2.0", "id": c.ID.Raw(), "result": map[string]any{
		"protocolVersion": version,
		"capabilities":    map[string]any{"tools": map[string]any{"listChanged": true}},
		"serverInfo":      map[string]any{"name": pt.name, "version": "not connected"},
		"instructions":    pt.notConnectedInstructions(),
	}})
}

// trimParams keeps a client's initialize params for its upstream session,
// within maxPendingParams: whole when they fit, else their version,
// capabilities and client info, else the version and the client's name
// alone (the upstream then sees a client with no capabilities: it sends
// it no requests of its own).
func trimParams(params []byte, version string) json.RawMessage {
	var buf bytes.Buffer
	if json.Compact(&buf, params) == nil && buf.Len() <= maxPendingParams {
		return buf.Bytes()
	}
	var p struct {
		Capabilities json.RawMessage `json:"capabilities"`
		ClientInfo   struct {
			Name    string `json:"name"`
			Version string `json:"version"`
		} `json:"clientInfo"`
	}
	_ = json.Unmarshal(params, &p)
	if len(p.Capabilities) == 0 || buf.Len() == 0 {
		p.Capabilities = json.RawMessage("{}")
	}
	b, _ := json.Marshal(map[string]any{"protocolVersion": version, "capabilities": p.Capabilities, "clientInfo": p.ClientInfo})
	if len(b) <= maxPendingParams {
		return b
	}
	if len(p.ClientInfo.Name) > 64 {
		p.ClientInfo.Name = p.ClientInfo.Name[:64]
	}
	b, _ = json.Marshal(map[string]any{"protocolVersion": version, "capabilities": map[string]any{},
		"clientInfo": map[string]string{"name": p.ClientInfo.Name, "version": "?"}})
	return b
}

// hold holds the GET stream of a person not connected until they connect
// (or holdFor passes, or the client goes), and then tells the client:
// notifications/elicitation/complete for each of their elicitations at
// the upstream, and notifications/tools/list_changed. The stream then
// goes on as the session's: the upstream's own GET stream, now as the
// person, relayed event by event, or, where the upstream has none, a
// quiet stream until holdFor. It is not ended at once, since a client
// (go-sdk's) takes a stream that ends as one to open again, and may have
// no retries left for it.
func (pt *PassThrough) hold(w http.ResponseWriter, r *http.Request, p policy.Principal, ex exchange) {
	if pt.connected == nil {
		upstream.WriteRPCError(w, http.StatusMethodNotAllowed, nil, message.CodeInvalidRequest,
			fmt.Sprintf("your account at %s is not connected; this stream opens once it is", pt.name))
		return
	}
	flush, ok := openEvents(w, ex)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), holdFor)
	defer cancel()
	// A connection since the request began counts: the person was not
	// connected when it was refused.
	ids, ok := pt.connected(ctx, r, ex.start)
	if !ok {
		return
	}
	if !pt.tell(ctx, w, ids, flush) {
		return
	}
	sid := ex.upstreamSID
	if ex.pending != nil {
		var err error
		if sid, _, err = pt.startPending(r, p, ex.pending); err != nil {
			<-ctx.Done()
			return
		}
	}
	pt.relay(ctx, w, r, sid, flush)
}

// startedStream serves the GET stream of a pending session that started
// during it, its person connected: it tells of their elicitations and the
// changed list, then relays the upstream's stream of the session.
func (pt *PassThrough) startedStream(w http.ResponseWriter, r *http.Request, ex exchange) {
	flush, ok := openEvents(w, ex)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), holdFor)
	defer cancel()
	var ids []string
	if pt.elicitations != nil {
		ids = pt.elicitations(ctx, r)
	}
	if pt.tell(ctx, w, ids, flush) {
		pt.relay(ctx, w, r, ex.upstreamSID, flush)
	}
}

// openEvents answers 200 with an event stream, flushed; flush flushes
// later writes.
func openEvents(w http.ResponseWriter, ex exchange) (flush func() error, ok bool) {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	if ex.clientSID != "" {
		h.Set(upstream.HeaderSessionID, ex.clientSID)
	}
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	flush = func() error {
		if err := rc.Flush(); err != nil && !errors.Is(err, http.ErrNotSupported) {
			return err
		}
		return nil
	}
	return flush, flush() == nil
}

// tell writes notifications/elicitation/complete for each of ids and
// notifications/tools/list_changed to a stream, so that a 2025-11-25
// client retries its calls and lists again.
func (pt *PassThrough) tell(ctx context.Context, w http.ResponseWriter, ids []string, flush func() error) bool {
	for _, id := range ids {
		w.Write(sseMessage(connectlink.CompleteNotification(id)))
	}
	w.Write(sseMessage([]byte(`{"jsonrpc":"2.0","method":"notifications/tools/list_changed"}`)))
	return ctx.Err() == nil && flush() == nil
}

// relay relays the upstream's GET stream of session sid until ctx ends;
// an upstream without one (or an upstream without sessions, sid "")
// leaves the stream open and quiet until then.
func (pt *PassThrough) relay(ctx context.Context, w http.ResponseWriter, r *http.Request, sid string, flush func() error) {
	if sid != "" {
		if resp, err := pt.send(r.WithContext(ctx), nil, sid); err == nil {
			defer resp.Body.Close()
			if resp.StatusCode == http.StatusOK && answerlimit.IsEventStream(resp.Header.Get("Content-Type")) {
				relayEvents(w, resp.Body, flush)
				return
			}
		}
	}
	<-ctx.Done()
}

// pendingRecord is what storage keeps of a pending session once its
// upstream session started: the upstream's id sealed to the token and
// the route (so storage alone does not give it), or none for an upstream
// without sessions.
type pendingRecord struct {
	Sealed  string    `json:"sealed,omitempty"`
	Expires time.Time `json:"expires"`
}

// pendingSessions keeps the upstream session id of each pending session
// whose upstream session started: in memory, and in storage for the
// other replicas.
type pendingSessions struct {
	mu    sync.Mutex
	m     map[string]string
	store storage.Storage
	// starting serializes the starts of this process when there is no
	// storage lock to: two requests of one pending session would start
	// two upstream sessions. A start happens once per pending session.
	starting sync.Mutex
}

func (pt *PassThrough) pendingKey(ps *pendingSession) string {
	sum := sha256.Sum256([]byte(pt.route + "\x00" + ps.ID))
	return "zidane/broker/pending/" + hex.EncodeToString(sum[:])
}

// lookup returns the upstream session id of ps, if it started.
func (pt *PassThrough) lookup(ctx context.Context, p policy.Principal, ps *pendingSession) (string, bool) {
	pt.pending.mu.Lock()
	sid, ok := pt.pending.m[ps.ID]
	pt.pending.mu.Unlock()
	if ok || pt.pending.store == nil {
		return sid, ok
	}
	raw, err := pt.pending.store.Load(ctx, pt.pendingKey(ps))
	var rec pendingRecord
	if err != nil || len(raw) > 4096 || json.Unmarshal(raw, &rec) != nil || !time.Now().Before(rec.Expires) {
		return "", false
	}
	if rec.Sealed != "" {
		if sid, err = pt.ids.Open(rec.Sealed, p.TokenID, pt.route); err != nil {
			return "", false
		}
	}
	pt.remember(ps, sid)
	return sid, true
}

// forget drops what is kept of ps: the client ended it.
func (pt *PassThrough) forget(ctx context.Context, ps *pendingSession) {
	pt.pending.mu.Lock()
	delete(pt.pending.m, ps.ID)
	pt.pending.mu.Unlock()
	if pt.pending.store != nil {
		_ = pt.pending.store.Delete(ctx, pt.pendingKey(ps))
	}
}

func (pt *PassThrough) remember(ps *pendingSession, sid string) {
	pt.pending.mu.Lock()
	defer pt.pending.mu.Unlock()
	if pt.pending.m == nil || len(pt.pending.m) >= maxPendingMemory {
		pt.pending.m = map[string]string{}
	}
	pt.pending.m[ps.ID] = sid
}

// startPending gives the pending session ps its upstream session, once
// its person has connected: the upstream's session id ("" for an upstream
// without sessions), and whether it had started before this call looked
// (before: not while the call waited for another to start it). A person
// still not connected gets the ConnectRequiredError, and nothing reached
// the upstream.
func (pt *PassThrough) startPending(r *http.Request, p policy.Principal, ps *pendingSession) (sid string, before bool, err error) {
	if sid, ok := pt.lookup(r.Context(), p, ps); ok {
		return sid, true, nil
	}
	if st := pt.pending.store; st != nil {
		// Its requests on this replica wait on each other in memory
		// (a client's GET stream and its first POST come together).
		unlock, err := storage.Lock(r.Context(), st, pt.pendingKey(ps))
		if err != nil {
			return "", false, fmt.Errorf("locking the pending session: %w", err)
		}
		defer unlock()
	} else {
		pt.pending.starting.Lock()
		defer pt.pending.starting.Unlock()
	}
	if sid, ok := pt.lookup(r.Context(), p, ps); ok {
		return sid, false, nil
	}
	version := legacyVersions[0]
	if v, ok := message.Lookup(ps.Params, []string{"protocolVersion"}); ok {
		if s, isString, ok := message.Scalar(v); ok && isString {
			version = s
		}
	}
	init, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": ps.Params})
	resp, err := pt.post(r.Context(), init, "", "")
	if err != nil {
		return "", false, err
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
	if err != nil {
		return "", false, err
	}
	if resp.StatusCode != http.StatusOK || !hasResult(body, resp.Header.Get("Content-Type")) {
		return "", false, fmt.Errorf("the upstream answered the initialize of a pending session with HTTP %d and no result", resp.StatusCode)
	}
	sid = resp.Header.Get(upstream.HeaderSessionID)
	if sid != "" && !sessionid.Valid(sid) {
		return "", false, errors.New("the upstream gave an invalid session id")
	}
	resp, err = pt.post(r.Context(), []byte(`{"jsonrpc":"2.0","method":"notifications/initialized"}`), sid, version)
	if err != nil {
		return "", false, err
	}
	io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return "", false, fmt.Errorf("the upstream refused notifications/initialized of a pending session with HTTP %d", resp.StatusCode)
	}
	if st := pt.pending.store; st != nil {
		rec := pendingRecord{Expires: time.Now().Add(pendingLifetime)}
		if sid != "" {
			rec.Sealed = pt.ids.Seal(sid, p.TokenID, pt.route)
		}
		b, _ := json.Marshal(rec)
		pt.prunePending(r.Context())
		if err := st.Store(r.Context(), pt.pendingKey(ps), b); err != nil {
			return "", false, fmt.Errorf("keeping the pending session's upstream session: %w", err)
		}
	}
	pt.remember(ps, sid)
	return sid, false, nil
}

// maxPrune bounds how many stored pending sessions one start looks at to
// delete the expired ones.
const maxPrune = 1000

// prunePending deletes expired pending sessions' records, looking at no
// more than maxPrune; failures are left for the next start.
func (pt *PassThrough) prunePending(ctx context.Context) {
	st := pt.pending.store
	keys, err := st.List(ctx, "zidane/broker/pending", false)
	if err != nil {
		return
	}
	now := time.Now()
	for i, key := range keys {
		if i == maxPrune || ctx.Err() != nil {
			return
		}
		raw, err := st.Load(ctx, key)
		var rec pendingRecord
		if err != nil || (len(raw) <= 4096 && json.Unmarshal(raw, &rec) == nil && now.Before(rec.Expires)) {
			continue
		}
		_ = st.Delete(ctx, key)
	}
}

// noteDiscover learns from the upstream's answer to a server/discover
// (another person's, connected) whether it speaks 2026-07-28: a result
// whose supportedVersions name it says it does; one that does not, an
// error, or HTTP 400, 404 or 405 say it does not. Only this process learns, and
// only the version: nothing of the answer reaches a person not
// connected.
func (pt *PassThrough) noteDiscover(resp *http.Response) {
	switch {
	case resp.StatusCode == http.StatusOK:
		// The answer (JSON, or an event stream that ends with it) is
		// read whole by answer or relayed event by event; it is looked
		// at as it goes.
		resp.Body = &discoverBody{ReadCloser: resp.Body, pt: pt}
	case resp.StatusCode == http.StatusBadRequest || resp.StatusCode == http.StatusNotFound || resp.StatusCode == http.StatusMethodNotAllowed:
		// What a server of 2025-11-25 answers a request without a
		// session, or a method it does not have. Another status (a
		// refused credential, an outage) says nothing of its versions.
		pt.legacy.Store(true)
	}
}

// discoverBody reads whether a JSON answer to server/discover held a
// result as answer reads it whole.
type discoverBody struct {
	io.ReadCloser
	pt  *PassThrough
	buf bytes.Buffer
}

func (d *discoverBody) Read(p []byte) (int, error) {
	n, err := d.ReadCloser.Read(p)
	if d.buf.Len() < 64<<10 {
		d.buf.Write(p[:n])
	}
	if err == io.EOF {
		modern := speaksModern(d.buf.Bytes())
		for _, line := range bytes.Split(d.buf.Bytes(), []byte("\n")) {
			if data, ok := bytes.CutPrefix(bytes.TrimRight(line, "\r"), []byte("data:")); ok && speaksModern(bytes.TrimSpace(data)) {
				modern = true
			}
		}
		d.pt.legacy.Store(!modern)
	}
	return n, err
}

// speaksModern reports whether an answer to server/discover is a result
// whose supportedVersions name 2026-07-28 (a server of 2025-11-25 may
// answer with its own versions, or with an error).
func speaksModern(answer []byte) bool {
	versions, ok := message.Lookup(answer, []string{"result", "supportedVersions"})
	if !ok {
		return false
	}
	var vs []string
	return json.Unmarshal(versions, &vs) == nil && slices.Contains(vs, message.ModernVersion)
}

// hasResult reports whether an answer (JSON, or an event stream of
// JSON-RPC messages) holds a result.
func hasResult(body []byte, contentType string) bool {
	if _, ok := message.Lookup(body, []string{"result"}); ok {
		return true
	}
	for _, line := range bytes.Split(body, []byte("\n")) {
		if data, ok := bytes.CutPrefix(bytes.TrimRight(line, "\r"), []byte("data:")); ok {
			if _, ok := message.Lookup(bytes.TrimSpace(data), []string{"result"}); ok {
				return true
			}
		}
	}
	return false
}

// post sends a message of the gateway's own to the upstream, as the
// calling person (ctx carries the principal the credentials act for).
func (pt *PassThrough) post(ctx context.Context, body []byte, sid, version string) (*http.Response, error) {
	ctx, cancel := context.WithTimeout(ctx, pt.headerTimeout)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, pt.endpoint, bytes.NewReader(body))
	if err != nil {
		cancel()
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if sid != "" {
		req.Header.Set(upstream.HeaderSessionID, sid)
	}
	if version != "" {
		req.Header.Set("Mcp-Protocol-Version", version)
	}
	resp, err := pt.client.Do(req)
	if err != nil {
		cancel()
		return nil, err
	}
	resp.Body = &cancelOnClose{ReadCloser: resp.Body, cancel: func(error) { cancel() }}
	return resp, nil
}

// ownAnswer tells the edge's writer, when it asks, that the answer is the
// gateway's own, with nothing of the upstream's in it: the edge's pins
// must not take it for what the upstream gives.
func ownAnswer(w http.ResponseWriter) {
	if o, ok := w.(interface{ OwnAnswer() }); ok {
		o.OwnAnswer()
	}
}

// withoutConnectState returns the body of one call with its
// params.requestState and params.inputResponses removed: they answer the
// gateway's connect elicitation, which the upstream never made, and an
// upstream that reads requestState (to go on with a call of its own)
// would take the gateway's for its. The rest of the message, which the
// edge decided on (the tool, its arguments, _meta), is as the client sent
// it. The body was read by package message, so its keys are unique and
// decoding it to maps and writing it back changes no value a reader
// sees.
func withoutConnectState(body []byte) ([]byte, error) {
	var msg map[string]json.RawMessage
	if err := json.Unmarshal(body, &msg); err != nil {
		return nil, err
	}
	var params map[string]json.RawMessage
	if err := json.Unmarshal(msg["params"], &params); err != nil {
		return nil, err
	}
	delete(params, "requestState")
	delete(params, "inputResponses")
	var err error
	if msg["params"], err = marshalPlain(params); err != nil {
		return nil, err
	}
	return marshalPlain(msg)
}

// marshalPlain is json.Marshal without HTML escaping, which would rewrite
// every <, > and & of the values kept.
func marshalPlain(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimRight(b.Bytes(), "\n"), nil
}

// writeJSON writes one JSON answer of the gateway's own.
func writeJSON(w http.ResponseWriter, status int, extra http.Header, v any) {
	ownAnswer(w)
	b, err := json.Marshal(v)
	if err != nil {
		upstream.WriteRPCError(w, http.StatusInternalServerError, nil, message.CodeInternalError, "the gateway could not write its answer")
		return
	}
	h := w.Header()
	for k, vs := range extra {
		h[k] = vs
	}
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	w.Write(b)
}

// URLElicitation reports whether the session that r names (its one
// Mcp-Session-Id, as issued to p on this route) declared URL elicitation
// at its initialize: what the gateway may answer a 2025-11-25 call of it
// with. A request without a session, or with one not p's, declares
// nothing.
func (pt *PassThrough) URLElicitation(r *http.Request, p policy.Principal) bool {
	values := r.Header.Values(upstream.HeaderSessionID)
	if len(values) != 1 {
		return false
	}
	payload, err := pt.ids.Open(values[0], p.TokenID, pt.route)
	if err != nil {
		return false
	}
	_, url, _ := openPayload(payload)
	return url
}

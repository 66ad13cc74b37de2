package message

// Call is what the edge reads of one JSON-RPC message.
type Call struct {
	// Method is the JSON-RPC method; "" for a response (a message with a
	// result or an error), which a client sends back to a server's request
	// (sampling, elicitation, roots).
	Method string
	// ID is the request id; zero for a notification.
	ID ID
	// Tool is params.name of tools/call (a non-empty string).
	Tool string
	// Verb is params.arguments.verb of tools/call, when present, for the
	// tools that take one (sessions, interactions).
	Verb string
	// Prompt is params.name of prompts/get.
	Prompt string
	// URI is params.uri of resources/read, resources/subscribe and
	// resources/unsubscribe.
	URI string
	// Ref is params.ref of completion/complete.
	Ref Ref

	// Spans of the body (sub-slices, not copies); nil when absent.

	// Raw is the whole message.
	Raw []byte
	// Params is the params value.
	Params []byte
	// Arguments is params.arguments of tools/call or prompts/get.
	Arguments []byte
	// Meta is params._meta, when params is an object.
	Meta []byte
	// Result is a response's result.
	Result []byte
	// Error is a response's error object.
	Error []byte

	// Cancelled is params.requestId of notifications/cancelled: the
	// request the client gives up on.
	Cancelled ID

	// InputResponses is set when the params of tools/call, prompts/get or
	// resources/read carry inputResponses or requestState (MCP 2026-07-28's
	// multi-round-trip request, SEP-2322).
	InputResponses bool
	// RequestState is that retry's params.requestState, when it is a
	// string: the opaque state a server (or the gateway) sealed. It is
	// read here so that whoever routes on it reads the one reading the
	// edge decided on.
	RequestState string

	// HasMetaVersion reports whether params._meta has the key
	// "io.modelcontextprotocol/protocolVersion" (MCP 2026-07-28's
	// per-request protocol version), and MetaVersion is its value when
	// that is a non-empty string ("" when it is anything else).
	HasMetaVersion bool
	MetaVersion    string

	// DeclaresTasks reports whether params._meta's client capabilities
	// ("io.modelcontextprotocol/clientCapabilities") name the Tasks
	// extension in their extensions (MCP 2026-07-28, SEP-2663).
	DeclaresTasks bool
	// TaskID is params.taskId of tasks/get, tasks/update and tasks/cancel
	// (a string), and TaskIDRaw its JSON string as the body spells it
	// (nil when absent).
	TaskID    string
	TaskIDRaw []byte
	// ListenTasks are the task ids a subscriptions/listen names in
	// params.notifications.taskIds (SEP-2663's status notifications), each
	// with its JSON string in the body.
	ListenTasks []Span
}

// Span is a string value of a body: its decoded content, and its JSON
// string as the body spells it (a sub-slice of the body).
type Span struct {
	Value string
	Raw   []byte
}

// TasksExtension names MCP 2026-07-28's Tasks extension (SEP-2663) in a
// client's or a server's capabilities.extensions.
const TasksExtension = "io.modelcontextprotocol/tasks"

// ClientCapabilitiesKey is the _meta key of a 2026-07-28 request's client
// capabilities.
const ClientCapabilitiesKey = "io.modelcontextprotocol/clientCapabilities"

// IsTaskMethod reports whether method is one of the Tasks extension's
// methods, which name a task by params.taskId.
func IsTaskMethod(method string) bool {
	switch method {
	case "tasks/get", "tasks/update", "tasks/cancel":
		return true
	}
	return false
}

// MetaVersionKey is the _meta key of a 2026-07-28 request's protocol
// version.
const MetaVersionKey = "io.modelcontextprotocol/protocolVersion"

// Ref is the reference of a completion/complete: Type "ref/prompt" with the
// prompt's Name, or "ref/resource" with the resource template's URI.
type Ref struct{ Type, Name, URI string }

// IsToolCall reports whether c is a tools/call request.
func (c Call) IsToolCall() bool { return c.Method == "tools/call" }

// IsResponse reports whether c is a response (it has a result or an error).
func (c Call) IsResponse() bool { return c.Method == "" }

// Name is what the MCP 2026-07-28 Mcp-Name header must carry: Tool for
// tools/call, Prompt for prompts/get, URI for resources/read, TaskID for
// tasks/get, tasks/update and tasks/cancel (SEP-2663's routing header);
// "" otherwise.
func (c Call) Name() string {
	switch c.Method {
	case "tools/call":
		return c.Tool
	case "prompts/get":
		return c.Prompt
	case "resources/read":
		return c.URI
	case "tasks/get", "tasks/update", "tasks/cancel":
		return c.TaskID
	}
	return ""
}

// ModernVersion is MCP 2026-07-28, the first version of the stateless
// core (SEP-2575): its requests name it in _meta and in headers.
const ModernVersion = "2026-07-28"

// Removed reports whether c is a message of a method that the protocol
// version its _meta names no longer has: from 2026-07-28, initialize,
// ping, logging/setLevel, resources/subscribe and resources/unsubscribe
// (SEP-2575; subscriptions/listen replaces the subscriptions). A server
// of that version answers such a request 404 with -32601, go-sdk's too.
// Read does not read such a message's params for what the method took
// (the URI of a subscription): the method is not found, whatever it
// would have taken.
func (c Call) Removed() bool { return removed(c.Method, c.MetaVersion) }

func removed(method, version string) bool {
	if version < ModernVersion {
		return false
	}
	switch method {
	case "initialize", "ping", "logging/setLevel", "resources/subscribe", "resources/unsubscribe":
		return true
	}
	return false
}

// Body is a read request body.
type Body struct {
	// Raw is the body as read; the Calls' spans are sub-slices of it.
	Raw []byte
	// Calls holds one Call per message, in order.
	Calls []Call
	// Batch reports whether the body was a JSON array of messages.
	Batch bool
}

// oneBody is a Body with room for its one Call, so that a single message
// costs one allocation.
type oneBody struct {
	Body
	one [1]Call
}

// Read reads a JSON-RPC 2.0 body: one message or a non-empty batch. It
// returns an *Error of kind ErrSyntax, ErrAmbiguous or ErrMalformed for
// anything it does not accept (see the package doc); raw is not modified,
// and the Body's spans point into it.
func Read(raw []byte) (*Body, error) { return read(raw, false) }

// ReadAnswer reads what a server sends a client (answers, and the
// server's requests and notifications) by Read's rules, but for ids (an
// answer's, and a server request's), which a server may spell as it likes
// and a client reads as a value: any number whose value is an integer
// within ±(2^53-1) (7.0, 7e0), and null (an error answer to a request whose
// id the server could not read). It is for the edge's listing filter, which matches answers to the
// requests it decided on.
func ReadAnswer(raw []byte) (*Body, error) { return read(raw, true) }

func read(raw []byte, answers bool) (*Body, error) {
	r := getReader(raw)
	defer putReader(r)
	r.answers = answers
	r.bom()
	r.ws()
	if r.i >= len(raw) {
		return nil, r.syntax(r.i, "empty body; send a JSON-RPC 2.0 message")
	}
	var (
		body *Body
		err  error
	)
	switch raw[r.i] {
	case '{':
		ob := &oneBody{}
		ob.Calls = ob.one[:]
		body = &ob.Body
		err = r.message(&ob.one[0], 1)
	case '[':
		body = &Body{Batch: true}
		body.Calls, err = r.batch()
	default:
		r.malformed(r.i, "a JSON-RPC body is one message object, or a batch: an array of them")
		err = r.value(0)
	}
	if err == nil {
		r.trailing()
	}
	if err := r.result(err); err != nil {
		return nil, err
	}
	body.Raw = raw
	return body, nil
}

// Validate checks the JSON-level rules alone, on any JSON value: what Read
// refuses as ErrSyntax or ErrAmbiguous anywhere in a body (grammar, UTF-8,
// surrogates, duplicate or folded-equal keys, "__proto__", depth, a
// byte-order mark, bytes after the value). The fuzz targets check Read
// against it; the listing filter reads answers with ReadAnswer.
func Validate(raw []byte) error {
	r := getReader(raw)
	defer putReader(r)
	r.bom()
	r.ws()
	if r.i >= len(raw) {
		return r.syntax(r.i, "empty; send a JSON value")
	}
	err := r.value(0)
	if err == nil {
		r.trailing()
	}
	return r.result(err)
}

func (r *reader) batch() ([]Call, error) {
	r.i++ // '['
	r.ws()
	if r.peek() == ']' {
		r.malformed(r.i, "an empty batch; send at least one message")
		r.i++
		return nil, nil
	}
	calls := make([]Call, 0, 4)
	for n := 0; ; n++ {
		r.ws()
		r.elem = n
		var err error
		switch r.peek() {
		case '{':
			calls = append(calls, Call{})
			err = r.message(&calls[len(calls)-1], 2)
		case '[':
			r.malformed(r.i, "a batch inside a batch; send the messages in one array")
			err = r.value(1)
		default:
			r.malformed(r.i, "a batch element must be a JSON-RPC message object")
			err = r.value(1)
		}
		if err != nil {
			return nil, err
		}
		r.ws()
		if r.i >= len(r.b) {
			return nil, r.eof()
		}
		switch r.b[r.i] {
		case ',':
			r.i++
		case ']':
			r.i++
			r.elem = -1
			r.sameIDs(calls)
			return calls, nil
		default:
			return nil, r.syntax(r.i, "expected ',' or ']' after an array element")
		}
	}
}

// sameIDs refuses two requests with one id in a batch: which answer goes
// to which request is then up to the server.
func (r *reader) sameIDs(calls []Call) {
	dup := func(i int) {
		r.ambiguous(offsetIn(r.b, calls[i].Raw), "two requests in one batch have the same id; give each request its own id")
	}
	if len(calls) <= smallObject {
		for i := range calls {
			if calls[i].Method == "" || calls[i].ID.IsZero() {
				continue
			}
			for j := 0; j < i; j++ {
				if calls[j].Method != "" && calls[j].ID == calls[i].ID {
					dup(i)
					return
				}
			}
		}
		return
	}
	seen := make(map[ID]struct{}, len(calls))
	for i := range calls {
		if calls[i].Method == "" || calls[i].ID.IsZero() {
			continue
		}
		if _, ok := seen[calls[i].ID]; ok {
			dup(i)
			return
		}
		seen[calls[i].ID] = struct{}{}
	}
}

// offsetIn returns where span starts in b (span is a sub-slice of b).
func offsetIn(b, span []byte) int {
	if len(span) == 0 {
		return 0
	}
	return cap(b) - cap(span)
}

// The fields the edge reads, object by object. In these objects a key that
// is not one of the fields but that encoding/json would match to one (a
// fold such as "Method", or an escaped spelling such as "n\u0061me") is
// refused: encoding/json reads it as the field where go-sdk and JavaScript
// ignore it, or see the field where a reader that matches raw key bytes
// does not.
var (
	envelopeFields   = []string{"jsonrpc", "id", "method", "params", "result", "error"}
	toolParamFields  = []string{"name", "arguments", "_meta", "inputResponses", "requestState"}
	argumentFields   = []string{"verb"}
	promptFields     = []string{"name", "arguments", "_meta", "inputResponses", "requestState"}
	resourceFields   = []string{"uri", "_meta", "inputResponses", "requestState"}
	completionFields = []string{"ref", "_meta"}
	refFields        = []string{"type", "name", "uri"}
	metaOnlyFields   = []string{"_meta"}
	// The trace context SEP-414 reserves in _meta is among them: the
	// broker replaces it and drops baggage by these exact keys, so a
	// spelling that a reader could take for one of them is refused.
	metaFields   = []string{MetaVersionKey, "traceparent", "tracestate", "baggage", ClientCapabilitiesKey}
	cancelFields = []string{"requestId", "_meta"}
	errorFields  = []string{"code", "message", "data"}
	// A task's id is read where a route opens it (the gateway's handle for
	// it) and another reader must not find another one: a server reading
	// case-insensitively would take "TaskID" for it.
	taskFields       = []string{"taskId", "_meta"}
	listenFields     = []string{"notifications", "_meta"}
	listenNoteFields = []string{"taskIds"}
	capabilityFields = []string{"extensions"}
	extensionFields  = []string{TasksExtension}
)

// field returns which of fields k is, or "". A key that only encoding/json
// would take for one of them is refused.
func (r *reader) field(k keyRef, fields []string) string {
	if k.plain() {
		key := r.b[k.start:k.end]
		for _, f := range fields {
			if len(f) != len(key) {
				continue
			}
			if string(key) == f {
				return f
			}
			if asciiFoldEqual(key, []byte(f)) {
				r.ambiguous(k.start-1, "a key that is \""+f+"\" in another case: encoding/json reads it as \""+f+"\", case-sensitive readers ignore it; spell it \""+f+"\" exactly")
				return ""
			}
		}
		return ""
	}
	canon := r.canon[k.cs:k.ce]
	for _, f := range fields {
		if canonIs(canon, f) {
			r.ambiguous(k.start-1, "a key spelled with escapes or non-ASCII letters that reads as \""+f+"\" once decoded and folded; readers differ on whether it is \""+f+"\", spell it \""+f+"\" exactly")
			return ""
		}
	}
	return ""
}

// strValue reads the value at r.i: a string's decoded content and true,
// or, for any other value, validates and skips it and returns false.
func (r *reader) strValue(depth int) (string, bool, error) {
	if r.peek() != '"' {
		return "", false, r.value(depth)
	}
	s, e, fl, err := r.str()
	if err != nil {
		return "", false, err
	}
	return r.text(s, e, fl), true, nil
}

// text returns a validated string's content, decoded. A string without
// escapes that is one of the protocol's common names costs no allocation.
func (r *reader) text(s, e int, fl uint8) string {
	if fl&hasEscape != 0 {
		return string(appendUnescaped(make([]byte, 0, e-s), r.b[s:e]))
	}
	switch b := r.b[s:e]; string(b) {
	case "2.0":
		return "2.0"
	case "tools/call":
		return "tools/call"
	case "tools/list":
		return "tools/list"
	case "prompts/get":
		return "prompts/get"
	case "prompts/list":
		return "prompts/list"
	case "resources/read":
		return "resources/read"
	case "resources/list":
		return "resources/list"
	case "resources/templates/list":
		return "resources/templates/list"
	case "resources/subscribe":
		return "resources/subscribe"
	case "resources/unsubscribe":
		return "resources/unsubscribe"
	case "completion/complete":
		return "completion/complete"
	case "initialize":
		return "initialize"
	case "ping":
		return "ping"
	case "logging/setLevel":
		return "logging/setLevel"
	case "notifications/initialized":
		return "notifications/initialized"
	case "notifications/cancelled":
		return "notifications/cancelled"
	case "notifications/progress":
		return "notifications/progress"
	case "notifications/roots/list_changed":
		return "notifications/roots/list_changed"
	case "server/discover":
		return "server/discover"
	case "subscriptions/listen":
		return "subscriptions/listen"
	case "2026-07-28":
		return "2026-07-28"
	case "2025-11-25":
		return "2025-11-25"
	default:
		return string(b)
	}
}

// message reads one JSON-RPC message object at r.i, nested depth deep.
func (r *reader) message(c *Call, depth int) error {
	start := r.i
	it, err := r.openObject(depth)
	if err != nil {
		return err
	}
	var m members
	for {
		k, more, err := r.nextKey(&it)
		if err != nil {
			return err
		}
		if !more {
			break
		}
		at := r.i
		switch r.field(k, envelopeFields) {
		case "jsonrpc":
			m.hasVersion = true
			var s string
			s, m.version, err = r.strValue(depth)
			m.version = m.version && s == "2.0"
		case "id":
			m.hasID, m.nullID = true, r.peek() == 'n'
			c.ID, err = r.requestID(depth)
		case "method":
			m.hasMethod = true
			var ok bool
			c.Method, ok, err = r.strValue(depth)
			if !ok || c.Method == "" {
				r.malformed(at, `"method" must be a non-empty string`)
			}
		case "params":
			m.hasParams, m.paramsAt = true, at
			if m.hasMethod {
				err = r.params(c, depth)
			} else {
				// The method comes later: check the JSON now, read the
				// params once the method is known.
				m.paramsPending = true
				err = r.value(depth)
			}
		case "result":
			m.hasResult = true
			err = r.value(depth)
			c.Result = r.b[at:r.i]
		case "error":
			m.hasError = true
			err = r.errorObject(depth)
			c.Error = r.b[at:r.i]
		default:
			err = r.value(depth)
		}
		if err != nil {
			return err
		}
	}
	end := r.i
	c.Raw = r.b[start:end]
	if m.paramsPending && m.hasMethod {
		r.i = m.paramsAt
		if err := r.params(c, depth); err != nil {
			return err
		}
		r.i = end
	}

	r.checkMembers(c, start, m)
	return nil
}

// members is what message saw of a message's members.
type members struct {
	hasVersion, version                bool
	hasID, hasMethod, hasParams        bool
	hasResult, hasError, paramsPending bool
	nullID                             bool
	paramsAt                           int
}

// checkMembers checks that the members m of the message c, read at start,
// make one JSON-RPC 2.0 request, notification or response, and says what
// is wrong when they do not.
func (r *reader) checkMembers(c *Call, start int, m members) {
	switch {
	case !m.hasVersion:
		r.malformed(start, `"jsonrpc" is missing; a JSON-RPC 2.0 message has "jsonrpc": "2.0"`)
	case !m.version:
		r.malformed(start, `"jsonrpc" must be the string "2.0"`)
	}
	if m.hasMethod {
		if m.nullID {
			// go-sdk runs it as a notification and answers nothing, the
			// TypeScript SDK refuses it, and MCP forbids it.
			r.ambiguous(start, `a request with a null "id": go-sdk runs it as a notification, the TypeScript SDK refuses it; send an integer or a string id, or no id for a notification`)
		}
		if m.hasResult || m.hasError {
			r.malformed(start, `a message with a "method" is a request, and has no "result" or "error"`)
		}
		if !m.hasParams && needsParams(c.Method) {
			r.malformed(start, c.Method+" needs params; see the MCP specification for the method")
		}
		return
	}
	switch {
	case !m.hasResult && !m.hasError:
		r.malformed(start, `a message needs a "method" (a request or notification), or a "result" or an "error" (a response)`)
	case m.hasResult && m.hasError:
		r.malformed(start, `a response has a "result" or an "error", not both`)
	case !m.hasID || (m.nullID && !(r.answers && m.hasError)):
		r.malformed(start, `a response needs the "id" of the request it answers`)
	case m.hasParams:
		r.malformed(start, `a response has no "params"`)
	}
}

func needsParams(method string) bool {
	switch method {
	case "tools/call", "prompts/get", "resources/read", "resources/subscribe", "resources/unsubscribe", "completion/complete":
		return true
	}
	return false
}

// requestID reads an id: a string, a plain integer (see requestInt) or
// null (which message then refuses, on a request and on a response alike).
func (r *reader) requestID(depth int) (ID, error) {
	at := r.i
	switch c := r.peek(); {
	case c == '"':
		s, e, fl, err := r.str()
		if err != nil {
			return ID{}, err
		}
		return stringID(r.text(s, e, fl)), nil
	case c == 'n':
		return ID{}, r.literal("null")
	case c == '-' || c >= '0' && c <= '9':
		s, e, err := r.number()
		if err != nil {
			return ID{}, err
		}
		if r.answers {
			n, ok := answerInt(r.b[s:e])
			if !ok {
				r.ambiguous(at, "an answer's numeric id must have an integer value within ±(2^53-1)")
			}
			return intID(n), nil
		}
		n, ok := requestInt(r.b[s:e])
		if !ok {
			r.ambiguous(at, "a numeric id must be a plain integer (no fraction, exponent or -0) within ±(2^53-1): go-sdk truncates fractions and JavaScript rounds large integers; send an integer or a string id")
		}
		return intID(n), nil
	}
	r.malformed(at, `an "id" must be a string, an integer or null`)
	return ID{}, r.value(depth)
}

// params reads the params value at r.i of a message nested depth deep,
// by what c.Method reads of it.
func (r *reader) params(c *Call, depth int) error {
	at := r.i
	var err error
	switch c.Method {
	case "tools/call":
		err = r.paramsObject(c, depth, toolParamFields)
	case "prompts/get":
		err = r.paramsObject(c, depth, promptFields)
	case "resources/read", "resources/subscribe", "resources/unsubscribe":
		err = r.paramsObject(c, depth, resourceFields)
	case "completion/complete":
		err = r.paramsObject(c, depth, completionFields)
	case "notifications/cancelled":
		err = r.paramsObject(c, depth, cancelFields)
	case "tasks/get", "tasks/update", "tasks/cancel":
		err = r.paramsObject(c, depth, taskFields)
	case "subscriptions/listen":
		if r.peek() == '{' {
			err = r.paramsObject(c, depth, listenFields)
		} else {
			err = r.value(depth)
		}
	default:
		// Params of other methods are not read; only their _meta is.
		if r.peek() == '{' {
			err = r.paramsObject(c, depth, metaOnlyFields)
		} else {
			err = r.value(depth)
		}
	}
	c.Params = r.b[at:r.i]
	return err
}

// paramsObject reads params that must be an object, with the given
// fields.
func (r *reader) paramsObject(c *Call, depth int, fields []string) error {
	at := r.i
	if r.peek() != '{' {
		r.malformed(at, c.Method+` "params" must be an object`)
		return r.value(depth)
	}
	it, err := r.openObject(depth + 1)
	if err != nil {
		return err
	}
	var hasName, hasURI, hasRef bool
	for {
		k, more, err := r.nextKey(&it)
		if err != nil {
			return err
		}
		if !more {
			break
		}
		vat := r.i
		var ok bool
		switch r.field(k, fields) {
		case "name":
			hasName = true
			var s string
			s, ok, err = r.strValue(depth + 1)
			switch {
			case !ok:
				r.malformed(vat, c.Method+` params.name must be a string`)
			case c.Method == "tools/call":
				c.Tool = s
			default:
				c.Prompt = s
			}
		case "uri":
			hasURI = true
			c.URI, ok, err = r.strValue(depth + 1)
			if !ok {
				r.malformed(vat, c.Method+` params.uri must be a string`)
			}
		case "arguments":
			err = r.arguments(c, depth+1)
		case "ref":
			hasRef = true
			err = r.ref(c, depth+1)
		case "_meta":
			if r.peek() == '{' {
				err = r.meta(c, depth+1)
				c.Meta = r.b[vat:r.i]
			} else {
				if r.peek() != 'n' {
					r.malformed(vat, `params._meta must be an object`)
				}
				err = r.value(depth + 1)
			}
		case "inputResponses":
			c.InputResponses = true
			err = r.value(depth + 1)
		case "requestState":
			c.InputResponses = true
			c.RequestState, _, err = r.strValue(depth + 1)
		case "requestId":
			c.Cancelled, err = r.requestID(depth + 1)
		case "taskId":
			var ok bool
			c.TaskID, ok, err = r.strValue(depth + 1)
			if !ok {
				// A number could name a task to a reader that compares
				// loosely; the gateway hands out string ids only.
				r.malformed(vat, c.Method+` params.taskId must be a string, the id of a task`)
			}
			c.TaskIDRaw = r.b[vat:r.i]
		case "notifications":
			err = r.listenNotifications(c, depth+1)
		default:
			err = r.value(depth + 1)
		}
		if err != nil {
			return err
		}
	}
	r.requireParams(c, at, hasName, hasURI, hasRef)
	return nil
}

// requireParams checks that the params of c, read at at, hold what its
// method needs: a name, a URI or a ref.
func (r *reader) requireParams(c *Call, at int, hasName, hasURI, hasRef bool) {
	switch c.Method {
	case "tools/call":
		if !hasName || c.Tool == "" {
			r.malformed(at, `tools/call needs params.name, the tool's name, a non-empty string`)
		}
	case "prompts/get":
		if !hasName {
			r.malformed(at, `prompts/get needs params.name, the prompt's name`)
		}
	case "resources/read", "resources/subscribe", "resources/unsubscribe":
		if !hasURI && !c.Removed() {
			r.malformed(at, c.Method+` needs params.uri, the resource's URI`)
		}
	case "completion/complete":
		if !hasRef {
			r.malformed(at, `completion/complete needs params.ref, an object with a "type"`)
		}
	}
}

// arguments reads the params.arguments of tools/call (for its verb) or
// prompts/get, an object, whose span the operator's rules read.
func (r *reader) arguments(c *Call, depth int) error {
	at := r.i
	if r.peek() == 'n' {
		// go-sdk's client sends a nil map as null; every reader reads it
		// as no arguments.
		return r.value(depth)
	}
	if r.peek() != '{' {
		r.malformed(at, c.Method+` params.arguments must be an object or null`)
		return r.value(depth)
	}
	it, err := r.openObject(depth + 1)
	if err != nil {
		return err
	}
	for {
		k, more, err := r.nextKey(&it)
		if err != nil {
			return err
		}
		if !more {
			break
		}
		if c.Method == "tools/call" && r.field(k, argumentFields) == "verb" {
			vat := r.i
			var ok bool
			c.Verb, ok, err = r.strValue(depth + 1)
			if !ok {
				r.malformed(vat, `tools/call arguments.verb must be a string`)
			}
		} else {
			err = r.value(depth + 1)
		}
		if err != nil {
			return err
		}
	}
	c.Arguments = r.b[at:r.i]
	return nil
}

// meta reads params._meta, an object, for the protocol version it may
// carry. It is read here, with the rest of the message, so that the edge
// checks the version against the header on the reading it decided on.
func (r *reader) meta(c *Call, depth int) error {
	it, err := r.openObject(depth + 1)
	if err != nil {
		return err
	}
	for {
		k, more, err := r.nextKey(&it)
		if err != nil {
			return err
		}
		if !more {
			return nil
		}
		switch r.field(k, metaFields) {
		case MetaVersionKey:
			c.HasMetaVersion = true
			var ok bool
			if c.MetaVersion, ok, err = r.strValue(depth + 1); !ok {
				c.MetaVersion = ""
			}
		case ClientCapabilitiesKey:
			err = r.capabilities(c, depth+1)
		default:
			err = r.value(depth + 1)
		}
		if err != nil {
			return err
		}
	}
}

// capabilities reads _meta's client capabilities, an object, for whether
// its extensions name the Tasks extension. Anything else there is
// skipped: only that one key decides (whether a task method is refused
// with -32021).
func (r *reader) capabilities(c *Call, depth int) error {
	if r.peek() != '{' {
		return r.value(depth)
	}
	it, err := r.openObject(depth + 1)
	if err != nil {
		return err
	}
	for {
		k, more, err := r.nextKey(&it)
		if err != nil || !more {
			return err
		}
		if r.field(k, capabilityFields) == "extensions" && r.peek() == '{' {
			err = r.extensions(c, depth+1)
		} else {
			err = r.value(depth + 1)
		}
		if err != nil {
			return err
		}
	}
}

// extensions reads client capabilities' extensions for the Tasks
// extension's key.
func (r *reader) extensions(c *Call, depth int) error {
	it, err := r.openObject(depth + 1)
	if err != nil {
		return err
	}
	for {
		k, more, err := r.nextKey(&it)
		if err != nil || !more {
			return err
		}
		if r.field(k, extensionFields) == TasksExtension {
			c.DeclaresTasks = true
		}
		if err := r.value(depth + 1); err != nil {
			return err
		}
	}
}

// listenNotifications reads subscriptions/listen's params.notifications
// for the task ids it names.
func (r *reader) listenNotifications(c *Call, depth int) error {
	if r.peek() != '{' {
		return r.value(depth)
	}
	it, err := r.openObject(depth + 1)
	if err != nil {
		return err
	}
	for {
		k, more, err := r.nextKey(&it)
		if err != nil || !more {
			return err
		}
		if r.field(k, listenNoteFields) != "taskIds" {
			if err := r.value(depth + 1); err != nil {
				return err
			}
			continue
		}
		at := r.i
		if r.peek() != '[' {
			r.malformed(at, `subscriptions/listen params.notifications.taskIds must be an array of task ids (strings)`)
			if err := r.value(depth + 1); err != nil {
				return err
			}
			continue
		}
		r.i++ // '['
		r.ws()
		if r.peek() == ']' {
			r.i++
			continue
		}
		for {
			r.ws()
			vat := r.i
			v, ok, err := r.strValue(depth + 2)
			if err != nil {
				return err
			}
			if !ok {
				r.malformed(vat, `subscriptions/listen params.notifications.taskIds must hold task ids (strings) only`)
			} else {
				c.ListenTasks = append(c.ListenTasks, Span{Value: v, Raw: r.b[vat:r.i]})
			}
			r.ws()
			if r.i >= len(r.b) {
				return r.eof()
			}
			if r.b[r.i] == ']' {
				r.i++
				break
			}
			if r.b[r.i] != ',' {
				return r.syntax(r.i, "expected ',' or ']' after an array element")
			}
			r.i++
		}
	}
}

// ref reads completion/complete params.ref.
func (r *reader) ref(c *Call, depth int) error {
	at := r.i
	if r.peek() != '{' {
		r.malformed(at, `completion/complete params.ref must be an object with a "type"`)
		return r.value(depth)
	}
	it, err := r.openObject(depth + 1)
	if err != nil {
		return err
	}
	var hasType, hasName, hasURI bool
	for {
		k, more, err := r.nextKey(&it)
		if err != nil {
			return err
		}
		if !more {
			break
		}
		vat := r.i
		var ok bool
		switch f := r.field(k, refFields); f {
		case "type":
			hasType = true
			c.Ref.Type, ok, err = r.strValue(depth + 1)
		case "name":
			hasName = true
			c.Ref.Name, ok, err = r.strValue(depth + 1)
		case "uri":
			hasURI = true
			c.Ref.URI, ok, err = r.strValue(depth + 1)
		default:
			ok = true
			err = r.value(depth + 1)
		}
		if !ok {
			r.malformed(vat, `completion/complete params.ref's type, name and uri must be strings`)
		}
		if err != nil {
			return err
		}
	}
	switch {
	case !hasType:
		r.malformed(at, `completion/complete params.ref needs a "type" ("ref/prompt" or "ref/resource")`)
	case c.Ref.Type == "ref/prompt" && !hasName:
		r.malformed(at, `a "ref/prompt" reference needs the prompt's "name"`)
	case c.Ref.Type == "ref/resource" && !hasURI:
		r.malformed(at, `a "ref/resource" reference needs the resource's "uri"`)
	}
	return nil
}

// errorObject reads a response's error: an object with an integer code and
// a string message, as go-sdk requires to read the response at all.
func (r *reader) errorObject(depth int) error {
	at := r.i
	if r.peek() != '{' {
		r.malformed(at, `a response's "error" must be an object with an integer "code" and a string "message"`)
		return r.value(depth)
	}
	it, err := r.openObject(depth + 1)
	if err != nil {
		return err
	}
	var code, msg bool
	for {
		k, more, err := r.nextKey(&it)
		if err != nil {
			return err
		}
		if !more {
			break
		}
		switch r.field(k, errorFields) {
		case "code":
			if c := r.peek(); c == '-' || c >= '0' && c <= '9' {
				var s, e int
				if s, e, err = r.number(); err == nil {
					_, code = requestInt(r.b[s:e])
				}
			} else {
				err = r.value(depth + 1)
			}
		case "message":
			_, msg, err = r.strValue(depth + 1)
		default:
			err = r.value(depth + 1)
		}
		if err != nil {
			return err
		}
	}
	if !code || !msg {
		r.malformed(at, `a response's "error" must be an object with an integer "code" and a string "message"`)
	}
	return nil
}

package edge

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/textproto"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/message"
)

// paramHeaderPrefix begins the MCP 2026-07-28 headers that carry a tool
// call's annotated arguments (SEP-2243): a tool whose inputSchema property
// says "x-mcp-header": "Region" has its clients send Mcp-Param-Region with
// that argument's value.
const paramHeaderPrefix = "Mcp-Param-"

// Bounds of what a route learns of its tools' x-mcp-header bindings.
const (
	// maxParamTools is how many tools' bindings one route keeps. A tool
	// learned past it is not kept, so its Mcp-Param-* headers are refused
	// as unchecked.
	maxParamTools = 4096
	// maxParamBindings is how many bindings one tool may declare; a tool
	// with more is kept as declaring none valid.
	maxParamBindings = 64
	// maxParamDepth is how deep in an inputSchema a binding is looked for.
	maxParamDepth = 16
)

// ParamHeaders is what a route learned of its tools' x-mcp-header
// bindings (SEP-2243), from the tools/list answers its listing filter
// read: which Mcp-Param-* header carries which argument. The edge checks
// each Mcp-Param-* header of a tools/call against the argument it names,
// and refuses one it cannot check: the tool's bindings are unknown to it
// (it has not seen the tool listed on this route since it started), or
// the tool declares no such binding. It is bounded (maxParamTools), and
// its zero value is ready to use.
//
// Replicas share what they learn (see Export and Merge): a client whose
// tools/list went to one replica may send its tools/call to another.
type ParamHeaders struct {
	mu       sync.RWMutex
	tools    map[string]toolParams
	onChange func()
}

// toolParams are one tool's bindings. invalid marks a tool whose
// annotations go-sdk's client would reject (it drops such a tool from
// tools/list): no Mcp-Param-* header is accepted for it. at is when they
// were learned (Unix nanoseconds): of two replicas' readings of a tool,
// the later one holds.
type toolParams struct {
	bindings []paramBinding
	invalid  bool
	at       int64
}

// same reports whether tp and o bind the same headers to the same
// arguments.
func (tp toolParams) same(o toolParams) bool {
	if tp.invalid != o.invalid || len(tp.bindings) != len(o.bindings) {
		return false
	}
	for i, b := range tp.bindings {
		if b.header != o.bindings[i].header || !slices.Equal(b.path, o.bindings[i].path) {
			return false
		}
	}
	return true
}

// OnChange sets fn, called (without the store's lock held) each time a
// listing changes what the store holds of a tool; Merge does not call it.
// Set it before the store is used.
func (ph *ParamHeaders) OnChange(fn func()) { ph.onChange = fn }

// paramBinding maps a (possibly nested) argument to its header, by the
// header's canonical name.
type paramBinding struct {
	path   []string
	header string
}

// paramRoute is a route that keeps its tools' bindings.
type paramRoute interface{ paramHeaders() *ParamHeaders }

// paramsOf is the bindings store of route, or nil when it keeps none.
func paramsOf(route Route) *ParamHeaders {
	if pr, ok := route.(paramRoute); ok {
		return pr.paramHeaders()
	}
	return nil
}

// lookup returns tool's bindings, and whether they are known.
func (ph *ParamHeaders) lookup(tool string) (toolParams, bool) {
	if ph == nil {
		return toolParams{}, false
	}
	ph.mu.RLock()
	defer ph.mu.RUnlock()
	tp, ok := ph.tools[tool]
	return tp, ok
}

// learn records the bindings of a listed tool from its inputSchema.
func (ph *ParamHeaders) learn(tool string, schema json.RawMessage) {
	if ph == nil || tool == "" {
		return
	}
	tp := parseParams(schema)
	ph.mu.Lock()
	old, known := ph.tools[tool]
	switch {
	case known && old.same(tp):
		ph.mu.Unlock()
		return
	case !known && len(ph.tools) >= maxParamTools:
		ph.mu.Unlock()
		return
	}
	if ph.tools == nil {
		ph.tools = make(map[string]toolParams)
	}
	tp.at = time.Now().UnixNano()
	ph.tools[tool] = tp
	ph.mu.Unlock()
	if ph.onChange != nil {
		ph.onChange()
	}
}

// sharedParams is the form in which Export and Merge carry a store.
type sharedParams struct {
	Tools map[string]sharedTool `json:"tools"`
}

type sharedTool struct {
	At       int64           `json:"at"`
	Invalid  bool            `json:"invalid,omitempty"`
	Bindings []sharedBinding `json:"bindings,omitempty"`
}

type sharedBinding struct {
	Path   []string `json:"path"`
	Header string   `json:"header"`
}

// Export returns what the store holds, for Merge on another replica.
func (ph *ParamHeaders) Export() []byte {
	ph.mu.RLock()
	out := sharedParams{Tools: make(map[string]sharedTool, len(ph.tools))}
	for name, tp := range ph.tools {
		st := sharedTool{At: tp.at, Invalid: tp.invalid}
		for _, b := range tp.bindings {
			st.Bindings = append(st.Bindings, sharedBinding{Path: b.path, Header: b.header})
		}
		out.Tools[name] = st
	}
	ph.mu.RUnlock()
	b, _ := json.Marshal(out)
	return b
}

// Merge takes in what another replica's store exported: each tool this
// store does not know, or learned before the other did. A tool whose
// bindings break this package's rules (a header that is no canonical
// Mcp-Param- name, two for one header, past the bounds) is skipped and
// counted in skipped; data that is not an export is an error, and changes
// nothing.
func (ph *ParamHeaders) Merge(data []byte) (skipped int, err error) {
	var in sharedParams
	if err := json.Unmarshal(data, &in); err != nil {
		return 0, fmt.Errorf("not an export of x-mcp-header bindings: %w", err)
	}
	ph.mu.Lock()
	defer ph.mu.Unlock()
	for name, st := range in.Tools {
		tp, ok := st.params()
		if name == "" || !ok {
			skipped++
			continue
		}
		old, known := ph.tools[name]
		switch {
		case known && old.at >= tp.at:
			continue
		case !known && len(ph.tools) >= maxParamTools:
			skipped++
			continue
		}
		if ph.tools == nil {
			ph.tools = make(map[string]toolParams)
		}
		ph.tools[name] = tp
	}
	return skipped, nil
}

// params checks a shared tool by the rules learn keeps, and returns it.
func (st sharedTool) params() (toolParams, bool) {
	tp := toolParams{invalid: st.Invalid, at: st.At}
	if st.Invalid {
		return tp, len(st.Bindings) == 0
	}
	if len(st.Bindings) > maxParamBindings {
		return tp, false
	}
	seen := map[string]bool{}
	for _, b := range st.Bindings {
		name, ok := strings.CutPrefix(b.Header, paramHeaderPrefix)
		if !ok || !validHeaderName(name) || textproto.CanonicalMIMEHeaderKey(b.Header) != b.Header ||
			seen[strings.ToLower(name)] || len(b.Path) == 0 || len(b.Path) > maxParamDepth {
			return tp, false
		}
		seen[strings.ToLower(name)] = true
		tp.bindings = append(tp.bindings, paramBinding{path: slices.Clone(b.Path), header: b.Header})
	}
	slices.SortFunc(tp.bindings, func(a, b paramBinding) int { return strings.Compare(a.header, b.header) })
	return tp, true
}

// schemaProperty is what of an inputSchema property the bindings need, as
// go-sdk reads it (headerSchemaProperty in its streamable_headers.go).
type schemaProperty struct {
	Type       string                    `json:"type"`
	XMCPHeader json.RawMessage           `json:"x-mcp-header,omitempty"`
	Properties map[string]schemaProperty `json:"properties,omitempty"`
}

// parseParams reads a tool's bindings from its inputSchema as go-sdk's
// client does (extractParamHeaderAnnotations, and the checks of
// validateParamHeaderAnnotations that drop a tool from its listing).
func parseParams(schema json.RawMessage) toolParams {
	// Most schemas carry no annotation: a schema with neither the word
	// nor an escape (which could spell it) is not decoded.
	if len(schema) == 0 || !bytes.Contains(schema, []byte("x-mcp-header")) && bytes.IndexByte(schema, '\\') < 0 {
		return toolParams{}
	}
	var s schemaProperty
	if json.Unmarshal(schema, &s) != nil {
		// go-sdk's client keeps such a tool and sends no header for it.
		return toolParams{}
	}
	var tp toolParams
	seen := map[string]bool{}
	if !collectParams(s.Properties, nil, 0, seen, &tp.bindings) {
		return toolParams{invalid: true}
	}
	// In one order, whatever the schema's map gave: a listing read again
	// is the same bindings, and checks report the same header first.
	slices.SortFunc(tp.bindings, func(a, b paramBinding) int { return strings.Compare(a.header, b.header) })
	return tp
}

// collectParams walks properties and appends their bindings; it reports
// false for annotations go-sdk's client rejects (or past this package's
// bounds).
func collectParams(props map[string]schemaProperty, prefix []string, depth int, seen map[string]bool, out *[]paramBinding) bool {
	if len(props) == 0 {
		return true
	}
	if depth >= maxParamDepth {
		return false
	}
	for name, prop := range props {
		path := append(append([]string(nil), prefix...), name)
		if prop.XMCPHeader != nil {
			var header string
			if prop.Type != "string" && prop.Type != "integer" && prop.Type != "boolean" ||
				json.Unmarshal(prop.XMCPHeader, &header) != nil || !validHeaderName(header) {
				return false
			}
			if seen[strings.ToLower(header)] || len(*out) >= maxParamBindings {
				return false
			}
			seen[strings.ToLower(header)] = true
			*out = append(*out, paramBinding{path: path, header: textproto.CanonicalMIMEHeaderKey(paramHeaderPrefix + header)})
		}
		if !collectParams(prop.Properties, path, depth+1, seen, out) {
			return false
		}
	}
	return true
}

// validHeaderName reports whether name is an HTTP token (1*tchar), as
// go-sdk requires of an x-mcp-header name.
func validHeaderName(name string) bool {
	if name == "" || len(name) > 128 {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case c >= '0' && c <= '9', c >= 'A' && c <= 'Z', c >= 'a' && c <= 'z':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}

// paramValue reads the argument at path as go-sdk does (lookupArgument,
// unmarshalPrimitive) and returns the one header value that carries it
// (encodeHeaderValue). present is false for an absent or null argument;
// sendable is false for one that is not a string, a boolean or an integer
// in JavaScript's safe range, for which go-sdk's client sends no header.
func paramValue(arguments []byte, path []string) (value string, present, sendable bool) {
	raw, ok := message.Lookup(arguments, path)
	if !ok {
		return "", false, false
	}
	text, isString, ok := message.Scalar(raw)
	switch {
	case !ok:
		return "", true, false
	case isString:
		if needsBase64(text) {
			text = encodeBase64(text)
		}
		return text, true, true
	case text == "null":
		return "", false, false
	case text == "true" || text == "false":
		return text, true, true
	}
	// A number, read as go-sdk reads it: a float64, sent only when it is
	// an integer in JavaScript's safe range.
	v, err := strconv.ParseFloat(text, 64)
	const maxSafe = 1<<53 - 1
	if err != nil || v != math.Trunc(v) || v < -maxSafe || v > maxSafe {
		return "", true, false
	}
	return strconv.FormatInt(int64(v), 10), true, true
}

// The wrapper of a base64-encoded Mcp-Param-* value (SEP-2243).
const (
	base64Prefix = "=?base64?"
	base64Suffix = "?="
)

// encodeBase64 is s in SEP-2243's base64 wrapper: standard alphabet,
// padded, as go-sdk's client encodes it.
func encodeBase64(s string) string {
	return base64Prefix + base64.StdEncoding.EncodeToString([]byte(s)) + base64Suffix
}

// paramHeaderMatches reports whether got, an Mcp-Param-* header's value,
// carries want, the value paramValue gives for its argument. It does in
// two spellings: want itself, and, when want is not already encoded, its
// base64 encoding, which SEP-2243 has servers decode whatever the value
// (the conformance suite's ServerAcceptsValidBase64).
//
// The encoding is compared, never decoded: decoders disagree on all but
// the canonical form (Go's and Node's take non-zero pad bits, Node's takes
// missing padding and skips characters outside the alphabet, strict ones
// refuse them all), so a header in another spelling could read as another
// value, or as none, behind the edge. One value has one encoding the edge
// takes.
func paramHeaderMatches(got, want string) bool {
	if got == want {
		return true
	}
	encoded := strings.HasPrefix(want, base64Prefix) && strings.HasSuffix(want, base64Suffix)
	return !encoded && got == encodeBase64(want)
}

// needsBase64 is go-sdk's requiresBase64Encoding: a string with a byte
// outside printable ASCII, leading or trailing blanks, or the look of an
// encoded value travels base64-encoded.
func needsBase64(s string) bool {
	if s == "" {
		return false
	}
	if s[0] == ' ' || s[0] == '\t' || s[len(s)-1] == ' ' || s[len(s)-1] == '\t' {
		return true
	}
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7E {
			return true
		}
	}
	return strings.HasPrefix(s, base64Prefix) && strings.HasSuffix(s, base64Suffix)
}

// checkParamHeaders checks a request's Mcp-Param-* headers against its
// body. Every such header must be the value of an argument the called tool
// binds to it, in go-sdk's client's encoding or as the canonical base64 of
// that (see paramHeaderMatches: no spelling that a reader behind could
// take for another value), on a tools/call sent on its own; a 2026-07-28
// call must carry a header for each bound argument it passes. What the edge cannot check is refused, not passed: a
// header for a tool whose bindings this route has not learned, or that
// its tool does not bind.
func checkParamHeaders(header http.Header, b *message.Body, ph *ParamHeaders, version string) (Verdict, message.Call) {
	mismatch := func(c message.Call, msg string) (Verdict, message.Call) {
		return Verdict{Status: http.StatusBadRequest, Reason: "header_mismatch", Code: message.CodeHeaderMismatch, Message: msg}, c
	}
	var keys []string
	for k := range header {
		if len(k) < len(paramHeaderPrefix) || !strings.EqualFold(strings.ReplaceAll(k[:len(paramHeaderPrefix)], "_", "-"), paramHeaderPrefix) {
			continue
		}
		if !strings.HasPrefix(k, paramHeaderPrefix) {
			// Spelled with _, or not in canonical form: a server behind
			// may read it as the header this check would look for.
			return mismatch(message.Call{}, fmt.Sprintf("header %q is spelled otherwise than Mcp-Param-<name>: send Mcp-Param- headers spelled so", clip(k)))
		}
		keys = append(keys, k)
	}
	var c message.Call
	if len(b.Calls) == 1 {
		c = b.Calls[0]
	}
	modernCall := !b.Batch && version >= modernVersion && c.IsToolCall()
	if len(keys) == 0 && !modernCall {
		return Verdict{}, message.Call{}
	}
	if len(keys) > 0 {
		if b.Batch || !c.IsToolCall() {
			return mismatch(c, "Mcp-Param- headers carry the arguments of one tools/call: send them only with a tools/call on its own")
		}
		folded := make(map[string]bool, len(keys))
		for _, k := range keys {
			if len(header[k]) != 1 {
				return mismatch(c, fmt.Sprintf("header %s was sent more than once: send each Mcp-Param- header once", clip(k)))
			}
			// CGI-style servers read - and _ alike.
			f := strings.ToLower(strings.ReplaceAll(k, "_", "-"))
			if folded[f] {
				return mismatch(c, fmt.Sprintf("header %s and another differ only in - and _, which a server behind may read as one: send one of them", clip(k)))
			}
			folded[f] = true
		}
	}
	tp, known := ph.lookup(c.Tool)
	if !known {
		if len(keys) == 0 {
			return Verdict{}, message.Call{} // nothing unchecked goes on
		}
		return mismatch(c, fmt.Sprintf("the gateway cannot check the Mcp-Param- headers of tool %q: it has not seen the tool's x-mcp-header bindings in a tools/list answer on this endpoint since it started; list the tools (tools/list) and call again", clip(c.Tool)))
	}
	for _, k := range keys {
		if tp.invalid || !bindsHeader(tp.bindings, k) {
			return mismatch(c, fmt.Sprintf("tool %q declares no argument for header %s (x-mcp-header): leave it out", clip(c.Tool), clip(k)))
		}
	}
	if tp.invalid {
		return Verdict{}, message.Call{}
	}
	for _, bd := range tp.bindings {
		got, sent := header[bd.header]
		want, present, sendable := paramValue(c.Arguments, bd.path)
		switch {
		case !present && sent:
			return mismatch(c, fmt.Sprintf("header %s was sent for argument %q, which the call does not pass: leave the header out, or pass the argument", bd.header, strings.Join(bd.path, ".")))
		case present && !sendable && sent:
			return mismatch(c, fmt.Sprintf("header %s was sent for argument %q, which is not a string, boolean or safe integer: leave the header out", bd.header, strings.Join(bd.path, ".")))
		case present && sendable && !sent && modernCall:
			return mismatch(c, fmt.Sprintf("a %s call of tool %q needs header %s with the value of argument %q", version, clip(c.Tool), bd.header, strings.Join(bd.path, ".")))
		case sent && !paramHeaderMatches(got[0], want):
			return mismatch(c, fmt.Sprintf("header %s does not match argument %q of the body: send the argument's value as it is, or base64-encoded as =?base64?<standard, padded base64>?= (where SEP-2243 requires it, only so)", bd.header, strings.Join(bd.path, ".")))
		}
	}
	return Verdict{}, message.Call{}
}

// bindsHeader reports whether bindings bind the canonical header k.
func bindsHeader(bindings []paramBinding, k string) bool {
	for _, b := range bindings {
		if b.header == k {
			return true
		}
	}
	return false
}

package hostile

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"net/http"
	"slices"
	"strings"
)

// Cases returns the hostile requests against t, each with the answer the
// edge must give. The first Forbidden call is the one most cases carry;
// every forbidden call gets a plain control, a batch beside the allowed
// call, and the field tricks that hide it behind an allowed call. It panics
// when t has no Forbidden call or its Params are not JSON objects.
func Cases(t Target) []Case {
	if len(t.Forbidden) == 0 {
		panic("hostile: a Target needs at least one Forbidden call")
	}
	b := &builder{t: t, a: t.Allowed, f: t.Forbidden[0]}
	b.controls()
	b.fields()
	b.envelopeKeys()
	b.values()
	b.encodings()
	b.trailing()
	b.syntax()
	b.shapes()
	b.ids()
	b.lists()
	b.batches()
	b.depth()
	b.prototype()
	b.headers()
	b.transport()
	return b.cases
}

// The values the cases are built from.
const (
	decoyMethod        = "ping" // open to every authenticated token on every route
	decoyNotification  = "notifications/initialized"
	maxSafeInteger     = "9007199254740991"  // 2^53-1, the largest id that is still canonical
	firstUnsafeInteger = "9007199254740992"  // 2^53
	beyondSafeInteger  = "9007199254740993"  // a float64 reader reads 2^53
	beyondSafeNegative = "-9007199254740993" // and -2^53
	deepLevels         = 200                 // past the edge's 128
	levelsBeforeRepeat = 130
)

type builder struct {
	t     Target
	a     Call // the allowed call
	f     Call // the first forbidden call, which most cases carry
	cases []Case
}

// add appends c. A slash would split a Go subtest name, so the names write
// U+2215 for it.
func (b *builder) add(c Case) {
	c.Name = strings.ReplaceAll(c.Name, "/", "\u2215")
	b.cases = append(b.cases, c)
}

func (b *builder) passed(name, body string) {
	b.add(Case{Name: name, Body: []byte(body), Status: http.StatusOK})
}

func (b *builder) scope(name, body string) {
	b.add(Case{Name: name, Body: []byte(body), Status: http.StatusForbidden, Reason: b.t.refusal()})
}

func (b *builder) ambiguous(name, body string) {
	b.add(Case{Name: name, Body: []byte(body), Status: http.StatusBadRequest, Reason: ReasonAmbiguous})
}

// notJSON is a body that is not JSON text.
func (b *builder) notJSON(name, body string) {
	b.add(Case{Name: name, Body: []byte(body), Status: http.StatusBadRequest, Reason: ReasonMalformed, Code: CodeParseError})
}

// notRPC is JSON that is no JSON-RPC message.
func (b *builder) notRPC(name, body string) {
	b.add(Case{Name: name, Body: []byte(body), Status: http.StatusBadRequest, Reason: ReasonMalformed, Code: CodeInvalidRequest})
}

// label names a forbidden call in case names: its method, and its name,
// URI or verb.
func label(c Call) string {
	s := c.Method
	if c.Params != "" {
		o := parse(c.Params)
		for _, path := range [][]string{{"name"}, {"uri"}, {"arguments", "verb"}, {"ref"}} {
			if v, ok := o.valueAt(path); ok {
				if path[0] == "arguments" {
					s += " verb"
				}
				s += " " + strings.Trim(compact(v), `"`)
			}
		}
	}
	return "[" + s + "]"
}

// decoy is the allowed call of f's method, if there is one.
func (b *builder) decoy(f Call) (Call, bool) {
	for _, c := range append([]Call{b.a}, b.t.AlsoAllowed...) {
		if c.Method == f.Method {
			return c, true
		}
	}
	return Call{}, false
}

// forbiddenList reports whether the token may not call list method m.
func (b *builder) forbiddenList(m string) bool {
	return slices.ContainsFunc(b.t.Forbidden, func(c Call) bool { return c.Method == m })
}

func (b *builder) controls() {
	b.passed("control: the allowed call", request("1", b.a).String())
	for _, f := range b.t.Forbidden {
		b.scope("control: "+label(f)+" plainly", request("1", f).String())
	}
}

// A spelling is one way to write a second key beside, or instead of, the
// key a call sets: readers that disagree on it read two different calls.
type spelling struct {
	how placement
	key func(name string) string // the raw key; "" when it does not apply
}

type placement int

const (
	decoyAfter  placement = iota // the call's member, then the decoy's
	decoyBefore                  // the decoy's member, then the call's
	alone                        // the call's member under the spelling, no decoy
)

func exact(name string) string { return key(name) }

var (
	// allSpellings are tried on each level of the first forbidden call.
	allSpellings = []spelling{
		{decoyAfter, exact},
		{decoyBefore, exact},
		{decoyAfter, titleCase},
		{decoyAfter, upperCase},
		{alone, titleCase},
		{decoyAfter, escaped},
		{alone, escaped},
		{decoyAfter, folded},
		{alone, folded},
	}
	// someSpellings are tried on the other forbidden calls: the order of
	// a repeated key (first-wins readers against last-wins ones) and case
	// variants (encoding/json v1 against go-sdk and the TypeScript SDK).
	someSpellings = []spelling{
		{decoyBefore, exact},
		{decoyAfter, titleCase},
		{decoyAfter, upperCase},
	}
	// methodSpellings are more spellings of the envelope's method.
	methodSpellings = []spelling{
		{decoyAfter, mixedCase},
		{alone, func(n string) string { return escapedAt(n, 0) }},
	}
)

// hide writes the member at path of call f's body (path[0] is an envelope
// key) with decoy, an allowed value, beside or instead of it, once per
// spelling. Every one is ambiguous, but a key of the arguments spelled
// otherwise and alone on a target whose rule reads the arguments: the
// reader knows no argument's name, and takes it; the rule reads the
// escaped spelling as the key it is, and fails closed on one in another
// case (a Go backend would read it as the key), so it is refused as the
// forbidden call is.
func (b *builder) hide(prefix string, f Call, path []string, decoy string, spellings []spelling) {
	name := path[len(path)-1]
	where := strings.Join(path, ".")
	for _, s := range spellings {
		k := s.key(name)
		if k == "" {
			continue
		}
		spelled := strings.Trim(k, `"`)
		var what string
		body := request("1", f).at(path[:len(path)-1], func(o object) object {
			switch s.how {
			case decoyBefore:
				what = fmt.Sprintf("the decoy as %s, then %s", spelled, name)
				return o.before(member{k, decoy})
			case alone:
				what = spelled + " alone"
				return o.rename(name, k)
			default:
				what = fmt.Sprintf("%s, then the decoy as %s", name, spelled)
				return o.with(member{k, decoy})
			}
		})
		if s.how == alone && b.t.ForbiddenReason == ReasonRule && len(path) > 2 && path[len(path)-2] == "arguments" {
			b.scope(prefix+where+": "+what, body.String())
			continue
		}
		b.ambiguous(prefix+where+": "+what, body.String())
	}
}

// fields hides each forbidden call behind an allowed one, at every level
// where they differ: the method (behind ping), params, and the keys inside
// params down to the value that differs (a tool's name, a verb, a URI).
func (b *builder) fields() {
	seen := map[string]bool{} // methods already hidden behind ping
	for i, f := range b.t.Forbidden {
		spellings, prefix := allSpellings, ""
		if i > 0 {
			spellings, prefix = someSpellings, label(f)+" "
		}
		if !seen[f.Method] {
			b.hide(prefix, f, []string{"method"}, str(decoyMethod), spellings)
		}
		if i == 0 {
			b.hide(prefix, f, []string{"method"}, str(decoyMethod), methodSpellings)
			body := request("1", f).with(member{titleCase("method"), str(decoyNotification)})
			b.ambiguous("method: method, then a notification as Method", body.String())
		}
		d, ok := b.decoy(f)
		switch {
		case f.Params == "":
		case ok && d.Params != "":
			b.hide(prefix, f, []string{"params"}, d.Params, spellings)
			path := []string{"params"}
			for _, k := range differingPath(d.Params, f.Params) {
				path = append(path, k)
				v, _ := request("1", d).valueAt(path)
				b.hide(prefix, f, slices.Clone(path), v, spellings)
			}
		case !seen[f.Method]:
			// No allowed call of this method: the decoy is params that
			// say nothing.
			b.hide(prefix, f, []string{"params"}, "{}", spellings)
		}
		seen[f.Method] = true
	}
}

// envelopeKeys are the other keys of the envelope, id and jsonrpc.
func (b *builder) envelopeKeys() {
	b.hide("", b.f, []string{"id"}, "2", []spelling{
		{decoyAfter, exact},
		{decoyAfter, titleCase},
		{decoyAfter, upperCase},
		{alone, escaped},
	})
	b.hide("", b.f, []string{"jsonrpc"}, `"1.0"`, []spelling{
		{decoyAfter, exact},
		{alone, upperCase},
	})
}

// values are escapes inside strings, which every reader decodes alike: the
// edge must decide on the decoded value.
func (b *builder) values() {
	if m, ok := escapeValue(str(b.a.Method)); ok {
		b.passed("value: the allowed method with an escaped letter", request("1", b.a).set("method", m).String())
	}
	if m, ok := escapeValue(str(b.f.Method)); ok {
		b.scope("value: the forbidden method with an escaped letter", request("1", b.f).set("method", m).String())
	}
	if strings.Contains(b.f.Method, "/") {
		m := `"` + strings.Replace(b.f.Method, "/", `\/`, 1) + `"`
		b.scope(`value: the forbidden method with an escaped solidus`, request("1", b.f).set("method", m).String())
	}
	if d, ok := b.decoy(b.f); ok {
		if path := differingPath(d.Params, b.f.Params); path != nil {
			full := append([]string{"params"}, path...)
			v, _ := request("1", b.f).valueAt(full)
			if ev, ok := escapeValue(v); ok {
				body := request("1", b.f).at(full[:len(full)-1], func(o object) object { return o.set(full[len(full)-1], ev) })
				b.scope("value: the forbidden "+strings.Join(full, ".")+" with an escaped letter", body.String())
			}
		}
	}
}

// encodings are strings that are not UTF-8, or escapes that are no
// character: decoders replace, drop or keep them, each its own way.
func (b *builder) encodings() {
	f := request("1", b.f)
	withMethod := func(m string) string { return f.set("method", m).String() }
	b.ambiguous("utf-8: an invalid byte in a key", f.with(member{"\"\xffmethod\"", str(decoyMethod)}).String())
	b.ambiguous("utf-8: an invalid byte in the method", withMethod("\""+b.f.Method+"\xff\""))
	b.ambiguous("utf-8: an overlong e in a key", f.with(member{"\"m\xc1\xa5thod\"", str(decoyMethod)}).String())
	if strings.Contains(b.f.Method, "/") {
		b.ambiguous("utf-8: an overlong solidus in the method", withMethod("\""+strings.Replace(b.f.Method, "/", "\xc0\xaf", 1)+"\""))
	}
	b.ambiguous("utf-8: an encoded surrogate in the id", f.set("id", "\"\xed\xa0\x80\"").String())
	b.ambiguous("utf-8: a truncated sequence in the id", f.set("id", "\"a\xe2\x82\"").String())
	b.ambiguous("surrogate: a lone high surrogate in the method", withMethod(`"`+b.f.Method+`\ud800"`))
	b.ambiguous("surrogate: a lone low surrogate in a key", f.with(member{`"method\udc00"`, str(decoyMethod)}).String())
	b.ambiguous("surrogate: a high surrogate before a letter", f.set("id", `"\ud800\u0041"`).String())
	b.passed("surrogate: a valid pair in the id", request(`"\ud83d\ude00"`, b.a).String())
}

// trailing is what comes after the first value: a stream or line reader
// runs it, a reader of one value does not.
func (b *builder) trailing() {
	a, f := request("1", b.a).String(), request("2", b.f).String()
	b.ambiguous("trailing: a second object", a+f)
	b.ambiguous("trailing: a second object on its own line", a+"\n"+f)
	b.ambiguous("trailing: a NUL, then a second object", a+"\x00"+f)
	b.ambiguous("trailing: a comma and a second object", a+","+f)
	b.ambiguous("trailing: a second batch", batch(a)+batch(f))
	b.ambiguous("trailing: a letter", a+"x")
	b.passed("trailing: whitespace around the body", "\r\n\t "+a+" \n")
	// A TextDecoder strips a leading byte order mark; Go readers refuse it.
	b.ambiguous("leading: a byte order mark before the body", "\xef\xbb\xbf"+request("1", b.f).String())
}

// syntax is text that is not JSON, which lenient readers (JSON5, some
// scripting runtimes) accept anyway.
func (b *builder) syntax() {
	f := request("1", b.f).String()
	b.notJSON("syntax: a comment hiding the method", strings.Replace(f, `"method":`, `/*"method":"ping",*/"method":`, 1))
	b.notJSON("syntax: a trailing comma", strings.TrimSuffix(f, "}")+",}")
	b.notJSON("syntax: an id with a leading zero", request("01", b.f).String())
	b.notJSON("syntax: an id that is NaN", request("NaN", b.f).String())
	b.notJSON("syntax: an empty body", "")
}

// shapes are JSON that is no JSON-RPC message.
func (b *builder) shapes() {
	f := request("1", b.f)
	b.notRPC("rpc: no jsonrpc member", f[1:].String())
	b.notRPC("rpc: jsonrpc 1.0", f.set("jsonrpc", `"1.0"`).String())
	b.notRPC("rpc: the method in an array", f.set("method", "["+str(b.f.Method)+"]").String())
	b.notRPC("rpc: a request that is also a response", f.with(member{key("result"), "{}"}).String())
	b.notRPC("rpc: the method as a bare string", str(b.f.Method))
	b.notRPC("rpc: null", "null")
	b.notRPC("rpc: an object as the id", f.set("id", `{"a":1}`).String())
}

// ids are numeric ids that readers turn into different values, or that
// an upstream writes back differently (1.0 comes back as 1).
func (b *builder) ids() {
	for _, id := range []struct{ text, what string }{
		{"1.0", "1.0"}, {"1e0", "1e0"}, {"1E+0", "1E+0"}, {"-0", "-0"}, {"1.5", "1.5"},
		{firstUnsafeInteger, "2^53"}, {beyondSafeInteger, "2^53+1"}, {beyondSafeNegative, "-(2^53+1)"},
	} {
		b.ambiguous("id: "+id.what, request(id.text, b.f).String())
	}
	b.scope("id: 2^53-1 is still an integer", request(maxSafeInteger, b.f).String())
	// go-sdk reads a request with a null id as a notification, runs it and
	// answers nothing; the TypeScript SDK refuses it; MCP forbids it.
	b.ambiguous("id: null", request("null", b.f).String())
}

// lists are the listings the edge filters by matching answers to requests
// by id: an id the upstream writes back in another form slips past a
// filter that compares text.
func (b *builder) lists() {
	list := Call{Method: "tools/list"}
	canonical := func(name, id string) {
		if b.forbiddenList(list.Method) {
			b.scope(name, request(id, list).String())
		} else {
			b.passed(name, request(id, list).String())
		}
	}
	canonical("list: tools/list with id 7", "7")
	canonical(`list: tools/list with an escaped string id`, `"\u0078"`)
	for _, id := range []string{"7.0", "1e0", "-0", "7.5"} {
		b.ambiguous("list: tools/list with id "+id, request(id, list).String())
	}
	b.ambiguous("list: prompts/list with id 1e0", request("1e0", Call{Method: "prompts/list"}).String())
	b.ambiguous("list: resources/list with id 1.0", request("1.0", Call{Method: "resources/list"}).String())
	b.ambiguous("list: resources/templates/list with id -0", request("-0", Call{Method: "resources/templates/list"}).String())
}

// batches: one decision covers every request of a batch.
func (b *builder) batches() {
	a := request("1", b.a).String()
	for _, f := range b.t.Forbidden {
		b.scope("batch: the allowed call, then "+label(f), batch(a, request("2", f).String()))
	}
	f := request("2", b.f).String()
	b.scope("batch: the forbidden call, then the allowed one", batch(f, a))
	b.scope("batch: the forbidden call alone", batch(f))
	b.ambiguous("batch: the allowed and the forbidden call share an id", batch(a, request("1", b.f).String()))
	b.ambiguous("batch: two allowed calls share an id", batch(a, a))
	hidden := request("2", b.f).with(member{titleCase("method"), str(decoyMethod)}).String()
	b.ambiguous("batch: the allowed call, then one hidden by Method", batch(a, hidden))
	b.notRPC("batch: a batch inside a batch", batch(batch(f)))
	b.notRPC("batch: an empty batch", "[]")
}

// depth is nesting past what the edge reads (128): a reader that stops
// looking there must not let what follows through.
func (b *builder) depth() {
	nest := func(n int) string { return strings.Repeat("[", n) + strings.Repeat("]", n) }
	params := object{}
	if b.f.Params != "" {
		params = parse(b.f.Params)
	}
	deep := params.before(member{key("_meta"), `{"deep":` + nest(deepLevels) + `}`})
	b.ambiguous(fmt.Sprintf("depth: %d levels in the forbidden call's params", deepLevels),
		request("1", Call{Method: b.f.Method, Params: deep.String()}).String())
	ping := request("1", Call{Method: decoyMethod, Params: `{"_meta":{"deep":` + nest(levelsBeforeRepeat) + `}}`})
	behind := ping.with(member{key("method"), str(b.f.Method)})
	if b.f.Params != "" {
		behind = behind.with(member{key("params"), b.f.Params})
	}
	b.ambiguous(fmt.Sprintf("depth: the method repeated after %d levels", levelsBeforeRepeat), behind.String())
}

// prototype is __proto__, which JSON.parse keeps as a plain member and
// JavaScript code that copies the object (Object.assign, a merge) takes for
// the prototype, whose members then read through as the object's own.
func (b *builder) prototype() {
	env := request("1", b.a).before(member{key("__proto__"), request("1", b.f)[2:].String()})
	b.ambiguous("prototype: __proto__ in the envelope holding the forbidden call", env.String())
	if b.f.Params != "" {
		hollow := request("1", Call{Method: b.f.Method}).with(member{key("__proto__"), object{{key("params"), b.f.Params}}.String()})
		b.ambiguous("prototype: __proto__ holding the params", hollow.String())
		params := object{}
		if b.a.Params != "" {
			params = parse(b.a.Params)
		}
		params = params.before(member{key("__proto__"), b.f.Params})
		b.ambiguous("prototype: __proto__ in params holding the forbidden params", request("1", Call{Method: b.a.Method, Params: params.String()}).String())
	}
}

// headers are the 2026-07-28 headers, which servers may route on before
// reading the body.
func (b *builder) headers() {
	stateless := func(name string, body string, status int, reason string, kv ...string) {
		h := http.Header{}
		h.Set(ProtocolVersionHeader, StatelessProtocol)
		for i := 0; i+1 < len(kv); i += 2 {
			h.Set(kv[i], kv[i+1])
		}
		c := Case{Name: name, Body: []byte(body), Header: h, Status: status, Reason: reason, Standalone: true}
		if reason == ReasonHeaderMismatch {
			c.Code = CodeHeaderMismatch
		}
		b.add(c)
	}
	f := request("1", b.f).String()
	ping := request("1", Call{Method: decoyMethod}).String()
	subject := b.f.Subject()
	agree := []string{MethodHeader, b.f.Method}
	if subject != "" {
		agree = append(agree, NameHeader, subject)
	}
	stateless("header: Mcp-Method says ping, the body is the forbidden call", f, http.StatusBadRequest, ReasonHeaderMismatch, MethodHeader, decoyMethod)
	stateless("header: Mcp-Method names the forbidden call, the body is ping", ping, http.StatusBadRequest, ReasonHeaderMismatch, agree...)
	stateless("header: Mcp-Method in capitals", f, http.StatusBadRequest, ReasonHeaderMismatch, MethodHeader, strings.ToUpper(b.f.Method))
	if subject != "" {
		stateless("header: Mcp-Name in capitals", f, http.StatusBadRequest, ReasonHeaderMismatch, MethodHeader, b.f.Method, NameHeader, strings.ToUpper(subject))
		if d, ok := b.decoy(b.f); ok && d.Subject() != "" && d.Subject() != subject {
			stateless("header: Mcp-Name names the allowed call, the body the forbidden one", f, http.StatusBadRequest, ReasonHeaderMismatch, MethodHeader, b.f.Method, NameHeader, d.Subject())
		}
	}
	stateless("header: both agree with the forbidden body", f, http.StatusForbidden, b.t.refusal(), agree...)
	stateless("header: a 2026-07-28 request without Mcp-Method", f, http.StatusBadRequest, ReasonHeaderMismatch)
	if subject != "" {
		stateless("header: a 2026-07-28 call without Mcp-Name", f, http.StatusBadRequest, ReasonHeaderMismatch, MethodHeader, b.f.Method)
	}
	b.add(Case{
		Name: "header: Mcp-Method says ping inside a 2025-11-25 session", Body: []byte(f),
		Header: http.Header{MethodHeader: {decoyMethod}},
		Status: http.StatusBadRequest, Reason: ReasonHeaderMismatch, Code: CodeHeaderMismatch,
	})
}

// utf16LE encodes the ASCII text s as UTF-16LE.
func utf16LE(s string) []byte {
	out := make([]byte, 0, 2*len(s))
	for i := 0; i < len(s); i++ {
		out = append(out, s[i], 0)
	}
	return out
}

// transport is what HTTP wraps around the body: encodings and media types
// the edge does not read, and methods that are no MCP.
func (b *builder) transport() {
	f := request("1", b.f).String()
	var gz bytes.Buffer
	w := gzip.NewWriter(&gz)
	_, _ = w.Write([]byte(f))
	_ = w.Close()
	with := func(name string, body []byte, status int, reason string, kv ...string) {
		h := http.Header{}
		for i := 0; i+1 < len(kv); i += 2 {
			h.Set(kv[i], kv[i+1])
		}
		b.add(Case{Name: name, Body: body, Header: h, Status: status, Reason: reason})
	}
	with("http: the forbidden call gzipped", gz.Bytes(), http.StatusUnsupportedMediaType, ReasonUnsupportedMedia, "Content-Encoding", "gzip")
	with("http: Content-Encoding gzip on a plain body", []byte(f), http.StatusUnsupportedMediaType, ReasonUnsupportedMedia, "Content-Encoding", "gzip")
	with("http: Content-Encoding identity", []byte(f), http.StatusForbidden, b.t.refusal(), "Content-Encoding", "identity")
	with("http: Content-Type text/plain", []byte(f), http.StatusUnsupportedMediaType, ReasonUnsupportedMedia, "Content-Type", "text/plain")
	with("http: Content-Type of a form", []byte(f), http.StatusUnsupportedMediaType, ReasonUnsupportedMedia, "Content-Type", "application/x-www-form-urlencoded")
	with("http: Content-Type JSON with charset utf-8", []byte(f), http.StatusForbidden, b.t.refusal(), "Content-Type", "application/json; charset=utf-8")
	with("http: the forbidden call in UTF-16 as its charset says", utf16LE(f), http.StatusUnsupportedMediaType, ReasonUnsupportedMedia,
		"Content-Type", "application/json; charset=utf-16le")
	b.add(Case{Name: "http: two Content-Types", Body: []byte(f), Header: http.Header{"Content-Type": {"application/json", "text/plain"}},
		Status: http.StatusUnsupportedMediaType, Reason: ReasonUnsupportedMedia})
	for _, m := range []string{http.MethodPut, http.MethodPatch} {
		b.add(Case{Name: "http: " + m, Body: []byte(f), Method: m, Status: http.StatusMethodNotAllowed, Reason: ReasonMethodNotAllowed})
	}
	// A loopback Origin passes on a loopback Host; a server behind that
	// reads the last Origin, or the whole list, sees another one. The
	// credentials here replace the target's own: a second one is refused
	// before either is checked.
	twice := func(name string, h http.Header) {
		b.add(Case{Name: name, Body: []byte(f), Header: h, Status: http.StatusBadRequest, Reason: ReasonDuplicateHeader})
	}
	twice("http: two Origin headers, a loopback one first", http.Header{"Origin": {"http://127.0.0.1", "https://evil.example"}})
	twice("http: one Origin header listing two origins", http.Header{"Origin": {"http://127.0.0.1, https://evil.example"}})
	twice("http: two Authorization headers", http.Header{"Authorization": {"Bearer zds_first", "Bearer zds_second"}})
	twice("http: one Authorization header listing two credentials", http.Header{"Authorization": {"Bearer zds_first, Bearer zds_second"}})
}

package message

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	segjson "github.com/segmentio/encoding/json"
)

// The rule FuzzRead checks: whatever Read accepts, every reader behind the
// gateway reads the same way. go-sdk reads the envelope with
// jsonrpc.DecodeMessage and params with segmentio/encoding/json matching
// keys exactly; a guarded encoding/json v1 server matches them
// case-insensitively. A disagreement on an accepted body is a bypass.

// fuzzSeeds are the table bodies and a few more shapes for the fuzzer to
// start from (also under testdata/fuzz/FuzzRead, see TestSeedCorpus).
func fuzzSeeds() []string {
	seeds := make([]string, 0, len(readRows)+16)
	for _, r := range readRows {
		seeds = append(seeds, r.body)
	}
	return append(seeds,
		string(body4KiB),
		`{"jsonrpc":"2.0","id":"s","method":"tools/call","params":{"_meta":{"progressToken":"p"},"name":"t","arguments":{"a":[1,2.5e3,-0,true,null,{"b":"\u00e9"}],"verb":"v"}}}`,
		`[{"jsonrpc":"2.0","id":1,"result":null},{"jsonrpc":"2.0","id":"x","error":{"code":-1,"message":"m"}},{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":1}}]`,
		`{"method":"completion/complete","jsonrpc":"2.0","id":9,"params":{"argument":{"name":"n","value":"v"},"ref":{"uri":"u","type":"ref/resource"}}}`,
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"ſ","arguments":{"K":"k","verb":"ẞ"}}}`,
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","arguments":{"verb":"v","Verb2":1,"v\u0065rbs":2}}}`,
		"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\",\"params\":{\"name\":\"\\u0000\",\"arguments\":{\"verb\\u0000\":\"x\"}}}",
		`{"jsonrpc":"2.0","id":1,"method":"x","params":[1e400,-1e-400,0.0000000000000000000001,123456789012345678901234567890,-0,0E+0]}`,
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","arguments":{"verb":"v","n":1e400,"":{"":""}}},"":null}`,
		`{"jsonrpc":"2.0","id":"\"\\\/\b\f\n\r\t\u0000\u001f\u007f\u0080\uffff\ud800\udc00","method":"ping"}`,
		`{"jsonrpc":"2.0","id":1,"result":null}`,
		`{"jsonrpc":"2.0","id":"e","error":{"code":-9007199254740991,"message":"","data":null}}`,
		"\r\n\t {\"jsonrpc\"\r:\n\"2.0\"\t,\"id\" :-1,\"method\":\"prompts/get\",\"params\":{\"name\":\"p\",\"arguments\":{\"name\":\"x\"}}}\r\n",
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","arguments":{"verb":"v","deep":`+nest(120)+`}}}`,
		`{"jsonrpc":"2.0","id":1,"method":"resources/read","params":{"uri":"file:///caf\u00e9/\ud83d\ude00","_meta":null}}`,
		`{"jsonrpc":"2.0","id":1,"method":"completion/complete","params":{"ref":{"type":"ref/other","name":"n"},"_meta":{"a":[]}}}`,
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","arguments":{"verb":"ſ","ſ":1,"k":2,"K":3}}}`,
		`{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":"r\u0031","reason":"x","_meta":{}}}`,
		`[{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":-3}},{"jsonrpc":"2.0","id":"a","error":{"code":1,"message":"m"}}]`,
		`{"jsonrpc":"2.0","id":500,"method":"resources/subscribe","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}`,
		`{"jsonrpc":"2.0","id":500,"params":{"uri":"u","_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}},"method":"resources/unsubscribe"}`,
	)
}

func FuzzRead(f *testing.F) {
	for _, s := range fuzzSeeds() {
		f.Add([]byte(s))
	}
	for _, b := range hostileBodies() {
		f.Add(b)
	}
	f.Fuzz(checkRead)
}

// FuzzReadMembers assembles messages from fuzzed key spellings and values,
// so that the fuzzer reaches bodies Read accepts far more often than by
// mutating bytes.
func FuzzReadMembers(f *testing.F) {
	f.Add("tools/call", "name", `"t"`, "verb", `"v"`, "x", `1`, "7")
	f.Add("tools/call", "n\\u0061me", `"t"`, "Verb", `"v"`, "ſ", `{"s":1}`, `"7"`)
	f.Add("prompts/get", "name", `"p"`, "name", `"x"`, "NAME", `2`, "-1")
	f.Add("completion/complete", "ref", `{"type":"ref/prompt","name":"p"}`, "a", `[]`, "b", `null`, "1")
	f.Add("resources/read", "uri", `"file:///\u00e9"`, "k", `"\ud83d\ude00"`, "K", `0`, `"\u0078"`)
	f.Add("tools/list", "_meta", `{}`, "cursor", `"c"`, "x", `1e400`, "null")
	f.Add("prompts/get", "requestState", `"s\u0031"`, "x", `1`, "y", `2`, "3")
	f.Add("resources/read", "RequestState", `"s"`, "inputResponses", `{}`, "z", `[]`, "4")
	f.Fuzz(func(t *testing.T, method, k1, v1, k2, v2, k3, v3, id string) {
		body := `{"jsonrpc":"2.0","id":` + id + `,"method":"` + method + `","params":{"` + k1 + `":` + v1 +
			`,"name":"t","uri":"u","arguments":{"` + k2 + `":` + v2 + `,"` + k3 + `":` + v3 + `}}}`
		checkRead(t, []byte(body))
	})
}

func checkRead(t *testing.T, raw []byte) {
	t.Helper()
	orig := bytes.Clone(raw)
	body, err := Read(raw)
	if !bytes.Equal(raw, orig) {
		t.Fatal("Read modified the body")
	}
	verr := Validate(raw)
	if err != nil {
		var e *Error
		if !errors.As(err, &e) || e.Offset < 0 || e.Offset > len(raw) || e.Msg == "" ||
			!(e.Kind == ErrSyntax || e.Kind == ErrAmbiguous || e.Kind == ErrMalformed) {
			t.Fatalf("Read error %#v: want an *Error of one of the three kinds", err)
		}
		if errors.Is(err, ErrSyntax) && json.Valid(raw) {
			t.Fatalf("Read calls valid JSON a syntax error: %v", err)
		}
		if errors.Is(err, ErrSyntax) != errors.Is(verr, ErrSyntax) {
			t.Fatalf("Read: %v; Validate: %v", err, verr)
		}
		return
	}
	if verr != nil {
		t.Fatalf("Read accepts what Validate refuses: %v", verr)
	}
	if !json.Valid(raw) {
		t.Fatal("Read accepts what encoding/json calls invalid")
	}
	agreeGoSDK(t, raw, body)
	agreeV1(t, raw, body)
}

func FuzzValidate(f *testing.F) {
	for _, s := range fuzzSeeds() {
		f.Add([]byte(s))
	}
	f.Add([]byte(`{"tools":[{"name":"a","inputSchema":{"type":"object"}}],"nextCursor":"c"}`))
	f.Add([]byte(`[1e400, -0.0e-0, "\ud83d\ude00", {"":{"":[]}}]`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		err := Validate(raw)
		if err == nil && !json.Valid(raw) {
			t.Fatal("Validate accepts what encoding/json calls invalid")
		}
		if errors.Is(err, ErrSyntax) && json.Valid(raw) {
			t.Fatalf("Validate calls valid JSON a syntax error: %v", err)
		}
		if err == nil {
			// A valid value decodes in every reader without complaint of
			// its text.
			var v any
			if err := segjson.Unmarshal(raw, &v); err != nil && !isRange(err) {
				t.Fatalf("segmentio refuses what Validate accepts: %v", err)
			}
		}
	})
}

// isRange reports a decoder's refusal of a number too large for float64,
// which is about the value, not its reading.
func isRange(err error) bool {
	var te *json.UnmarshalTypeError
	var se *segjson.UnmarshalTypeError
	return errors.As(err, &te) || errors.As(err, &se)
}

// segDecode decodes as go-sdk's internal/json does.
func segDecode(data []byte, v any) error {
	dec := segjson.NewDecoder(bytes.NewReader(data))
	dec.DontMatchCaseInsensitiveStructFields()
	return dec.Decode(v)
}

// The params each read method has, as a Go server declares them.
type (
	toolParams struct {
		Name      string `json:"name"`
		Arguments *struct {
			Verb any `json:"verb"`
		} `json:"arguments"`
		Meta           json.RawMessage `json:"_meta"`
		InputResponses json.RawMessage `json:"inputResponses"`
		RequestState   json.RawMessage `json:"requestState"`
	}
	promptParams struct {
		Name           string          `json:"name"`
		Meta           json.RawMessage `json:"_meta"`
		InputResponses json.RawMessage `json:"inputResponses"`
		RequestState   json.RawMessage `json:"requestState"`
	}
	resourceParams struct {
		URI            string          `json:"uri"`
		Meta           json.RawMessage `json:"_meta"`
		InputResponses json.RawMessage `json:"inputResponses"`
		RequestState   json.RawMessage `json:"requestState"`
	}
	completeParams struct {
		Ref *struct {
			Type string `json:"type"`
			Name string `json:"name"`
			URI  string `json:"uri"`
		} `json:"ref"`
		Meta json.RawMessage `json:"_meta"`
	}
	metaParams struct {
		Meta json.RawMessage `json:"_meta"`
	}
	cancelParams struct {
		RequestID any             `json:"requestId"`
		Meta      json.RawMessage `json:"_meta"`
	}
)

// idOf turns a decoder's id (float64 or string) into an ID, as go-sdk's
// MakeID does; a fractional id here means Read accepted one it must not.
func idOf(t *testing.T, v any) ID {
	t.Helper()
	switch v := v.(type) {
	case float64:
		if v != math.Trunc(v) {
			t.Fatalf("id %v read as a fraction", v)
		}
		return intID(int64(v))
	case string:
		return stringID(v)
	}
	t.Fatalf("id read as %T", v)
	return ID{}
}

// paramsReading is what a decoder reads of c.Params, in Call's terms.
func paramsReading(t *testing.T, c Call, decode func([]byte, any) error) (Call, bool) {
	t.Helper()
	var got Call
	var meta json.RawMessage
	var err error
	switch c.Method {
	case "tools/call":
		var p toolParams
		err = decode(c.Params, &p)
		got.Tool, meta = p.Name, p.Meta
		got.InputResponses, got.RequestState = retryOf(p.InputResponses, p.RequestState)
		if p.Arguments != nil && p.Arguments.Verb != nil {
			v, ok := p.Arguments.Verb.(string)
			if !ok {
				t.Fatalf("verb read as %T", p.Arguments.Verb)
			}
			got.Verb = v
		}
	case "prompts/get":
		var p promptParams
		err = decode(c.Params, &p)
		got.Prompt, meta = p.Name, p.Meta
		got.InputResponses, got.RequestState = retryOf(p.InputResponses, p.RequestState)
	case "resources/read", "resources/subscribe", "resources/unsubscribe":
		var p resourceParams
		err = decode(c.Params, &p)
		got.URI, meta = p.URI, p.Meta
		got.InputResponses, got.RequestState = retryOf(p.InputResponses, p.RequestState)
	case "completion/complete":
		var p completeParams
		err = decode(c.Params, &p)
		if p.Ref != nil {
			got.Ref = Ref{Type: p.Ref.Type, Name: p.Ref.Name, URI: p.Ref.URI}
		}
		meta = p.Meta
	case "notifications/cancelled":
		var p cancelParams
		err = decode(c.Params, &p)
		if err == nil && p.RequestID != nil {
			got.Cancelled = idOf(t, p.RequestID)
		}
		meta = p.Meta
	default:
		if len(c.Params) == 0 || c.Params[0] != '{' {
			return got, false
		}
		var p metaParams
		err = decode(c.Params, &p)
		meta = p.Meta
	}
	if err != nil {
		t.Fatalf("params of %s: %v", c.Method, err)
	}
	if string(meta) != "null" {
		got.Meta = meta
	}
	return got, true
}

// retryOf is what a decoder reads of a multi-round-trip retry: whether
// params carry inputResponses or requestState, and the state when it is a
// string.
func retryOf(responses, state json.RawMessage) (bool, string) {
	var s string
	if state != nil {
		_ = json.Unmarshal(state, &s)
	}
	return responses != nil || state != nil, s
}

func compareParams(t *testing.T, reader string, c, got Call) {
	t.Helper()
	if got.Tool != c.Tool || got.Verb != c.Verb || got.Prompt != c.Prompt || got.URI != c.URI || got.Ref != c.Ref ||
		got.InputResponses != c.InputResponses || got.RequestState != c.RequestState || !bytes.Equal(got.Meta, c.Meta) || got.Cancelled != c.Cancelled {
		t.Fatalf("%s reads params as tool %q verb %q prompt %q uri %q ref %+v input %v meta %q cancelled %s;\nRead: tool %q verb %q prompt %q uri %q ref %+v input %v meta %q cancelled %s",
			reader, got.Tool, got.Verb, got.Prompt, got.URI, got.Ref, got.InputResponses, got.Meta, got.Cancelled,
			c.Tool, c.Verb, c.Prompt, c.URI, c.Ref, c.InputResponses, c.Meta, c.Cancelled)
	}
}

// agreeGoSDK checks the body against go-sdk's reading: its readBatch, then
// DecodeMessage per message, then segmentio on params.
func agreeGoSDK(t *testing.T, raw []byte, body *Body) {
	t.Helper()
	msgs := [][]byte{raw}
	if body.Batch {
		var batch []json.RawMessage
		if err := segDecode(raw, &batch); err != nil {
			t.Fatalf("go-sdk does not read the batch: %v", err)
		}
		if len(batch) != len(body.Calls) {
			t.Fatalf("go-sdk reads %d messages, Read %d", len(batch), len(body.Calls))
		}
		msgs = msgs[:0]
		for i, m := range batch {
			if !bytes.Equal(m, body.Calls[i].Raw) {
				t.Fatalf("batch element %d: go-sdk reads %q, Read %q", i, m, body.Calls[i].Raw)
			}
			msgs = append(msgs, m)
		}
	}
	for i, c := range body.Calls {
		msg, err := jsonrpc.DecodeMessage(msgs[i])
		if err != nil {
			t.Fatalf("message %d: go-sdk refuses what Read accepts: %v", i, err)
		}
		switch m := msg.(type) {
		case *jsonrpc.Request:
			if m.Method != c.Method || c.IsResponse() {
				t.Fatalf("message %d: go-sdk reads method %q, Read %q", i, m.Method, c.Method)
			}
			sameID(t, "go-sdk", m.ID.Raw(), c.ID)
			if !bytes.Equal(m.Params, c.Params) {
				t.Fatalf("message %d: go-sdk reads params %q, Read %q", i, m.Params, c.Params)
			}
		case *jsonrpc.Response:
			if !c.IsResponse() {
				t.Fatalf("message %d: go-sdk reads a response, Read method %q", i, c.Method)
			}
			sameID(t, "go-sdk", m.ID.Raw(), c.ID)
			if !bytes.Equal(m.Result, c.Result) && !(m.Error != nil && string(m.Result) == "") {
				t.Fatalf("message %d: go-sdk reads result %q, Read %q", i, m.Result, c.Result)
			}
		}
		if c.Params != nil {
			if got, ok := paramsReading(t, c, segDecode); ok {
				compareParams(t, "segmentio", c, got)
			}
		}
	}
}

// sameID compares a decoder's id (nil, int64, float64 or string) to ours.
func sameID(t *testing.T, reader string, v any, id ID) {
	t.Helper()
	ok := false
	switch v := v.(type) {
	case nil:
		ok = id.IsZero()
	case int64:
		ok = id.kind == idInt && id.n == v
	case float64:
		ok = id.kind == idInt && float64(id.n) == v && v == math.Trunc(v)
	case string:
		ok = id.kind == idString && id.s == v
	}
	if !ok {
		t.Fatalf("%s reads id %#v, Read %s", reader, v, id)
	}
}

// v1Envelope is a JSON-RPC message as an encoding/json v1 server declares
// it.
type v1Envelope struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      any             `json:"id"`
	Method  *string         `json:"method"`
	Params  json.RawMessage `json:"params"`
	Result  json.RawMessage `json:"result"`
	Error   json.RawMessage `json:"error"`
}

// agreeV1 checks the body against encoding/json v1's case-insensitive
// reading.
func agreeV1(t *testing.T, raw []byte, body *Body) {
	t.Helper()
	msgs := [][]byte{raw}
	if body.Batch {
		var batch []json.RawMessage
		if err := json.Unmarshal(raw, &batch); err != nil {
			t.Fatalf("encoding/json does not read the batch: %v", err)
		}
		msgs = msgs[:0]
		for _, m := range batch {
			msgs = append(msgs, m)
		}
	}
	for i, c := range body.Calls {
		var m v1Envelope
		if err := json.Unmarshal(msgs[i], &m); err != nil {
			t.Fatalf("message %d: encoding/json refuses what Read accepts: %v", i, err)
		}
		method := ""
		if m.Method != nil {
			method = *m.Method
		}
		if m.JSONRPC != "2.0" || method != c.Method {
			t.Fatalf("message %d: encoding/json reads jsonrpc %q method %q, Read %q", i, m.JSONRPC, method, c.Method)
		}
		sameID(t, "encoding/json", m.ID, c.ID)
		if !bytes.Equal(m.Params, c.Params) || !bytes.Equal(m.Result, c.Result) || !bytes.Equal(m.Error, c.Error) {
			t.Fatalf("message %d: encoding/json reads params %q result %q error %q, Read %q %q %q", i, m.Params, m.Result, m.Error, c.Params, c.Result, c.Error)
		}
		if c.Params != nil {
			if got, ok := paramsReading(t, c, json.Unmarshal); ok {
				compareParams(t, "encoding/json", c, got)
			}
		}
	}
}

package upstream

import (
	"encoding/json"
	"testing"
)

// The trace context goes in params._meta (SEP-414) beside what the client
// put there, which keeps its values byte for byte; a client's baggage and
// trace context are replaced, and a body with no message to carry them
// goes unchanged.
func TestWithTraceMeta(t *testing.T) {
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	in := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x<y>","arguments":{"a":1.50,"b":"&"},` +
		`"_meta":{"progressToken":7,"traceparent":"00-forged-by-client","baggage":"user=admin","io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}`
	out, ok := withTraceMeta([]byte(in), tp, "vendor=x")
	if !ok {
		t.Fatal("not rewritten")
	}
	var m struct {
		Params struct {
			Name      string                     `json:"name"`
			Arguments json.RawMessage            `json:"arguments"`
			Meta      map[string]json.RawMessage `json:"_meta"`
		} `json:"params"`
	}
	if err := json.Unmarshal(out, &m); err != nil {
		t.Fatal(err)
	}
	if m.Params.Name != "x<y>" || string(m.Params.Arguments) != `{"a":1.50,"b":"&"}` {
		t.Fatalf("the values changed: %s", out)
	}
	meta := m.Params.Meta
	if string(meta["traceparent"]) != `"`+tp+`"` || string(meta["tracestate"]) != `"vendor=x"` || meta["baggage"] != nil ||
		string(meta["progressToken"]) != "7" || string(meta["io.modelcontextprotocol/protocolVersion"]) != `"2026-07-28"` {
		t.Fatalf("_meta: %s", out)
	}
	if out, ok := withTraceMeta([]byte(`{"jsonrpc":"2.0","id":1,"method":"ping"}`), tp, ""); !ok || string(out) != `{"id":1,"jsonrpc":"2.0","method":"ping","params":{"_meta":{"traceparent":"`+tp+`"}}}` {
		t.Fatalf("no params: %s %v", out, ok)
	}
	for _, body := range []string{`[{"jsonrpc":"2.0","id":1,"method":"ping"}]`, `{"jsonrpc":"2.0","id":1,"result":{}}`,
		`{"jsonrpc":"2.0","id":1,"method":"x","params":[1]}`, `not json`} {
		if _, ok := withTraceMeta([]byte(body), tp, ""); ok {
			t.Errorf("%s was rewritten", body)
		}
	}
}

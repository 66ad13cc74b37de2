package policy

import (
	"bytes"
	"reflect"
	"testing"
)

// fastCases are bodies inspectFast must read as inspectOne does, or decline.
var fastCases = []struct {
	body   string
	accept bool // inspectFast must take it (the common shapes)
}{
	{`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"text":"hi"}}}`, true},
	{` {"jsonrpc": "2.0", "id": "a-1", "method": "tools/call", "params": {"_meta": {"progressToken": 7}, "name": "sessions", "arguments": {"verb": "send", "prompt": "caf\u00e9 \"q\"", "n": [1, 2.5e3, true, null, {}]}}} `, true},
	{`{"jsonrpc":"2.0","id":0,"method":"tools/list","params":{"cursor":"x"}}`, true},
	{`{"jsonrpc":"2.0","method":"notifications/initialized"}`, true},
	{`{"jsonrpc":"2.0","id":7,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{"roots":{}},"clientInfo":{"name":"c","version":"1"}}}`, true},
	// Declined: encoding/json reads these, sometimes otherwise than a
	// naive reader would.
	{`{"jsonrpc":"2.0","id":1,"METHOD":"tools/call","method":"tools/list"}`, false},
	{`{"jsonrpc":"2.0","id":1,"method":"tools/list","method":"tools/call","params":{"name":"x"}}`, false},
	{`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a","Name":"b"}}`, false},
	{`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"n\u0061me":"b"}}`, false},
	{`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a","argumentſ":{"verb":"x"}}}`, false},
	{`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a","arguments":{"verb":"x","VERB":"y"}}}`, false},
	{`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a","arguments":{"verb":1}}}`, false},
	{`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a\u0062"}}`, false},
	{"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\",\"params\":{\"name\":\"a\xff\"}}", false},
	{`{"jsonrpc":"2.0","id":null,"method":"ping"}`, false},
	{`{"jsonrpc":"2.0","id":1.5,"method":"ping"}`, false},
	{`{"jsonrpc":"2.0","id":-1,"method":"ping"}`, false},
	{`{"jsonrpc":"2.0","id":01,"method":"ping"}`, false},
	{`{"jsonrpc":"2.0","id":1,"method":"ping","params":null}`, false},
	{`{"jsonrpc":"2.0","id":1,"method":"ping","params":[1]}`, false},
	{`{"jsonrpc":"2.0","id":1,"method":"ping","extra":true}`, false},
	{`{"jsonrpc":"2.0","id":1,"result":{}}`, false},
	{`{"jsonrpc":"1.0","id":1,"method":"ping"}`, false},
	{`{"jsonrpc":"2.0","id":1,"method":""}`, false},
	{`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{}}`, false},
	{`{"jsonrpc":"2.0","id":1,"method":"ping"} x`, false},
	{`{"jsonrpc":"2.0","id":1,"method":"ping",}`, false},
	{`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a","arguments":{"x":"\q"}}}`, false},
}

func TestInspectFastAgreesWithInspectOne(t *testing.T) {
	for _, tc := range fastCases {
		got, ok := inspectFast([]byte(tc.body))
		if ok != tc.accept {
			t.Errorf("inspectFast(%s) accepted %v, want %v", tc.body, ok, tc.accept)
		}
		if !ok {
			continue
		}
		want, err := inspectOne(bytes.TrimLeft([]byte(tc.body), " \t\r\n"))
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("inspectFast(%s) = %+v; inspectOne = %+v, %v", tc.body, got, want, err)
		}
	}
}

// FuzzInspectFast: whatever inspectFast accepts, inspectOne (encoding/json)
// reads as the same Call without error.
func FuzzInspectFast(f *testing.F) {
	for _, tc := range fastCases {
		f.Add([]byte(tc.body))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		got, ok := inspectFast(body)
		if !ok {
			return
		}
		want, err := inspectOne(body)
		if err != nil {
			t.Fatalf("inspectFast accepted %q, which inspectOne refuses: %v", body, err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("inspectFast(%q) = %+v, inspectOne = %+v", body, got, want)
		}
	})
}

func BenchmarkInspectSmall(b *testing.B) {
	body := []byte(`{"jsonrpc":"2.0","id":17,"method":"tools/call","params":{"name":"echo","arguments":{"text":"hello from the benchmark client"}}}`)
	b.ReportAllocs()
	for b.Loop() {
		calls, _, err := Inspect(body)
		if err != nil || calls[0].Tool != "echo" {
			b.Fatal(err)
		}
	}
}

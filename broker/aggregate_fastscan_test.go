package broker

import (
	"bytes"
	"encoding/json"
	"testing"
)

var answerSeeds = []string{
	`{"jsonrpc":"2.0","id":3,"result":{"content":[{"type":"text","text":"caf\u00e9"}],"isError":false}}`,
	`{"jsonrpc":"2.0","id":"zf-1","result":{"content":[],"structuredContent":{"type":"image"}}}`,
	`{"jsonrpc":"2.0","id":4,"result":{"content":[{"type":"image","data":"AA==","mimeType":"image/png"}]}}`,
	`{"jsonrpc":"2.0","id":5,"error":{"code":-32602,"message":"bad","data":{"x":1}}}`,
	`{"jsonrpc":"2.0","id":6,"result":{"content":[{"Type":"image"}],"isError":true}}`,
	`{"jsonrpc":"2.0","id":7,"result":{"Content":[],"content":[{"type":"text"}]}}`,
	`{"jsonrpc":"2.0","id":8,"result":{"content":[{"type":"text","type":"image"}]}}`,
	`{"jsonrpc":"2.0","ID":9,"result":{"content":[]}}`,
	`{"jsonrpc":"2.0","id":10,"result":{"content":[{"t\u0079pe":"image"}]}}`,
}

// FuzzScanAnswer: what scanEnvelope and scanTextResult read, encoding/json
// reads the same way.
func FuzzScanAnswer(f *testing.F) {
	for _, s := range answerSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		id, res, rerr, ok := scanEnvelope(data)
		if !ok {
			return
		}
		var env fastEnvelope
		if err := json.Unmarshal(data, &env); err != nil {
			t.Fatalf("scanEnvelope read %q, which encoding/json refuses: %v", data, err)
		}
		if !bytes.Equal(id, env.ID) || !bytes.Equal(res, env.Result) || !bytes.Equal(rerr, env.Error) || env.Method != "" {
			t.Fatalf("scanEnvelope(%q) = %s %s %s; encoding/json: %s %s %s", data, id, res, rerr, env.ID, env.Result, env.Error)
		}
		if res == nil {
			return
		}
		textOnly, isError, ok := scanTextResult(res)
		if !ok {
			return
		}
		var head struct {
			Content *[]struct {
				Type string `json:"type"`
			} `json:"content"`
			IsError bool `json:"isError"`
		}
		if err := json.Unmarshal(res, &head); err != nil || head.Content == nil {
			t.Fatalf("scanTextResult read %s, which encoding/json reads otherwise (%v)", res, err)
		}
		want := true
		for _, b := range *head.Content {
			want = want && b.Type == "text"
		}
		if textOnly != want || isError != head.IsError {
			t.Fatalf("scanTextResult(%s) = text-only %v, isError %v; encoding/json: %v, %v", res, textOnly, isError, want, head.IsError)
		}
	})
}

// FuzzScanToolCall: what scanToolCall reads, fastToolCall's encoding/json
// decoding reads the same way.
func FuzzScanToolCall(f *testing.F) {
	for _, s := range []string{
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"mcp_a_echo","arguments":{"text":"caf\u00e9"},"_meta":{"progressToken":3}}}`,
		`{"jsonrpc":"2.0","id":"x","method":"tools/call","params":{"name":"t","arguments":null}}`,
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","Name":"u"}}`,
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","inputResponses":{}}}`,
		`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		id, p, ok := scanToolCall(body)
		if !ok {
			return
		}
		var msg struct {
			JSONRPC string          `json:"jsonrpc"`
			ID      json.RawMessage `json:"id"`
			Method  string          `json:"method"`
			Params  *fastToolParams `json:"params"`
		}
		if err := json.Unmarshal(body, &msg); err != nil || msg.Params == nil {
			t.Fatalf("scanToolCall read %q, which encoding/json reads otherwise (%v)", body, err)
		}
		if msg.JSONRPC != "2.0" || msg.Method != "tools/call" || !bytes.Equal(id, msg.ID) || p.Name != msg.Params.Name ||
			!bytes.Equal(p.Arguments, msg.Params.Arguments) || !bytes.Equal(p.Meta, msg.Params.Meta) ||
			len(msg.Params.InputResponses) > 0 || len(msg.Params.RequestState) > 0 {
			t.Fatalf("scanToolCall(%q) = %s %+v; encoding/json: %+v %+v", body, id, p, msg, *msg.Params)
		}
	})
}

package message

import (
	"encoding/json"
	"errors"
	"maps"
	"net/http"
	"slices"
	"testing"

	"github.com/Tahul/caddy-zidane-mcp/internal/hostile"
)

// hostileTargets are shaped like the routes the end-to-end attack test
// attacks: verbs of one tool, tools and other methods of a guarded server,
// upstreams of an aggregate, and a token that may only ping.
var hostileTargets = map[string]hostile.Target{
	"verbs": {
		Allowed:   hostile.Call{Method: "tools/call", Params: `{"name":"sessions","arguments":{"verb":"list"}}`},
		Forbidden: []hostile.Call{{Method: "tools/call", Params: `{"name":"sessions","arguments":{"verb":"create","prompt":"hi","cwd":"/tmp/x"}}`}},
	},
	"tools": {
		Allowed: hostile.Call{Method: "tools/call", Params: `{"name":"test_simple_text","arguments":{}}`},
		Forbidden: []hostile.Call{
			{Method: "tools/call", Params: `{"name":"test_embedded_resource","arguments":{}}`},
			{Method: "resources/read", Params: `{"uri":"test://static-text"}`},
			{Method: "prompts/get", Params: `{"name":"test_simple_prompt"}`},
		},
	},
	"upstreams": {
		Allowed: hostile.Call{Method: "tools/call", Params: `{"name":"mcp_b_tool_b","arguments":{"text":"hi"}}`},
		AlsoAllowed: []hostile.Call{
			{Method: "resources/read", Params: `{"uri":"test://b/doc"}`},
			{Method: "completion/complete", Params: `{"ref":{"type":"ref/prompt","name":"mcp_b_prompt_b"},"argument":{"name":"topic","value":"x"}}`},
		},
		Forbidden: []hostile.Call{
			{Method: "tools/call", Params: `{"name":"mcp_a_tool_a","arguments":{"text":"hi"}}`},
			{Method: "resources/read", Params: `{"uri":"test://a/doc"}`},
			{Method: "completion/complete", Params: `{"ref":{"type":"ref/prompt","name":"mcp_a_prompt_a"},"argument":{"name":"topic","value":"x"}}`},
		},
	},
	"ping only": {
		Allowed: hostile.Call{Method: "ping"},
		Forbidden: []hostile.Call{
			{Method: "tools/call", Params: `{"name":"tool_a","arguments":{}}`},
			{Method: "tools/list"},
		},
	},
}

// TestReadHostileCases runs the threat model's hostile bodies: each is
// refused with the kind its expected answer names, or read as the call
// the client meant, so that the decision sees the forbidden call.
func TestReadHostileCases(t *testing.T) {
	for name, target := range hostileTargets {
		t.Run(name, func(t *testing.T) {
			for _, c := range hostile.Cases(target) {
				if c.Header.Get("Content-Encoding") != "" || c.Reason == hostile.ReasonUnsupportedMedia || c.Reason == hostile.ReasonMethodNotAllowed || c.Reason == hostile.ReasonDuplicateHeader {
					continue // HTTP's business, not the reader's
				}
				body, err := Read(c.Body)
				var want error
				switch {
				case c.Reason == hostile.ReasonAmbiguous:
					want = ErrAmbiguous
				case c.Code == hostile.CodeParseError:
					want = ErrSyntax
				case c.Code == hostile.CodeInvalidRequest:
					want = ErrMalformed
				}
				if want != nil {
					if !errors.Is(err, want) {
						t.Errorf("%s: Read = %v, want %v", c.Name, err, want)
					}
					continue
				}
				if err != nil {
					t.Errorf("%s: Read: %v", c.Name, err)
					continue
				}
				forbidden := false
				for _, call := range body.Calls {
					for _, f := range target.Forbidden {
						forbidden = forbidden || sameCall(call, f)
					}
				}
				// A header mismatch is decided against the headers; the body
				// only has to be read.
				if c.Reason != hostile.ReasonHeaderMismatch && forbidden != (c.Status == http.StatusForbidden) {
					t.Errorf("%s: Read reads the forbidden call: %v, want %v", c.Name, forbidden, !forbidden)
				}
			}
		})
	}
}

// sameCall reports whether Read's call is hostile call f.
func sameCall(c Call, f hostile.Call) bool {
	if c.Method != f.Method {
		return false
	}
	var p struct {
		Name      string `json:"name"`
		URI       string `json:"uri"`
		Arguments struct {
			Verb string `json:"verb"`
		} `json:"arguments"`
		Ref Ref `json:"ref"`
	}
	if f.Params != "" {
		if err := json.Unmarshal([]byte(f.Params), &p); err != nil {
			panic(err)
		}
	}
	switch c.Method {
	case "tools/call":
		return c.Tool == p.Name && c.Verb == p.Arguments.Verb
	case "prompts/get":
		return c.Prompt == p.Name
	case "resources/read":
		return c.URI == p.URI
	case "completion/complete":
		return c.Ref == p.Ref
	}
	return true
}

// hostileBodies are the bodies of every hostile case, in a fixed order,
// for the fuzzer and the Node test to start from.
func hostileBodies() [][]byte {
	var out [][]byte
	for _, name := range slices.Sorted(maps.Keys(hostileTargets)) {
		for _, c := range hostile.Cases(hostileTargets[name]) {
			out = append(out, c.Body)
		}
	}
	return out
}

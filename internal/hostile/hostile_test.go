package hostile

import (
	"bytes"
	"encoding/json"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

// targets are shaped like the routes the end-to-end test attacks: verbs of
// one tool, tools and other methods of a guarded server, and a route where
// the token may only ping.
var targets = map[string]Target{
	"verbs": {
		Allowed:   Call{Method: "tools/call", Params: `{"name":"sessions","arguments":{"verb":"list"}}`},
		Forbidden: []Call{{Method: "tools/call", Params: `{"name":"sessions","arguments":{"verb":"create","prompt":"hi","cwd":"/tmp/x"}}`}},
	},
	"tools": {
		Allowed: Call{Method: "tools/call", Params: `{"name":"test_simple_text","arguments":{}}`},
		Forbidden: []Call{
			{Method: "tools/call", Params: `{"name":"test_embedded_resource","arguments":{}}`},
			{Method: "tools/call", Params: `{"name":"test_image_content","arguments":{}}`},
			{Method: "resources/read", Params: `{"uri":"test://static-text"}`},
			{Method: "prompts/get", Params: `{"name":"test_simple_prompt"}`},
		},
	},
	"upstreams": {
		Allowed: Call{Method: "tools/call", Params: `{"name":"mcp_b_tool_b","arguments":{"text":"hi"}}`},
		AlsoAllowed: []Call{
			{Method: "resources/read", Params: `{"uri":"test://b/doc"}`},
			{Method: "completion/complete", Params: `{"ref":{"type":"ref/prompt","name":"mcp_b_prompt_b"},"argument":{"name":"topic","value":"x"}}`},
		},
		Forbidden: []Call{
			{Method: "tools/call", Params: `{"name":"mcp_a_tool_a","arguments":{"text":"hi"}}`},
			{Method: "resources/read", Params: `{"uri":"test://a/doc"}`},
			{Method: "completion/complete", Params: `{"ref":{"type":"ref/prompt","name":"mcp_a_prompt_a"},"argument":{"name":"topic","value":"x"}}`},
		},
	},
	"a rule over an argument": {
		Allowed:         Call{Method: "tools/call", Params: `{"name":"deploy","arguments":{"environment":"staging"}}`},
		Forbidden:       []Call{{Method: "tools/call", Params: `{"name":"deploy","arguments":{"environment":"production"}}`}},
		ForbiddenReason: ReasonRule,
	},
	"ping only": {
		Allowed: Call{Method: "ping"},
		Forbidden: []Call{
			{Method: "tools/call", Params: `{"name":"tool_a","arguments":{}}`},
			{Method: "tools/list"},
		},
	},
}

func TestCasesInvariants(t *testing.T) {
	reasons := []string{ReasonAmbiguous, ReasonMalformed, ReasonScope, ReasonRule, ReasonHeaderMismatch, ReasonUnsupportedMedia, ReasonMethodNotAllowed, ReasonDuplicateHeader}
	for name, target := range targets {
		t.Run(name, func(t *testing.T) {
			cases := Cases(target)
			if len(cases) < 40 {
				t.Fatalf("%d cases, want at least 40", len(cases))
			}
			if again := Cases(target); !reflect.DeepEqual(cases, again) {
				t.Fatal("Cases is not deterministic")
			}
			names := map[string]bool{}
			for _, c := range cases {
				if names[c.Name] {
					t.Errorf("two cases named %q", c.Name)
				}
				names[c.Name] = true
				if strings.Contains(c.Name, "/") || !strings.Contains(c.Name, ": ") {
					t.Errorf("case name %q: want <where>: <what>, without a slash", c.Name)
				}
				ok := c.Status >= 200 && c.Status < 300
				if ok != (c.Reason == "") || (!ok && !slices.Contains(reasons, c.Reason)) {
					t.Errorf("%s: status %d with reason %q", c.Name, c.Status, c.Reason)
				}
				wantStatus := map[string]int{
					ReasonAmbiguous: 400, ReasonMalformed: 400, ReasonHeaderMismatch: 400,
					ReasonScope: 403, ReasonRule: 403, ReasonUnsupportedMedia: 415, ReasonMethodNotAllowed: 405, ReasonDuplicateHeader: 400,
				}
				if !ok && wantStatus[c.Reason] != c.Status {
					t.Errorf("%s: reason %s with status %d", c.Name, c.Reason, c.Status)
				}
				if len(c.Body) == 0 && c.Name != "syntax: an empty body" {
					t.Errorf("%s: empty body", c.Name)
				}
				if standalone := c.Header.Get(ProtocolVersionHeader) == StatelessProtocol; standalone != c.Standalone {
					t.Errorf("%s: Standalone %v, but protocol version header %q", c.Name, c.Standalone, c.Header.Get(ProtocolVersionHeader))
				}
				switch c.Code {
				case CodeParseError:
					if c.Reason != ReasonMalformed || json.Valid(c.Body) {
						t.Errorf("%s: a parse error must be a body that is not JSON: %q", c.Name, c.Body)
					}
				case CodeInvalidRequest:
					if c.Reason != ReasonMalformed || !json.Valid(c.Body) {
						t.Errorf("%s: an invalid request must be JSON: %q", c.Name, c.Body)
					}
				case CodeHeaderMismatch:
					if c.Reason != ReasonHeaderMismatch {
						t.Errorf("%s: code %d with reason %s", c.Name, c.Code, c.Reason)
					}
				case 0:
					if c.Reason == ReasonMalformed || c.Reason == ReasonHeaderMismatch {
						t.Errorf("%s: reason %s needs its code", c.Name, c.Reason)
					}
				default:
					t.Errorf("%s: unexpected code %d", c.Name, c.Code)
				}
				// What the edge must read and decide on (2xx and 403) is
				// one plain JSON text, unless HTTP wraps it.
				if (ok || c.Reason == ReasonScope || c.Reason == ReasonRule) && c.Header.Get("Content-Encoding") == "" {
					if !json.Valid(c.Body) || !utf8.Valid(c.Body) || repeatsKey(c.Body) {
						t.Errorf("%s: a body the edge must decide on is not plain JSON: %q", c.Name, c.Body)
					}
				}
				if c.HTTPMethod() != http.MethodPost && c.Reason != ReasonMethodNotAllowed {
					t.Errorf("%s: HTTP method %s", c.Name, c.HTTPMethod())
				}
			}
			for _, f := range target.Forbidden {
				control := Request("1", f)
				found := slices.ContainsFunc(cases, func(c Case) bool { return bytes.Equal(c.Body, control) && c.Reason == target.refusal() })
				if !found {
					t.Errorf("no control case refusing %s %s", f.Method, f.Params)
				}
			}
		})
	}
}

// The cases that hide a call behind another must be read as two different
// calls by encoding/json v1 (case-insensitive, last key wins) and by a
// case-sensitive reader such as go-sdk's and the TypeScript SDK's: that is
// the disagreement they stand for.
func TestCaseVariantsSplitTheReaders(t *testing.T) {
	cases := Cases(targets["tools"])
	i := slices.IndexFunc(cases, func(c Case) bool { return c.Name == "params.name: name, then the decoy as Name" })
	if i < 0 {
		t.Fatal("no case hides params.name behind Name")
	}
	var v1 struct {
		Params struct {
			Name string `json:"name"`
		} `json:"params"`
	}
	if err := json.Unmarshal(cases[i].Body, &v1); err != nil {
		t.Fatal(err)
	}
	var exact map[string]json.RawMessage
	if err := json.Unmarshal(cases[i].Body, &exact); err != nil {
		t.Fatal(err)
	}
	var params map[string]json.RawMessage
	if err := json.Unmarshal(exact["params"], &params); err != nil {
		t.Fatal(err)
	}
	if v1.Params.Name != "test_simple_text" || string(params["name"]) != `"test_embedded_resource"` {
		t.Fatalf("encoding/json reads %q, a case-sensitive reader %s: want the allowed and the forbidden tool", v1.Params.Name, params["name"])
	}
}

// A case that repeats a key, in its own case or another, is JSON with a key
// twice: the check that the plain cases are plain sees them.
func TestRepeatedKeysAreSeen(t *testing.T) {
	n := 0
	for _, c := range Cases(targets["verbs"]) {
		_, spelled, found := strings.Cut(c.Name, ", then the decoy as ")
		if !found || strings.ContainsAny(spelled, `\ſ`) {
			continue
		}
		n++
		if !repeatsKey(c.Body) {
			t.Errorf("%s: repeatsKey misses the repeated key in %s", c.Name, c.Body)
		}
	}
	if n < 8 {
		t.Fatalf("only %d cases repeat a key", n)
	}
}

func TestSubject(t *testing.T) {
	for _, tc := range []struct {
		c    Call
		want string
	}{
		{Call{"tools/call", `{"name":"echo","arguments":{}}`}, "echo"},
		{Call{"prompts/get", `{"name":"simple"}`}, "simple"},
		{Call{"resources/read", `{"uri":"test://x"}`}, "test://x"},
		{Call{"resources/subscribe", `{"uri":"test://x"}`}, ""},
		{Call{"ping", ""}, ""},
	} {
		if got := tc.c.Subject(); got != tc.want {
			t.Errorf("%s %s: Subject %q, want %q", tc.c.Method, tc.c.Params, got, tc.want)
		}
	}
}

// repeatsKey reports whether an object in the JSON text b has a key twice,
// or a key that equals another under case folding: a cheap check that the
// cases meant to be plain are.
func repeatsKey(b []byte) bool {
	dec := json.NewDecoder(bytes.NewReader(b))
	type frame struct {
		object bool
		keys   map[string]bool
		expect bool // the next string token is a key
	}
	var stack []*frame
	for {
		tok, err := dec.Token()
		if err != nil {
			return false
		}
		var top *frame
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		switch v := tok.(type) {
		case json.Delim:
			switch v {
			case '{':
				if top != nil && top.object {
					top.expect = true
				}
				stack = append(stack, &frame{object: true, keys: map[string]bool{}, expect: true})
				continue
			case '[':
				if top != nil && top.object {
					top.expect = true
				}
				stack = append(stack, &frame{})
				continue
			default:
				stack = stack[:len(stack)-1]
				if len(stack) > 0 && stack[len(stack)-1].object {
					stack[len(stack)-1].expect = true
				}
				continue
			}
		case string:
			if top != nil && top.object && top.expect {
				k := strings.ToLower(v)
				if top.keys[k] {
					return true
				}
				top.keys[k] = true
				top.expect = false
				continue
			}
		}
		if top != nil && top.object {
			top.expect = true
		}
	}
}

package edge

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/Tahul/caddy-zidane-mcp/message"
	"github.com/Tahul/caddy-zidane-mcp/policy"
)

// paramTools is a tools/list answer with x-mcp-header bindings: geo binds
// a string, an integer, a boolean and a nested string; plain binds
// nothing; broken binds a number, which go-sdk's client refuses (it drops
// the tool from its listing).
const paramTools = `{"jsonrpc":"2.0","id":7,"result":{"tools":[
{"name":"geo","inputSchema":{"type":"object","properties":{
  "region":{"type":"string","x-mcp-header":"Region"},
  "level":{"type":"integer","x-mcp-header":"Level"},
  "flag":{"type":"boolean","x-mcp-header":"Flag"},
  "where":{"type":"object","properties":{"zone":{"type":"string","x-mcp-header":"Zone"}}},
  "note":{"type":"string"}}}},
{"name":"plain","inputSchema":{"type":"object","properties":{"region":{"type":"string"}}}},
{"name":"broken","inputSchema":{"type":"object","properties":{"ratio":{"type":"number","x-mcp-header":"Ratio"}}}}
]}}`

// paramRoutes are the routes that check Mcp-Param-* headers, each with a
// principal that may call every tool on it.
func paramRoutes(t *testing.T) map[string]struct {
	route Route
	p     policy.Principal
} {
	t.Helper()
	all, err := policy.NewScopeMap([]policy.Rule{{Scope: "all", Tools: []string{"*"}, Methods: []string{"*"}}}, true)
	if err != nil {
		t.Fatal(err)
	}
	p := policy.Principal{TokenID: "t", Name: "all", Kind: policy.KindUser, Scopes: []string{"all", "upstream:a"}}
	cat := testCatalog()
	cat.tools = map[string]string{"geo": "a", "plain": "a", "broken": "a", "unlisted": "a"}
	return map[string]struct {
		route Route
		p     policy.Principal
	}{
		"guard":       {&Guard{Scopes: all}, p},
		"passthrough": {&Upstream{Scopes: all.Strict()}, p},
		"aggregate":   {&Aggregate{Catalog: cat, Allows: func(policy.Principal, string) bool { return true }}, p},
	}
}

// learnThrough passes a tools/list answer through route's listing filter,
// as the edge does on its way to the client.
func learnThrough(t *testing.T, route Route, p policy.Principal, answer string) {
	t.Helper()
	answerThroughRoute(t, route, p, listTools, answer)
}

// answerThroughRoute passes answer, to the request body, through route's
// listing filter.
func answerThroughRoute(t *testing.T, route Route, p policy.Principal, body, answer string) {
	t.Helper()
	b, err := message.Read([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	w, closeFilter := NewListing(route, p, b, nil).Wrap(httptest.NewRecorder())
	w.Header().Set("Content-Type", "application/json")
	io.WriteString(w, answer)
	if err := closeFilter(); err != nil {
		t.Fatal(err)
	}
}

func geoCall(args string) string {
	return `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"geo","arguments":` + args + `}}`
}

func TestParamHeaders(t *testing.T) {
	v := "2026-07-28"
	h := func(kv ...string) http.Header {
		out := http.Header{"Mcp-Protocol-Version": {v}, "Mcp-Method": {"tools/call"}}
		for i := 0; i+1 < len(kv); i += 2 {
			out[kv[i]] = append(out[kv[i]], kv[i+1])
		}
		return out
	}
	named := func(tool string, hd http.Header) http.Header { hd.Set("Mcp-Name", tool); return hd }
	geo := func(kv ...string) http.Header { return named("geo", h(kv...)) }
	cases := []struct {
		name   string
		header http.Header
		body   string
		ok     bool
	}{
		{"matching string", geo("Mcp-Param-Region", "us-west1"), geoCall(`{"region":"us-west1"}`), true},
		{"matching every kind", geo("Mcp-Param-Region", "eu", "Mcp-Param-Level", "3", "Mcp-Param-Flag", "true", "Mcp-Param-Zone", "b"),
			geoCall(`{"region":"eu","level":3,"flag":true,"where":{"zone":"b"},"note":"x"}`), true},
		{"no bound argument, no header", geo(), geoCall(`{"note":"x"}`), true},
		{"null argument, no header", geo(), geoCall(`{"region":null}`), true},
		{"integer spelled as JSON reads it", geo("Mcp-Param-Level", "100"), geoCall(`{"level":1e2}`), true},
		{"non-ASCII in base64", geo("Mcp-Param-Region", "=?base64?5pel5pys?="), geoCall(`{"region":"日本"}`), true},
		{"leading blank in base64", geo("Mcp-Param-Region", "=?base64?IGV1?="), geoCall(`{"region":" eu"}`), true},
		{"sentinel-looking value in base64", geo("Mcp-Param-Region", "=?base64?PT9iYXNlNjQ/eD89?="), geoCall(`{"region":"=?base64?x?="}`), true},
		{"case of the header name", geo("Mcp-Param-Region", "eu"), geoCall(`{"region":"eu"}`), true},
		// SEP-2243: a server decodes =?base64?…?= whatever the value, so a
		// value that needs no encoding may come encoded too (the
		// conformance suite's ServerAcceptsValidBase64).
		{"plain value in base64", geo("Mcp-Param-Region", "=?base64?SGVsbG8=?="), geoCall(`{"region":"Hello"}`), true},
		{"integer in base64", geo("Mcp-Param-Level", "=?base64?Mw==?="), geoCall(`{"level":3}`), true},
		{"boolean in base64", geo("Mcp-Param-Flag", "=?base64?dHJ1ZQ==?="), geoCall(`{"flag":true}`), true},
		{"nested value in base64", geo("Mcp-Param-Zone", "=?base64?Yg==?="), geoCall(`{"where":{"zone":"b"}}`), true},
		{"empty value in base64", geo("Mcp-Param-Region", "=?base64??="), geoCall(`{"region":""}`), true},
		// What only looks encoded is the value itself.
		{"base64 text without the wrapper", geo("Mcp-Param-Region", "SGVsbG8="), geoCall(`{"region":"SGVsbG8="}`), true},
		{"wrapper without its suffix", geo("Mcp-Param-Region", "=?base64?SGVsbG8="), geoCall(`{"region":"=?base64?SGVsbG8="}`), true},
		{"wrapper without its suffix, in base64", geo("Mcp-Param-Region", "=?base64?PT9iYXNlNjQ/U0dWc2JHOD0=?="), geoCall(`{"region":"=?base64?SGVsbG8="}`), true},
		{"wrapper in another case", geo("Mcp-Param-Region", "=?BASE64?SGVsbG8=?="), geoCall(`{"region":"=?BASE64?SGVsbG8=?="}`), true},
		{"standard alphabet", geo("Mcp-Param-Region", "=?base64?Pz8+?="), geoCall(`{"region":"??>"}`), true},
		{"non-ASCII, canonical", geo("Mcp-Param-Region", "=?base64?w6k=?="), geoCall(`{"region":"é"}`), true},

		// Attacks: a header that says something else than the body.
		{"other value", geo("Mcp-Param-Region", "eu"), geoCall(`{"region":"us"}`), false},
		{"value of another argument", geo("Mcp-Param-Region", "x"), geoCall(`{"note":"x"}`), false},
		{"header for an absent argument", geo("Mcp-Param-Region", "eu"), geoCall(`{}`), false},
		{"header for a null argument", geo("Mcp-Param-Region", "null"), geoCall(`{"region":null}`), false},
		{"empty header for an absent argument", geo("Mcp-Param-Region", ""), geoCall(`{}`), false},
		{"two values", geo("Mcp-Param-Region", "us", "Mcp-Param-Region", "us"), geoCall(`{"region":"us"}`), false},
		{"two values, one matching", geo("Mcp-Param-Region", "us", "Mcp-Param-Region", "eu"), geoCall(`{"region":"us"}`), false},
		{"spelled with _", geo("Mcp_Param_Region", "eu"), geoCall(`{"region":"us"}`), false},
		{"prefix spelled with _", geo("Mcp-Param_region", "eu"), geoCall(`{"region":"us"}`), false},
		{"spelled with _ beside the matching one", geo("Mcp-Param-Region", "us", "Mcp_param_region", "eu"), geoCall(`{"region":"us"}`), false},
		{"prefix spelled with _ beside the matching one", geo("Mcp-Param-Region", "us", "Mcp-Param_region", "eu"), geoCall(`{"region":"us"}`), false},
		{"header the tool does not bind", geo("Mcp-Param-Note", "x"), geoCall(`{"note":"x"}`), false},
		{"header of a nested name at the top", geo("Mcp-Param-Zone", "b"), geoCall(`{"zone":"b"}`), false},
		{"missing header, 2026-07-28", geo(), geoCall(`{"region":"us"}`), false},
		{"missing nested header", geo(), geoCall(`{"where":{"zone":"b"}}`), false},
		{"integer not canonical", geo("Mcp-Param-Level", "3.0"), geoCall(`{"level":3}`), false},
		{"integer with a sign", geo("Mcp-Param-Level", "+3"), geoCall(`{"level":3}`), false},
		{"integer in exponent form", geo("Mcp-Param-Level", "1e2"), geoCall(`{"level":100}`), false},
		{"boolean in another case", geo("Mcp-Param-Flag", "True"), geoCall(`{"flag":true}`), false},
		{"string for an integer", geo("Mcp-Param-Level", "3"), geoCall(`{"level":"3"}`), true}, // the body's string "3" is "3"
		{"header for a fraction", geo("Mcp-Param-Level", "3"), geoCall(`{"level":3.5}`), false},
		{"header for an unsafe integer", geo("Mcp-Param-Level", "9007199254740993"), geoCall(`{"level":9007199254740993}`), false},
		{"header for an object", geo("Mcp-Param-Region", "{}"), geoCall(`{"region":{}}`), false},
		{"non-ASCII sent raw", geo("Mcp-Param-Region", "日本"), geoCall(`{"region":"日本"}`), false},
		{"base64 of another value", geo("Mcp-Param-Region", "=?base64?5pel?="), geoCall(`{"region":"日本"}`), false},
		// Base64 that decoders read differently, or that is not the
		// argument's: one value has one encoding the edge takes.
		{"base64 of a different plain value", geo("Mcp-Param-Region", "=?base64?ZXU=?="), geoCall(`{"region":"us"}`), false},
		{"base64 of a value the body does not pass", geo("Mcp-Param-Region", "=?base64?ZXU=?="), geoCall(`{}`), false},
		{"second encoding of one value: non-zero pad bits", geo("Mcp-Param-Region", "=?base64?SGVsbG9=?="), geoCall(`{"region":"Hello"}`), false},
		{"second encoding of one value: non-zero pad bits, non-ASCII", geo("Mcp-Param-Region", "=?base64?w6l=?="), geoCall(`{"region":"é"}`), false},
		{"padding missing", geo("Mcp-Param-Region", "=?base64?SGVsbG8?="), geoCall(`{"region":"Hello"}`), false},
		{"padding doubled", geo("Mcp-Param-Region", "=?base64?SGVsbG8==?="), geoCall(`{"region":"Hello"}`), false},
		{"padding in the middle", geo("Mcp-Param-Region", "=?base64?SGVs=bG8=?="), geoCall(`{"region":"Hello"}`), false},
		{"characters outside the alphabet", geo("Mcp-Param-Region", "=?base64?SGVs!!!bG8=?="), geoCall(`{"region":"Hello"}`), false},
		{"blank inside", geo("Mcp-Param-Region", "=?base64?SGVs bG8=?="), geoCall(`{"region":"Hello"}`), false},
		{"URL-safe alphabet", geo("Mcp-Param-Region", "=?base64?Pz8-?="), geoCall(`{"region":"??>"}`), false},
		{"base64 of base64", geo("Mcp-Param-Region", "=?base64?PT9iYXNlNjQ/U0dWc2JHOD0/PQ==?="), geoCall(`{"region":"Hello"}`), false},
		{"integer in base64, not canonical", geo("Mcp-Param-Level", "=?base64?My4w?="), geoCall(`{"level":3}`), false},
		{"boolean in base64, other case", geo("Mcp-Param-Flag", "=?base64?VHJ1ZQ==?="), geoCall(`{"flag":true}`), false},
		{"base64 for a null argument", geo("Mcp-Param-Region", "=?base64?bnVsbA==?="), geoCall(`{"region":null}`), false},
		{"base64 for an object", geo("Mcp-Param-Region", "=?base64?e30=?="), geoCall(`{"region":{}}`), false},
		{"argument spelled with an escape", geo("Mcp-Param-Region", "eu"), geoCall(`{"regio\u006e":"us"}`), false},
		{"on a tool that binds nothing", named("plain", h("Mcp-Param-Region", "eu")),
			`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"plain","arguments":{"region":"eu"}}}`, false},
		{"on a tool whose bindings go-sdk refuses", named("broken", h("Mcp-Param-Ratio", "1")),
			`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"broken","arguments":{"ratio":1}}}`, false},
		{"on a tool never listed", named("unlisted", h("Mcp-Param-Region", "eu")),
			`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"unlisted","arguments":{"region":"eu"}}}`, false},
		{"on another method", http.Header{"Mcp-Protocol-Version": {v}, "Mcp-Method": {"tools/list"}, "Mcp-Param-Region": {"eu"}},
			`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`, false},
		{"on a batch", http.Header{"Mcp-Protocol-Version": {v}, "Mcp-Param-Region": {"eu"}},
			`[` + geoCall(`{"region":"eu"}`) + `]`, false},
		{"on a legacy call, not matching", http.Header{"Mcp-Param-Region": {"eu"}}, geoCall(`{"region":"us"}`), false},

		// What is not 2026-07-28 needs no header, and a tool never listed
		// without headers sends nothing unchecked on (its server checks).
		{"legacy call without headers", http.Header{}, geoCall(`{"region":"us"}`), true},
		{"legacy call, matching", http.Header{"Mcp-Param-Region": {"us"}}, geoCall(`{"region":"us"}`), true},
		{"tool never listed, no header", named("unlisted", h()),
			`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"unlisted","arguments":{"region":"eu"}}}`, true},
		{"tool binding nothing, no header", named("plain", h()),
			`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"plain","arguments":{"region":"eu"}}}`, true},
	}
	for routeName, rt := range paramRoutes(t) {
		learnThrough(t, rt.route, rt.p, paramTools)
		for _, tc := range cases {
			d := Decide(rt.route, rt.p, http.MethodPost, tc.header, []byte(tc.body))
			if d.Allowed() != tc.ok {
				t.Errorf("%s: %s: allowed %v (%s)", routeName, tc.name, d.Allowed(), d.Message)
				continue
			}
			if !tc.ok && (d.Status != http.StatusBadRequest || d.Code != message.CodeHeaderMismatch || d.Reason != "header_mismatch" || d.Message == "") {
				t.Errorf("%s: %s: refusal %d %d %q, want 400 -32020 header_mismatch", routeName, tc.name, d.Status, d.Code, d.Reason)
			}
		}
	}
	// The sessions endpoint keeps no bindings: its tools bind nothing, and
	// every Mcp-Param- header is refused there.
	rt := testRoutes(t)["sessions"]
	d := Decide(rt.route, rt.p, http.MethodPost, geo("Mcp-Param-Region", "us"), []byte(geoCall(`{"region":"us"}`)))
	if d.Allowed() || d.Code != message.CodeHeaderMismatch {
		t.Errorf("sessions: Mcp-Param-Region allowed %v (%d)", d.Allowed(), d.Code)
	}
}

// TestParamHeadersRelearn: a tool listed again with other bindings is
// checked by the new ones, and the store stays bounded.
func TestParamHeadersRelearn(t *testing.T) {
	rt := paramRoutes(t)["guard"]
	learnThrough(t, rt.route, rt.p, paramTools)
	learnThrough(t, rt.route, rt.p, `{"jsonrpc":"2.0","id":7,"result":{"tools":[{"name":"geo","inputSchema":{"type":"object","properties":{"region":{"type":"string"}}}}]}}`)
	hd := http.Header{"Mcp-Protocol-Version": {"2026-07-28"}, "Mcp-Method": {"tools/call"}, "Mcp-Name": {"geo"}, "Mcp-Param-Region": {"us"}}
	if d := Decide(rt.route, rt.p, http.MethodPost, hd, []byte(geoCall(`{"region":"us"}`))); d.Allowed() {
		t.Error("a header the tool no longer binds was allowed")
	}

	// A binding's name is matched as HTTP matches header names, whatever
	// the case the schema spells it in (go-sdk's client canonicalizes it
	// too, and so does Go's server the header it receives).
	learnThrough(t, rt.route, rt.p, `{"jsonrpc":"2.0","id":7,"result":{"tools":[{"name":"geo","inputSchema":{"type":"object","properties":{"region":{"type":"string","x-mcp-header":"rEGION"}}}}]}}`)
	hd.Set("mcp-param-REGION", "us")
	if d := Decide(rt.route, rt.p, http.MethodPost, hd, []byte(geoCall(`{"region":"us"}`))); !d.Allowed() {
		t.Errorf("a binding spelled rEGION refused Mcp-Param-Region: %s", d.Message)
	}

	// An answer to another request, shaped as a tools list (a server may
	// echo what a client sent it), teaches nothing.
	echo := paramRoutes(t)["passthrough"]
	answerThroughRoute(t, echo.route, echo.p, `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"echo"}}`,
		`{"jsonrpc":"2.0","id":7,"result":{"tools":[{"name":"geo","inputSchema":{"type":"object","properties":{"note":{"type":"string","x-mcp-header":"Region"}}}}]}}`)
	if _, known := paramsOf(echo.route).lookup("geo"); known {
		t.Error("bindings were learned from the answer to a tools/call")
	}

	var many strings.Builder
	many.WriteString(`{"jsonrpc":"2.0","id":7,"result":{"tools":[`)
	for i := range maxParamTools + 10 {
		if i > 0 {
			many.WriteByte(',')
		}
		fmt.Fprintf(&many, `{"name":"t%d","inputSchema":{"type":"object"}}`, i)
	}
	many.WriteString(`]}}`)
	g := paramRoutes(t)["guard"]
	learnThrough(t, g.route, g.p, many.String())
	ph := paramsOf(g.route)
	if n := len(ph.tools); n != maxParamTools {
		t.Fatalf("the store holds %d tools, want its bound %d", n, maxParamTools)
	}
}

// TestParamHeadersOfGoSDK runs go-sdk's own client and server through the
// edge's decision and listing filter: every header go-sdk's client sends
// for an argument (its encoding, base64 and all) is allowed and its server
// takes the call; a header changed on the way is refused by the edge
// before the server sees it.
func TestParamHeadersOfGoSDK(t *testing.T) {
	server := mcp.NewServer(&mcp.Implementation{Name: "geo", Version: "1"}, nil)
	var mu sync.Mutex
	var seen []string
	server.AddTool(&mcp.Tool{Name: "geo", InputSchema: json.RawMessage(`{"type":"object","properties":{
		"region":{"type":"string","x-mcp-header":"Region"},
		"level":{"type":"integer","x-mcp-header":"Level"},
		"flag":{"type":"boolean","x-mcp-header":"Flag"}}}`)},
		func(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			mu.Lock()
			seen = append(seen, string(req.Params.Arguments))
			mu.Unlock()
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "ok"}}}, nil
		})
	backend := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server }, &mcp.StreamableHTTPOptions{Stateless: true})
	rt := paramRoutes(t)["guard"]
	var tamper func(http.Header)
	var refusals []Verdict
	edgeSrv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body []byte
		if r.Method == http.MethodPost {
			body, _ = io.ReadAll(r.Body)
			r.Body = io.NopCloser(strings.NewReader(string(body)))
		}
		if tamper != nil && r.Header.Get("Mcp-Method") == "tools/call" {
			tamper(r.Header)
		}
		d := Decide(rt.route, rt.p, r.Method, r.Header, body)
		if !d.Allowed() {
			mu.Lock()
			refusals = append(refusals, d.Verdict)
			mu.Unlock()
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(d.Status)
			fmt.Fprintf(w, `{"jsonrpc":"2.0","id":null,"error":{"code":%d,"message":%q}}`, d.Code, d.Message)
			return
		}
		fw, closeFilter := NewListing(rt.route, rt.p, d.Body, nil).Wrap(w)
		backend.ServeHTTP(fw, r)
		closeFilter()
	}))
	defer edgeSrv.Close()

	ctx := context.Background()
	connect := func() *mcp.ClientSession {
		client := mcp.NewClient(&mcp.Implementation{Name: "c", Version: "1"}, nil)
		cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: edgeSrv.URL, MaxRetries: -1}, &mcp.ClientSessionOptions{ProtocolVersion: "2026-07-28"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cs.Close() })
		if _, err := cs.ListTools(ctx, nil); err != nil {
			t.Fatal(err)
		}
		return cs
	}
	cs := connect()
	values := []map[string]any{
		{"region": "us-west1", "level": 3, "flag": true},
		{"region": "日本", "level": -9007199254740991, "flag": false},
		{"region": " padded ", "level": json.RawMessage("1e2")},
		{"region": "=?base64?eA==?=", "level": 0},
		{"region": "tab\there"},
		{"region": "ascii ~!@#$%^&*()"},
		{"level": 9007199254740991},
		{},
	}
	for _, args := range values {
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "geo", Arguments: args})
		if err != nil || res.IsError {
			t.Errorf("go-sdk client with %v: %v %+v", args, err, res)
		}
	}
	mu.Lock()
	n := len(seen)
	if len(refusals) > 0 {
		t.Errorf("the edge refused go-sdk's own headers: %+v", refusals)
	}
	mu.Unlock()
	if n != len(values) {
		t.Fatalf("the server took %d calls, want %d", n, len(values))
	}

	for name, change := range map[string]func(http.Header){
		"value changed":     func(h http.Header) { h.Set("Mcp-Param-Region", "eu") },
		"value removed":     func(h http.Header) { h.Del("Mcp-Param-Region") },
		"value repeated":    func(h http.Header) { h.Add("Mcp-Param-Region", h.Get("Mcp-Param-Region")) },
		"unbound header":    func(h http.Header) { h.Set("Mcp-Param-Other", "x") },
		"spelled with _":    func(h http.Header) { h["Mcp_param_region"] = []string{"eu"} },
		"level not decimal": func(h http.Header) { h.Set("Mcp-Param-Level", "3.0") },
	} {
		tamper = change
		_, err := connect().CallTool(ctx, &mcp.CallToolParams{Name: "geo", Arguments: map[string]any{"region": "us", "level": 3}})
		mu.Lock()
		var last Verdict
		if len(refusals) > 0 {
			last = refusals[len(refusals)-1]
		}
		refusals = nil
		mu.Unlock()
		if err == nil || last.Code != message.CodeHeaderMismatch {
			t.Errorf("%s: go-sdk client got %v, edge refusal %+v; want the edge's -32020", name, err, last)
		}
	}
	tamper = nil
	mu.Lock()
	if len(seen) != n {
		t.Errorf("the server took %d calls the edge should have refused", len(seen)-n)
	}
	mu.Unlock()

	// A value sent base64-encoded (SEP-2243), as another client may: the
	// edge takes the canonical encoding, and go-sdk's server decodes it to
	// the argument and takes the call; a second encoding of the same value
	// (non-zero pad bits), which go-sdk's decoder would read as it, is
	// refused all the same.
	for _, tc := range []struct {
		name   string
		change func(http.Header)
		ok     bool
	}{
		{"every value base64-encoded", func(h http.Header) {
			for k, v := range h {
				if strings.HasPrefix(k, "Mcp-Param-") {
					h.Set(k, encodeBase64(v[0]))
				}
			}
		}, true},
		{"a second encoding of one value", func(h http.Header) { h.Set("Mcp-Param-Region", "=?base64?dXN=?=") }, false},
	} {
		tamper = tc.change
		res, err := connect().CallTool(ctx, &mcp.CallToolParams{Name: "geo", Arguments: map[string]any{"region": "us", "level": 3, "flag": true}})
		mu.Lock()
		got := len(refusals)
		refusals, seen = nil, nil
		mu.Unlock()
		if ok := err == nil && !res.IsError && got == 0; ok != tc.ok {
			t.Errorf("%s: go-sdk client got %v %+v, %d refusals by the edge; want taken %v", tc.name, err, res, got, tc.ok)
		}
	}
	tamper = nil
}

// What one replica learns of a tool's bindings, another takes in through
// Export and Merge, and then checks a call's Mcp-Param- headers by it; a
// later reading holds over an earlier one, and a shared tool that breaks
// the rules learn keeps is not taken.
func TestParamHeadersShared(t *testing.T) {
	p := policy.Principal{TokenID: "t", Name: "all", Kind: policy.KindUser, Scopes: []string{"all"}}
	all, err := policy.NewScopeMap([]policy.Rule{{Scope: "all", Tools: []string{"*"}, Methods: []string{"*"}}}, true)
	if err != nil {
		t.Fatal(err)
	}
	a, b := &Guard{Scopes: all, SharedParams: new(ParamHeaders)}, &Guard{Scopes: all, SharedParams: new(ParamHeaders)}
	changes := 0
	a.SharedParams.OnChange(func() { changes++ })
	learnThrough(t, a, p, paramTools)
	if changes != 3 {
		t.Fatalf("learning a listing of three tools told of %d changes, want 3", changes)
	}
	learnThrough(t, a, p, paramTools)
	if changes != 3 {
		t.Fatalf("the same listing again told of a change")
	}
	header := http.Header{"Mcp-Protocol-Version": {"2026-07-28"}, "Mcp-Method": {"tools/call"}, "Mcp-Name": {"geo"}, "Mcp-Param-Region": {"eu"}}
	call := geoCall(`{"region":"eu"}`)
	if d := Decide(b, p, http.MethodPost, header, []byte(call)); d.Allowed() {
		t.Fatal("a replica that never saw the listing checked the header")
	}
	if skipped, err := b.SharedParams.Merge(a.SharedParams.Export()); err != nil || skipped != 0 {
		t.Fatalf("Merge: %d skipped, %v", skipped, err)
	}
	if d := Decide(b, p, http.MethodPost, header, []byte(call)); !d.Allowed() {
		t.Fatalf("after Merge: %s", d.Message)
	}
	if d := Decide(b, p, http.MethodPost, header, []byte(geoCall(`{"region":"us"}`))); d.Allowed() || d.Code != message.CodeHeaderMismatch {
		t.Fatalf("after Merge a mismatching header passed: %+v", d.Verdict)
	}
	if changes != 3 {
		t.Fatal("Merge told of a change")
	}

	// The upstream drops geo's region binding; b reads that listing later
	// than a read the first: b's reading holds on a, and a's older export
	// does not undo it on b.
	relisted := strings.Replace(paramTools, `"region":{"type":"string","x-mcp-header":"Region"}`, `"region":{"type":"string"}`, 1)
	older := a.SharedParams.Export()
	learnThrough(t, b, p, relisted)
	if _, err := b.SharedParams.Merge(older); err != nil {
		t.Fatal(err)
	}
	if _, err := a.SharedParams.Merge(b.SharedParams.Export()); err != nil {
		t.Fatal(err)
	}
	for name, g := range map[string]*Guard{"a": a, "b": b} {
		if d := Decide(g, p, http.MethodPost, header, []byte(call)); d.Allowed() {
			t.Errorf("%s still takes the dropped binding's header", name)
		}
	}

	// Shared tools that break the rules are skipped; others are taken.
	c := new(ParamHeaders)
	skipped, err := c.Merge([]byte(`{"tools":{
		"lower":{"at":1,"bindings":[{"path":["x"],"header":"mcp-param-x"}]},
		"other":{"at":1,"bindings":[{"path":["x"],"header":"Authorization"}]},
		"twice":{"at":1,"bindings":[{"path":["x"],"header":"Mcp-Param-X"},{"path":["y"],"header":"Mcp-Param-X"}]},
		"nopath":{"at":1,"bindings":[{"path":[],"header":"Mcp-Param-X"}]},
		"badname":{"at":1,"bindings":[{"path":["x"],"header":"Mcp-Param-A B"}]},
		"invalid-with-bindings":{"at":1,"invalid":true,"bindings":[{"path":["x"],"header":"Mcp-Param-X"}]},
		"":{"at":1},
		"good":{"at":1,"bindings":[{"path":["x"],"header":"Mcp-Param-X"}]}}}`))
	if err != nil || skipped != 7 {
		t.Fatalf("Merge of bad tools: %d skipped, %v; want 7", skipped, err)
	}
	if _, known := c.lookup("good"); !known {
		t.Error("the good tool was not taken")
	}
	for _, bad := range []string{"lower", "other", "twice", "nopath", "badname", "invalid-with-bindings"} {
		if _, known := c.lookup(bad); known {
			t.Errorf("tool %q was taken", bad)
		}
	}
	if _, err := c.Merge([]byte(`[1,2]`)); err == nil {
		t.Error("Merge took data that is no export")
	}
	if _, known := c.lookup("good"); !known {
		t.Error("a refused Merge changed the store")
	}
}

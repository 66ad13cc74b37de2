package message

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
)

// want is what a table row expects of one Call; id is the ID's Key ("" for
// zero).
type want struct {
	method, id, tool, verb, prompt, uri string
	ref                                 Ref
	input                               bool
}

type row struct {
	name  string
	body  string
	err   error  // ErrSyntax, ErrAmbiguous, ErrMalformed; nil: accepted
	calls []want // for an accepted body
	batch bool
}

func tc(tool, verb string) string {
	return `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"` + tool + `","arguments":{"verb":"` + verb + `"}}}`
}

// nest returns a value nested n arrays deep.
func nest(n int) string { return strings.Repeat("[", n) + strings.Repeat("]", n) }

// readRows are the bodies an attacker sends, and what Read must make of
// them. SECRET marks client-chosen text that no error may quote.
var readRows = []row{
	// Accepted: the common messages.
	{name: "tools/call with verb", body: tc("sessions", "send"),
		calls: []want{{method: "tools/call", id: "1", tool: "sessions", verb: "send"}}},
	{name: "tools/call without arguments", body: `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo"}}`,
		calls: []want{{method: "tools/call", id: "2", tool: "echo"}}},
	{name: "tools/call without verb", body: `{"jsonrpc":"2.0","id":17,"method":"tools/call","params":{"name":"echo","arguments":{"text":"SECRET"}}}`,
		calls: []want{{method: "tools/call", id: "17", tool: "echo"}}},
	{name: "notification", body: `{"jsonrpc":"2.0","method":"notifications/initialized"}`,
		calls: []want{{method: "notifications/initialized"}}},
	{name: "ping with a string id", body: `{"jsonrpc":"2.0","id":"abc","method":"ping"}`,
		calls: []want{{method: "ping", id: `"abc"`}}},
	{name: "response with result", body: `{"jsonrpc":"2.0","id":5,"result":{"roots":[]}}`,
		calls: []want{{id: "5"}}},
	{name: "response with error", body: `{"jsonrpc":"2.0","id":5,"error":{"code":-32601,"message":"no","data":{"x":1}}}`,
		calls: []want{{id: "5"}}},
	// go-sdk refuses a client's answer without a valid id.
	{name: "error answer with a null id", body: `{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"parse error"}}`, err: ErrMalformed},
	{name: "tools/call with null arguments (go-sdk's nil map)", body: `{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"echo","arguments":null}}`,
		calls: []want{{method: "tools/call", id: "3", tool: "echo"}}},
	{name: "prompts/get", body: `{"jsonrpc":"2.0","id":3,"method":"prompts/get","params":{"name":"review","arguments":{"x":"y"}}}`,
		calls: []want{{method: "prompts/get", id: "3", prompt: "review"}}},
	{name: "resources/read", body: `{"jsonrpc":"2.0","id":3,"method":"resources/read","params":{"uri":"file:///a"}}`,
		calls: []want{{method: "resources/read", id: "3", uri: "file:///a"}}},
	{name: "resources/subscribe", body: `{"jsonrpc":"2.0","id":3,"method":"resources/subscribe","params":{"uri":"file:///a"}}`,
		calls: []want{{method: "resources/subscribe", id: "3", uri: "file:///a"}}},
	{name: "resources/unsubscribe", body: `{"jsonrpc":"2.0","id":3,"method":"resources/unsubscribe","params":{"uri":"file:///a"}}`,
		calls: []want{{method: "resources/unsubscribe", id: "3", uri: "file:///a"}}},
	{name: "completion of a prompt", body: `{"jsonrpc":"2.0","id":4,"method":"completion/complete","params":{"ref":{"type":"ref/prompt","name":"review"},"argument":{"name":"a","value":"b"}}}`,
		calls: []want{{method: "completion/complete", id: "4", ref: Ref{Type: "ref/prompt", Name: "review"}}}},
	{name: "completion of a resource", body: `{"jsonrpc":"2.0","id":4,"method":"completion/complete","params":{"ref":{"type":"ref/resource","uri":"file:///{x}"}}}`,
		calls: []want{{method: "completion/complete", id: "4", ref: Ref{Type: "ref/resource", URI: "file:///{x}"}}}},
	{name: "params before method", body: `{"jsonrpc":"2.0","params":{"name":"sessions","arguments":{"verb":"list"}},"id":1,"method":"tools/call"}`,
		calls: []want{{method: "tools/call", id: "1", tool: "sessions", verb: "list"}}},
	{name: "other method, params array", body: `{"jsonrpc":"2.0","id":1,"method":"x/y","params":[1,2,{"a":"b"}]}`,
		calls: []want{{method: "x/y", id: "1"}}},
	{name: "other method, params null", body: `{"jsonrpc":"2.0","id":1,"method":"tools/list","params":null}`,
		calls: []want{{method: "tools/list", id: "1"}}},
	{name: "other method, params with _meta", body: `{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"cursor":"c","_meta":{"progressToken":1}}}`,
		calls: []want{{method: "tools/list", id: "1"}}},
	{name: "tools/call with _meta and inputResponses", body: `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","_meta":{},"inputResponses":{"a":{}},"requestState":"s"}}`,
		calls: []want{{method: "tools/call", id: "1", tool: "t", input: true}}},
	{name: "method value in another case is another method", body: `{"jsonrpc":"2.0","id":1,"method":"Tools/Call","params":{"Name":"x"}}`,
		calls: []want{{method: "Tools/Call", id: "1"}}},
	{name: "unknown envelope member", body: `{"jsonrpc":"2.0","id":1,"method":"ping","SECRET":"x"}`,
		calls: []want{{method: "ping", id: "1"}}},
	{name: "keys that differ", body: `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","names":"x","nam":"y","arguments":{"verbs":1,"ver":2}}}`,
		calls: []want{{method: "tools/call", id: "1", tool: "t"}}},
	{name: "same key in sibling objects", body: `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","arguments":{"a":{"k":1},"b":{"k":1},"c":[{"k":1},{"k":2}]}}}`,
		calls: []want{{method: "tools/call", id: "1", tool: "t"}}},
	{name: "whitespace around", body: " \t\r\n" + tc("a", "b") + " \n\t\r",
		calls: []want{{method: "tools/call", id: "1", tool: "a", verb: "b"}}},
	{name: "whitespace everywhere", body: "{ \"jsonrpc\" : \"2.0\" , \"id\" : 1 , \"method\" : \"tools/call\" , \"params\" : { \"name\" : \"a\" , \"arguments\" : { \"verb\" : \"b\" } } }",
		calls: []want{{method: "tools/call", id: "1", tool: "a", verb: "b"}}},

	// Accepted: values with escapes and non-ASCII are decoded, as every
	// reader decodes them.
	{name: "escaped method", body: `{"jsonrpc":"2.0","id":1,"method":"tools\/call","params":{"name":"a\u0062c","arguments":{"verb":"s\u0065nd"}}}`,
		calls: []want{{method: "tools/call", id: "1", tool: "abc", verb: "send"}}},
	{name: "escaped version", body: `{"jsonrpc":"2\u002e0","id":1,"method":"ping"}`,
		calls: []want{{method: "ping", id: "1"}}},
	{name: "non-ASCII value escaped", body: `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"caf\u00e9"}}`,
		calls: []want{{method: "tools/call", id: "1", tool: "café"}}},
	{name: "non-ASCII value raw", body: `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"café"}}`,
		calls: []want{{method: "tools/call", id: "1", tool: "café"}}},
	{name: "raw U+FFFD is valid", body: "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\",\"params\":{\"name\":\"a\xef\xbf\xbdb\"}}",
		calls: []want{{method: "tools/call", id: "1", tool: "a\uFFFDb"}}},
	{name: "surrogate pair escape", body: `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"\ud83d\ude00"}}`,
		calls: []want{{method: "tools/call", id: "1", tool: "😀"}}},
	{name: "4-byte UTF-8 raw", body: `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"😀"}}`,
		calls: []want{{method: "tools/call", id: "1", tool: "😀"}}},
	{name: "escaped control characters", body: `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a\n\t\"\\\/\b\f\r\u0000"}}`,
		calls: []want{{method: "tools/call", id: "1", tool: "a\n\t\"\\/\b\f\r\x00"}}},
	{name: "U+2028 raw in a value", body: "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\",\"params\":{\"name\":\"a\u2028b\"}}",
		calls: []want{{method: "tools/call", id: "1", tool: "a\u2028b"}}},
	{name: "non-ASCII key not a field", body: `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","nämé":1,"arguments":{"vérb":"x"}}}`,
		calls: []want{{method: "tools/call", id: "1", tool: "t"}}},
	{name: "escaped key not a field", body: `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","n\u0061mes":1}}`,
		calls: []want{{method: "tools/call", id: "1", tool: "t"}}},

	// Accepted: ids.
	{name: "id 7", body: `{"jsonrpc":"2.0","id":7,"method":"ping"}`, calls: []want{{method: "ping", id: "7"}}},
	{name: "id -7", body: `{"jsonrpc":"2.0","id":-7,"method":"ping"}`, calls: []want{{method: "ping", id: "-7"}}},
	{name: "id 0", body: `{"jsonrpc":"2.0","id":0,"method":"ping"}`, calls: []want{{method: "ping", id: "0"}}},
	{name: `id "7"`, body: `{"jsonrpc":"2.0","id":"7","method":"ping"}`, calls: []want{{method: "ping", id: `"7"`}}},
	{name: `id ""`, body: `{"jsonrpc":"2.0","id":"","method":"ping"}`, calls: []want{{method: "ping", id: `""`}}},
	{name: "id 2^53-1", body: `{"jsonrpc":"2.0","id":9007199254740991,"method":"ping"}`, calls: []want{{method: "ping", id: "9007199254740991"}}},
	{name: "id -(2^53-1)", body: `{"jsonrpc":"2.0","id":-9007199254740991,"method":"ping"}`, calls: []want{{method: "ping", id: "-9007199254740991"}}},
	{name: "id escaped string", body: `{"jsonrpc":"2.0","id":"\u0078","method":"ping"}`, calls: []want{{method: "ping", id: `"x"`}}},

	// Accepted: batches.
	{name: "batch", body: `[` + tc("a", "b") + `,{"jsonrpc":"2.0","id":2,"method":"ping"}]`, batch: true,
		calls: []want{{method: "tools/call", id: "1", tool: "a", verb: "b"}, {method: "ping", id: "2"}}},
	{name: "batch, 7 and \"7\" differ", body: `[{"jsonrpc":"2.0","id":7,"method":"ping"},{"jsonrpc":"2.0","id":"7","method":"ping"}]`, batch: true,
		calls: []want{{method: "ping", id: "7"}, {method: "ping", id: `"7"`}}},
	{name: "batch, a response may share a request's id", body: `[{"jsonrpc":"2.0","id":7,"method":"ping"},{"jsonrpc":"2.0","id":7,"result":{}}]`, batch: true,
		calls: []want{{method: "ping", id: "7"}, {id: "7"}}},
	{name: "batch of notifications", body: ` [ {"jsonrpc":"2.0","method":"a"} , {"jsonrpc":"2.0","method":"a"} ] `, batch: true,
		calls: []want{{method: "a"}, {method: "a"}}},
	{name: "nested 128 deep", body: `{"jsonrpc":"2.0","id":1,"method":"x","params":` + nest(127) + `}`,
		calls: []want{{method: "x", id: "1"}}},

	// Ambiguous: duplicate keys, anywhere.
	{name: "method twice", body: `{"jsonrpc":"2.0","id":1,"method":"tools/list","method":"tools/call","params":{"name":"x"}}`, err: ErrAmbiguous},
	{name: "method and Method", body: `{"jsonrpc":"2.0","id":1,"method":"tools/list","Method":"tools/call","params":{"name":"x"}}`, err: ErrAmbiguous},
	{name: "name and Name", body: `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"safe","Name":"SECRET"}}`, err: ErrAmbiguous},
	{name: "name and NAME", body: `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"NAME":"SECRET","name":"safe"}}`, err: ErrAmbiguous},
	{name: "verb and Verb", body: `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"sessions","arguments":{"verb":"list","Verb":"delete"}}}`, err: ErrAmbiguous},
	{name: "name and n\\u0061me", body: `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"safe","n\u0061me":"SECRET"}}`, err: ErrAmbiguous},
	{name: "\\u004eame and name", body: `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"\u004eame":"SECRET","name":"safe"}}`, err: ErrAmbiguous},
	{name: "id twice", body: `{"jsonrpc":"2.0","id":1,"id":2,"method":"ping"}`, err: ErrAmbiguous},
	{name: "params twice", body: `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a"},"params":{"name":"b"}}`, err: ErrAmbiguous},
	{name: "duplicate deep in arguments", body: `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","arguments":{"a":[{"b":{"SECRETkey":1,"secretKEY":2}}]}}}`, err: ErrAmbiguous},
	{name: "duplicate in params of an unread method", body: `{"jsonrpc":"2.0","id":1,"method":"x","params":{"a":1,"a":2}}`, err: ErrAmbiguous},
	{name: "duplicate in a result", body: `{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","TYPE":"x"}]}}`, err: ErrAmbiguous},
	{name: "long s folds to s", body: `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","arguments":{"ſecret":1,"Secret":2}}}`, err: ErrAmbiguous},
	{name: "Kelvin sign folds to k", body: `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","arguments":{"\u212aey":1,"key":2}}}`, err: ErrAmbiguous},
	{name: "duplicate in a batch element", body: `[{"jsonrpc":"2.0","id":1,"method":"ping"},{"jsonrpc":"2.0","id":2,"method":"ping","method":"x"}]`, err: ErrAmbiguous},

	// Ambiguous: a lone key that encoding/json would read as a field.
	{name: "lone Method", body: `{"jsonrpc":"2.0","id":1,"Method":"tools/call","params":{"name":"x"}}`, err: ErrAmbiguous},
	{name: "lone METHOD", body: `{"jsonrpc":"2.0","id":1,"METHOD":"ping"}`, err: ErrAmbiguous},
	{name: "lone Params", body: `{"jsonrpc":"2.0","id":1,"method":"x","Params":{}}`, err: ErrAmbiguous},
	{name: "lone ID", body: `{"jsonrpc":"2.0","ID":1,"method":"ping"}`, err: ErrAmbiguous},
	{name: "lone JSONRPC", body: `{"JSONRPC":"2.0","id":1,"method":"ping"}`, err: ErrAmbiguous},
	{name: "lone Result", body: `{"jsonrpc":"2.0","id":1,"Result":{}}`, err: ErrAmbiguous},
	{name: "lone nAmE", body: `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"nAmE":"x"}}`, err: ErrAmbiguous},
	{name: "lone Arguments", body: `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"sessions","Arguments":{"verb":"delete"}}}`, err: ErrAmbiguous},
	{name: "lone Verb", body: `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"sessions","arguments":{"Verb":"delete"}}}`, err: ErrAmbiguous},
	{name: "lone URI", body: `{"jsonrpc":"2.0","id":1,"method":"resources/read","params":{"URI":"file:///etc"}}`, err: ErrAmbiguous},
	{name: "lone _META", body: `{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"_META":{}}}`, err: ErrAmbiguous},
	{name: "ref Type", body: `{"jsonrpc":"2.0","id":1,"method":"completion/complete","params":{"ref":{"Type":"ref/prompt","name":"a"}}}`, err: ErrAmbiguous},
	{name: "long s spells params", body: `{"jsonrpc":"2.0","id":1,"method":"x","paramſ":{}}`, err: ErrAmbiguous},
	{name: "long s spells arguments", body: `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","argumentſ":{"verb":"x"}}}`, err: ErrAmbiguous},
	{name: "lone escaped n\\u0061me", body: `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"n\u0061me":"x"}}`, err: ErrAmbiguous},
	{name: "lone escaped \\u006dethod", body: `{"jsonrpc":"2.0","id":1,"\u006dethod":"ping"}`, err: ErrAmbiguous},
	{name: "lone escaped verb", body: `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","arguments":{"v\u0065rb":"delete"}}}`, err: ErrAmbiguous},
	{name: "error Code", body: `{"jsonrpc":"2.0","id":1,"error":{"Code":1,"code":1,"message":"m"}}`, err: ErrAmbiguous},
	{name: "__proto__ in arguments", body: `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"sessions","arguments":{"__proto__":{"verb":"delete"}}}}`, err: ErrAmbiguous},
	{name: "escaped __proto__", body: `{"jsonrpc":"2.0","id":1,"method":"x","params":{"\u005f_proto__":{}}}`, err: ErrAmbiguous},

	// Ambiguous: UTF-8 and surrogates.
	{name: "invalid byte in a value", body: "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\",\"params\":{\"name\":\"a\xffb\"}}", err: ErrAmbiguous},
	{name: "overlong slash", body: "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\",\"params\":{\"name\":\"a\xc0\xafb\"}}", err: ErrAmbiguous},
	{name: "surrogate in UTF-8", body: "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"x\",\"params\":{\"a\":\"\xed\xa0\x80\"}}", err: ErrAmbiguous},
	{name: "truncated UTF-8 before a quote", body: "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"x\",\"params\":{\"a\":\"\xe2\x82\"}}", err: ErrAmbiguous},
	{name: "invalid UTF-8 in a key", body: "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"x\",\"params\":{\"\xff\":1}}", err: ErrAmbiguous},
	{name: "invalid UTF-8 deep in arguments", body: "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\",\"params\":{\"name\":\"t\",\"arguments\":{\"a\":[\"ok\",\"\xf8\x88\x80\x80\x80\"]}}}", err: ErrAmbiguous},
	{name: "lone high surrogate", body: `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"\ud800"}}`, err: ErrAmbiguous},
	{name: "lone low surrogate", body: `{"jsonrpc":"2.0","id":1,"method":"x","params":{"a":"\udc00"}}`, err: ErrAmbiguous},
	{name: "misordered surrogates", body: `{"jsonrpc":"2.0","id":1,"method":"x","params":{"a":"\udc00\ud800"}}`, err: ErrAmbiguous},
	{name: "high surrogate then a letter", body: `{"jsonrpc":"2.0","id":1,"method":"x","params":{"a":"\ud800\u0041"}}`, err: ErrAmbiguous},
	{name: "lone surrogate in a key", body: `{"jsonrpc":"2.0","id":1,"method":"x","params":{"\ud800":1,"\ud801":2}}`, err: ErrAmbiguous},

	// Ambiguous: around the value.
	{name: "trailing x", body: tc("a", "b") + "x", err: ErrAmbiguous},
	{name: "two objects", body: `{"jsonrpc":"2.0","id":1,"method":"ping"}{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"x"}}`, err: ErrAmbiguous},
	{name: "{}{}", body: `{}{}`, err: ErrAmbiguous},
	{name: "trailing NUL", body: tc("a", "b") + "\x00", err: ErrAmbiguous},
	{name: "trailing form feed", body: tc("a", "b") + "\f", err: ErrAmbiguous},
	{name: "byte-order mark", body: "\xef\xbb\xbf" + tc("a", "b"), err: ErrAmbiguous},
	{name: "nested 129 deep", body: `{"jsonrpc":"2.0","id":1,"method":"x","params":` + nest(128) + `}`, err: ErrAmbiguous},

	// Ambiguous: ids.
	{name: "id 1.0", body: `{"jsonrpc":"2.0","id":1.0,"method":"ping"}`, err: ErrAmbiguous},
	{name: "id 1.5", body: `{"jsonrpc":"2.0","id":1.5,"method":"ping"}`, err: ErrAmbiguous},
	{name: "id 1e0", body: `{"jsonrpc":"2.0","id":1e0,"method":"ping"}`, err: ErrAmbiguous},
	{name: "id 1e2", body: `{"jsonrpc":"2.0","id":1e2,"method":"ping"}`, err: ErrAmbiguous},
	{name: "id -0", body: `{"jsonrpc":"2.0","id":-0,"method":"ping"}`, err: ErrAmbiguous},
	{name: "id 2^53", body: `{"jsonrpc":"2.0","id":9007199254740992,"method":"ping"}`, err: ErrAmbiguous},
	{name: "id -2^53", body: `{"jsonrpc":"2.0","id":-9007199254740992,"method":"ping"}`, err: ErrAmbiguous},
	{name: "id null on a request", body: `{"jsonrpc":"2.0","id":null,"method":"tools/call","params":{"name":"x"}}`, err: ErrAmbiguous},
	{name: "id null on a notification", body: `{"jsonrpc":"2.0","id":null,"method":"notifications/cancelled"}`, err: ErrAmbiguous},
	{name: "id 20 digits", body: `{"jsonrpc":"2.0","id":12345678901234567890,"method":"ping"}`, err: ErrAmbiguous},
	{name: "batch, same id twice", body: `[{"jsonrpc":"2.0","id":1,"method":"ping"},{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x"}}]`, err: ErrAmbiguous},
	{name: "batch, same string id, escaped", body: `[{"jsonrpc":"2.0","id":"x","method":"ping"},{"jsonrpc":"2.0","id":"\u0078","method":"ping"}]`, err: ErrAmbiguous},

	// Syntax.
	{name: "empty", body: ``, err: ErrSyntax},
	{name: "whitespace only", body: " \n", err: ErrSyntax},
	{name: "unclosed object", body: `{"jsonrpc":"2.0"`, err: ErrSyntax},
	{name: "key without value", body: `{"jsonrpc"}`, err: ErrSyntax},
	{name: "trailing comma", body: `{"jsonrpc":"2.0","id":1,"method":"ping",}`, err: ErrSyntax},
	{name: "trailing comma in array", body: `{"jsonrpc":"2.0","id":1,"method":"x","params":[1,]}`, err: ErrSyntax},
	{name: "id 01", body: `{"jsonrpc":"2.0","id":01,"method":"ping"}`, err: ErrSyntax},
	{name: "id +1", body: `{"jsonrpc":"2.0","id":+1,"method":"ping"}`, err: ErrSyntax},
	{name: "single quotes", body: `{"jsonrpc":'2.0',"id":1,"method":"ping"}`, err: ErrSyntax},
	{name: "control character in a string", body: "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\x01\"}", err: ErrSyntax},
	{name: "raw tab in a string", body: "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"pi\tng\"}", err: ErrSyntax},
	{name: "invalid escape", body: `{"jsonrpc":"2.0","id":1,"method":"\x41"}`, err: ErrSyntax},
	{name: "short \\u escape", body: `{"jsonrpc":"2.0","id":1,"method":"\u12g4"}`, err: ErrSyntax},
	{name: "bad literal", body: `{"jsonrpc":"2.0","id":1,"method":"x","params":tru}`, err: ErrSyntax},
	{name: "NaN", body: `{"jsonrpc":"2.0","id":NaN,"method":"x"}`, err: ErrSyntax},
	{name: "number 1.", body: `{"jsonrpc":"2.0","id":1.,"method":"x"}`, err: ErrSyntax},
	{name: "number .5", body: `{"jsonrpc":"2.0","id":.5,"method":"x"}`, err: ErrSyntax},
	{name: "number 1e", body: `{"jsonrpc":"2.0","id":1e,"method":"x"}`, err: ErrSyntax},
	{name: "unterminated string", body: `{"jsonrpc":"2.0","id":1,"method":"x`, err: ErrSyntax},
	{name: "leading garbage", body: `x{"jsonrpc":"2.0","id":1,"method":"ping"}`, err: ErrSyntax},
	{name: "key not a string", body: `{jsonrpc:"2.0"}`, err: ErrSyntax},
	{name: "syntax error after an ambiguity", body: `{"method":"a","Method":"b",}`, err: ErrSyntax},
	{name: "syntax error after a malformation", body: `[1,{"jsonrpc":"2.0"]`, err: ErrSyntax},

	// Malformed.
	{name: "top-level number", body: `5`, err: ErrMalformed},
	{name: "top-level string", body: `"tools/call"`, err: ErrMalformed},
	{name: "top-level null", body: `null`, err: ErrMalformed},
	{name: "empty batch", body: `[]`, err: ErrMalformed},
	{name: "batch element a number", body: `[` + tc("a", "b") + `,1]`, err: ErrMalformed},
	{name: "nested batch", body: `[[` + tc("a", "b") + `]]`, err: ErrMalformed},
	{name: "jsonrpc missing", body: `{"id":1,"method":"ping"}`, err: ErrMalformed},
	{name: "jsonrpc 1.0", body: `{"jsonrpc":"1.0","id":1,"method":"ping"}`, err: ErrMalformed},
	{name: "jsonrpc a number", body: `{"jsonrpc":2.0,"id":1,"method":"ping"}`, err: ErrMalformed},
	{name: "method empty", body: `{"jsonrpc":"2.0","id":1,"method":""}`, err: ErrMalformed},
	{name: "method a number", body: `{"jsonrpc":"2.0","id":1,"method":5}`, err: ErrMalformed},
	{name: "method null", body: `{"jsonrpc":"2.0","id":1,"method":null}`, err: ErrMalformed},
	{name: "no method, result or error", body: `{"jsonrpc":"2.0","id":1}`, err: ErrMalformed},
	{name: "result and error", body: `{"jsonrpc":"2.0","id":1,"result":{},"error":{"code":1,"message":"m"}}`, err: ErrMalformed},
	{name: "method and result", body: `{"jsonrpc":"2.0","id":1,"method":"ping","result":{}}`, err: ErrMalformed},
	{name: "id true", body: `{"jsonrpc":"2.0","id":true,"method":"ping"}`, err: ErrMalformed},
	{name: "id object", body: `{"jsonrpc":"2.0","id":{"SECRET":1},"method":"ping"}`, err: ErrMalformed},
	{name: "id array", body: `{"jsonrpc":"2.0","id":[1],"method":"ping"}`, err: ErrMalformed},
	{name: "tools/call without params", body: `{"jsonrpc":"2.0","id":1,"method":"tools/call"}`, err: ErrMalformed},
	{name: "tools/call params array", body: `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":["sessions"]}`, err: ErrMalformed},
	{name: "tools/call params null", body: `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":null}`, err: ErrMalformed},
	{name: "tools/call without name", body: `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"arguments":{}}}`, err: ErrMalformed},
	{name: "tools/call name empty", body: `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":""}}`, err: ErrMalformed},
	{name: "tools/call name a number", body: `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":5}}`, err: ErrMalformed},
	{name: "tools/call name null", body: `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":null}}`, err: ErrMalformed},
	{name: "arguments a string", body: `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","arguments":"SECRET"}}`, err: ErrMalformed},
	{name: "arguments an array", body: `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","arguments":[]}}`, err: ErrMalformed},
	{name: "verb a number", body: `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","arguments":{"verb":5}}}`, err: ErrMalformed},
	{name: "verb null", body: `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","arguments":{"verb":null}}}`, err: ErrMalformed},
	{name: "verb an array", body: `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","arguments":{"verb":["delete"]}}}`, err: ErrMalformed},
	{name: "_meta a string", body: `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","_meta":"x"}}`, err: ErrMalformed},
	{name: "prompts/get without name", body: `{"jsonrpc":"2.0","id":1,"method":"prompts/get","params":{}}`, err: ErrMalformed},
	{name: "prompts/get name a number", body: `{"jsonrpc":"2.0","id":1,"method":"prompts/get","params":{"name":1}}`, err: ErrMalformed},
	{name: "prompts/get without params", body: `{"jsonrpc":"2.0","id":1,"method":"prompts/get"}`, err: ErrMalformed},
	{name: "resources/read without uri", body: `{"jsonrpc":"2.0","id":1,"method":"resources/read","params":{}}`, err: ErrMalformed},
	{name: "resources/subscribe uri a number", body: `{"jsonrpc":"2.0","id":1,"method":"resources/subscribe","params":{"uri":1}}`, err: ErrMalformed},
	{name: "resources/unsubscribe without params", body: `{"jsonrpc":"2.0","id":1,"method":"resources/unsubscribe"}`, err: ErrMalformed},
	{name: "completion without ref", body: `{"jsonrpc":"2.0","id":1,"method":"completion/complete","params":{}}`, err: ErrMalformed},
	{name: "completion ref a string", body: `{"jsonrpc":"2.0","id":1,"method":"completion/complete","params":{"ref":"ref/prompt"}}`, err: ErrMalformed},
	{name: "completion ref without type", body: `{"jsonrpc":"2.0","id":1,"method":"completion/complete","params":{"ref":{"name":"a"}}}`, err: ErrMalformed},
	{name: "completion ref type a number", body: `{"jsonrpc":"2.0","id":1,"method":"completion/complete","params":{"ref":{"type":1}}}`, err: ErrMalformed},
	{name: "ref/prompt without name", body: `{"jsonrpc":"2.0","id":1,"method":"completion/complete","params":{"ref":{"type":"ref/prompt","uri":"x"}}}`, err: ErrMalformed},
	{name: "ref/resource without uri", body: `{"jsonrpc":"2.0","id":1,"method":"completion/complete","params":{"ref":{"type":"ref/resource","name":"x"}}}`, err: ErrMalformed},
	{name: "response without id", body: `{"jsonrpc":"2.0","result":{}}`, err: ErrMalformed},
	{name: "response with params", body: `{"jsonrpc":"2.0","id":1,"result":{},"params":{}}`, err: ErrMalformed},
	{name: "error a string", body: `{"jsonrpc":"2.0","id":1,"error":"SECRET"}`, err: ErrMalformed},
	{name: "error without code", body: `{"jsonrpc":"2.0","id":1,"error":{"message":"m"}}`, err: ErrMalformed},
	{name: "error code 1.5", body: `{"jsonrpc":"2.0","id":1,"error":{"code":1.5,"message":"m"}}`, err: ErrMalformed},
	{name: "ambiguity reported before a malformation", body: `{"id":1,"method":"ping","x":{"a":1,"A":1}}`, err: ErrAmbiguous},
}

func TestRead(t *testing.T) {
	for _, tt := range readRows {
		t.Run(tt.name, func(t *testing.T) {
			b, err := Read([]byte(tt.body))
			if tt.err != nil {
				if !errors.Is(err, tt.err) {
					t.Fatalf("Read = %v, want %v", err, tt.err)
				}
				var e *Error
				if !errors.As(err, &e) || e.Offset < 0 || e.Offset > len(tt.body) || e.Msg == "" {
					t.Fatalf("error %#v: want an *Error with an offset in the body and a message", err)
				}
				if strings.Contains(err.Error(), "SECRET") {
					t.Fatalf("error %q quotes the body", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Read: %v", err)
			}
			if b.Batch != tt.batch || len(b.Calls) != len(tt.calls) {
				t.Fatalf("batch %v with %d calls, want %v with %d", b.Batch, len(b.Calls), tt.batch, len(tt.calls))
			}
			if string(b.Raw) != tt.body {
				t.Fatal("Raw is not the body")
			}
			for i, c := range b.Calls {
				got := want{c.Method, c.ID.Key(), c.Tool, c.Verb, c.Prompt, c.URI, c.Ref, c.InputResponses}
				if got != tt.calls[i] {
					t.Errorf("call %d = %+v, want %+v", i, got, tt.calls[i])
				}
			}
		})
	}
}

// TestReadSpans checks that the spans are the body's own bytes.
func TestReadSpans(t *testing.T) {
	raw := []byte(` {"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","_meta":{"p":1},"arguments":{"verb":"v","x":[1]}}} `)
	b, err := Read(raw)
	if err != nil {
		t.Fatal(err)
	}
	c := b.Calls[0]
	for _, s := range []struct{ name, got, want string }{
		{"Raw", string(c.Raw), string(raw[1 : len(raw)-1])},
		{"Params", string(c.Params), `{"name":"t","_meta":{"p":1},"arguments":{"verb":"v","x":[1]}}`},
		{"Arguments", string(c.Arguments), `{"verb":"v","x":[1]}`},
		{"Meta", string(c.Meta), `{"p":1}`},
	} {
		if s.got != s.want {
			t.Errorf("%s = %s, want %s", s.name, s.got, s.want)
		}
	}
	if &c.Raw[0] != &raw[1] {
		t.Error("Raw is a copy, want a sub-slice of the body")
	}
	if c.Result != nil {
		t.Error("Result set on a request")
	}
	resp, err := Read([]byte(`{"jsonrpc":"2.0","id":"a","result":{"ok":true}}`))
	if err != nil {
		t.Fatal(err)
	}
	if r := resp.Calls[0]; string(r.Result) != `{"ok":true}` || !r.IsResponse() || r.Params != nil {
		t.Errorf("response = %+v", r)
	}
}

func TestCallName(t *testing.T) {
	for _, tt := range []struct {
		c    Call
		want string
	}{
		{Call{Method: "tools/call", Tool: "t", Prompt: "p", URI: "u"}, "t"},
		{Call{Method: "prompts/get", Tool: "t", Prompt: "p", URI: "u"}, "p"},
		{Call{Method: "resources/read", URI: "u"}, "u"},
		{Call{Method: "resources/subscribe", URI: "u"}, ""},
		{Call{Method: "tools/list"}, ""},
	} {
		if got := tt.c.Name(); got != tt.want {
			t.Errorf("%s: Name() = %q, want %q", tt.c.Method, got, tt.want)
		}
	}
}

// TestErrorsNeverQuoteTheBody puts a credential where each kind of error
// fires and checks that no message carries it.
func TestErrorsNeverQuoteTheBody(t *testing.T) {
	const secret = "sk-live-0123456789abcdef"
	for _, body := range []string{
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"` + secret + `","Name":"` + secret + `"}}`,
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","arguments":{"` + secret + `":1,"` + strings.ToUpper(secret) + `":2}}}`,
		`{"jsonrpc":"2.0","id":1,"` + secret + `":1,"` + secret + `":2}`,
		`{"jsonrpc":"2.0","id":"` + secret + "\xff" + `","method":"x"}`,
		`{"jsonrpc":"2.0","id":1,"method":"` + secret + `\q"}`,
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","arguments":"` + secret + `"}}`,
		`{"jsonrpc":"2.0","id":1,"method":"` + secret + `","params":{"name":1}} ` + secret,
		`{"jsonrpc":"` + secret + `","id":1,"method":"x"}`,
		`[{"jsonrpc":"2.0","id":"` + secret + `","method":"x"},{"jsonrpc":"2.0","id":"` + secret + `","method":"x"}]`,
		`{"jsonrpc":"2.0","id":1,"method":"x","params":{"` + secret + `":"\ud800"}}`,
		secret,
	} {
		_, err := Read([]byte(body))
		if err == nil {
			t.Fatalf("Read accepted %q", body)
		}
		if strings.Contains(err.Error(), secret) || strings.Contains(strings.ToLower(err.Error()), "0123456789") {
			t.Errorf("error %q quotes the body", err)
		}
	}
}

// TestReadLargeObjects: objects of many keys read in linear time, and a
// duplicate among them is still found.
func TestReadLargeObjects(t *testing.T) {
	var sb strings.Builder
	sb.WriteString(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","arguments":{`)
	for i := 0; i < 10000; i++ {
		if i > 0 {
			sb.WriteByte(',')
		}
		fmt.Fprintf(&sb, `"k%d":%d`, i, i)
	}
	ok := sb.String() + `}}}`
	if _, err := Read([]byte(ok)); err != nil {
		t.Fatalf("10,000 keys: %v", err)
	}
	for _, dup := range []string{`,"K9999":1`, `,"k\u0035":1`, `,"\u212a17":1`, `,"verb":"a","VERB":"b"`} {
		if _, err := Read([]byte(sb.String() + dup + `}}}`)); !errors.Is(err, ErrAmbiguous) {
			t.Errorf("10,000 keys and %s: %v, want ErrAmbiguous", dup, err)
		}
	}
	// Many keys with escapes and non-ASCII letters, in a large object.
	sb.Reset()
	sb.WriteString(`{`)
	for i := 0; i < 100; i++ {
		fmt.Fprintf(&sb, `"\u00e9%d":1,"ſ%d":1,`, i, i)
	}
	if err := Validate([]byte(sb.String() + `"x":1}`)); err != nil {
		t.Fatalf("distinct non-ASCII keys: %v", err)
	}
	if err := Validate([]byte(sb.String() + `"S42":1}`)); !errors.Is(err, ErrAmbiguous) {
		t.Fatalf("S42 beside ſ42: %v, want ErrAmbiguous", err)
	}
	if err := Validate([]byte(sb.String() + `"\u00c97":1}`)); !errors.Is(err, ErrAmbiguous) {
		t.Fatalf("É7 beside é7: %v, want ErrAmbiguous", err)
	}
}

func TestReadDeep(t *testing.T) {
	// An attacker's deep nesting is refused without recursing past the limit.
	deep := `{"jsonrpc":"2.0","id":1,"method":"x","params":` + strings.Repeat(`{"a":`, 100000) + `1` + strings.Repeat(`}`, 100000) + `}`
	if _, err := Read([]byte(deep)); !errors.Is(err, ErrAmbiguous) || !strings.Contains(err.Error(), "nested deeper than 128 levels") {
		t.Fatalf("Read = %v", err)
	}
	if err := Validate([]byte(nest(128))); err != nil {
		t.Fatalf("Validate 128 deep: %v", err)
	}
	if err := Validate([]byte(nest(129))); !errors.Is(err, ErrAmbiguous) {
		t.Fatalf("Validate 129 deep: %v", err)
	}
}

func TestValidate(t *testing.T) {
	for _, tt := range []struct {
		in  string
		err error
	}{
		{`{"tools":[{"name":"a"},{"name":"b"}]}`, nil},
		{`[1,"2",null,true,false,{"a":{}}]`, nil},
		{`"just a string"`, nil},
		{` 0 `, nil},
		{`-1.5e+10`, nil},
		{`{"result":{"tools":[{"name":"a","NAME":"b"}]}}`, ErrAmbiguous},
		{`{"a":1}x`, ErrAmbiguous},
		{"\"\xff\"", ErrAmbiguous},
		{`"\udfff"`, ErrAmbiguous},
		{"\xef\xbb\xbf{}", ErrAmbiguous},
		{`{"__proto__":1}`, ErrAmbiguous},
		{`{"a":1,}`, ErrSyntax},
		{``, ErrSyntax},
		{`01`, ErrAmbiguous},
		{`[1 2]`, ErrSyntax},
	} {
		err := Validate([]byte(tt.in))
		if tt.err == nil && err != nil || tt.err != nil && !errors.Is(err, tt.err) {
			t.Errorf("Validate(%q) = %v, want %v", tt.in, err, tt.err)
		}
	}
	// Method-level rules are not Validate's: a lone "Method" is fine.
	if err := Validate([]byte(`{"Method":"x"}`)); err != nil {
		t.Errorf("Validate: %v", err)
	}
}

func TestParseID(t *testing.T) {
	for _, tt := range []struct {
		in, key string
		err     error
	}{
		{`7`, `7`, nil},
		{`7.0`, `7`, nil},
		{`7e0`, `7`, nil},
		{`0.7e1`, `7`, nil},
		{`700e-2`, `7`, nil},
		{`70E-1`, `7`, nil},
		{`-0`, `0`, nil},
		{`0.0e10`, `0`, nil},
		{`-3`, `-3`, nil},
		{` 9007199254740991 `, `9007199254740991`, nil},
		{`-9007199254740991`, `-9007199254740991`, nil},
		{`9.007199254740991e15`, `9007199254740991`, nil},
		{`9007199254740992`, ``, ErrAmbiguous},
		{`1e16`, ``, ErrAmbiguous},
		{`1e999999999999`, ``, ErrAmbiguous},
		{`1.5`, ``, ErrAmbiguous},
		{`1e-1`, ``, ErrAmbiguous},
		{`"x"`, `"x"`, nil},
		{`"\u0078"`, `"x"`, nil},
		{`""`, `""`, nil},
		{`"a\"b"`, `"a\"b"`, nil},
		{`"<é>"`, `"<é>"`, nil},
		{`"\u2028"`, `"\u2028"`, nil},
		{`"\ud800"`, ``, ErrAmbiguous},
		{"\"\xff\"", ``, ErrAmbiguous},
		{`null`, ``, nil},
		{`true`, ``, ErrMalformed},
		{`{}`, ``, ErrMalformed},
		{`[1]`, ``, ErrMalformed},
		{`01`, ``, ErrSyntax},
		{`1 2`, ``, ErrSyntax},
		{``, ``, ErrSyntax},
		{`+1`, ``, ErrSyntax},
	} {
		id, err := ParseID([]byte(tt.in))
		if tt.err != nil {
			if !errors.Is(err, tt.err) {
				t.Errorf("ParseID(%q) = %v, %v; want %v", tt.in, id, err, tt.err)
			}
			continue
		}
		if err != nil || id.Key() != tt.key {
			t.Errorf("ParseID(%q) = %q, %v; want %q", tt.in, id.Key(), err, tt.key)
		}
		if (tt.key == "") != id.IsZero() || string(id.Raw()) != tt.key || id.String() != tt.key {
			t.Errorf("ParseID(%q): IsZero %v, Raw %s, String %s", tt.in, id.IsZero(), id.Raw(), id)
		}
	}
	// An answer's id matches the request's id it spells differently.
	b, err := Read([]byte(`{"jsonrpc":"2.0","id":7,"method":"ping"}`))
	if err != nil {
		t.Fatal(err)
	}
	if id, _ := ParseID([]byte(`7.0`)); id != b.Calls[0].ID || id.Key() != b.Calls[0].ID.Key() {
		t.Error("ParseID(7.0) does not match id 7")
	}
	if id, _ := ParseID([]byte(`"7"`)); id == b.Calls[0].ID || id.Key() == b.Calls[0].ID.Key() {
		t.Error(`ParseID("7") matches id 7`)
	}
}

func TestContext(t *testing.T) {
	ctx := context.Background()
	if _, ok := FromContext(ctx); ok {
		t.Fatal("FromContext on an empty context")
	}
	b, err := Read([]byte(tc("a", "b")))
	if err != nil {
		t.Fatal(err)
	}
	got, ok := FromContext(NewContext(ctx, b))
	if !ok || got != b {
		t.Fatal("FromContext does not return the Body")
	}
	if _, ok := FromContext(NewContext(ctx, nil)); ok {
		t.Fatal("FromContext of a nil Body")
	}
}

// TestReadConcurrent: readers share a pool of scratch space; concurrent
// reads of different bodies must not see each other's keys.
func TestReadConcurrent(t *testing.T) {
	type outcome struct {
		err   error
		calls []want
	}
	read := func(body string) outcome {
		b, err := Read([]byte(body))
		if err != nil {
			for _, k := range []error{ErrSyntax, ErrAmbiguous, ErrMalformed} {
				if errors.Is(err, k) {
					return outcome{err: k}
				}
			}
		}
		var o outcome
		for _, c := range b.Calls {
			o.calls = append(o.calls, want{c.Method, c.ID.Key(), c.Tool, c.Verb, c.Prompt, c.URI, c.Ref, c.InputResponses})
		}
		return o
	}
	wantOut := make([]outcome, len(readRows))
	for i, r := range readRows {
		wantOut[i] = read(r.body)
	}
	done := make(chan string)
	for g := 0; g < 8; g++ {
		go func(g int) {
			for n := 0; n < 20; n++ {
				for i := range readRows {
					j := (i + g*7 + n) % len(readRows)
					if got := read(readRows[j].body); fmt.Sprint(got) != fmt.Sprint(wantOut[j]) {
						done <- fmt.Sprintf("%s: %v, want %v", readRows[j].name, got, wantOut[j])
						return
					}
				}
			}
			done <- ""
		}(g)
	}
	for g := 0; g < 8; g++ {
		if msg := <-done; msg != "" {
			t.Error(msg)
		}
	}
}

// TestReadCancelled: notifications/cancelled names the request it gives up
// on by the same id rules as a request's own id.
func TestReadCancelled(t *testing.T) {
	for _, tt := range []struct {
		body, key string
		err       error
	}{
		{`{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":7,"reason":"SECRET"}}`, "7", nil},
		{`{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":"\u0078"}}`, `"x"`, nil},
		{`{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"reason":"no id"}}`, "", nil},
		{`{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":7.0}}`, "", ErrAmbiguous},
		{`{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":1,"RequestId":2}}`, "", ErrAmbiguous},
		{`{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestID":2}}`, "", ErrAmbiguous},
		{`{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":true}}`, "", ErrMalformed},
	} {
		b, err := Read([]byte(tt.body))
		if tt.err != nil {
			if !errors.Is(err, tt.err) {
				t.Errorf("%s: %v, want %v", tt.body, err, tt.err)
			}
			continue
		}
		if err != nil || b.Calls[0].Cancelled.Key() != tt.key {
			t.Errorf("%s: Cancelled %q, %v; want %q", tt.body, b.Calls[0].Cancelled.Key(), err, tt.key)
		}
	}
}

// ReadAnswer reads a server's ids as a client reads them: by value.
func TestReadAnswer(t *testing.T) {
	for _, tc := range []struct {
		body string
		key  string
		err  error
	}{
		{`{"jsonrpc":"2.0","id":7.0,"result":{}}`, "7", nil},
		{`{"jsonrpc":"2.0","id":0.7e1,"result":{}}`, "7", nil},
		{`{"jsonrpc":"2.0","id":-0,"result":{}}`, "0", nil},
		{`{"jsonrpc":"2.0","id":"\u0078","result":{}}`, `"x"`, nil},
		{`{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"parse error"}}`, "", nil},
		{`{"jsonrpc":"2.0","id":1.5,"result":{}}`, "", ErrAmbiguous},
		{`{"jsonrpc":"2.0","id":9007199254740993,"result":{}}`, "", ErrAmbiguous},
		{`{"jsonrpc":"2.0","id":null,"result":{"tools":[]}}`, "", ErrMalformed},
		{`{"jsonrpc":"2.0","id":null,"method":"ping"}`, "", ErrAmbiguous},
		{`{"jsonrpc":"2.0","id":7,"Result":{}}`, "", ErrAmbiguous},
	} {
		b, err := ReadAnswer([]byte(tc.body))
		if !errors.Is(err, tc.err) || (err == nil && b.Calls[0].ID.Key() != tc.key) {
			t.Errorf("ReadAnswer(%s) = %v, %v; want key %q, %v", tc.body, b, err, tc.key, tc.err)
		}
	}
	// Read keeps the request rules.
	if _, err := Read([]byte(`{"jsonrpc":"2.0","id":7.0,"result":{}}`)); !errors.Is(err, ErrAmbiguous) {
		t.Errorf("Read took a non-canonical id: %v", err)
	}
}

// The protocol version a 2026-07-28 request carries in params._meta is read
// with the rest of the message, on any method, and its key is refused when
// a reader could take another key for it.
func TestReadMetaVersion(t *testing.T) {
	const key = `"io.modelcontextprotocol/protocolVersion"`
	for _, c := range []struct {
		body    string
		present bool
		version string
	}{
		{`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","_meta":{` + key + `:"2026-07-28"}}}`, true, "2026-07-28"},
		{`{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"_meta":{"progressToken":1,` + key + `:"2026-07-28","x":{}}}}`, true, "2026-07-28"},
		{`{"jsonrpc":"2.0","id":1,"method":"prompts/get","params":{"name":"p","_meta":{` + key + `:"2026\u002d07-28"}}}`, true, "2026-07-28"},
		{`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","_meta":{` + key + `:7}}}`, true, ""},
		{`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","_meta":{` + key + `:""}}}`, true, ""},
		{`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","_meta":{"other":"2026-07-28"}}}`, false, ""},
		{`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","_meta":null}}`, false, ""},
		{`{"jsonrpc":"2.0","id":1,"method":"ping"}`, false, ""},
	} {
		b, err := Read([]byte(c.body))
		if err != nil {
			t.Fatalf("%s: %v", c.body, err)
		}
		if got := b.Calls[0]; got.HasMetaVersion != c.present || got.MetaVersion != c.version {
			t.Errorf("%s: read %v %q, want %v %q", c.body, got.HasMetaVersion, got.MetaVersion, c.present, c.version)
		}
	}
	for _, body := range []string{
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","_meta":{"io.modelcontextprotocol/protocol\u0056ersion":"2026-07-28"}}}`,
		`{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"_meta":{"IO.modelcontextprotocol/protocolVersion":"2026-07-28"}}}`,
		`{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"_meta":{` + key + `:"2026-07-28",` + key + `:"2025-11-25"}}}`,
	} {
		if _, err := Read([]byte(body)); !errors.Is(err, ErrAmbiguous) {
			t.Errorf("%s: %v, want ErrAmbiguous", body, err)
		}
	}
}

// MCP 2026-07-28 removed initialize, ping, logging/setLevel and the
// resource subscriptions (SEP-2575): a message that names that version in
// its _meta and one of those methods is Removed, and its params are not
// read for what the method took (a URI), so that the edge answers it as
// the method not found it is; the same methods at 2025-11-25, or with no
// version, are read as ever and are not Removed.
func TestReadRemoved(t *testing.T) {
	meta := func(v string) string {
		return `"_meta":{"io.modelcontextprotocol/protocolVersion":"` + v + `","io.modelcontextprotocol/clientCapabilities":{}}`
	}
	for _, c := range []struct {
		body    string
		removed bool
		err     error
	}{
		{`{"jsonrpc":"2.0","id":500,"method":"resources/subscribe","params":{` + meta("2026-07-28") + `}}`, true, nil},
		{`{"jsonrpc":"2.0","id":500,"method":"resources/unsubscribe","params":{` + meta("2026-07-28") + `}}`, true, nil},
		{`{"jsonrpc":"2.0","id":500,"method":"resources/subscribe","params":{"uri":"file:///a",` + meta("2026-07-28") + `}}`, true, nil},
		{`{"jsonrpc":"2.0","id":500,"params":{` + meta("2026-07-28") + `},"method":"resources/subscribe"}`, true, nil},
		{`{"jsonrpc":"2.0","method":"resources/subscribe","params":{` + meta("2026-07-28") + `}}`, true, nil},
		{`{"jsonrpc":"2.0","id":500,"method":"initialize","params":{` + meta("2026-07-28") + `}}`, true, nil},
		{`{"jsonrpc":"2.0","id":500,"method":"ping","params":{` + meta("2026-07-28") + `}}`, true, nil},
		{`{"jsonrpc":"2.0","id":500,"method":"logging/setLevel","params":{` + meta("2026-07-28") + `}}`, true, nil},
		{`{"jsonrpc":"2.0","id":500,"method":"tools/list","params":{` + meta("2026-07-28") + `}}`, false, nil},
		{`{"jsonrpc":"2.0","id":500,"method":"resources/read","params":{"uri":"file:///a",` + meta("2026-07-28") + `}}`, false, nil},
		{`{"jsonrpc":"2.0","id":500,"method":"ping"}`, false, nil},
		{`{"jsonrpc":"2.0","id":500,"method":"resources/subscribe","params":{"uri":"file:///a"}}`, false, nil},
		{`{"jsonrpc":"2.0","id":500,"method":"resources/subscribe","params":{"uri":"file:///a",` + meta("2025-11-25") + `}}`, false, nil},
		// Not removed, so read as ever: a URI is needed, and a string.
		{`{"jsonrpc":"2.0","id":500,"method":"resources/read","params":{` + meta("2026-07-28") + `}}`, false, ErrMalformed},
		{`{"jsonrpc":"2.0","id":500,"method":"resources/subscribe","params":{` + meta("2025-11-25") + `}}`, false, ErrMalformed},
		{`{"jsonrpc":"2.0","id":500,"method":"resources/subscribe","params":{"_meta":{}}}`, false, ErrMalformed},
		{`{"jsonrpc":"2.0","id":500,"method":"resources/subscribe","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":7}}}`, false, ErrMalformed},
		// What is read of a removed message is still read strictly.
		{`{"jsonrpc":"2.0","id":500,"method":"resources/subscribe","params":{"uri":1,` + meta("2026-07-28") + `}}`, false, ErrMalformed},
		{`{"jsonrpc":"2.0","id":500,"method":"resources/subscribe","params":{"URI":"a",` + meta("2026-07-28") + `}}`, false, ErrAmbiguous},
		{`{"jsonrpc":"2.0","id":500,"method":"resources/subscribe","params":"x"}`, false, ErrMalformed},
		{`{"jsonrpc":"2.0","id":500,"method":"resources/subscribe"}`, false, ErrMalformed},
	} {
		b, err := Read([]byte(c.body))
		if c.err != nil {
			if !errors.Is(err, c.err) {
				t.Errorf("%s: %v, want %v", c.body, err, c.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", c.body, err)
			continue
		}
		if got := b.Calls[0].Removed(); got != c.removed {
			t.Errorf("%s: Removed() = %v, want %v", c.body, got, c.removed)
		}
	}
}

// The trace context keys SEP-414 reserves in _meta are read exactly: a
// case or escape variant, which a case-insensitive reader behind would
// take for the one the gateway replaces or drops, is refused.
func TestReadMetaTraceKeys(t *testing.T) {
	ok := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","_meta":{"traceparent":"00-x","tracestate":"a=b","baggage":"k=v"}}}`
	if _, err := Read([]byte(ok)); err != nil {
		t.Fatalf("%s: %v", ok, err)
	}
	for _, body := range []string{
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","_meta":{"Baggage":"user=admin"}}}`,
		`{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"_meta":{"TraceParent":"00-x"}}}`,
		`{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"_meta":{"bagg\u0061ge":"user=admin"}}}`,
	} {
		if _, err := Read([]byte(body)); !errors.Is(err, ErrAmbiguous) {
			t.Errorf("%s: %v, want ErrAmbiguous", body, err)
		}
	}
}

// The multi-round-trip retry of MCP 2026-07-28 (SEP-2322) carries
// requestState on tools/call, prompts/get and resources/read. The reader
// gives its value, read once with the rest of the message, to whoever
// routes on it (a cluster sends the retry to the replica that sealed the
// state), so nothing else decodes the client's body. A spelling that
// another reader would take for it is refused on all three methods.
func TestReadRequestState(t *testing.T) {
	for _, c := range []struct {
		body, state string
		has         bool
	}{
		{`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","requestState":"zidane-mrtr.2.abc","inputResponses":{}}}`, "zidane-mrtr.2.abc", true},
		{`{"jsonrpc":"2.0","id":1,"method":"prompts/get","params":{"name":"p","requestState":"s1"}}`, "s1", true},
		{`{"jsonrpc":"2.0","id":1,"method":"resources/read","params":{"uri":"file:///a","requestState":"s\u0032"}}`, "s2", true},
		{`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","inputResponses":{}}}`, "", true},
		{`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t"}}`, "", false},
		// Not a string: no state to route on, and the route refuses it.
		{`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","requestState":{"x":1}}}`, "", true},
	} {
		b, err := Read([]byte(c.body))
		if err != nil {
			t.Errorf("%s: %v", c.body, err)
			continue
		}
		call := b.Calls[0]
		if call.RequestState != c.state || call.InputResponses != c.has {
			t.Errorf("%s: RequestState %q InputResponses %v, want %q %v", c.body, call.RequestState, call.InputResponses, c.state, c.has)
		}
	}
	for _, body := range []string{
		`{"jsonrpc":"2.0","id":1,"method":"prompts/get","params":{"name":"p","RequestState":"other"}}`,
		`{"jsonrpc":"2.0","id":1,"method":"resources/read","params":{"uri":"u","requeststate":"other"}}`,
		`{"jsonrpc":"2.0","id":1,"method":"prompts/get","params":{"name":"p","requestState":"a","requestState":"b"}}`,
		`{"jsonrpc":"2.0","id":1,"method":"resources/read","params":{"uri":"u","InputResponses":{}}}`,
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","requestState":"a","RequestState":"b"}}`,
	} {
		if _, err := Read([]byte(body)); !errors.Is(err, ErrAmbiguous) {
			t.Errorf("%s: %v, want ErrAmbiguous", body, err)
		}
	}
}

// Lookup and Scalar read an accepted message's arguments as go-sdk looks a
// tool's argument up: keys spelled exactly (escapes decoded), the value's
// text as encoding/json decodes it.
func TestLookupScalar(t *testing.T) {
	args := []byte(`{"repo":"a\u0062c","n":42,"f":1.5,"t":true,"z":null,"o":{"de\u0065p":{"k":"v"}},"arr":[1],"e":""}`)
	for _, c := range []struct {
		path           []string
		text           string
		found, str, ok bool
	}{
		{[]string{"repo"}, "abc", true, true, true},
		{[]string{"n"}, "42", true, false, true},
		{[]string{"f"}, "1.5", true, false, true},
		{[]string{"t"}, "true", true, false, true},
		{[]string{"z"}, "null", true, false, true},
		{[]string{"e"}, "", true, true, true},
		{[]string{"o", "deep", "k"}, "v", true, true, true},
		{[]string{"o", "deep"}, "", true, false, false},
		{[]string{"arr"}, "", true, false, false},
		{[]string{"Repo"}, "", false, false, false},
		{[]string{"repo", "x"}, "", false, false, false},
		{[]string{"missing"}, "", false, false, false},
	} {
		raw, found := Lookup(args, c.path)
		if found != c.found {
			t.Errorf("%v: found %v", c.path, found)
			continue
		}
		if !found {
			continue
		}
		text, str, ok := Scalar(raw)
		if text != c.text || str != c.str || ok != c.ok {
			t.Errorf("%v: Scalar(%s) = %q %v %v, want %q %v %v", c.path, raw, text, str, ok, c.text, c.str, c.ok)
		}
	}
}

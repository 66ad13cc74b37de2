// Package message is the one reader of a client's JSON-RPC message: the
// edge reads a request body here once (Read), decides on what it read (the
// Calls: method, id, tool, verb, prompt, URI, completion ref), and the route
// forwards the very bytes it decided on (Body.Raw, carried to the route by
// NewContext). Nothing else in the repository decodes a client's envelope
// to decide something; a route that needs a field the edge reads takes it
// from the Call.
//
// # One reading, or none
//
// A decision binds to what runs only if the edge and the server behind it
// read the same message. They do not read JSON the same way:
//
//   - go-sdk (jsonrpc.DecodeMessage, and segmentio/encoding/json with
//     DontMatchCaseInsensitiveStructFields for params) matches keys
//     exactly, keeps the last of two equal keys, stops after the first JSON
//     value, replaces invalid UTF-8 and lone surrogate escapes with U+FFFD,
//     and reads a numeric id through a float64 truncated to an int64 (1.5
//     reads as 1).
//   - JavaScript's JSON.parse (the TypeScript SDK) matches keys exactly,
//     keeps the last duplicate, refuses anything after the value, keeps lone
//     surrogates, keeps 1.5, and rounds integers past 2^53. A fatal
//     TextDecoder refuses invalid UTF-8, and strips a byte-order mark.
//   - encoding/json v1, which guard mode may front, matches struct fields
//     case-insensitively with Unicode folding ("Method", "METHOD" and
//     "ſcheme" match method and scheme) and keeps the last duplicate.
//
// So a body with "method" and "Method", or "name" and "n\u0061me", would be
// authorized on one reading and executed on another. Read accepts a body
// only when every one of these readers reads the fields the edge decides
// on exactly as Read does, and refuses everything else: it never picks a
// reading. FuzzRead checks the rule against go-sdk, segmentio and
// encoding/json; TestReadAgreesWithJSONParse against Node.
//
// # What is refused
//
// ErrSyntax: anything that is not JSON by RFC 8259's grammar, and an empty
// body.
//
// ErrAmbiguous, anywhere in the body, read or not (Validate checks these
// alone): two keys of one object that are equal once escapes are decoded
// and case is folded (rune by rune to the least rune of its
// unicode.SimpleFold orbit, as encoding/json folds, so equal exactly when
// strings.EqualFold says so); a key "__proto__" (JavaScript code that
// copies the object takes it for the prototype); invalid UTF-8, and lone or
// misordered surrogate escapes; nesting deeper than 128 levels; a byte-order
// mark; anything after the value. And in the objects whose fields the edge
// reads (the envelope; the params object of tools/call, prompts/get,
// resources/read|subscribe|unsubscribe, completion/complete,
// notifications/cancelled, tasks/get|update|cancel (its taskId) and
// subscriptions/listen (its notifications and their taskIds), and of any
// other method for its _meta; tools/call arguments; a params._meta, for its
// protocol version, the trace context keys (traceparent, tracestate,
// baggage) and the client capabilities, whose extensions are read for the
// Tasks extension; a completion ref; a response's error), a key that
// encoding/json would take for one of those
// fields without being it exactly: another case, another folding, or an
// escaped spelling ("n\u0061me" alone: some readers match raw key bytes).
// Ids that readers read differently are refused too: a numeric id that is
// not a plain integer in canonical form within ±(2^53-1), a request's null
// id (go-sdk runs it as a notification, the TypeScript SDK refuses it), and
// two requests with one id in a batch.
//
// ErrMalformed: unambiguous JSON that is not a JSON-RPC 2.0 message the
// edge accepts (see Read's checks in read.go: the version, the method, a
// request's or a response's members, and the params each read method
// needs). A response needs a string or integer id: go-sdk refuses one
// without, null included. Params of other methods may be any value and are
// not read.
//
// Syntax errors are reported before ambiguities, and ambiguities before
// malformations, whatever their order in the body. Errors are *Error; they
// name a protocol field at most, and never quote the body.
//
// # Cost
//
// Read makes one pass over the body (two over params that come before the
// method), scans strings eight bytes at a time, validates UTF-8 only where
// a string has non-ASCII bytes, compares plain ASCII keys in place, and
// allocates only the Body, a batch's Calls and the strings it returns. A
// duplicate check costs a linear scan in a small object and a map in a
// large one, so an object's keys cost linear time overall.
package message

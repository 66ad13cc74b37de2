// Package rules decides MCP calls by the operator's rules over who calls
// what with which arguments, written in CEL (https://cel.dev), ahead of
// the scopes: a `deny` rule that holds refuses the call, an `approve` rule
// that holds makes it wait for a person's approval, an `allow` rule that
// holds lets it through, and a call no rule holds for is left to the
// scopes. Deny wins over approve, approve over allow.
//
// A rule reads these variables, each typed, so that a rule naming one that
// does not exist is refused when the config loads, with the rule's place
// and CEL's message (the dotted names are variables of their own, which a
// rule reads without reflection):
//
//	principal.owner, .token, .kind, .source, .client  string
//	principal.scopes                                   list(string)
//	claims                                             map(string, dyn): a JWT's claims
//	method                                             string
//	tool.name, prompt.name, resource.uri               string ("" when the call has none)
//	args                                               map(string, dyn): the call's arguments
//	upstream, route                                    string
//
// args is the tools/call (or prompts/get) arguments object exactly as the
// edge's one reader read it (package message refuses duplicate and
// case-variant keys anywhere in a body, so no other reader of the body can
// see different arguments), read from its text one key at a time when a
// rule reads that key; a key present only in another spelling (which Go's
// encoding/json would match) fails the rule reading it closed. JSON
// numbers written as integers are ints, others doubles, and ints and
// doubles compare with each other; an integer beyond ±(2^53-1), which
// JavaScript rounds and Go and Python do not, fails the rule reading it
// closed.
//
// A JWT's claims are read as the arguments are, once checked as the edge
// checks a body (package message's Validate): claims with a key twice, two
// keys equal once folded, "__proto__" or a lone surrogate fail every rule
// reading claims closed.
//
// Why a rule failed (Verdict.Err, for the audit line) never holds the
// call's values: CEL's own messages quote them (a regular expression, a
// map key, a timestamp), so they are told by their kind alone.
//
// Evaluation is bounded by a cost limit (a rule whose cost CEL bounds
// under it for any input runs untracked). A rule whose evaluation fails (a
// missing argument, a value of another type, the cost limit) fails closed:
// a deny or approve rule that fails denies the call, as does any rule over
// the cost limit; an allow rule that fails for another reason does not
// hold, and the call goes on to the next rule and to the scopes, which is
// what would decide it without that rule.
//
// Listings are decided on the same rules with the arguments unknown (CEL's
// partial evaluation): a tool that a deny rule refuses whatever the
// arguments is left out.
package rules

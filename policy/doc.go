// Package policy owns the inbound decisions of the edge, with no HTTP
// framework in it: the opaque token format and its store, JWT access-token
// verification, the scope map that turns a principal and a JSON-RPC call into
// allow or deny, JSON-RPC body inspection, rate limiters, Origin rules and
// the audit event. It never forwards a request and never holds an upstream
// credential.
package policy

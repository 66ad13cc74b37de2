// Package policy owns the inbound decisions of the edge, with no HTTP
// framework in it: authentication (the opaque token format and its store,
// the grants a person gives OAuth clients and their access and refresh
// tokens, see grants.go; JWT access-token verification, with a DPoP-bound
// token's cnf.jkt, which the edge holds each request to; revoked JWT
// subjects, the queue that bounds
// the signature checks of addresses that guess), who a credential
// acts for (its owner), the tokens derived for sessions' agents and their
// bounds (scopes that only narrow the parent's, an expiry no later than the
// parent's, one per session and purpose, gone with their session; see
// children.go; the verb scopes an orchestrator's token gets, see
// [OrchestratorScopes]), the scope map that turns a principal and a
// JSON-RPC call (as package message read it) into allow or deny, the one
// table of the sessions endpoint's verbs (verbs.go), the aggregated
// route's rule of who may use an upstream ([UpstreamAllows]), rate
// limiters and Origin rules. It never reads a request body, never forwards
// a request and never holds an upstream credential.
package policy

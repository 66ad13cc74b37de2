// Package sessionid seals an upstream's Mcp-Session-Id into the session id
// the gateway gives a client, bound to one principal and one route, and
// opens it again ([Sealer]). An id presented by another token, on another
// route, altered or forged does not open, and the caller cannot tell which.
//
// It never gives a client the upstream's id, remembers a bounded number of
// the ids it opened (whatever clients send), and holds no key of its own:
// the caller keeps the key across reloads and shares it between replicas.
package sessionid

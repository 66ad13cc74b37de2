// Package oauthtest provides an OAuth 2.1 authorization server and an
// OAuth-protected MCP server for tests, in the spirit of net/http/httptest:
// real servers on 127.0.0.1, speaking the real protocols, that record what
// they saw so a test can check it.
//
// [AuthServer] serves RFC 8414 metadata, an authorization endpoint that
// requires PKCE (S256) and redirects at once (no login page: the test is
// the operator's browser), a token endpoint (authorization_code,
// refresh_token with rotation and reuse detection, client_credentials, both
// halves of SEP-990 cross-app access, and the RFC 7523 jwt-bearer grant
// with a workload's JWT), RFC 7591 dynamic registration and RFC 7009
// revocation. A rotated refresh token presented again is refused and
// revokes its whole grant, as OAuth 2.1 asks, and is counted
// ([AuthServer.RefreshReuses]). With [AuthServerOptions.DPoP] it binds
// tokens to the key of the request's DPoP proof (RFC 9449), optionally
// behind a nonce. Access tokens are opaque; [MCPServer] checks them against
// the AuthServer that issued them.
//
// [MCPServer] is a go-sdk MCP server (stateless, JSON responses) behind a
// bearer check: RFC 9728 protected resource metadata, 401 with
// resource_metadata for a missing or invalid token, and 403
// insufficient_scope with the scopes needed for a tool the token may not
// call; a DPoP-bound token needs the DPoP scheme and a fresh proof of its
// key. Its tools are echo and admin_op (see [MCPOptions]).
//
// An AuthServer also plays a company IdP for a person's token without a
// browser: it signs ID tokens and trades them for ID-JAGs (JWTs, keys at
// /jwks), and another AuthServer that trusts it ([AuthServer.TrustIdP])
// takes its ID tokens as RFC 8693 subject tokens and its ID-JAGs as
// jwt-bearer assertions, verified against its keys, for the user they
// name.
//
// Every secret either server hands out (codes, access and refresh tokens,
// registered client secrets, ID-JAGs) is listed by [AuthServer.Secrets], so a
// test can search logs, storage and responses for leaks.
//
// The package is for tests only; nothing in the product imports it.
package oauthtest

import (
	"crypto/rand"
	"sync"
	"time"
)

// Clock is a settable clock to give as [AuthServerOptions.Now] (and to the
// clients under test), so that tokens expire when a test says so.
type Clock struct {
	mu sync.Mutex
	t  time.Time
}

// NewClock returns a clock that reads start until it is advanced.
func NewClock(start time.Time) *Clock { return &Clock{t: start} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Advance moves the clock forward by d.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// NewSecret returns prefix, a dash and 26 random base32 characters: a
// value that cannot occur anywhere by chance, for client secrets and
// tokens.
func NewSecret(prefix string) string { return prefix + "-" + rand.Text() }

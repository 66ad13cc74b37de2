// Package connect lets a person connect their own account at an upstream
// MCP server to the gateway, from the call that needed it: it makes the
// connect link, serves it, and writes the protocol answers that carry it
// to the person's MCP client (URL-mode elicitation).
//
// A connect link is single-use, short-lived (DefaultLifetime, at most
// MaxLifetime) and bound to the owner whose call caused it and to the
// upstream. Storage keeps only the SHA-256 of its secret, as the sign-in
// links of package authserver/idp do. The link is a path on the gateway's
// site ([PathPrefix] and the secret), so that a person who is not signed
// in is sent to sign in and brought back to it ([Persons.SignIn] takes a
// path, and a fragment would not survive the trip through the IdP). What
// the path can leak to an access log is worth little: the link works only
// in a browser signed in as its owner.
//
// GET shows a page and never uses the link up; a browser signed in as
// anyone but the link's owner is refused (and the refusal audited), so a
// link sent to a victim attaches neither the victim's upstream account to
// the sender nor the reverse. POST, from the page's own origin, uses the
// link up (under the storage lock: of two uses on any replica, one wins)
// and starts the upstream's authorization for that owner through an
// [Authorizer]. The authorization's state is kept (hashed) with the owner
// and the upstream, and the upstream's callback ([CallbackPath]) is
// finished only in a browser signed in as that same owner, before the
// Authorizer redeems anything: an authorization URL or a callback URL
// forwarded to another person's browser stores nothing.
//
// The protocol answers ([Answer]) follow MCP: at 2025-11-25 a JSON-RPC
// error -32042 (URLElicitationRequired) whose data carries the URL
// elicitation, and notifications/elicitation/complete once connected
// ([CompleteNotification]); at 2026-07-28 an input_required result with a
// URL elicitation and a requestState, retried by the client; and for a
// client that does not declare the URL elicitation capability, a tool
// error that names the URL.
//
// It imports no Caddy; the gateway serves [Service] under [PathPrefix].
// It never takes an origin from Host or X-Forwarded-* (the site is
// configuration), never keeps a link's secret, and never logs a secret, a
// state or a code.
package connect

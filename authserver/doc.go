// Package authserver is the gateway as its MCP clients' OAuth
// authorization server: the RFC 8414 metadata, the authorization endpoint
// with its consent page, the token endpoint and revocation (RFC 7009),
// and the authorization codes in between.
//
// What it owns: the checks of an authorization request (response_type
// code alone; PKCE with S256 alone; exactly one RFC 8707 resource among
// the configured ones; scopes within what the resource knows, narrowed to
// what the person may grant; a redirect URI that the client registered,
// exactly but for a loopback one's port, and that is https or http on
// loopback, without a fragment), one reading of every request (a
// parameter given twice, or in two letter cases, a ';' separator or a bad
// escape is refused), the consent page and its form (sealed, CSRF-bound
// to the browser and the request, never framed), the codes (random,
// stored under their SHA-256 with a short lifetime, redeemed once under
// the storage lock, a second redemption revoking the grant issued from
// the first), and the token endpoint's mapping of OAuth onto [Grants]
// (DPoP-bound when the request carries a proof, Bearer otherwise), and a
// rate limit per client address at the endpoints (not per client: a
// client_id is public, so its bucket would be anyone's to exhaust).
//
// What it never does: resolve clients (Client ID Metadata Documents and
// registration are [Clients]', package authserver/clients), sign a person
// in ([People]'s, package authserver/idp), keep grants or tokens
// ([Grants]', the token store of package policy), or import Caddy. No URL
// it gives out is built from a request's Host or X-Forwarded-* headers:
// the issuer is configured, and every endpoint's URL is the issuer's
// origin and a fixed path. No code, token, verifier, state, proof or
// cookie reaches an audit line or an error text.
//
// # Why it is written here
//
// zitadel/oidc's op package (an OpenID Certified provider library) was
// evaluated first. It serves no RFC 8414 document (only OpenID discovery),
// accepts plain PKCE and requests without PKCE, drops the resource
// parameter, puts no iss in the authorization response, compares loopback
// redirect URIs without the port rule of RFC 8252, and knows neither
// Client ID Metadata Documents, dynamic registration as MCP uses it, nor
// DPoP. Each of those would be a patch against its Storage interface, and
// the OpenID parts (ID tokens, userinfo, sessions of its own) would be
// served for nothing. What is left is small: the endpoints are a few
// hundred lines of standard library, the cryptography is the standard
// library's (crypto/rand, SHA-256, HMAC, HKDF, AES-GCM through
// internal/seal) and go-jose's (DPoP proofs, through package dpop), and
// the tokens are the token store's. go-sdk's oauthex.AuthServerMeta is
// the metadata's type.
//
// # Both MCP authorization revisions
//
// 2025-11-25 asks an authorization server for OAuth 2.1 with PKCE, RFC
// 8414 (or OpenID) discovery, the resource parameter of RFC 8707 on the
// authorization and token requests, and SHOULD-level support of Client ID
// Metadata Documents; dynamic registration is a MAY. 2026-07-28 keeps all
// of that and adds: RFC 9207's iss in every authorization response,
// errors included (SHOULD, announced as
// authorization_response_iss_parameter_supported, which a client then
// holds the server to); dynamic registration deprecated, kept for
// compatibility; resource URIs whose scheme and host come in upper case
// accepted; and rotated refresh tokens for public clients (a MUST in its
// security considerations). One server serves both: nothing the later
// revision adds is refused by a client of the earlier one (a 2025-11-25
// client ignores iss and the metadata members it does not know), so the
// server always answers as 2026-07-28 asks, and there is no version to
// choose per request. Dynamic registration is off unless the operator
// turns it on.
package authserver

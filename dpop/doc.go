// Package dpop verifies the DPoP proofs (RFC 9449, SEP-1932) that clients
// send with their requests: the checks of RFC 9449 §4.3 on one proof, the
// server nonces of §8 (stateless), and a replay check of each proof's jti
// within the window, in process.
//
// What it owns: [Verifier.Verify] (typ, algorithm, the jwk header, the
// signature, htm, htu, iat, jti, ath, nonce, size, and one reading: a
// protected header or claims with a member twice, or two names equal but
// for case, are refused, by the check package message applies to every
// client body), [Nonces] (issuing and
// checking server nonces without storing any), the [Replay] interface
// and [Local], its implementation on one node.
//
// What it never does: storage (a cluster's replay check is another
// implementation of [Replay]), HTTP (reading the DPoP header, writing
// WWW-Authenticate or DPoP-Nonce is the caller's), Caddy, or deciding
// whether a token must be DPoP-bound. The URL a proof is checked against
// is the resource URL the caller was configured with, never one built
// from the request's Host header: a proof signed for another host must
// not pass because the client chose the Host it sent.
//
// Why it is written here: no Go library verifies DPoP proofs on the
// server side; the JOSE libraries (go-jose, golang-jwt) verify a JWS and
// its signature, and leave htm, htu, ath, a nonce and a jti's replay to
// the server. The cryptography is go-jose's: the JWS
// parsing with an allow-list of algorithms, the embedded jwk (which
// go-jose refuses unless public), the signature and the RFC 7638
// thumbprint. This package adds only the checks RFC 9449 puts on top.
package dpop

// Package idp signs a person's browser in to the gateway: through the
// company's IdP (an OpenID Connect relying party), or with a one-time link
// an operator printed. It owns the browser's sign-in session (a sealed
// cookie naming the person: owner, display name, the scopes they may
// grant), the sign-in flow's state, the rules that map an IdP's claims to
// an owner and scopes, and the links.
//
// The authorization server (package authserver) asks it who is signed in
// ([Service.Current]) and, when no one is, sends the browser to sign in
// ([Service.SignIn]) with the path to come back to. The gateway serves
// [Service] at [CallbackPath] and [LinkPath]. It imports no Caddy.
//
// The relying party is github.com/coreos/go-oidc/v3 with golang.org/x/oauth2
// (discovery, the token exchange, the ID token's signature, iss, aud and
// exp). What they leave to the caller is done here: PKCE S256, state and
// nonce bound to the browser by a sealed cookie, the nonce compared, azp
// when the ID token names several audiences, RFC 9207's iss in the
// authorization response (the IdP says in its metadata whether it sends
// one, and then it must be there and be the issuer), one reading of the
// callback's query and of the ID token's claims, and a state redeemed once
// per node (the IdP's code is single-use too, so a replay on another
// replica fails at the IdP's token endpoint). Every request to the IdP
// goes through pinnedfetch (the issuer's origin pinned, the client secret
// never sent elsewhere, loopback only for plain HTTP), bounded in size and
// time.
//
// With Config.KeepSignIns it keeps each person's last sign-in through the
// IdP (the ID token, and the refresh token when the IdP gave one), sealed
// under a keyed hash of the person, so that an upstream that trusts the
// same IdP can give the person their own token without a browser
// ([Service.SubjectToken], [Service.ForgetSignIn]; see tokens.go for its
// owner, lifetime and revocation).
//
// What it never does: it takes no URL, issuer, audience or redirect from
// Host or X-Forwarded-* (the site's origin is configuration), never
// redirects off the site (a return path is a path on this site, see
// [CheckReturnTo]), never keeps a link's secret (only its SHA-256) and
// never logs a secret, code or token. A cookie cannot be revoked one by
// one: its lifetime is short, and changing the key signs everyone out.
package idp

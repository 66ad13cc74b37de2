package policy

import (
	"context"
	"strings"
	"time"
)

// Kind says who holds a credential: a person's client or an unattended machine.
type Kind string

const (
	// KindUser is a token held by a person's MCP client (Claude Code, Cursor).
	KindUser Kind = "user"
	// KindMachine is a token held by an unattended process. Machine tokens
	// may not drive the sessions endpoint.
	KindMachine Kind = "machine"
)

// Principal is who a request acts for, as step 2 of the request path
// established it. It never carries the credential itself.
type Principal struct {
	// TokenID is the stable id of an opaque token, or "jwt:<sub>" for a JWT.
	TokenID string
	// Name is the operator-chosen name of the token, or the JWT subject.
	Name string
	// Kind is user or machine.
	Kind Kind
	// Scopes are the scopes the credential grants.
	Scopes []string
	// Source is "token" for opaque tokens, "jwt" for JWT access tokens,
	// and "grant" for the access tokens this gateway issues to OAuth
	// clients a person signed in (see [Principal.Client]).
	Source string
	// Client is the OAuth client_id a grant was issued to (a Client ID
	// Metadata Document URL or a registered id); empty for other sources.
	Client string
	// Resource is the one resource (RFC 8707) the credential was issued
	// for, when it names one; the edge refuses it at any other resource.
	Resource string
	// JKT is the RFC 7638 thumbprint of the DPoP key the credential is
	// bound to (cnf.jkt); empty for a bearer credential. A request with a
	// bound credential must carry a DPoP proof signed by that key.
	JKT string
	// Roots are the directory trees the token's sessions are confined to,
	// within the gateway's own roots; nil means the gateway's alone.
	Roots []string
	// Owner is who the credential acts for, and so who the sessions it
	// creates belong to: a token's owner (its --owner, inherited by the
	// tokens derived from it; by default the token's own id), or
	// "jwt:<sub>" for a JWT. See [Principal.OwnerID].
	Owner string
	// Parent is the credential a derived token was minted from (a token id
	// or "jwt:<sub>"); empty for the others.
	Parent string
	// Quota is the credential at the top of a derived token's chain (a
	// token id or "jwt:<sub>"): its per-token quotas are the ones a derived
	// token's sessions count against, so that minting children does not
	// multiply them. Empty for the others. See [Principal.QuotaID].
	Quota string
	// Expires is when the credential stops being valid: a token's expiry
	// (for a derived token, no later than its parent's), a JWT's exp. Nil
	// for a token that never expires.
	Expires *time.Time
	// Issued is a JWT's iat, when it has one; nil for tokens.
	Issued *time.Time
	// Claims is a verified JWT's payload (its claims, base64url-encoded
	// JSON, as the token carries it), which the operator's rules read as
	// claims; empty for other credentials. Kept encoded: it is decoded
	// only when a rule reads it.
	Claims string
}

// OwnerID is p's owner, or its TokenID when none was set (a principal built
// by hand).
func (p Principal) OwnerID() string {
	if p.Owner != "" {
		return p.Owner
	}
	return p.TokenID
}

// QuotaID is the credential whose per-token quotas p's sessions count
// against: the top of its parent chain, or p itself.
func (p Principal) QuotaID() string {
	if p.Quota != "" {
		return p.Quota
	}
	return p.TokenID
}

// JWTPrefix starts the TokenID (and the Owner) of a JWT principal:
// "jwt:<sub>". Opaque token ids start with "tok_", so the two never meet.
const JWTPrefix = "jwt:"

// IsJWTID reports whether id names a JWT subject ("jwt:<sub>") rather than
// a token of the store.
func IsJWTID(id string) bool { return strings.HasPrefix(id, JWTPrefix) }

// HasScope reports whether p was granted scope s.
func (p Principal) HasScope(s string) bool {
	for _, have := range p.Scopes {
		if have == s {
			return true
		}
	}
	return false
}

type principalKey struct{}

// WithPrincipal returns a context that carries p.
func WithPrincipal(ctx context.Context, p Principal) context.Context {
	return context.WithValue(ctx, principalKey{}, p)
}

// PrincipalFrom returns the principal carried by ctx, if any.
func PrincipalFrom(ctx context.Context) (Principal, bool) {
	p, ok := ctx.Value(principalKey{}).(Principal)
	return p, ok
}

type jwtKey struct{}

// WithJWT returns a context that carries jwt, the access token of the JWT
// principal a request acts for. Only a replica of a cluster needs it: the
// replica that holds the request's session, or runs the agent session it
// acts on, verifies a JWT principal's token itself (see
// [Authenticator.Forwarded]), since it can look no JWT subject up. A
// principal never carries its credential; this is the one place a request
// keeps it after the edge.
func WithJWT(ctx context.Context, jwt string) context.Context {
	return context.WithValue(ctx, jwtKey{}, jwt)
}

// JWTFrom returns the access token WithJWT put in ctx, or "".
func JWTFrom(ctx context.Context) string {
	jwt, _ := ctx.Value(jwtKey{}).(string)
	return jwt
}

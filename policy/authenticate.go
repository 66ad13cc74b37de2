package policy

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
)

// ErrNoCredential is returned by [Authenticator.Authenticate] for a request
// without an Authorization header.
var ErrNoCredential = errors.New("no bearer token")

// TokenVerifier verifies a JWT access token ([JWTVerifier] is one).
type TokenVerifier interface {
	Verify(ctx context.Context, raw string) (Principal, error)
}

// Authenticator is step 2 of the request path: it turns a request's
// Authorization header into the principal it authenticates, from an opaque
// token of the store or, with a verifier, a JWT access token.
type Authenticator struct {
	Tokens *TokenStore
	// JWT, when set, verifies tokens that look like JWTs.
	JWT TokenVerifier
}

// Authenticate checks the Authorization header value authz. Errors wrap
// [ErrNoCredential], [ErrKeysUnavailable] (the identity provider's keys
// could not be fetched: not the client's fault) or [ErrTokenInvalid]; the
// message of the last two says what to do.
func (a Authenticator) Authenticate(ctx context.Context, authz string, now time.Time) (Principal, error) {
	if authz == "" {
		return Principal{}, fmt.Errorf("%w: this MCP endpoint needs a bearer token: send Authorization: Bearer <token>", ErrNoCredential)
	}
	scheme, tok, ok := strings.Cut(authz, " ")
	tok = strings.TrimSpace(tok)
	if !ok || !strings.EqualFold(scheme, "Bearer") || tok == "" {
		return Principal{}, fmt.Errorf("%w: send the token as Authorization: Bearer <token>", ErrTokenInvalid)
	}
	if a.JWT != nil && LooksLikeJWT(tok) {
		p, err := a.JWT.Verify(ctx, tok)
		if err != nil || a.Tokens == nil {
			return p, err
		}
		// An operator's `token revoke jwt:<sub>` refuses the subject's
		// access tokens issued until then; one without iat cannot show it
		// came after.
		if at, revoked := a.Tokens.SubjectRevoked(p.TokenID); revoked && (p.Issued == nil || !p.Issued.After(at)) {
			return Principal{}, fmt.Errorf("%w: the operator revoked the access tokens of %q issued until %s: sign in again for a new one", ErrTokenInvalid, p.Name, at.UTC().Format(time.RFC3339))
		}
		return p, nil
	}
	p, err := a.Tokens.Check(tok, now)
	switch {
	case err == nil:
		return p, nil
	case errors.Is(err, ErrTokenRevoked) || errors.Is(err, ErrTokenExpired):
		return Principal{}, fmt.Errorf("%w: %v: ask the operator for a new token", ErrTokenInvalid, err)
	}
	return Principal{}, fmt.Errorf("%w: the token is not valid here: check it, or ask the operator for a new one", ErrTokenInvalid)
}

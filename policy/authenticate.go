package policy

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
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
	// Suspects, when set, is where the JWT signature checks of
	// [Authenticator.AuthenticateSuspect] wait their turn.
	Suspects *SuspectQueue
}

// AuthenticateSuspect is Authenticate for a request from an address whose
// budget of failed attempts is spent: it is likely guessing, but another
// client on the same address (an orchestrator on the host of an agent that
// guesses, everyone behind one NAT) may hold a valid credential, which is
// never refused for its address. An opaque token costs one hash either
// way; a JWT's signature check, tens to hundreds of microseconds, is the
// one costly step, and it waits for a slot of a.Suspects, so that all
// suspect requests together keep at most that many CPUs busy verifying
// signatures, however fast they come. What fails before the signature (not
// a JWT, an algorithm or key id the issuer does not use) never waits.
func (a Authenticator) AuthenticateSuspect(ctx context.Context, authz string, now time.Time) (Principal, error) {
	if a.Suspects != nil {
		ctx = context.WithValue(ctx, suspectKey{}, a.Suspects)
	}
	return a.Authenticate(ctx, authz, now)
}

// SuspectQueue bounds how many signature checks of suspect requests
// ([Authenticator.AuthenticateSuspect]) run at once; the others wait, in
// the order they came, until their request ends.
type SuspectQueue struct {
	slots   chan struct{}
	waiting atomic.Int64 // checks waiting for a slot now
}

// NewSuspectQueue returns a queue of n slots (at least 1).
func NewSuspectQueue(n int) *SuspectQueue {
	return &SuspectQueue{slots: make(chan struct{}, max(n, 1))}
}

// enter takes a slot, waiting until one is free or ctx ends.
func (q *SuspectQueue) enter(ctx context.Context) error {
	select {
	case q.slots <- struct{}{}:
		return nil
	default:
	}
	q.waiting.Add(1)
	defer q.waiting.Add(-1)
	select {
	case q.slots <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (q *SuspectQueue) leave() { <-q.slots }

// suspectKey carries the SuspectQueue of AuthenticateSuspect to the
// verifier, past the TokenVerifier interface.
type suspectKey struct{}

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

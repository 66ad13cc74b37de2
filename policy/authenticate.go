package policy

import (
	"context"
	"errors"
	"fmt"
	"slices"
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
// token of the store, an access token of a grant (see grants.go), or, with
// a verifier, a JWT access token.
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
		return a.verifyJWT(ctx, tok)
	}
	if strings.HasPrefix(tok, RefreshPrefix) {
		return Principal{}, fmt.Errorf("%w: this is a refresh token, which only the token endpoint takes: send the access token", ErrTokenInvalid)
	}
	p, err := a.Tokens.Check(tok, now)
	grant := strings.HasPrefix(tok, AccessPrefix)
	switch {
	case err == nil:
		return p, nil
	case grant && errors.Is(err, ErrTokenExpired):
		return Principal{}, fmt.Errorf("%w: %v: refresh it at the token endpoint, or sign in again", ErrTokenInvalid, err)
	case grant && errors.Is(err, ErrTokenRevoked):
		return Principal{}, fmt.Errorf("%w: %v: sign in again", ErrTokenInvalid, err)
	case grant:
		return Principal{}, fmt.Errorf("%w: the access token is not valid here: sign in again", ErrTokenInvalid)
	case errors.Is(err, ErrTokenRevoked) || errors.Is(err, ErrTokenExpired):
		return Principal{}, fmt.Errorf("%w: %v: ask the operator for a new token", ErrTokenInvalid, err)
	}
	return Principal{}, fmt.Errorf("%w: the token is not valid here: check it, or ask the operator for a new one", ErrTokenInvalid)
}

// verifyJWT verifies the access token raw, and refuses one whose subject
// an operator revoked after it was issued.
func (a Authenticator) verifyJWT(ctx context.Context, raw string) (Principal, error) {
	p, err := a.JWT.Verify(ctx, raw)
	if err != nil || a.Tokens == nil {
		return p, err
	}
	// An operator's `token revoke jwt:<sub>` refuses the subject's access
	// tokens issued until then; one without iat cannot show it came after.
	if at, revoked := a.Tokens.SubjectRevoked(p.TokenID); revoked && (p.Issued == nil || !p.Issued.After(at)) {
		return Principal{}, fmt.Errorf("%w: the operator revoked the access tokens of %q issued until %s: sign in again for a new one", ErrTokenInvalid, p.Name, at.UTC().Format(time.RFC3339))
	}
	return p, nil
}

// BearerJWT is the JWT access token that the Authorization header value
// authz carries, with the Bearer or the DPoP scheme (RFC 9449 §7.1), or ""
// when it carries none (no token, or an opaque one): what a replica
// forwards of a JWT principal's credential (see [Authenticator.Forwarded]),
// and never an opaque token.
func BearerJWT(authz string) string {
	scheme, tok, ok := strings.Cut(authz, " ")
	tok = strings.TrimSpace(tok)
	if !ok || !(strings.EqualFold(scheme, "Bearer") || strings.EqualFold(scheme, "DPoP")) || !LooksLikeJWT(tok) {
		return ""
	}
	return tok
}

// BearerToken is the token that the Authorization header value authz
// carries with the Bearer scheme, or "".
func BearerToken(authz string) string {
	scheme, tok, ok := strings.Cut(authz, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return ""
	}
	return strings.TrimSpace(tok)
}

// ErrScopesClaimed is returned by [Authenticator.Forwarded] for a forwarded
// request that claims a scope its credential does not grant here.
var ErrScopesClaimed = errors.New("the forwarded request claims scopes its credential does not grant")

// Forwarded establishes whom a request another replica forwarded acts
// for. The forwarding replica authenticated the client, and says who that
// was (id, a token of the store or "jwt:<sub>") and with what scopes;
// Forwarded takes only the identity from it:
//
//   - a token is looked up in this replica's store ([TokenStore.Lookup]):
//     an unknown, revoked or expired one, or one whose parents are, is
//     refused, and its owner, kind, roots and parents are the store's;
//   - a JWT principal's access token, which the hop carries as jwt, is
//     verified here as any client's would be ([Authenticator.Authenticate]),
//     and must name the subject id names.
//
// The scopes are those the store or the JWT grants, narrowed to claimed:
// never more than the forwarding replica claims, and a claim of a scope
// not granted here is refused with [ErrScopesClaimed], since no replica of
// this cluster makes it. Other errors wrap [ErrTokenInvalid] or
// [ErrKeysUnavailable]. A token created on another replica a moment ago
// may not be in this replica's store yet: one unknown id makes the store
// load the token file again before it is refused.
func (a Authenticator) Forwarded(ctx context.Context, id string, claimed []string, jwt string, now time.Time) (Principal, error) {
	var p Principal
	switch {
	case IsJWTID(id):
		if a.JWT == nil {
			return Principal{}, fmt.Errorf("%w: the forwarded request acts for JWT subject %q, and this replica takes no JWTs: give every replica the same jwt configuration", ErrTokenInvalid, strings.TrimPrefix(id, JWTPrefix))
		}
		if jwt == "" || !LooksLikeJWT(jwt) {
			return Principal{}, fmt.Errorf("%w: the forwarded request acts for JWT subject %q without carrying the access token, which this replica verifies itself", ErrTokenInvalid, strings.TrimPrefix(id, JWTPrefix))
		}
		var err error
		if p, err = a.verifyJWT(ctx, jwt); err != nil {
			return Principal{}, err
		}
		if p.TokenID != id {
			return Principal{}, fmt.Errorf("%w: the forwarded request acts for %q, and the access token it carries is %q's", ErrTokenInvalid, id, p.TokenID)
		}
	case jwt != "":
		return Principal{}, fmt.Errorf("%w: the forwarded request acts for token %q and carries a credential, which a replica forwards only for a JWT subject", ErrTokenInvalid, id)
	case a.Tokens == nil:
		return Principal{}, fmt.Errorf("%w: this replica has no token store", ErrTokenInvalid)
	default:
		var err error
		p, err = a.Tokens.Lookup(id, now)
		if errors.Is(err, ErrTokenUnknown) {
			if serr := a.Tokens.Sync(ctx); serr == nil {
				p, err = a.Tokens.Lookup(id, now)
			}
		}
		if err != nil {
			return Principal{}, fmt.Errorf("%w: the forwarded request acts for a token this replica refuses: %v", ErrTokenInvalid, err)
		}
	}
	var extra []string
	for _, sc := range claimed {
		if !p.HasScope(sc) {
			extra = append(extra, sc)
		}
	}
	if len(extra) > 0 {
		return Principal{}, fmt.Errorf("%w: it claims %s for %q, which holds %s here", ErrScopesClaimed, strings.Join(extra, ", "), id, strings.Join(p.Scopes, ", "))
	}
	p.Scopes = slices.DeleteFunc(slices.Clone(p.Scopes), func(sc string) bool { return !slices.Contains(claimed, sc) })
	return p, nil
}

package edge

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/policy"
)

// Reasons of the authentication step's refusals.
const (
	ReasonNoToken         = "no_token"
	ReasonInvalidToken    = "invalid_token"
	ReasonKeysUnavailable = "jwt_keys_unavailable"
	ReasonRateLimitedIP   = "rate_limited_ip"
	ReasonWrongResource   = "wrong_resource"
)

// keysRetry is the Retry-After of a refusal for the identity provider's
// keys being unavailable.
const keysRetry = 30 * time.Second

// Authentication is step 2 of the request path: the credential of a
// request, turned into its principal or a refusal. A request without a
// valid credential is charged to its address (an IPv6 client's prefix) in
// Failures, and once the address's bucket is empty it is refused 429
// rather than 401, so that guessing slows down. The bucket is consulted
// after the credential, never for a valid one: an address is shared (an
// agent that guesses and the orchestrator on its host; in a cluster, the
// usage reaches every replica), and one client's guesses must not lock the
// others out. While the bucket is empty, a JWT's signature check waits its
// turn in the Authenticator's SuspectQueue (see
// [policy.Authenticator.AuthenticateSuspect]), which bounds the CPU that
// such addresses can have spent on checking signatures.
type Authentication struct {
	Authn policy.Authenticator
	// Failures is the bucket of failed attempts per address.
	Failures *policy.Limiter
	// IPv6Prefix is the prefix length by which Failures keys IPv6 clients.
	IPv6Prefix int
	// DPoP holds bound credentials to their keys (see [DPoP]).
	DPoP DPoP
	// PerToken, when set, is step 5's bucket per principal, consulted
	// (not drawn on) before a proof is checked: a principal whose bucket
	// is empty is refused 429 as step 5 would, before its proof costs a
	// signature check and a claim in the replay check, so that one
	// holder of a bound token cannot fill the check that every client's
	// proofs go through.
	PerToken *policy.Limiter
	// Resource is the site's configured resource URL when it is absolute,
	// "" when it is a path alone. A credential issued for one resource (a
	// grant, RFC 8707) is taken only where Resource is exactly that one;
	// a site with no absolute resource cannot tell, and takes none.
	Resource string
}

// Authenticate checks the Authorization header value authz of a request
// from clientIP that carries no DPoP proof (see [Authentication.Check]).
func (a Authentication) Authenticate(ctx context.Context, authz, clientIP string, now time.Time) (p policy.Principal, v Verdict, err error) {
	return a.Check(ctx, Credential{Authorization: authz}, clientIP, now)
}

// Check authenticates the credential c of a request from clientIP: its
// token, with the Bearer or the DPoP scheme, then the token's DPoP binding
// (see [DPoP]). A refusal for the identity provider's keys (a 503 with
// [ReasonKeysUnavailable]) or for the replay check (503
// [ReasonDPoPUnavailable]) is not the client's fault: it is not charged,
// and its detail, err, is for the log only (an URL, a network error); nor
// is the use_dpop_nonce step of the protocol. A refused proof is charged
// like a failed token.
func (a Authentication) Check(ctx context.Context, c Credential, clientIP string, now time.Time) (p policy.Principal, v Verdict, err error) {
	ip := policy.AddressKey(clientIP, a.IPv6Prefix)
	authenticate := a.Authn.Authenticate
	if a.Authn.JWT != nil && a.Failures.Empty(ip, now) {
		authenticate = a.Authn.AuthenticateSuspect
	}
	authz := c.Authorization
	token, isDPoP := dpopScheme(authz)
	if isDPoP {
		// The Authenticator checks the token; the scheme's binding is
		// checked below, here, once the token's principal is known.
		authz = "Bearer " + token
	}
	p, err = authenticate(ctx, authz, now)
	if err == nil {
		if p.Resource != "" && p.Resource != a.Resource {
			v := Refuse(http.StatusUnauthorized, ReasonWrongResource, wrongResource(p.Resource, a.Resource))
			return policy.Principal{}, a.charge(ip, now, v), errors.New(v.Message)
		}
		if !isDPoP {
			token = policy.BearerToken(authz)
		}
		if p.JKT != "" && isDPoP && a.PerToken != nil && a.PerToken.Empty(p.TokenID, now) {
			return policy.Principal{}, RateLimit(a.PerToken, p.TokenID, now), nil
		}
		v = a.DPoP.checkBinding(ctx, p, c, token, isDPoP, now)
		if v.Allowed() {
			return p, Verdict{}, nil
		}
		if !dpopCharged(v) {
			return policy.Principal{}, v, nil
		}
		return policy.Principal{}, a.charge(ip, now, v), errors.New(v.Message)
	}
	if errors.Is(err, policy.ErrKeysUnavailable) {
		v := Refuse(http.StatusServiceUnavailable, ReasonKeysUnavailable,
			"the identity provider's signing keys are unavailable right now; retry later")
		v.RetryAfter = keysRetry
		return policy.Principal{}, v, err
	}
	return policy.Principal{}, a.charge(ip, now, credentialVerdict(err)), err
}

// wrongResource says why a credential for resource was refused at a site
// whose resource is here ("" for a path alone).
func wrongResource(resource, here string) string {
	if here == "" {
		return "this token was issued for " + resource + "; this site names no absolute resource, so it takes no token issued for one"
	}
	return "this token was issued for " + resource + ", not for " + here + ": sign in to this resource for a token of its own"
}

// charge counts the failed credential refused with v against the address
// ip, and once its bucket is empty answers 429 instead.
func (a Authentication) charge(ip string, now time.Time, v Verdict) Verdict {
	if ok, retry := a.Failures.Allow(ip, now); !ok {
		v := Refuse(http.StatusTooManyRequests, ReasonRateLimitedIP,
			"too many requests without a valid token from this address; wait and retry with a valid token")
		v.RetryAfter = retry
		return v
	}
	return v
}

// credentialVerdict is the 401 of a failed credential: the one place an
// authentication error becomes a status.
func credentialVerdict(err error) Verdict {
	if errors.Is(err, policy.ErrNoCredential) {
		return Refuse(http.StatusUnauthorized, ReasonNoToken, errMessage(err, policy.ErrNoCredential))
	}
	return Refuse(http.StatusUnauthorized, ReasonInvalidToken, errMessage(err, policy.ErrTokenInvalid))
}

// errMessage is err's message without the sentinel's prefix.
func errMessage(err, sentinel error) string {
	return strings.TrimPrefix(err.Error(), sentinel.Error()+": ")
}

// ChargeRefusedHop charges the address of a hop refused with v (a request
// with the replicas' hop headers that did not verify) as a failed
// credential, and once its bucket is empty refuses it 429 instead. A hop
// that verifies is never charged: the address is a replica's, which
// whatever else shares it (an agent's shell on that host) must not be able
// to cut off by sending bad hops.
func (a Authentication) ChargeRefusedHop(clientIP string, now time.Time, v Verdict) Verdict {
	if v.Status != http.StatusUnauthorized && v.Status != http.StatusForbidden {
		return v
	}
	ip := policy.AddressKey(clientIP, a.IPv6Prefix)
	if !a.Failures.Empty(ip, now) {
		a.Failures.Allow(ip, now)
		return v
	}
	_, retry := a.Failures.Allow(ip, now)
	v = Refuse(http.StatusTooManyRequests, ReasonRateLimitedIP, "too many refused requests from this address; wait and retry")
	v.RetryAfter = retry
	return v
}

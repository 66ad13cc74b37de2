package edge

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/dpop"
	"github.com/Tahul/caddy-zidane-mcp/policy"
)

// Reasons of the refusals of DPoP (RFC 9449) at step 2.
const (
	// ReasonDPoPProof: a bound credential came without one valid proof
	// for this request, signed by its key (invalid_dpop_proof).
	ReasonDPoPProof = "invalid_dpop_proof"
	// ReasonDPoPNonce: the proof lacks this server's current nonce
	// (use_dpop_nonce); the client signs again with DPoP-Nonce's value.
	ReasonDPoPNonce = "use_dpop_nonce"
	// ReasonDPoPRequired: the site takes DPoP-bound credentials only.
	ReasonDPoPRequired = "dpop_required"
	// ReasonDPoPUnavailable: the replay check could not answer (503).
	ReasonDPoPUnavailable = "dpop_unavailable"
)

// dpopRetry is the Retry-After of a refusal for the replay check being
// unavailable: a storage hiccup, over in moments.
const dpopRetry = 5 * time.Second

// DPoP is how a site holds requests to the DPoP keys their credentials are
// bound to (RFC 9449, SEP-1932). A credential bound to a key (a principal
// with JKT: a JWT with cnf.jkt, a grant this gateway issued to a client
// that sent a proof) is taken only with the DPoP scheme and one DPoP
// header whose proof, for this request's method, this resource's URL and
// this token, verifies and is signed by that key. Never as a bearer token
// (RFC 9449 §7.1): that is what makes a stolen bound token useless.
type DPoP struct {
	// Verifier checks proofs, with the replay check (shared by the
	// replicas of a cluster) and, when nonces are on, the nonces. Nil when
	// the site cannot check a proof (its resource is a path alone): a
	// bound credential is then refused.
	Verifier *dpop.Verifier
	// URL is the resource's configured absolute URL, whose scheme and
	// host every proof's htu must name, with the path the client sent
	// the request to (the resource's own, for an MCP client). Never a
	// scheme or host built from the request's Host or X-Forwarded-*
	// headers, which the client chooses: a proof signed for another host
	// (another resource the same token is good at, say) would otherwise
	// pass wherever the client sent it with that Host.
	URL *url.URL
	// Required refuses every credential that is not bound to a key, but
	// the tokens the gateway derives for its own agents (a session's
	// orchestrator and egress tokens, Principal.Parent set). Those are
	// bearer tokens whatever their parent: the agent holds no key of the
	// client's, so a derived token never inherits a JKT it could not
	// prove. It is bound to its session instead: it lives no longer than
	// its parent or its session, holds narrower scopes, is revoked with
	// either, and is handed only to the agent process the gateway runs.
	Required bool
}

// On says whether the site can check proofs.
func (d DPoP) On() bool { return d.Verifier != nil && d.URL != nil }

// Nonce is the DPoP-Nonce that the site's answers carry when nonces are
// on (RFC 9449 §8), "" otherwise.
func (d DPoP) Nonce(now time.Time) string {
	if !d.On() || d.Verifier.Nonces == nil {
		return ""
	}
	return d.Verifier.Nonces.Issue(now)
}

// DPoPAlgorithms are the proof algorithms the edge verifies, for the
// metadata's dpop_signing_alg_values_supported and the challenge's algs.
func DPoPAlgorithms() []string {
	algs := make([]string, len(dpop.Algorithms))
	for i, a := range dpop.Algorithms {
		algs[i] = string(a)
	}
	return algs
}

// Credential is what step 2 reads of a request.
type Credential struct {
	// Authorization is the Authorization header's value (sent once: see
	// CheckSingleHeaders).
	Authorization string
	// Proofs are the DPoP header's values, as many as were sent.
	Proofs []string
	// Method is the request's HTTP method, which a proof's htm names.
	Method string
	// Path is the request's path as the client sent it (escaped, before
	// any rewrite on the server), which a proof's htu names; empty for
	// the resource's own.
	Path string
}

// CredentialOf reads r's credential; its Path is r's, which a caller that
// rewrites paths replaces with the one the client sent.
func CredentialOf(r *http.Request) Credential {
	return Credential{Authorization: r.Header.Get("Authorization"), Proofs: r.Header.Values("DPoP"), Method: r.Method, Path: r.URL.EscapedPath()}
}

// htu is the URL a proof of a request to path must name: the configured
// resource's scheme and host, and path (the resource's when empty).
func (d DPoP) htu(path string) *url.URL {
	if path == "" {
		return d.URL
	}
	u := *d.URL
	u.RawPath = path
	u.Path, _ = url.PathUnescape(path)
	return &u
}

// dpopScheme splits authz into its token and whether its scheme is DPoP.
// Auth-scheme names are case-insensitive (RFC 9110 §11.1). Any other
// scheme is left as it is, for the Authenticator to refuse or take.
func dpopScheme(authz string) (token string, isDPoP bool) {
	scheme, tok, ok := strings.Cut(authz, " ")
	if !ok || !strings.EqualFold(scheme, "DPoP") {
		return "", false
	}
	return strings.TrimSpace(tok), true
}

// dpopRefuse is a 401 whose challenge is DPoP's with code as its error.
func dpopRefuse(reason, code, msg string) Verdict {
	v := Refuse(http.StatusUnauthorized, reason, msg)
	v.DPoPError = code
	return v
}

// checkBinding holds the request of credential c, whose token authenticated
// p, to p's DPoP binding, and to the site's rule on unbound credentials.
// token is the access token the proof's ath must hash; isDPoP says whether
// it came with the DPoP scheme. A refusal is for the caller to charge.
func (d DPoP) checkBinding(ctx context.Context, p policy.Principal, c Credential, token string, isDPoP bool, now time.Time) Verdict {
	switch {
	case p.JKT == "" && isDPoP:
		return dpopRefuse(ReasonInvalidToken, "invalid_token", "the token is not DPoP-bound: send it as Authorization: Bearer <token>, or get a DPoP-bound token from the authorization server by sending it a DPoP proof")
	case p.JKT == "" && d.Required && p.Parent == "":
		// A derived token (Parent set) is the gateway's own, held by the
		// agent of a session it runs: a bearer token bound to its session
		// (see [DPoP.Required]).
		return dpopRefuse(ReasonDPoPRequired, "invalid_token", "this resource takes DPoP-bound access tokens only (RFC 9449): get one from the authorization server by sending it a DPoP proof, and send it as Authorization: DPoP <token> with a DPoP proof")
	case p.JKT == "":
		return Verdict{}
	case !isDPoP:
		// RFC 9449 §7.1: a bound token presented as a bearer token is
		// refused, with or without a proof beside it.
		return dpopRefuse(ReasonInvalidToken, "invalid_token", "the token is DPoP-bound: send it as Authorization: DPoP <token>, with a DPoP header holding a proof signed by its key for this request")
	case !d.On():
		return dpopRefuse(ReasonInvalidToken, "invalid_token", "the token is DPoP-bound, and this site cannot check DPoP proofs: its operator must give its resource as an absolute URL (such as https://mcp.example.com/mcp), which a proof's htu names")
	case len(c.Proofs) == 0:
		return dpopRefuse(ReasonDPoPProof, "invalid_dpop_proof", "a DPoP-bound token needs a DPoP header holding a proof signed by its key for this request (RFC 9449 §4)")
	case len(c.Proofs) > 1:
		// Two proofs: two readers could check different ones.
		return dpopRefuse(ReasonDPoPProof, "invalid_dpop_proof", "send exactly one DPoP header, with one proof")
	}
	proof, err := d.Verifier.Verify(ctx, dpop.Request{Proof: c.Proofs[0], Method: c.Method, URL: d.htu(c.Path), AccessToken: token, Now: now})
	var e *dpop.Error
	switch {
	case err == nil && proof.JKT != p.JKT:
		return dpopRefuse(ReasonDPoPProof, "invalid_dpop_proof", "the proof is signed by another key than the one the token is bound to (cnf.jkt); sign it with the token's key")
	case err == nil:
		return Verdict{}
	case errors.Is(err, dpop.ErrUnavailable):
		v := Refuse(http.StatusServiceUnavailable, ReasonDPoPUnavailable, "the server could not check the DPoP proof right now; retry shortly with a new proof")
		v.RetryAfter = dpopRetry
		return v
	case errors.Is(err, dpop.ErrUseNonce) && errors.As(err, &e):
		v := dpopRefuse(ReasonDPoPNonce, "use_dpop_nonce", e.Reason)
		v.DPoPNonce = d.Verifier.Nonces.Issue(now)
		return v
	case errors.As(err, &e):
		return dpopRefuse(ReasonDPoPProof, "invalid_dpop_proof", e.Reason)
	}
	return dpopRefuse(ReasonDPoPProof, "invalid_dpop_proof", "the DPoP proof does not verify")
}

// CheckForwarded holds a request another replica forwarded (a hop), acting
// for p, to p's DPoP binding, as the sending replica's edge did: a hop
// carries identity, never authority (see hop.go), and whoever holds the
// cluster key can sign one, so a bound principal's hop must carry the
// client's proof, under the hop's MAC, and this replica checks it again:
// its signature by p's key, htm (method), htu (this resource's scheme and
// host, and path, the request's as the client sent it), iat, the nonce, and
// ath over jwt, the access token the hop carries (for a principal of the
// token store, which no hop carries, ath is not checked). The proof was
// claimed once cluster-wide by the sending edge; here it is claimed once
// more under a key of its own, so that one proof makes one hop. A holder
// of the cluster key and a stolen bound token thus needs a proof the
// client signed for this resource within the window, and one that was
// forwarded already will not do. An unbound principal on a site that
// requires DPoP is refused as at the edge.
func (d DPoP) CheckForwarded(ctx context.Context, p policy.Principal, proofs []string, method, path, jwt string, now time.Time) Verdict {
	if p.JKT == "" {
		if d.Required && p.Parent == "" {
			return dpopRefuse(ReasonDPoPRequired, "invalid_token", "the forwarded request acts for a credential that is not DPoP-bound, and this resource takes DPoP-bound access tokens only")
		}
		return Verdict{}
	}
	if !d.On() || len(proofs) != 1 {
		return dpopRefuse(ReasonDPoPProof, "invalid_dpop_proof", "the forwarded request acts for a DPoP-bound credential and does not carry one proof of it, which a replica of this cluster always forwards")
	}
	v := *d.Verifier
	if v.Replay != nil {
		v.Replay = hopReplay{v.Replay}
	}
	proof, err := v.Verify(ctx, dpop.Request{Proof: proofs[0], Method: method, URL: d.htu(path), AccessToken: jwt, Now: now})
	var e *dpop.Error
	switch {
	case err == nil && proof.JKT == p.JKT:
		return Verdict{}
	case err == nil:
		return dpopRefuse(ReasonDPoPProof, "invalid_dpop_proof", "the forwarded request's proof is signed by another key than the one its credential is bound to")
	case errors.Is(err, dpop.ErrUnavailable):
		v := Refuse(http.StatusServiceUnavailable, ReasonDPoPUnavailable, "the replica that holds this session could not check the DPoP proof right now; retry shortly with a new proof")
		v.RetryAfter = dpopRetry
		return v
	case errors.As(err, &e):
		return dpopRefuse(ReasonDPoPProof, "invalid_dpop_proof", "the forwarded request's proof: "+e.Reason)
	}
	return dpopRefuse(ReasonDPoPProof, "invalid_dpop_proof", "the forwarded request's proof does not verify")
}

// hopReplay claims a proof for its hop, apart from its claim at the edge.
type hopReplay struct{ dpop.Replay }

func (h hopReplay) Claim(ctx context.Context, key string, until time.Time) (bool, error) {
	return h.Replay.Claim(ctx, "hop|"+key, until)
}

type proofKey struct{}

// WithProof returns a context that carries the DPoP proof a request of a
// bound principal came with, for a hop to carry on (see
// [DPoP.CheckForwarded]); like the JWT of policy.WithJWT, it is kept past
// the edge only for that.
func WithProof(ctx context.Context, proof string) context.Context {
	return context.WithValue(ctx, proofKey{}, proof)
}

// ProofFrom returns the proof WithProof put in ctx, or "".
func ProofFrom(ctx context.Context) string {
	proof, _ := ctx.Value(proofKey{}).(string)
	return proof
}

// dpopCharged says whether a refusal of checkBinding counts as a failed
// credential against the address: not the nonce step of the protocol, nor
// the server's own unavailability.
func dpopCharged(v Verdict) bool {
	return v.Reason != ReasonDPoPNonce && v.Reason != ReasonDPoPUnavailable
}

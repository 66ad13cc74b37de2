package dpop

import (
	"context"
	"crypto"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/url"
	"strings"
	"time"

	"github.com/go-jose/go-jose/v4"

	"github.com/Tahul/caddy-zidane-mcp/message"
)

// Defaults of a [Verifier] whose fields are zero.
const (
	// DefaultWindow is how far a proof's iat may be from the server's
	// clock, either way.
	DefaultWindow = 60 * time.Second
	// DefaultMaxSize bounds a proof, in bytes: an ES256 proof is about
	// 600, an RSA-4096 one about 1,300; 8 KiB leaves room and refuses a
	// header stuffed to cost parsing.
	DefaultMaxSize = 8 << 10
	// MaxJTI bounds a proof's jti, in bytes; RFC 9449 asks for 96 bits
	// of randomness, a few dozen characters.
	MaxJTI = 256
	// MaxNonce bounds a proof's nonce, in bytes.
	MaxNonce = 512
	// minRSABits refuses RSA keys too short to sign with.
	minRSABits = 2048
)

// Algorithms are the proof algorithms accepted: asymmetric only (RFC 9449
// §4.2 forbids none and MACs, whose key the server would have to share).
var Algorithms = []jose.SignatureAlgorithm{jose.ES256, jose.ES384, jose.EdDSA, jose.RS256, jose.PS256}

// The kinds of refusal, for errors.Is. Every error [Verifier.Verify]
// returns is one of them.
var (
	// ErrInvalidProof: the proof is malformed, signed wrongly, for
	// another request, stale, or replayed (RFC 9449 invalid_dpop_proof).
	// The client signs a new proof for this request.
	ErrInvalidProof = errors.New("invalid_dpop_proof")
	// ErrUseNonce: the server requires a nonce and the proof carries
	// none, or one that is stale or not the server's (RFC 9449 §8
	// use_dpop_nonce). The client signs a new proof with the nonce of
	// the DPoP-Nonce header that comes with this error.
	ErrUseNonce = errors.New("use_dpop_nonce")
	// ErrUnavailable: the replay check could not answer (full, or its
	// storage failed). The proof was not accepted; the client may try
	// again shortly. This is the server's fault, not the client's.
	ErrUnavailable = errors.New("dpop replay check unavailable")
)

// Error is a refusal: its kind (one of the Err values above, for
// errors.Is) and what the client should do, in words a client developer
// can act on. It never carries the proof or a value read from it.
type Error struct {
	Kind   error
	Reason string
}

func (e *Error) Error() string { return "DPoP proof refused (" + e.Kind.Error() + "): " + e.Reason }

func (e *Error) Unwrap() error { return e.Kind }

func invalid(format string, a ...any) error {
	return &Error{Kind: ErrInvalidProof, Reason: fmt.Sprintf(format, a...)}
}

// Replay remembers the proofs already taken, so that each is accepted
// once. [Local] is the one of a single node; a cluster shares one.
type Replay interface {
	// Claim records key until until, and says whether it was fresh
	// (never claimed before, within its lifetime). An error means the
	// check could not answer; the proof is refused.
	Claim(ctx context.Context, key string, until time.Time) (fresh bool, err error)
}

// Verifier checks DPoP proofs. Its zero value checks with the defaults,
// requires no nonce and has no replay check; a server sets Replay (a proof
// without it may be presented again within the window).
type Verifier struct {
	// Window is how far a proof's iat may be from now, either way;
	// DefaultWindow when zero. A proof is claimed in Replay until its iat
	// plus Window, when it would be refused as stale anyway.
	Window time.Duration
	// MaxSize bounds a proof in bytes; DefaultMaxSize when zero.
	MaxSize int
	// Nonces, when set, makes a nonce it issued (current or previous
	// period) required in every proof.
	Nonces *Nonces
	// Replay, when set, refuses a proof whose key and jti were seen.
	Replay Replay
}

// Request is what a proof is checked against.
type Request struct {
	// Proof is the DPoP header's value: one JWS in compact serialization.
	Proof string
	// Method is the request's HTTP method, compared exactly with htm.
	Method string
	// URL is the resource's configured URL (never one built from the
	// request's Host); its query and fragment are ignored.
	URL *url.URL
	// AccessToken, when set, is the token the proof goes with; the
	// proof's ath must be its hash. Empty at a token endpoint.
	AccessToken string
	// Now is the server's clock.
	Now time.Time
}

// Proof is what a verified proof says.
type Proof struct {
	// JKT is the RFC 7638 SHA-256 thumbprint of the proof's key,
	// base64url: what a bound token's cnf.jkt names.
	JKT string
	// JTI is the proof's id.
	JTI string
	// IAT is when the client says it signed the proof.
	IAT time.Time
}

// Verify checks proof for a request of method to htu at now, with the
// defaults: no nonce, no replay check. A server uses a [Verifier] with a
// Replay.
func Verify(proof, method string, htu *url.URL, accessToken string, now time.Time) (Proof, error) {
	var v Verifier
	return v.Verify(context.Background(), Request{Proof: proof, Method: method, URL: htu, AccessToken: accessToken, Now: now})
}

// claims are a proof's (RFC 9449 §4.2). iat is a NumericDate, which may
// have a fraction.
type claims struct {
	JTI   *string  `json:"jti"`
	HTM   string   `json:"htm"`
	HTU   string   `json:"htu"`
	IAT   *float64 `json:"iat"`
	ATH   *string  `json:"ath"`
	Nonce *string  `json:"nonce"`
}

// Verify runs the checks of RFC 9449 §4.3 on r.Proof. The cheap checks
// come before the signature, and the replay claim after every other, so
// that a proof refused for another reason does not use up its jti.
func (v *Verifier) Verify(ctx context.Context, r Request) (Proof, error) {
	maxSize := v.MaxSize
	if maxSize <= 0 {
		maxSize = DefaultMaxSize
	}
	window := v.Window
	if window <= 0 {
		window = DefaultWindow
	}
	if r.URL == nil {
		// The caller's mistake, not the client's; refused all the same.
		return Proof{}, invalid("the server has no resource URL to check the proof's htu against")
	}
	if r.Proof == "" {
		return Proof{}, invalid("no DPoP proof; send one DPoP header with a proof signed for this request")
	}
	if len(r.Proof) > maxSize {
		return Proof{}, invalid("the proof is over %d bytes", maxSize)
	}
	// Compact only: RFC 9449 §4.1 names the compact serialization, which
	// has exactly one signature and no unprotected header.
	if strings.Count(r.Proof, ".") != 2 {
		return Proof{}, invalid("the proof is not a JWS in compact serialization (three base64url parts joined by dots)")
	}
	// The header is checked before go-jose parses it, so that a member
	// twice is refused as that, with what to fix. A header that is not
	// base64url is go-jose's to refuse, just below.
	header, _, _ := strings.Cut(r.Proof, ".")
	if raw, err := base64.RawURLEncoding.DecodeString(header); err == nil {
		if err := oneReading("protected header is", raw); err != nil {
			return Proof{}, err
		}
	}
	jws, err := jose.ParseSignedCompact(r.Proof, Algorithms)
	if err != nil {
		return Proof{}, invalid("the proof does not parse as a JWS signed with one of ES256, ES384, EdDSA, RS256, PS256, with a public jwk header")
	}
	if len(jws.Signatures) != 1 {
		return Proof{}, invalid("the proof has %d signatures; it must have one", len(jws.Signatures))
	}
	// The claims before the signature too: a check of the bytes, cheaper
	// than the signature; the payload is the one Verify returns below.
	if err := oneReading("claims are", jws.UnsafePayloadWithoutVerification()); err != nil {
		return Proof{}, err
	}
	h := jws.Signatures[0].Protected
	if typ, _ := h.ExtraHeaders[jose.HeaderType].(string); typ != "dpop+jwt" {
		return Proof{}, invalid(`the proof's typ header must be "dpop+jwt"`)
	}
	jwk := h.JSONWebKey
	if jwk == nil {
		return Proof{}, invalid("the proof has no jwk header; put the public key it is signed with in it")
	}
	// go-jose refuses a private embedded jwk when it parses; this says so
	// here too, and refuses symmetric keys, which IsPublic never calls
	// public.
	if !jwk.IsPublic() || !jwk.Valid() {
		return Proof{}, invalid("the proof's jwk header must be a public asymmetric key (EC, OKP or RSA) without private parameters")
	}
	if k, ok := jwk.Key.(*rsa.PublicKey); ok && k.N.BitLen() < minRSABits {
		return Proof{}, invalid("the proof's RSA key is shorter than %d bits", minRSABits)
	}
	payload, err := jws.Verify(jwk)
	if err != nil {
		return Proof{}, invalid("the proof's signature does not verify with its jwk header")
	}
	if err := exactClaimNames(payload); err != nil {
		return Proof{}, err
	}
	var c claims
	if err := json.Unmarshal(payload, &c); err != nil {
		return Proof{}, invalid("the proof's claims are not a JSON object with jti, htm, htu and iat of the right types")
	}
	switch {
	case c.JTI == nil || *c.JTI == "":
		return Proof{}, invalid("the proof has no jti; give each proof a new random id")
	case len(*c.JTI) > MaxJTI:
		return Proof{}, invalid("the proof's jti is over %d bytes", MaxJTI)
	case c.HTM != r.Method:
		return Proof{}, invalid("the proof's htm is not this request's method, %s", r.Method)
	case !sameURI(c.HTU, r.URL):
		return Proof{}, invalid("the proof's htu is not this resource's URL, %s (scheme, host and path, without query or fragment)", target(r.URL))
	case c.IAT == nil:
		return Proof{}, invalid("the proof has no iat")
	}
	now := float64(r.Now.UnixNano()) / 1e9
	if math.Abs(now-*c.IAT) > window.Seconds() {
		return Proof{}, invalid("the proof's iat is more than %s from the server's time; sign each proof when sending it, with a clock set right", window)
	}
	if r.AccessToken != "" {
		sum := sha256.Sum256([]byte(r.AccessToken))
		want := base64.RawURLEncoding.EncodeToString(sum[:])
		switch {
		case c.ATH == nil:
			return Proof{}, invalid("the proof has no ath; with an access token, ath is base64url(SHA-256(token))")
		case subtle.ConstantTimeCompare([]byte(*c.ATH), []byte(want)) != 1:
			return Proof{}, invalid("the proof's ath is not base64url(SHA-256) of the access token sent with it")
		}
	}
	if v.Nonces != nil {
		switch {
		case c.Nonce == nil:
			return Proof{}, &Error{Kind: ErrUseNonce, Reason: "this server requires a nonce in DPoP proofs; sign a new proof with the DPoP-Nonce header's value"}
		case len(*c.Nonce) > MaxNonce || !v.Nonces.Valid(*c.Nonce, r.Now):
			return Proof{}, &Error{Kind: ErrUseNonce, Reason: "the proof's nonce is stale or not this server's; sign a new proof with the DPoP-Nonce header's value"}
		}
	}
	tp, err := jwk.Thumbprint(crypto.SHA256)
	if err != nil {
		return Proof{}, invalid("the proof's jwk has no thumbprint")
	}
	p := Proof{JKT: base64.RawURLEncoding.EncodeToString(tp), JTI: *c.JTI, IAT: time.Unix(0, int64(*c.IAT*1e9))}
	if v.Replay != nil {
		until := p.IAT.Add(window)
		fresh, err := v.Replay.Claim(ctx, ReplayKey(p.JKT, p.JTI), until)
		if err != nil {
			return Proof{}, &Error{Kind: ErrUnavailable, Reason: "the replay check could not answer; try again shortly"}
		}
		if !fresh {
			return Proof{}, invalid("this proof was used already; sign a new proof, with a new jti, for every request")
		}
	}
	return p, nil
}

// oneReading refuses a proof's protected header or claims (raw, decoded
// from base64url) when two readers could read them differently: a member
// twice, or two names equal once case is folded and escapes decoded, at
// any depth (the jwk's members included); "__proto__"; invalid UTF-8 or a
// lone surrogate escape; and JSON that is not JSON by RFC 8259. The proof
// is read here by encoding/json (the claims: it folds case and keeps the
// last of two members) and by go-jose's JSON (the header and its jwk: it
// refuses exact duplicates but matches names exactly and ignores "TYP" or
// "X"); another reader of the same proof (a client's library, an audit)
// may keep the first of two members, or match names exactly, and then
// check another htu, jti, typ or key than this one did.
//
// It is message.Validate, the repository's one check of that rule (the
// one the edge applies to every client body, fuzzed against encoding/json
// and the SDKs' readers), rather than a second detector here that could
// disagree with it; internal/jsonscan has no duplicate check and reads no
// client's message. Its reasons never quote the input (message.Error
// names no key or value the client chose), so passing them on keeps the
// proof out of the error.
func oneReading(part string, raw []byte) error {
	err := message.Validate(raw)
	if err == nil {
		return nil
	}
	var e *message.Error
	if !errors.As(err, &e) {
		return invalid("the proof's %s not JSON that one reading fits; send plain JSON with each member once", part)
	}
	if errors.Is(err, message.ErrSyntax) {
		return invalid("the proof's %s not a JSON object: %s", part, e.Msg)
	}
	return invalid("the proof's %s JSON that readers could read differently: %s", part, e.Msg)
}

// ReplayKey is the key a proof is claimed under: base64url(SHA-256(jkt ||
// jti)). jkt is always 43 characters (a SHA-256 in base64url), so the
// concatenation is unambiguous; the key is the same size whatever the
// jti, and one client's jti cannot collide with another key's.
func ReplayKey(jkt, jti string) string {
	h := sha256.New()
	h.Write([]byte(jkt))
	h.Write([]byte(jti))
	return base64.RawURLEncoding.EncodeToString(h.Sum(nil))
}

// sameURI compares a proof's htu with the resource's URL as RFC 9449 §4.3
// says, with RFC 3986 §6.2.2 and §6.2.3 normalization: scheme and host
// case-insensitive, a default port the same as none, an empty path the
// same as "/", the path otherwise exact (no case folding, no decoding).
// htu must have no query and no fragment (§4.2); the URL's are ignored.
func sameURI(htu string, u *url.URL) bool {
	if strings.ContainsAny(htu, "?#") {
		return false
	}
	p, err := url.Parse(htu)
	if err != nil || p.Opaque != "" || p.User != nil || p.Host == "" {
		return false
	}
	if s := strings.ToLower(p.Scheme); s != "https" && s != "http" {
		return false
	}
	return target(p) == target(u)
}

// target is u's normal form for comparison: scheme://host[:port]/path.
func target(u *url.URL) string {
	scheme := strings.ToLower(u.Scheme)
	host, port := strings.ToLower(u.Hostname()), u.Port()
	if (scheme == "https" && port == "443") || (scheme == "http" && port == "80") {
		port = ""
	}
	if strings.Contains(host, ":") {
		host = "[" + host + "]"
	}
	if port != "" {
		host += ":" + port
	}
	path := u.EscapedPath()
	if path == "" {
		path = "/"
	}
	return scheme + "://" + host + path
}

// claimNames are the claims Verify reads, as RFC 9449 spells them.
var claimNames = []string{"jti", "htm", "htu", "iat", "ath", "nonce"}

// exactClaimNames refuses claims that spell one of claimNames in another
// letter case: encoding/json matches member names without regard to case,
// so {"HTU": …} alone would be read as htu here, and as no htu at all by a
// reader that matches names exactly (one reading, as oneReading keeps for
// duplicates). payload is a JSON object: oneReading checked it.
func exactClaimNames(payload []byte) error {
	var members map[string]json.RawMessage
	if err := json.Unmarshal(payload, &members); err != nil {
		return invalid("the proof's claims are not a JSON object")
	}
	for name := range members {
		for _, want := range claimNames {
			if name != want && strings.EqualFold(name, want) {
				return invalid("the proof's claims spell %s in another letter case; spell jti, htm, htu, iat, ath and nonce in lower case, as RFC 9449 does", want)
			}
		}
	}
	return nil
}

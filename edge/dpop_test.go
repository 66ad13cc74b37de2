package edge

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"
	"github.com/go-jose/go-jose/v4"
	"github.com/golang-jwt/jwt/v5"
	"github.com/modelcontextprotocol/go-sdk/oauthex"

	"github.com/Tahul/caddy-zidane-mcp/dpop"
	"github.com/Tahul/caddy-zidane-mcp/policy"
)

const dpopResource = "https://edge.example/mcp"

// dpopClient is a client's DPoP key: it signs proofs as RFC 9449 §4.2
// says, with go-jose, as a client library would.
type dpopClient struct {
	signer jose.Signer
	jkt    string
}

func newDPoPClient(t testing.TB) dpopClient {
	t.Helper()
	priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.ES256, Key: priv}, (&jose.SignerOptions{EmbedJWK: true}).WithType("dpop+jwt"))
	if err != nil {
		t.Fatal(err)
	}
	tp, err := (&jose.JSONWebKey{Key: &priv.PublicKey}).Thumbprint(crypto.SHA256)
	if err != nil {
		t.Fatal(err)
	}
	return dpopClient{signer: signer, jkt: base64.RawURLEncoding.EncodeToString(tp)}
}

// proofFor signs a proof for method on htu with token's ath, and nonce
// when not "".
func (c dpopClient) proofFor(t testing.TB, method, htu, token, nonce string) string {
	t.Helper()
	sum := sha256.Sum256([]byte(token))
	claims := map[string]any{"jti": rand.Text(), "htm": method, "htu": htu, "iat": time.Now().Unix(),
		"ath": base64.RawURLEncoding.EncodeToString(sum[:])}
	if nonce != "" {
		claims["nonce"] = nonce
	}
	payload, err := json.Marshal(claims)
	if err != nil {
		t.Fatal(err)
	}
	jws, err := c.signer.Sign(payload)
	if err != nil {
		t.Fatal(err)
	}
	s, err := jws.CompactSerialize()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// boundToken is a JWT access token of j bound to jkt (cnf.jkt).
func (j testJWT) boundToken(t testing.TB, sub, scope, jkt string) string {
	t.Helper()
	now := time.Now()
	raw, err := jwt.NewWithClaims(jwt.SigningMethodES256, jwt.MapClaims{"iss": "https://idp.example/", "aud": "https://edge.example/mcp",
		"sub": sub, "scope": scope, "iat": now.Unix(), "exp": now.Add(time.Hour).Unix(), "cnf": map[string]any{"jkt": jkt}}).SignedString(j.key)
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// dpopSite is an edge whose resource is dpopResource, with the
// identity provider issuer, the opaque token opaque in its store, and a
// replay check on one node.
type dpopSite struct {
	a      Authentication
	issuer testJWT
	opaque string
}

func newDPoPSite(t testing.TB, required, nonces bool) *dpopSite {
	t.Helper()
	ctx := context.Background()
	tokens, err := policy.OpenTokenStore(ctx, &certmagic.FileStorage{Path: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	secret, _, err := tokens.Create(ctx, policy.TokenSpec{Name: "operator", Scopes: []string{"mcp"}})
	if err != nil {
		t.Fatal(err)
	}
	issuer, v := newTestJWT(t)
	verifier := &dpop.Verifier{Replay: dpop.NewLocal(1000, 0)}
	if nonces {
		n, err := dpop.NewNonces([]byte(strings.Repeat("k", 32)), 0)
		if err != nil {
			t.Fatal(err)
		}
		verifier.Nonces = n
	}
	u, _ := url.Parse(dpopResource)
	return &dpopSite{
		a: Authentication{Failures: policy.NewLimiter(policy.Limit{Rate: 1, Burst: 100}), IPv6Prefix: policy.DefaultIPv6Prefix,
			Authn: policy.Authenticator{Tokens: tokens, JWT: v},
			DPoP:  DPoP{Verifier: verifier, URL: u, Required: required}, Resource: dpopResource},
		issuer: issuer, opaque: secret,
	}
}

func (s *dpopSite) check(authz string, proofs ...string) (policy.Principal, Verdict) {
	p, v, _ := s.a.Check(context.Background(), Credential{Authorization: authz, Proofs: proofs, Method: http.MethodPost}, "192.0.2.1", time.Now())
	return p, v
}

// What an attacker holding a DPoP-bound token, or a proof, sends; each is
// refused 401 with the DPoP challenge's error code (RFC 9449 §7.1, §12),
// and a message that says what to do. The client's own request passes.
func TestDPoPAttacks(t *testing.T) {
	s := newDPoPSite(t, false, false)
	owner, thief := newDPoPClient(t), newDPoPClient(t)
	tok := s.issuer.boundToken(t, "alice", "mcp", owner.jkt)
	other := s.issuer.boundToken(t, "alice", "mcp", owner.jkt) // another token of the same key
	unbound := s.issuer.token(t, "alice", "mcp")
	good := func() string { return owner.proofFor(t, http.MethodPost, dpopResource, tok, "") }

	p, v := s.check("DPoP "+tok, good())
	if !v.Allowed() || p.JKT != owner.jkt || p.TokenID != "jwt:alice" {
		t.Fatalf("the owner's request with its proof: %+v, principal %+v; want it served, bound to the key", v, p)
	}

	replayed := good()
	if _, v := s.check("DPoP "+tok, replayed); !v.Allowed() {
		t.Fatalf("first use of a proof: %+v", v)
	}
	for _, tc := range []struct {
		name     string
		authz    string
		proofs   []string
		reason   string
		dpopErr  string
		says     string
		assertOK bool
	}{
		{name: "a bound token sent as Bearer", authz: "Bearer " + tok, reason: ReasonInvalidToken, dpopErr: "invalid_token", says: "Authorization: DPoP"},
		{name: "a bound token sent as Bearer, with a proof", authz: "Bearer " + tok, proofs: []string{good()}, reason: ReasonInvalidToken, dpopErr: "invalid_token", says: "Authorization: DPoP"},
		{name: "a bound token without a proof", authz: "DPoP " + tok, reason: ReasonDPoPProof, dpopErr: "invalid_dpop_proof", says: "DPoP header"},
		{name: "two DPoP headers", authz: "DPoP " + tok, proofs: []string{good(), good()}, reason: ReasonDPoPProof, dpopErr: "invalid_dpop_proof", says: "one DPoP header"},
		{name: "a proof for another URI", authz: "DPoP " + tok, proofs: []string{owner.proofFor(t, http.MethodPost, "https://other.example/mcp", tok, "")}, reason: ReasonDPoPProof, dpopErr: "invalid_dpop_proof", says: "htu"},
		{name: "a proof for another path", authz: "DPoP " + tok, proofs: []string{owner.proofFor(t, http.MethodPost, "https://edge.example/other", tok, "")}, reason: ReasonDPoPProof, dpopErr: "invalid_dpop_proof", says: "htu"},
		{name: "a proof for another method", authz: "DPoP " + tok, proofs: []string{owner.proofFor(t, http.MethodGet, dpopResource, tok, "")}, reason: ReasonDPoPProof, dpopErr: "invalid_dpop_proof", says: "htm"},
		{name: "a proof for another token (ath)", authz: "DPoP " + tok, proofs: []string{owner.proofFor(t, http.MethodPost, dpopResource, other, "")}, reason: ReasonDPoPProof, dpopErr: "invalid_dpop_proof", says: "ath"},
		{name: "a replayed proof", authz: "DPoP " + tok, proofs: []string{replayed}, reason: ReasonDPoPProof, dpopErr: "invalid_dpop_proof", says: "used already"},
		{name: "a proof by another key than cnf.jkt", authz: "DPoP " + tok, proofs: []string{thief.proofFor(t, http.MethodPost, dpopResource, tok, "")}, reason: ReasonDPoPProof, dpopErr: "invalid_dpop_proof", says: "another key"},
		{name: "the DPoP scheme with an unbound JWT", authz: "DPoP " + unbound, proofs: []string{thief.proofFor(t, http.MethodPost, dpopResource, unbound, "")}, reason: ReasonInvalidToken, dpopErr: "invalid_token", says: "not DPoP-bound"},
		{name: "the DPoP scheme with an opaque token", authz: "DPoP " + s.opaque, proofs: []string{thief.proofFor(t, http.MethodPost, dpopResource, s.opaque, "")}, reason: ReasonInvalidToken, dpopErr: "invalid_token", says: "not DPoP-bound"},
		{name: "the scheme spelled dpop", authz: "dpop " + tok, proofs: []string{good()}, assertOK: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, v := s.check(tc.authz, tc.proofs...)
			if tc.assertOK {
				if !v.Allowed() || p.JKT != owner.jkt {
					t.Fatalf("%+v, want it served (auth-scheme names are case-insensitive, RFC 9110 §11.1)", v)
				}
				return
			}
			if v.Status != http.StatusUnauthorized || v.Reason != tc.reason || v.DPoPError != tc.dpopErr || !strings.Contains(v.Message, tc.says) {
				t.Fatalf("%d %q dpop error %q: %q; want 401 %s, %s, saying %q", v.Status, v.Reason, v.DPoPError, v.Message, tc.reason, tc.dpopErr, tc.says)
			}
			if strings.Contains(v.Message, tok) {
				t.Errorf("the message carries the token")
			}
		})
	}
	// The bearer tokens of a site that does not require DPoP are served
	// as before.
	for _, authz := range []string{"Bearer " + unbound, "Bearer " + s.opaque} {
		if p, v := s.check(authz); !v.Allowed() || p.JKT != "" {
			t.Errorf("a bearer token on a site where DPoP is optional: %+v", v)
		}
	}
}

// A site that requires DPoP refuses every unbound credential, with a DPoP
// challenge only, and serves a bound one with its proof.
func TestDPoPRequired(t *testing.T) {
	s := newDPoPSite(t, true, false)
	c := newDPoPClient(t)
	for _, authz := range []string{"Bearer " + s.issuer.token(t, "alice", "mcp"), "Bearer " + s.opaque} {
		_, v := s.check(authz)
		if v.Status != http.StatusUnauthorized || v.Reason != ReasonDPoPRequired || v.DPoPError != "invalid_token" || !strings.Contains(v.Message, "DPoP-bound") {
			t.Errorf("an unbound token: %+v, want 401 %s invalid_token saying DPoP-bound", v, ReasonDPoPRequired)
		}
	}
	tok := s.issuer.boundToken(t, "alice", "mcp", c.jkt)
	if p, v := s.check("DPoP "+tok, c.proofFor(t, http.MethodPost, dpopResource, tok, "")); !v.Allowed() || p.JKT != c.jkt {
		t.Errorf("a bound token with its proof: %+v", v)
	}
	_, v := s.check("Bearer " + s.opaque)
	res := ProtectedResource{URL: mustParse(t, dpopResource), DPoPAlgs: DPoPAlgorithms(), DPoPRequired: true}
	w := httptest.NewRecorder()
	_ = WriteRefusal(w, httptest.NewRequest(http.MethodPost, dpopResource, nil), res, v, nil)
	cs := challenges(t, w.Result().Header)
	if len(cs) != 1 || cs[0].Scheme != "dpop" || cs[0].Params["error"] != "invalid_token" || cs[0].Params["algs"] == "" ||
		cs[0].Params["resource_metadata"] != "https://edge.example/.well-known/oauth-protected-resource/mcp" {
		t.Errorf("challenges %+v, want one DPoP challenge with algs, resource_metadata and error=invalid_token (no Bearer: this site takes none)", cs)
	}
	md := res.Metadata(httptest.NewRequest(http.MethodGet, dpopResource, nil))
	if !md.DPOPBoundAccessTokensRequired || !slices.Contains(md.DPOPSigningAlgValuesSupported, "ES256") {
		t.Errorf("metadata %+v, want dpop_bound_access_tokens_required and the algorithms", md)
	}
}

// With nonces on, a proof without one is refused use_dpop_nonce with a
// DPoP-Nonce to use, and the client's retry with it passes (RFC 9449 §9).
func TestDPoPNonceRetry(t *testing.T) {
	s := newDPoPSite(t, false, true)
	c := newDPoPClient(t)
	tok := s.issuer.boundToken(t, "alice", "mcp", c.jkt)
	_, v := s.check("DPoP "+tok, c.proofFor(t, http.MethodPost, dpopResource, tok, ""))
	if v.Status != http.StatusUnauthorized || v.Reason != ReasonDPoPNonce || v.DPoPError != "use_dpop_nonce" || v.DPoPNonce == "" {
		t.Fatalf("a proof without a nonce: %+v, want 401 use_dpop_nonce with a nonce", v)
	}
	w := httptest.NewRecorder()
	res := ProtectedResource{URL: mustParse(t, dpopResource), DPoPAlgs: DPoPAlgorithms()}
	_ = WriteRefusal(w, httptest.NewRequest(http.MethodPost, dpopResource, nil), res, v, nil)
	h := w.Result().Header
	if h.Get("DPoP-Nonce") != v.DPoPNonce {
		t.Errorf("DPoP-Nonce %q, want the verdict's", h.Get("DPoP-Nonce"))
	}
	cs := challenges(t, h)
	if !slices.ContainsFunc(cs, func(c oauthex.Challenge) bool { return c.Scheme == "dpop" && c.Params["error"] == "use_dpop_nonce" }) ||
		!slices.ContainsFunc(cs, func(c oauthex.Challenge) bool { return c.Scheme == "bearer" && c.Params["error"] == "" }) {
		t.Errorf("challenges %+v, want DPoP error=use_dpop_nonce and a plain Bearer one (bearer tokens are still taken)", cs)
	}
	if p, v := s.check("DPoP "+tok, c.proofFor(t, http.MethodPost, dpopResource, tok, v.DPoPNonce)); !v.Allowed() || p.JKT != c.jkt {
		t.Fatalf("the retry with the nonce: %+v, want it served", v)
	}
	if _, v := s.check("DPoP "+tok, c.proofFor(t, http.MethodPost, dpopResource, tok, "not-the-servers")); v.Reason != ReasonDPoPNonce {
		t.Errorf("a made-up nonce: %+v, want use_dpop_nonce", v)
	}
}

// A replay check that cannot answer is the server's fault: 503 with a
// Retry-After, not charged to the client's address.
func TestDPoPReplayUnavailable(t *testing.T) {
	s := newDPoPSite(t, false, false)
	s.a.DPoP.Verifier.Replay = dpop.NewLocal(1, 0)
	s.a.Failures = policy.NewLimiter(policy.Limit{Rate: 1.0 / 3600, Burst: 1})
	c := newDPoPClient(t)
	tok := s.issuer.boundToken(t, "alice", "mcp", c.jkt)
	// The check holds one proof per shard: proofs pass until one lands on
	// a full shard.
	full := 0
	for i := range 4096 {
		_, v := s.check("DPoP "+tok, c.proofFor(t, http.MethodPost, dpopResource, tok, ""))
		if v.Allowed() {
			continue
		}
		if v.Status != http.StatusServiceUnavailable || v.Reason != ReasonDPoPUnavailable || v.RetryAfter <= 0 {
			t.Fatalf("proof %d with the check full: %+v, want 503 %s with a Retry-After", i, v, ReasonDPoPUnavailable)
		}
		if full++; full == 3 {
			break
		}
	}
	if full != 3 {
		t.Fatal("the replay check never filled up")
	}
	if _, v := s.check("Bearer " + s.opaque + "x"); v.Status != http.StatusUnauthorized {
		t.Errorf("a wrong token after the 503s: %+v, want 401: the 503s were not charged to the address", v)
	}
}

// A refused proof is a failed credential, charged to the address like a
// wrong token; the use_dpop_nonce step of the protocol is not.
func TestDPoPRefusalsAreCharged(t *testing.T) {
	s := newDPoPSite(t, false, true)
	s.a.Failures = policy.NewLimiter(policy.Limit{Rate: 1.0 / 3600, Burst: 2})
	c := newDPoPClient(t)
	tok := s.issuer.boundToken(t, "alice", "mcp", c.jkt)
	for i := range 5 {
		if _, v := s.check("DPoP "+tok, c.proofFor(t, http.MethodPost, dpopResource, tok, "")); v.Reason != ReasonDPoPNonce {
			t.Fatalf("nonce step %d: %+v, want use_dpop_nonce every time", i, v)
		}
	}
	for i := range 2 {
		if _, v := s.check("Bearer " + tok); v.Status != http.StatusUnauthorized {
			t.Fatalf("bound token as bearer %d: %+v, want 401 within the burst", i, v)
		}
	}
	if _, v := s.check("Bearer " + tok); v.Status != http.StatusTooManyRequests {
		t.Errorf("past the burst: %+v, want 429", v)
	}
}

// A site whose resource is a path alone names no URL to check a proof's
// htu against (the Host header is the client's to choose): it refuses a
// bound credential, saying what the operator must configure.
func TestDPoPWithoutAbsoluteResource(t *testing.T) {
	s := newDPoPSite(t, false, false)
	s.a.DPoP = DPoP{}
	c := newDPoPClient(t)
	tok := s.issuer.boundToken(t, "alice", "mcp", c.jkt)
	_, v := s.check("DPoP "+tok, c.proofFor(t, http.MethodPost, dpopResource, tok, ""))
	if v.Status != http.StatusUnauthorized || v.Reason != ReasonInvalidToken || !strings.Contains(v.Message, "absolute URL") {
		t.Errorf("%+v, want 401 invalid_token saying the resource must be an absolute URL", v)
	}
}

func mustParse(t *testing.T, s string) *url.URL {
	t.Helper()
	u, err := url.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

func challenges(t *testing.T, h http.Header) []oauthex.Challenge {
	t.Helper()
	cs, err := oauthex.ParseWWWAuthenticate(h.Values("WWW-Authenticate"))
	if err != nil {
		t.Fatalf("WWW-Authenticate %q: %v", h.Values("WWW-Authenticate"), err)
	}
	return cs
}

// A hop carries identity, never authority: whoever holds the cluster key
// can sign one, so the replica that takes a hop for a bound principal
// checks the client's proof again. What such a signer sends with a stolen
// bound token is refused: no proof, another key's, one for another token,
// one forwarded already; the proof the edge took (and claimed) passes on
// its one hop.
func TestDPoPCheckForwarded(t *testing.T) {
	s := newDPoPSite(t, false, false)
	owner, thief := newDPoPClient(t), newDPoPClient(t)
	tok := s.issuer.boundToken(t, "alice", "mcp", owner.jkt)
	other := s.issuer.boundToken(t, "bob", "mcp", owner.jkt)
	p, v := s.check("DPoP "+tok, owner.proofFor(t, http.MethodPost, dpopResource, tok, ""))
	if !v.Allowed() {
		t.Fatal(v)
	}
	taken := owner.proofFor(t, http.MethodPost, dpopResource, tok, "")
	if _, v := s.check("DPoP "+tok, taken); !v.Allowed() {
		t.Fatalf("the edge's check: %+v", v)
	}
	fwd := func(proofs []string, jwt string) Verdict {
		return s.a.DPoP.CheckForwarded(context.Background(), p, proofs, http.MethodPost, "", jwt, time.Now())
	}
	if v := fwd([]string{taken}, tok); !v.Allowed() {
		t.Fatalf("the hop of a proof the edge took: %+v, want it served", v)
	}
	for _, tc := range []struct {
		name   string
		proofs []string
		jwt    string
		says   string
	}{
		{"no proof", nil, tok, "one proof"},
		{"two proofs", []string{taken, taken}, tok, "one proof"},
		{"a proof forwarded already", []string{taken}, tok, "used already"},
		{"another key's proof", []string{thief.proofFor(t, http.MethodPost, dpopResource, tok, "")}, tok, "another key"},
		{"a proof for another token", []string{owner.proofFor(t, http.MethodPost, dpopResource, other, "")}, tok, "ath"},
		{"a proof for another method", []string{owner.proofFor(t, http.MethodGet, dpopResource, tok, "")}, tok, "htm"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := fwd(tc.proofs, tc.jwt)
			if v.Status != http.StatusUnauthorized || v.Reason != ReasonDPoPProof || !strings.Contains(v.Message, tc.says) {
				t.Fatalf("%+v, want 401 %s saying %q", v, ReasonDPoPProof, tc.says)
			}
		})
	}
	unbound := policy.Principal{TokenID: "tok_x"}
	if v := s.a.DPoP.CheckForwarded(context.Background(), unbound, nil, http.MethodPost, "", "", time.Now()); !v.Allowed() {
		t.Errorf("an unbound principal's hop on a site where DPoP is optional: %+v", v)
	}
	s.a.DPoP.Required = true
	if v := s.a.DPoP.CheckForwarded(context.Background(), unbound, nil, http.MethodPost, "", "", time.Now()); v.Reason != ReasonDPoPRequired {
		t.Errorf("an unbound principal's hop on a site that requires DPoP: %+v, want %s", v, ReasonDPoPRequired)
	}
}

// The tokens the gateway derives for a session's agents (an orchestrator's
// child token, an egress token) from a DPoP-bound credential are bearer
// tokens: the agent holds no key of the client's, so they do not inherit
// the JKT, which they could never prove. They stay bound to their session
// instead (lifetime, scopes and revocation: see policy/children.go), and a
// site that requires DPoP takes them, the gateway's own, as bearer tokens;
// sent with the DPoP scheme they are refused as any unbound token.
func TestDPoPDerivedTokensAreBearer(t *testing.T) {
	s := newDPoPSite(t, true, false)
	c := newDPoPClient(t)
	tok := s.issuer.boundToken(t, "alice", "mcp", c.jkt)
	parent, v := s.check("DPoP "+tok, c.proofFor(t, http.MethodPost, dpopResource, tok, ""))
	if !v.Allowed() || parent.JKT != c.jkt {
		t.Fatalf("the parent: %+v", v)
	}
	secret, _, err := s.a.Authn.Tokens.CreateChild(context.Background(), policy.ChildSpec{Parent: parent, Session: "ses_1",
		Purpose: policy.PurposeOrchestrator, Scopes: []string{"sessions:create"}})
	if err != nil {
		t.Fatal(err)
	}
	child, v := s.check("Bearer " + secret)
	if !v.Allowed() || child.JKT != "" || child.Parent != parent.TokenID {
		t.Fatalf("the child as a bearer token on a site that requires DPoP: %+v, principal %+v; want it served, unbound, derived from %s", v, child, parent.TokenID)
	}
	if _, v := s.check("DPoP "+secret, c.proofFor(t, http.MethodPost, dpopResource, secret, "")); v.Reason != ReasonInvalidToken || v.DPoPError != "invalid_token" {
		t.Errorf("the child with the DPoP scheme: %+v, want invalid_token (not bound)", v)
	}
	if v := s.a.DPoP.CheckForwarded(context.Background(), child, nil, http.MethodPost, "", "", time.Now()); !v.Allowed() {
		t.Errorf("a hop of the child: %+v", v)
	}
}

// A grant this gateway issued to a client that sent a proof (a zda_ access
// token bound to its key) is held to the same check as a cnf.jkt JWT.
func TestDPoPBoundGrant(t *testing.T) {
	s := newDPoPSite(t, false, false)
	c, thief := newDPoPClient(t), newDPoPClient(t)
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	if err := s.a.Authn.Tokens.SetGrantKey(key); err != nil {
		t.Fatal(err)
	}
	iss, err := s.a.Authn.Tokens.CreateGrant(context.Background(), policy.GrantSpec{Owner: "alice", Client: "https://client.example/metadata.json",
		Resource: dpopResource, Scopes: []string{"mcp"}, JKT: c.jkt}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	tok := iss.Access
	if _, v := s.check("Bearer " + tok); v.Status != http.StatusUnauthorized || v.DPoPError != "invalid_token" {
		t.Errorf("a bound grant as Bearer: %+v, want 401 with DPoP error=invalid_token", v)
	}
	if _, v := s.check("DPoP "+tok, thief.proofFor(t, http.MethodPost, dpopResource, tok, "")); v.Reason != ReasonDPoPProof {
		t.Errorf("a bound grant with another key's proof: %+v, want %s", v, ReasonDPoPProof)
	}
	if p, v := s.check("DPoP "+tok, c.proofFor(t, http.MethodPost, dpopResource, tok, "")); !v.Allowed() || p.JKT != c.jkt || p.Source != "grant" {
		t.Errorf("a bound grant with its proof: %+v, principal %+v", v, p)
	}
}

// One holder of a bound token cannot fill the replay check that every
// client's proofs go through: once its bucket of step 5 is empty, its
// requests are refused 429 before their proof is checked or claimed.
func TestDPoPProofsBoundedByTheTokensBucket(t *testing.T) {
	s := newDPoPSite(t, false, false)
	s.a.PerToken = policy.NewLimiter(policy.Limit{Rate: 1.0 / 3600, Burst: 2})
	c := newDPoPClient(t)
	tok := s.issuer.boundToken(t, "alice", "mcp", c.jkt)
	now := time.Now()
	for range 2 {
		if v := RateLimit(s.a.PerToken, "jwt:alice", now); !v.Allowed() {
			t.Fatalf("step 5 within the burst: %+v", v)
		}
	}
	proof := c.proofFor(t, http.MethodPost, dpopResource, tok, "")
	if _, v := s.check("DPoP "+tok, proof); v.Status != http.StatusTooManyRequests || v.Reason != ReasonRateLimited || v.RetryAfter <= 0 {
		t.Fatalf("a proof with the token's bucket empty: %+v, want 429 %s", v, ReasonRateLimited)
	}
	s.a.PerToken = policy.NewLimiter(policy.Limit{Rate: 1, Burst: 2})
	if _, v := s.check("DPoP "+tok, proof); !v.Allowed() {
		t.Errorf("the same proof once the bucket has room: %+v, want it served (the refused request claimed nothing)", v)
	}
}

// A proof names the path it was sent to (htu, RFC 9449 §4.2) on the
// resource's configured scheme and host: a proof for the resource's URL is
// no proof for a request to another path of the same site, and one for the
// other path is, whatever Host the request names.
func TestDPoPProofNamesTheRequestPath(t *testing.T) {
	s := newDPoPSite(t, false, false)
	c := newDPoPClient(t)
	tok := s.issuer.boundToken(t, "alice", "mcp", c.jkt)
	check := func(path, htu string) Verdict {
		_, v, _ := s.a.Check(context.Background(), Credential{Authorization: "DPoP " + tok, Method: http.MethodPost, Path: path,
			Proofs: []string{c.proofFor(t, http.MethodPost, htu, tok, "")}}, "192.0.2.1", time.Now())
		return v
	}
	if v := check("/other", dpopResource); v.Reason != ReasonDPoPProof || !strings.Contains(v.Message, "https://edge.example/other") {
		t.Errorf("the resource's proof sent to /other: %+v, want invalid_dpop_proof naming https://edge.example/other", v)
	}
	if v := check("/other", "https://edge.example/other"); !v.Allowed() {
		t.Errorf("a proof for /other sent to /other: %+v", v)
	}
	if v := check("/mcp", dpopResource); !v.Allowed() {
		t.Errorf("the resource's proof sent to its path: %+v", v)
	}
}

// A DPoP client in a browser page of an allowed origin can send its proof
// (the preflight allows the DPoP header) and read the nonce and the
// challenge of an answer (DPoP-Nonce and WWW-Authenticate are exposed).
func TestDPoPThroughCORS(t *testing.T) {
	r := httptest.NewRequest(http.MethodOptions, dpopResource, nil)
	r.Header.Set("Origin", "https://app.example")
	r.Header.Set("Access-Control-Request-Method", "POST")
	r.Header.Set("Access-Control-Request-Headers", "authorization, dpop")
	w := httptest.NewRecorder()
	if !Preflight(w, r) || !slices.Contains(strings.Split(w.Header().Get("Access-Control-Allow-Headers"), ", "), "DPoP") {
		t.Errorf("preflight allows %q, want DPoP among them", w.Header().Get("Access-Control-Allow-Headers"))
	}
	expose := strings.Split(w.Header().Get("Access-Control-Expose-Headers"), ", ")
	if !slices.Contains(expose, "DPoP-Nonce") || !slices.Contains(expose, "WWW-Authenticate") {
		t.Errorf("answers expose %q, want DPoP-Nonce and WWW-Authenticate", expose)
	}
}

// The challenges a client reads, per refusal and site: Bearer first (what
// clients without DPoP read) and DPoP beside it where proofs are checked;
// DPoP alone where bound tokens are required, carrying the error the
// Bearer challenge would have; none of DPoP's on a site that checks no
// proof (a resource that is a path).
func TestDPoPChallenges(t *testing.T) {
	u := mustParse(t, dpopResource)
	optional := ProtectedResource{URL: u, DPoPAlgs: DPoPAlgorithms()}
	required := ProtectedResource{URL: u, DPoPAlgs: DPoPAlgorithms(), DPoPRequired: true}
	pathOnly := ProtectedResource{URL: mustParse(t, "/mcp")}
	noToken := Refuse(http.StatusUnauthorized, ReasonNoToken, "send a token")
	badToken := Refuse(http.StatusUnauthorized, ReasonInvalidToken, "expired")
	scope := Verdict{Status: http.StatusForbidden, Reason: ReasonScope, Message: "needs deploy", Need: []string{"deploy"}}
	type want struct{ scheme, err string }
	for _, tc := range []struct {
		name string
		res  ProtectedResource
		v    Verdict
		want []want
	}{
		{"optional, no token", optional, noToken, []want{{"bearer", ""}, {"dpop", ""}}},
		{"optional, a bad token", optional, badToken, []want{{"bearer", "invalid_token"}, {"dpop", ""}}},
		{"optional, insufficient scope", optional, scope, []want{{"bearer", "insufficient_scope"}}},
		{"required, no token", required, noToken, []want{{"dpop", ""}}},
		{"required, a bad token", required, badToken, []want{{"dpop", "invalid_token"}}},
		{"required, insufficient scope", required, scope, []want{{"dpop", "insufficient_scope"}}},
		{"a path resource, a bad token", pathOnly, badToken, []want{{"bearer", "invalid_token"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := httptest.NewRecorder()
			_ = WriteRefusal(w, httptest.NewRequest(http.MethodPost, "http://127.0.0.1/mcp", nil), tc.res, tc.v, nil)
			cs := challenges(t, w.Result().Header)
			if len(cs) != len(tc.want) {
				t.Fatalf("challenges %+v, want %+v", cs, tc.want)
			}
			for i, c := range cs {
				if c.Scheme != tc.want[i].scheme || c.Params["error"] != tc.want[i].err || c.Params["resource_metadata"] == "" {
					t.Errorf("challenge %d: %+v, want %+v with resource_metadata", i, c, tc.want[i])
				}
				if c.Scheme == "dpop" && c.Params["algs"] != strings.Join(DPoPAlgorithms(), " ") {
					t.Errorf("DPoP challenge algs %q", c.Params["algs"])
				}
				if c.Params["error"] == "insufficient_scope" && c.Params["scope"] != "deploy" {
					t.Errorf("insufficient_scope names scope %q, want deploy", c.Params["scope"])
				}
			}
		})
	}
}

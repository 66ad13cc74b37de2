package e2e

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/golang-jwt/jwt/v5"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/modelcontextprotocol/go-sdk/oauthex"
)

// dpopKey is a client's DPoP key, signing proofs as RFC 9449 §4.2 says
// with go-jose, as a client library does.
type dpopKey struct {
	signer jose.Signer
	jkt    string
}

func newDPoPKey(t testing.TB) dpopKey {
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
	return dpopKey{signer: signer, jkt: base64.RawURLEncoding.EncodeToString(tp)}
}

// proof signs a proof for method on htu, for token, with nonce when set.
func (k dpopKey) proof(t testing.TB, method, htu, token, nonce string) string {
	t.Helper()
	s, err := k.sign(method, htu, token, nonce)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func (k dpopKey) sign(method, htu, token, nonce string) (string, error) {
	sum := sha256.Sum256([]byte(token))
	claims := map[string]any{"jti": rand.Text(), "htm": method, "htu": htu, "iat": time.Now().Unix(), "ath": base64.RawURLEncoding.EncodeToString(sum[:])}
	if nonce != "" {
		claims["nonce"] = nonce
	}
	payload, _ := json.Marshal(claims)
	jws, err := k.signer.Sign(payload)
	if err != nil {
		return "", err
	}
	return jws.CompactSerialize()
}

// dpopTransport is what a DPoP client library does under an MCP client:
// the DPoP scheme and a fresh proof for every request (its method, its URL
// without query), the last nonce the server gave, and one retry of a
// use_dpop_nonce refusal with the nonce it carries (RFC 9449 §9).
type dpopTransport struct {
	key   dpopKey
	token string

	mu      sync.Mutex
	nonce   string
	methods map[string]int // requests sent, by method
	retried int            // use_dpop_nonce refusals retried
}

func (d *dpopTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	var body []byte
	if r.Body != nil {
		var err error
		if body, err = io.ReadAll(r.Body); err != nil {
			return nil, err
		}
		r.Body.Close()
	}
	htu := (&url.URL{Scheme: r.URL.Scheme, Host: r.URL.Host, Path: r.URL.Path, RawPath: r.URL.RawPath}).String()
	for attempt := 0; ; attempt++ {
		d.mu.Lock()
		nonce := d.nonce
		if d.methods == nil {
			d.methods = map[string]int{}
		}
		d.methods[r.Method]++
		d.mu.Unlock()
		proof, err := d.key.sign(r.Method, htu, d.token, nonce)
		if err != nil {
			return nil, err
		}
		out := r.Clone(r.Context())
		if body != nil {
			out.Body, out.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
		}
		out.Header.Set("Authorization", "DPoP "+d.token)
		out.Header.Set("DPoP", proof)
		resp, err := http.DefaultTransport.RoundTrip(out)
		if err != nil {
			return nil, err
		}
		if n := resp.Header.Get("DPoP-Nonce"); n != "" {
			d.mu.Lock()
			d.nonce = n
			d.mu.Unlock()
		}
		cs, _ := oauthex.ParseWWWAuthenticate(resp.Header.Values("WWW-Authenticate"))
		if attempt == 0 && resp.StatusCode == http.StatusUnauthorized && slices.ContainsFunc(cs, func(c oauthex.Challenge) bool {
			return c.Scheme == "dpop" && c.Params["error"] == "use_dpop_nonce"
		}) {
			resp.Body.Close()
			d.mu.Lock()
			d.retried++
			d.mu.Unlock()
			continue
		}
		return resp, nil
	}
}

// go-sdk's MCP client, over a transport that adds DPoP as a client
// library does, goes from initialize to a tool call and closes its
// session through the built binary with a DPoP-bound JWT: every request
// (POST, the GET stream, DELETE) carries a proof, the first is refused
// use_dpop_nonce and retried with the nonce, and nothing else is refused.
// The same client sending the token as Bearer cannot connect.
func TestDPoPGoSDKClient(t *testing.T) {
	upstream := startEverythingServer(t)
	up := strings.TrimSuffix(strings.TrimPrefix(upstream, "http://"), "/mcp")
	p := startIDP(t)
	site := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	resource := "http://" + site + "/mcp"
	c := startCaddy(t, fmt.Sprintf(`{
	admin %s
}

http://%s {
	zidane_mcp {
		guard
		resource %s
		dpop_nonce
		jwt {
			issuer %s
			jwks_url %s
			algorithms RS256
		}
	}
	reverse_proxy %s
}
`, AdminPlaceholder, site, resource, p.issuer, p.jwksURL, up))
	key := newDPoPKey(t)
	now := time.Now()
	tok := p.token(t, jwt.MapClaims{"iss": p.issuer, "aud": resource, "sub": "alice", "scope": "mcp",
		"iat": now.Unix(), "exp": now.Add(time.Hour).Unix(), "cnf": map[string]any{"jkt": key.jkt}})

	tr := &dpopTransport{key: key, token: tok}
	cs, err := connectGo(t, resource, &http.Client{Transport: tr})
	if err != nil {
		t.Fatal(err)
	}
	tools, err := cs.ListTools(context.Background(), nil)
	if err != nil || len(tools.Tools) == 0 {
		t.Fatalf("tools/list: %v %v", tools, err)
	}
	if res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "test_simple_text"}); err != nil || res.IsError {
		t.Fatalf("tools/call: %+v %v", res, err)
	}
	if err := cs.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	tr.mu.Lock()
	methods, retried := maps.Clone(tr.methods), tr.retried
	tr.mu.Unlock()
	t.Logf("requests by method %v, %d retried after use_dpop_nonce", methods, retried)
	if retried != 1 || methods[http.MethodPost] < 4 || methods[http.MethodDelete] != 1 {
		t.Errorf("requests by method %v, %d use_dpop_nonce retried; want one retry, POSTs and the session's DELETE", methods, retried)
	}
	refused := map[string]int{}
	for _, l := range auditLines(c) {
		if l["event"] == "refused" {
			refused[fmt.Sprint(l["reason"])]++
		}
	}
	if len(refused) != 1 || refused["use_dpop_nonce"] != 1 {
		t.Errorf("refusals audited %v, want the one use_dpop_nonce", refused)
	}

	if _, err := connectGo(t, resource, bearerClient(tok, nil)); err == nil {
		t.Fatal("the bound token as Bearer connected")
	}
}

// postDPoP posts body to url with the Authorization value authz and one
// DPoP header per proof; host, when set, is the Host header sent.
func postDPoP(t *testing.T, url, host, authz string, proofs []string, body string) rawAnswer {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if authz != "" {
		req.Header.Set("Authorization", authz)
	}
	for _, p := range proofs {
		req.Header.Add("DPoP", p)
	}
	if host != "" {
		req.Host = host
	}
	return sendRaw(t, req)
}

// sendRaw sends req and reads its answer.
func sendRaw(t *testing.T, req *http.Request) rawAnswer {
	t.Helper()
	resp, err := shortClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", req.Method, req.URL, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	a := rawAnswer{status: resp.StatusCode, header: resp.Header, body: string(b)}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		json.Unmarshal(b, &a.rpc)
	}
	return a
}

// dpopChallenge is the DPoP challenge of a, if any.
func dpopChallenge(t *testing.T, a rawAnswer) (oauthex.Challenge, bool) {
	t.Helper()
	cs, err := oauthex.ParseWWWAuthenticate(a.header.Values("WWW-Authenticate"))
	if err != nil {
		t.Fatalf("WWW-Authenticate %q: %v", a.header.Values("WWW-Authenticate"), err)
	}
	for _, c := range cs {
		if c.Scheme == "dpop" {
			return c, true
		}
	}
	return oauthex.Challenge{}, false
}

// A guard site that checks DPoP, driven through the built binary: the
// owner of a DPoP-bound JWT (cnf.jkt) is served after the use_dpop_nonce
// retry, and what an attacker holding the token or a proof sends is
// refused (the site answers every Host, and a proof for the URL of the Host
// sent is no proof for the configured resource) 401 with the DPoP challenge and audited; neither the token nor
// the proof reaches the server behind. On a site that requires DPoP, an
// unbound token is refused with a DPoP challenge alone, and the metadata
// says so.
func TestDPoPAtTheEdge(t *testing.T) {
	up := startRecordingUpstream(t)
	p := startIDP(t)
	port := freePort(t)
	site := fmt.Sprintf("127.0.0.1:%d", port)
	resource := "http://" + site + "/mcp"
	requiredSite := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	requiredResource := "http://" + requiredSite + "/mcp"
	c := startCaddy(t, fmt.Sprintf(`{
	admin %s
}

http://:%d {
	bind 127.0.0.1
	zidane_mcp {
		guard
		resource %s
		dpop_nonce
		jwt {
			issuer %s
			jwks_url %s
			algorithms RS256
		}
	}
	reverse_proxy %s
}

http://%s {
	zidane_mcp {
		guard
		resource %s
		dpop required
		jwt {
			issuer %s
			audience %s
			jwks_url %s
			algorithms RS256
		}
	}
	reverse_proxy %s
}
`, AdminPlaceholder, port, resource, p.issuer, p.jwksURL, up.addr, requiredSite, requiredResource, p.issuer, requiredResource, p.jwksURL, up.addr))

	owner, thief := newDPoPKey(t), newDPoPKey(t)
	now := time.Now()
	bound := func(aud string, cnf bool) string {
		claims := jwt.MapClaims{"iss": p.issuer, "aud": aud, "sub": "alice", "scope": "mcp", "iat": now.Unix(), "exp": now.Add(time.Hour).Unix()}
		if cnf {
			claims["cnf"] = map[string]any{"jkt": owner.jkt}
		}
		return p.token(t, claims)
	}
	tok := bound(resource, true)
	other := p.token(t, jwt.MapClaims{"iss": p.issuer, "aud": resource, "sub": "bob", "scope": "mcp", "iat": now.Unix(), "exp": now.Add(time.Hour).Unix(), "cnf": map[string]any{"jkt": owner.jkt}})

	// The owner: its first proof has no nonce and is refused
	// use_dpop_nonce with one; the retry with it passes.
	first := postDPoP(t, resource, "", "DPoP "+tok, []string{owner.proof(t, "POST", resource, tok, "")}, initializeBody)
	ch, ok := dpopChallenge(t, first)
	nonce := first.header.Get("DPoP-Nonce")
	if first.status != http.StatusUnauthorized || !ok || ch.Params["error"] != "use_dpop_nonce" || nonce == "" {
		t.Fatalf("first proof without a nonce: %d %q nonce %q %s; want 401 use_dpop_nonce with a DPoP-Nonce", first.status, first.header.Values("WWW-Authenticate"), nonce, first.body)
	}
	served := postDPoP(t, resource, "", "DPoP "+tok, []string{owner.proof(t, "POST", resource, tok, nonce)}, initializeBody)
	if served.status != http.StatusOK {
		t.Fatalf("the retry with the nonce: %d %s", served.status, served.body)
	}
	if served.header.Get("DPoP-Nonce") == "" {
		t.Errorf("a served answer carries no DPoP-Nonce, with nonces on")
	}
	seen := up.last(t)
	if seen.Get("Authorization") != "" || seen.Get("DPoP") != "" {
		t.Fatalf("the server behind got Authorization %q, DPoP %q: the client's credential went past the edge", seen.Get("Authorization"), seen.Get("DPoP"))
	}

	used := owner.proof(t, "POST", resource, tok, nonce)
	if a := postDPoP(t, resource, "", "DPoP "+tok, []string{used}, initializeBody); a.status != http.StatusOK {
		t.Fatalf("a fresh proof: %d %s", a.status, a.body)
	}
	up.mu.Lock()
	upstreamSeen := len(up.seen)
	up.mu.Unlock()
	for _, tc := range []struct {
		name, host, authz string
		proofs            []string
		dpopErr, says     string
	}{
		{name: "a bound token sent as Bearer", authz: "Bearer " + tok, dpopErr: "invalid_token", says: "Authorization: DPoP"},
		{name: "a bound token without a proof", authz: "DPoP " + tok, dpopErr: "invalid_dpop_proof", says: "DPoP header"},
		{name: "two DPoP headers", authz: "DPoP " + tok, proofs: []string{owner.proof(t, "POST", resource, tok, nonce), owner.proof(t, "POST", resource, tok, nonce)}, dpopErr: "invalid_dpop_proof", says: "one DPoP header"},
		{name: "a proof for another URI", authz: "DPoP " + tok, proofs: []string{owner.proof(t, "POST", "http://127.0.0.1:1/mcp", tok, nonce)}, dpopErr: "invalid_dpop_proof", says: "htu"},
		{name: "a proof for the URI of the Host sent", host: fmt.Sprintf("localhost:%d", port), authz: "DPoP " + tok, proofs: []string{owner.proof(t, "POST", fmt.Sprintf("http://localhost:%d/mcp", port), tok, nonce)}, dpopErr: "invalid_dpop_proof", says: "htu"},
		{name: "a proof for another method", authz: "DPoP " + tok, proofs: []string{owner.proof(t, "GET", resource, tok, nonce)}, dpopErr: "invalid_dpop_proof", says: "htm"},
		{name: "a proof for another token", authz: "DPoP " + tok, proofs: []string{owner.proof(t, "POST", resource, other, nonce)}, dpopErr: "invalid_dpop_proof", says: "ath"},
		{name: "a replayed proof", authz: "DPoP " + tok, proofs: []string{used}, dpopErr: "invalid_dpop_proof", says: "used already"},
		{name: "a proof by another key than cnf.jkt", authz: "DPoP " + tok, proofs: []string{thief.proof(t, "POST", resource, tok, nonce)}, dpopErr: "invalid_dpop_proof", says: "another key"},
		{name: "a nonce not the server's", authz: "DPoP " + tok, proofs: []string{owner.proof(t, "POST", resource, tok, "AAAA")}, dpopErr: "use_dpop_nonce", says: "nonce"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := postDPoP(t, resource, tc.host, tc.authz, tc.proofs, initializeBody)
			ch, ok := dpopChallenge(t, a)
			if a.status != http.StatusUnauthorized || !ok || ch.Params["error"] != tc.dpopErr || !strings.Contains(a.rpc.Error.Message, tc.says) {
				t.Fatalf("%d %q %s; want 401 with DPoP error=%s saying %q", a.status, a.header.Values("WWW-Authenticate"), a.body, tc.dpopErr, tc.says)
			}
			if ch.Params["algs"] == "" {
				t.Errorf("the DPoP challenge names no algs: %+v", ch)
			}
			if strings.Contains(a.body, tok) || strings.Contains(strings.Join(a.header.Values("WWW-Authenticate"), " "), tok) {
				t.Errorf("the refusal carries the token")
			}
		})
	}
	up.mu.Lock()
	reached := len(up.seen) - upstreamSeen
	up.mu.Unlock()
	if reached != 0 {
		t.Errorf("%d refused requests reached the server behind", reached)
	}
	audited := map[string]int{}
	for _, l := range auditLines(c) {
		if r, _ := l["reason"].(string); l["status"] == float64(401) {
			audited[r]++
		}
	}
	if audited["invalid_dpop_proof"] < 7 || audited["invalid_token"] < 1 || audited["use_dpop_nonce"] < 2 {
		t.Errorf("audited 401s by reason %v; want every refusal audited", audited)
	}

	t.Run("a site that requires DPoP", func(t *testing.T) {
		unbound := bound(requiredResource, false)
		a := postDPoP(t, requiredResource, "", "Bearer "+unbound, nil, initializeBody)
		cs, err := oauthex.ParseWWWAuthenticate(a.header.Values("WWW-Authenticate"))
		if err != nil || a.status != http.StatusUnauthorized || len(cs) != 1 || cs[0].Scheme != "dpop" || cs[0].Params["error"] != "invalid_token" || a.rpc.Error.Data.Reason != "dpop_required" {
			t.Fatalf("an unbound token: %d %q %s; want 401 dpop_required with one DPoP challenge, error=invalid_token", a.status, a.header.Values("WWW-Authenticate"), a.body)
		}
		tok := bound(requiredResource, true)
		if a := postDPoP(t, requiredResource, "", "DPoP "+tok, []string{owner.proof(t, "POST", requiredResource, tok, "")}, initializeBody); a.status != http.StatusOK {
			t.Fatalf("a bound token with its proof: %d %s", a.status, a.body)
		}
		resp, err := shortClient.Get("http://" + requiredSite + "/.well-known/oauth-protected-resource/mcp")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var md oauthex.ProtectedResourceMetadata
		if err := json.NewDecoder(resp.Body).Decode(&md); err != nil {
			t.Fatal(err)
		}
		if !md.DPOPBoundAccessTokensRequired || !slices.Contains(md.DPOPSigningAlgValuesSupported, "ES256") {
			t.Errorf("metadata %+v, want dpop_bound_access_tokens_required and ES256 among the algorithms", md)
		}
	})
}

package oauthtest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
)

// proofer signs DPoP proofs with one key, the way a client would.
type proofer struct {
	t   *testing.T
	key *ecdsa.PrivateKey
}

func newProofer(t *testing.T) *proofer {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return &proofer{t: t, key: k}
}

func (p *proofer) proof(method, htu, token, nonce, jti string, iat time.Time) string {
	p.t.Helper()
	s, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.ES256, Key: p.key}, (&jose.SignerOptions{EmbedJWK: true}).WithType("dpop+jwt"))
	if err != nil {
		p.t.Fatal(err)
	}
	claims := map[string]any{"jti": jti, "htm": method, "htu": htu, "iat": iat.Unix()}
	if token != "" {
		sum := sha256.Sum256([]byte(token))
		claims["ath"] = base64.RawURLEncoding.EncodeToString(sum[:])
	}
	if nonce != "" {
		claims["nonce"] = nonce
	}
	b, _ := json.Marshal(claims)
	jws, err := s.Sign(b)
	if err != nil {
		p.t.Fatal(err)
	}
	out, err := jws.CompactSerialize()
	if err != nil {
		p.t.Fatal(err)
	}
	return out
}

// The servers' DPoP checks refuse what RFC 9449 says to refuse, so that a
// client test passing against them means something.
func TestDPoPServersRefuseBadProofs(t *testing.T) {
	clk := NewClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	as := NewAuthServer(AuthServerOptions{Now: clk.Now, DPoP: true, DPoPNonce: true})
	t.Cleanup(as.Close)
	m := NewMCPServer(as, MCPOptions{DPoPNonce: true})
	t.Cleanup(m.Close)
	as.AddClient("c", "", nil)
	p := newProofer(t)
	now := clk.Now()

	tokenReq := func(proof string) (*http.Response, tokens) {
		req, _ := http.NewRequest(http.MethodPost, as.URL+"/token", strings.NewReader(url.Values{"grant_type": {GrantClientCredentials}, "client_id": {"c"}, "resource": {m.URL}}.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		if proof != "" {
			req.Header.Set("DPoP", proof)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var tr tokens
		json.NewDecoder(resp.Body).Decode(&tr)
		return resp, tr
	}
	if _, tr := tokenReq(p.proof("POST", as.URL+"/other", "", as.DPoPNonce(), "j0", now)); tr.Error != "invalid_dpop_proof" {
		t.Errorf("a proof for another URL: %+v", tr)
	}
	resp, tr := tokenReq(p.proof("POST", as.URL+"/token", "", "", "j1", now))
	if tr.Error != "use_dpop_nonce" || resp.Header.Get("DPoP-Nonce") != as.DPoPNonce() {
		t.Fatalf("a proof without the nonce: %+v", tr)
	}
	_, tr = tokenReq(p.proof("POST", as.URL+"/token", "", as.DPoPNonce(), "j2", now))
	if tr.Access == "" {
		t.Fatalf("a valid proof: %+v", tr)
	}
	if _, tr := tokenReq(p.proof("POST", as.URL+"/token", "", as.DPoPNonce(), "j2", now)); tr.Error != "invalid_dpop_proof" {
		t.Errorf("a replayed proof: %+v", tr)
	}

	call := func(scheme, proof string) (int, string) {
		req, _ := http.NewRequest(http.MethodPost, m.URL, strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Authorization", scheme+" "+tr.Access)
		if proof != "" {
			req.Header.Set("DPoP", proof)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode, resp.Header.Get("WWW-Authenticate")
	}
	good := func(jti string) string { return p.proof("POST", m.URL, tr.Access, m.DPoPNonce(), jti, now) }
	for name, c := range map[string]struct{ scheme, proof string }{
		"bearer scheme":   {"Bearer", good("r1")},
		"no proof":        {"DPoP", ""},
		"other URL":       {"DPoP", p.proof("POST", m.URL+"x", tr.Access, m.DPoPNonce(), "r2", now)},
		"other method":    {"DPoP", p.proof("GET", m.URL, tr.Access, m.DPoPNonce(), "r3", now)},
		"no ath":          {"DPoP", p.proof("POST", m.URL, "", m.DPoPNonce(), "r4", now)},
		"other key":       {"DPoP", newProofer(t).proof("POST", m.URL, tr.Access, m.DPoPNonce(), "r5", now)},
		"stale":           {"DPoP", p.proof("POST", m.URL, tr.Access, m.DPoPNonce(), "r6", now.Add(-time.Hour))},
		"another's nonce": {"DPoP", p.proof("POST", m.URL, tr.Access, as.DPoPNonce(), "r7", now)},
	} {
		if status, _ := call(c.scheme, c.proof); status != http.StatusUnauthorized {
			t.Errorf("%s: %d, want 401", name, status)
		}
	}
	if status, www := call("DPoP", p.proof("POST", m.URL, tr.Access, "", "r8", now)); status != http.StatusUnauthorized || !strings.Contains(www, "use_dpop_nonce") {
		t.Errorf("no nonce: %d %q", status, www)
	}
	if status, _ := call("DPoP", good("r9")); status != http.StatusOK {
		t.Errorf("a valid proof: %d", status)
	}
	if status, _ := call("DPoP", good("r9")); status != http.StatusUnauthorized {
		t.Errorf("a replayed proof: %d", status)
	}
}

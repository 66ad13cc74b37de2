package dpop

import (
	"context"
	"crypto/elliptic"
	"errors"
	"net/url"
	"strings"
	"testing"

	"github.com/go-jose/go-jose/v4"
)

// No input makes Verify panic; every refusal is of a documented kind
// and never echoes the proof.
func FuzzVerify(f *testing.F) {
	fx := newFixture(f)
	nonce := fx.nonces.Issue(fx.now)
	f.Add(sign(f, jose.ES256, fx.key, baseClaims(fx.now, nonce)), "POST", "https://mcp.example.com/mcp", token)
	f.Add(sign(f, jose.ES384, ecKey(f, elliptic.P384()), baseClaims(fx.now, "")), "GET", "https://mcp.example.com/", "")
	f.Add("eyJhbGciOiJub25lIn0.e30.", "POST", "http://x", "t")
	f.Add(`{"payload":"e30","signatures":[]}`, "POST", "https://a/b", "")
	f.Fuzz(func(t *testing.T, proof, method, htu, tok string) {
		// An htu that does not parse stands for a caller without a URL.
		ru, _ := url.Parse(htu)
		_, err := fx.v.Verify(context.Background(), Request{Proof: proof, Method: method, URL: ru, AccessToken: tok, Now: fx.now})
		if err == nil {
			return
		}
		if !errors.Is(err, ErrInvalidProof) && !errors.Is(err, ErrUseNonce) && !errors.Is(err, ErrUnavailable) {
			t.Fatalf("error of no kind: %v", err)
		}
		if len(proof) >= 16 && strings.Contains(err.Error(), proof) {
			t.Fatalf("the error echoes the proof: %v", err)
		}
	})
}

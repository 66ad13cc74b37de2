package dpop

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/go-jose/go-jose/v4"
)

// BenchmarkVerify is the cost of checking an ES256 proof (with a nonce,
// without the replay check, which would refuse the repeated proof) beside
// go-jose's parse and verify of the same compact JWS alone: the ratio is
// what the DPoP checks add to the cryptography.
func BenchmarkVerify(b *testing.B) {
	fx := newFixture(b)
	fx.v.Replay = nil
	nonce := fx.nonces.Issue(fx.now)
	proof := sign(b, jose.ES256, fx.key, baseClaims(fx.now, nonce))
	r := fx.req(proof)
	if _, err := fx.v.Verify(context.Background(), r); err != nil {
		b.Fatal(err)
	}
	b.Run("dpop/ES256", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := fx.v.Verify(context.Background(), r); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("dpop/ES256+replay", func(b *testing.B) {
		// A fresh proof per iteration, signed before the clock runs.
		proofs := make([]string, 0, 1024)
		for range cap(proofs) {
			proofs = append(proofs, sign(b, jose.ES256, fx.key, baseClaims(fx.now, nonce)))
		}
		v := *fx.v
		v.Replay = NewLocal(1<<16, DefaultWindow)
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			if i == len(proofs) {
				b.StopTimer()
				v.Replay = NewLocal(1<<16, DefaultWindow)
				i = 0
				b.StartTimer()
			}
			rr := r
			rr.Proof = proofs[i]
			i++
			if _, err := v.Verify(context.Background(), rr); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("jose/ES256", func(b *testing.B) {
		pub := &fx.key.PublicKey
		b.ReportAllocs()
		for b.Loop() {
			jws, err := jose.ParseSignedCompact(proof, []jose.SignatureAlgorithm{jose.ES256})
			if err != nil {
				b.Fatal(err)
			}
			payload, err := jws.Verify(pub)
			if err != nil {
				b.Fatal(err)
			}
			var c map[string]any
			if err := json.Unmarshal(payload, &c); err != nil {
				b.Fatal(err)
			}
		}
	})
}

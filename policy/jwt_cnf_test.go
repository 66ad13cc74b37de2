package policy

import (
	"encoding/base64"
	"strconv"
	"strings"
	"testing"

	"github.com/golang-jwt/jwt/v5"
)

// testJKT is a thumbprint as RFC 7638 gives one: 43 base64url characters.
const testJKT = "0ZcOCORZNYy-DWpqq30jZyJGHTN0d2HglBV3uiguA4I"

// A JWT access token bound to a DPoP key (cnf.jkt, RFC 9449 §6.1) gives
// a principal that carries the thumbprint, which the edge holds the
// request to; one without cnf is a bearer principal.
func TestJWTConfirmationKey(t *testing.T) {
	k := ecKey(t, "k1")
	v := newVerifier(t, JWTConfig{Algorithms: []string{"ES256"}, PublicKeyPEM: k.pem(t)})
	p, err := v.Verify(testCtx(t), k.sign(t, claims(func(c jwt.MapClaims) { c["cnf"] = map[string]any{"jkt": testJKT} })))
	if err != nil {
		t.Fatal(err)
	}
	if p.JKT != testJKT {
		t.Errorf("JKT %q, want the token's cnf.jkt %q", p.JKT, testJKT)
	}
	p, err = v.Verify(testCtx(t), k.sign(t, claims(nil)))
	if err != nil {
		t.Fatal(err)
	}
	if p.JKT != "" {
		t.Errorf("a token without cnf: JKT %q, want none (a bearer token)", p.JKT)
	}
}

// A confirmation this server cannot hold a request to, or that two readers
// could read differently, is refused rather than read as no binding: the
// token's issuer meant it bound, and reading it as a bearer token would let
// whoever holds it use it without the key.
func TestJWTConfirmationRefused(t *testing.T) {
	k := ecKey(t, "k1")
	v := newVerifier(t, JWTConfig{Algorithms: []string{"ES256"}, PublicKeyPEM: k.pem(t)})
	signRaw := func(payload string) string {
		head := base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"ES256","typ":"JWT"}`))
		body := base64.RawURLEncoding.EncodeToString([]byte(payload))
		sig, err := jwt.SigningMethodES256.Sign(head+"."+body, k.priv)
		if err != nil {
			t.Fatal(err)
		}
		return head + "." + body + "." + base64.RawURLEncoding.EncodeToString(sig)
	}
	valid := claims(nil)
	base := `"iss":"` + testIssuer + `","aud":"` + testAudience + `","sub":"user-1","iat":` +
		jsonNumber(valid["iat"]) + `,"exp":` + jsonNumber(valid["exp"])
	for _, tc := range []struct {
		name, payload, says string
	}{
		{"cnf is not an object", `{` + base + `,"cnf":"` + testJKT + `"}`, "cnf"},
		{"cnf without jkt (an mTLS binding)", `{` + base + `,"cnf":{"x5t#S256":"abc"}}`, "jkt"},
		{"jkt not a thumbprint", `{` + base + `,"cnf":{"jkt":"short"}}`, "jkt"},
		{"jkt not a string", `{` + base + `,"cnf":{"jkt":42}}`, "cnf"},
		{"cnf twice, the last one null", `{` + base + `,"cnf":{"jkt":"` + testJKT + `"},"cnf":null}`, "readers could read"},
		{"cnf spelled in another case", `{` + base + `,"CNF":{"jkt":"` + testJKT + `"}}`, "cnf"},
		{"cnf spelled with an escape, twice", `{` + base + `,"cnf":{"jkt":"` + testJKT + `"},"\u0063nf":null}`, "readers could read"},
		{"jkt spelled in another case", `{` + base + `,"cnf":{"JKT":"` + testJKT + `"}}`, "jkt"},
		{"jkt twice", `{` + base + `,"cnf":{"jkt":"` + testJKT + `","jkt":"` + strings.Repeat("A", 43) + `"}}`, "readers could read"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			raw := signRaw(tc.payload)
			p, err := v.Verify(testCtx(t), raw)
			if err == nil {
				t.Fatalf("accepted with JKT %q; want a refusal saying %q", p.JKT, tc.says)
			}
			mustRefuse(t, err, raw, tc.says)
		})
	}
}

func jsonNumber(v any) string { return strconv.FormatInt(v.(int64), 10) }

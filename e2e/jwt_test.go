package e2e

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// idp is an identity provider's key endpoint: a JWKS served on loopback
// and the key that signs its tokens.
type idp struct {
	issuer  string
	key     *rsa.PrivateKey
	kid     string
	jwksURL string
	fetches atomic.Int32
}

func startIDP(t *testing.T) *idp {
	t.Helper()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	p := &idp{issuer: "https://idp.example.test/", key: key, kid: "k1"}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.fetches.Add(1)
		b64 := base64.RawURLEncoding.EncodeToString
		json.NewEncoder(w).Encode(map[string]any{"keys": []map[string]string{{
			"kty": "RSA", "kid": p.kid, "alg": "RS256", "use": "sig",
			"n": b64(key.N.Bytes()), "e": b64(big.NewInt(int64(key.E)).Bytes()),
		}}})
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	p.jwksURL = "http://" + ln.Addr().String() + "/jwks"
	return p
}

func (p *idp) token(t *testing.T, claims jwt.MapClaims) string {
	t.Helper()
	tok := jwt.NewWithClaims(jwt.SigningMethodRS256, claims)
	tok.Header["kid"] = p.kid
	s, err := tok.SignedString(p.key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestGuardAcceptsJWTFromIdentityProvider(t *testing.T) {
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
		scope simple tools test_simple_text
		jwt {
			issuer %s
			jwks_url %s
			algorithms RS256
		}
	}
	reverse_proxy %s
}
`, AdminPlaceholder, site, resource, p.issuer, p.jwksURL, up))

	now := time.Now()
	claims := func(mod func(jwt.MapClaims)) jwt.MapClaims {
		c := jwt.MapClaims{"iss": p.issuer, "aud": resource, "sub": "alice", "scope": "simple",
			"iat": now.Unix(), "exp": now.Add(time.Hour).Unix()}
		if mod != nil {
			mod(c)
		}
		return c
	}

	t.Run("valid token drives the upstream within its scopes", func(t *testing.T) {
		cs, err := connectGo(t, resource, bearerClient(p.token(t, claims(nil)), nil))
		if err != nil {
			t.Fatal(err)
		}
		tools, err := cs.ListTools(context.Background(), nil)
		if err != nil {
			t.Fatal(err)
		}
		if got := toolNamesOf(tools); len(got) != 1 || got[0] != "test_simple_text" {
			t.Fatalf("JWT with scope simple lists %v", got)
		}
		if res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "test_simple_text"}); err != nil || res.IsError {
			t.Fatalf("call: %+v %v", res, err)
		}
		a := post(t, resource, p.token(t, claims(nil)), toolCallBody("test_image_content"))
		if a.status != http.StatusForbidden || !strings.Contains(a.header.Get("WWW-Authenticate"), `error="insufficient_scope"`) {
			t.Fatalf("JWT without the scope: %d %q", a.status, a.header.Get("WWW-Authenticate"))
		}
		// scp as an array works as well as scope.
		scp := p.token(t, claims(func(c jwt.MapClaims) { delete(c, "scope"); c["scp"] = []string{"mcp"} }))
		if a := post(t, resource, scp, toolCallBody("test_image_content")); a.status != http.StatusOK {
			t.Fatalf("scp [mcp]: %d %s", a.status, a.body)
		}
	})

	for name, mod := range map[string]func(jwt.MapClaims){
		"expired":        func(c jwt.MapClaims) { c["exp"] = now.Add(-time.Hour).Unix() },
		"wrong audience": func(c jwt.MapClaims) { c["aud"] = "https://other.example/mcp" },
		"wrong issuer":   func(c jwt.MapClaims) { c["iss"] = "https://evil.example/" },
	} {
		t.Run(name+" gets 401 invalid_token", func(t *testing.T) {
			a := post(t, resource, p.token(t, claims(mod)), initializeBody)
			if a.status != http.StatusUnauthorized || !strings.Contains(a.header.Get("WWW-Authenticate"), `error="invalid_token"`) {
				t.Fatalf("%d %q %s", a.status, a.header.Get("WWW-Authenticate"), a.body)
			}
		})
	}

	t.Run("a token signed by another key gets 401", func(t *testing.T) {
		other := startIDP(t)
		other.issuer = p.issuer
		if a := post(t, resource, other.token(t, claims(nil)), initializeBody); a.status != http.StatusUnauthorized {
			t.Fatalf("%d %s", a.status, a.body)
		}
	})

	t.Run("metadata names the authorization server", func(t *testing.T) {
		resp, err := shortClient.Get("http://" + site + "/.well-known/oauth-protected-resource/mcp")
		if err != nil {
			t.Fatal(err)
		}
		var meta struct {
			Resource string   `json:"resource"`
			AS       []string `json:"authorization_servers"`
		}
		json.NewDecoder(resp.Body).Decode(&meta)
		resp.Body.Close()
		if meta.Resource != resource || len(meta.AS) != 1 || meta.AS[0] != p.issuer {
			t.Fatalf("metadata = %+v", meta)
		}
	})

	if p.fetches.Load() == 0 {
		t.Fatal("the JWKS was never fetched")
	}
	for _, l := range auditLines(c) {
		raw, _ := json.Marshal(l)
		if strings.Contains(string(raw), "eyJ") {
			t.Fatalf("an audit line holds a JWT: %s", raw)
		}
	}
}

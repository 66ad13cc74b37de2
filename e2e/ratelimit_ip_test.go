package e2e

import (
	"crypto/rand"
	"crypto/rsa"
	"encoding/base64"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// guessUntilLimited sends failed credentials to url, each of guesses in
// turn, until one is answered 429 rate_limited_ip with a Retry-After, and
// returns how many were answered 401 before it. At most limit tries.
func guessUntilLimited(t *testing.T, url string, guesses []string, limit int) int {
	t.Helper()
	for i := range limit {
		a := post(t, url, guesses[i%len(guesses)], initializeBody)
		switch {
		case a.status == http.StatusTooManyRequests:
			if a.rpc.Error.Data.Reason != "rate_limited_ip" || a.header.Get("Retry-After") == "" {
				t.Fatalf("guess %d: 429 %s, Retry-After %q; want rate_limited_ip with a delay", i+1, a.body, a.header.Get("Retry-After"))
			}
			return i
		case a.status != http.StatusUnauthorized:
			t.Fatalf("guess %d: %d %s, want 401 until the address's bucket is empty", i+1, a.status, a.body)
		}
	}
	t.Fatalf("%d failed guesses from one address, none refused 429: the limit on guessing is gone", limit)
	return 0
}

// A loopback agent that sends bad tokens (wrong opaque tokens, JWTs
// signed with its own key) empties the bucket of the address it shares
// with every other client on the host; from then on its guesses get 429
// rate_limited_ip, and every client there with a valid opaque token or
// JWT is served all the same.
func TestValidTokenIsNeverRateLimitedIP(t *testing.T) {
	up := startRecordingUpstream(t)
	idp := startIDP(t)
	site := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	resource := "http://" + site + "/mcp"
	c := startCaddy(t, fmt.Sprintf(`{
	admin %s
}

http://%s {
	zidane_mcp {
		guard
		resource %s
		rate_limit {
			per_ip 1/h 5
		}
		jwt {
			issuer %s
			jwks_url %s
			algorithms RS256
		}
	}
	reverse_proxy %s
}
`, AdminPlaceholder, site, resource, idp.issuer, idp.jwksURL, up.addr))
	token := createToken(t, c, "orchestrator", "--scope", "mcp")
	claims := jwt.MapClaims{"iss": idp.issuer, "aud": resource, "sub": "alice", "scope": "mcp",
		"iat": time.Now().Unix(), "exp": time.Now().Add(time.Hour).Unix()}
	valid := idp.token(t, claims)
	// The agent's forgery: the provider's kid and claims, its own key.
	other, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	forged := jwt.NewWithClaims(jwt.SigningMethodRS256, claims)
	forged.Header["kid"] = idp.kid
	forgery, err := forged.SignedString(other)
	if err != nil {
		t.Fatal(err)
	}

	wrong := "zds_" + base64.RawURLEncoding.EncodeToString([]byte(randomHex(16)))
	if n := guessUntilLimited(t, resource, []string{wrong, forgery}, 20); n != 5 {
		t.Fatalf("%d failed guesses before the first 429, want 5 (the burst)", n)
	}
	for i := range 5 {
		for name, cred := range map[string]string{"opaque token": token, "JWT": valid} {
			if a := post(t, resource, cred, initializeBody); a.status != http.StatusOK {
				t.Fatalf("call %d with a valid %s from the guessing address: %d %s", i+1, name, a.status, a.body)
			}
		}
	}
	for _, guess := range []string{wrong, forgery, ""} {
		if a := post(t, resource, guess, initializeBody); a.status != http.StatusTooManyRequests || a.rpc.Error.Data.Reason != "rate_limited_ip" {
			t.Fatalf("a failed credential (%q…) after the valid calls: %d %s; want 429 rate_limited_ip: guessing stays limited", guess[:min(len(guess), 8)], a.status, a.body)
		}
	}
	limited := 0
	for _, l := range auditLines(c) {
		if l["reason"] == "rate_limited_ip" {
			limited++
		}
	}
	if limited < 4 {
		t.Fatalf("%d audit lines for rate_limited_ip, want one for each of the 4 refusals", limited)
	}
}

// Replicas share the usage of the per-address bucket: failed guesses sent
// to A empty the address's bucket on B too, so B refuses that address's
// next guess with 429 before B's own count of them reaches the burst, and
// still serves a valid token from it.
func TestClusterGuessFloodSparesValidTokensOnOtherReplicas(t *testing.T) {
	nats := startNATS(t)
	up := startRecordingUpstream(t)
	clusterKey := "ZIDANE_CLUSTER_KEY=" + base64.StdEncoding.EncodeToString([]byte(randomHex(16)))
	const burst = 40
	replica := func() (*Caddy, string) {
		site := fmt.Sprintf("127.0.0.1:%d", freePort(t))
		c := startCaddy(t, fmt.Sprintf(`{
	admin %s
	storage zidane_nats
	zidane {
		cluster {
			url %s
		}
	}
}

http://%s {
	zidane_mcp {
		guard
		rate_limit {
			per_ip 1/h %d
		}
	}
	reverse_proxy %s
}
`, AdminPlaceholder, nats.url, site, burst, up.addr), clusterKey)
		return c, "http://" + site + "/mcp"
	}
	a, urlA := replica()
	_, urlB := replica()
	token := createToken(t, a, "orchestrator", "--scope", "mcp")
	waitStatus(t, urlB, token, http.StatusOK, 20*time.Second)

	wrong := "zds_" + base64.RawURLEncoding.EncodeToString([]byte(randomHex(16)))
	if n := guessUntilLimited(t, urlA, []string{wrong}, 2*burst); n != burst {
		t.Fatalf("A: %d failed guesses before the first 429, want %d (the burst)", n, burst)
	}
	// B hears of A's usage within a share period (100 ms); until then its
	// own bucket answers, and each guess charges it. Polled every 100 ms:
	// B's first 429 before its own count reaches the burst is A's usage.
	own := 0
	for ; own < burst; own++ {
		if a := post(t, urlB, wrong, initializeBody); a.status == http.StatusTooManyRequests {
			break
		} else if a.status != http.StatusUnauthorized {
			t.Fatalf("guess at B: %d %s", a.status, a.body)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if own == burst {
		t.Fatalf("B refused no guess before its own %d: the guesses sent to A did not reach B's bucket", burst)
	}
	for i := range 5 {
		if a := post(t, urlB, token, initializeBody); a.status != http.StatusOK {
			t.Fatalf("valid call %d at B from the address whose guesses A and B refuse: %d %s", i+1, a.status, a.body)
		}
	}
	if a := post(t, urlB, wrong, initializeBody); a.status != http.StatusTooManyRequests {
		t.Fatalf("a guess at B after the valid calls: %d, want 429", a.status)
	}
	t.Logf("B refused the address's guesses after %d of its own (A's %d reached it)", own, burst)
}

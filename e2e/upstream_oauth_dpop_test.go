package e2e

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/Tahul/caddy-zidane-mcp/internal/oauthtest"
)

// TestUpstreamOAuthDPoPAndWorkload runs the built gateway against two
// upstreams whose authorization server binds tokens to DPoP keys (RFC
// 9449) and whose servers each demand a nonce of their own: one the
// operator logs in to with `caddy zidane login`, one the gateway reaches
// with its workload's JWT (grant jwt_bearer, SEP-1933). Both are used
// through the aggregated route, the path real traffic takes: every
// request carries the DPoP scheme and a fresh proof of the grant's key,
// and neither token, key nor JWT lands in storage or the logs in clear.
func TestUpstreamOAuthDPoPAndWorkload(t *testing.T) {
	as := oauthtest.NewAuthServer(oauthtest.AuthServerOptions{
		DPoP: true, DPoPNonce: true,
		AuthMethods: []string{oauthtest.ClientSecretBasic, oauthtest.AuthNone},
	})
	t.Cleanup(as.Close)
	up := oauthtest.NewMCPServer(as, oauthtest.MCPOptions{ScopesSupported: []string{"mcp:read"}, DPoPNonce: true})
	t.Cleanup(up.Close)
	wl := oauthtest.NewMCPServer(as, oauthtest.MCPOptions{DPoPNonce: true})
	t.Cleanup(wl.Close)
	clientSecret := oauthtest.NewSecret("gateway-client-secret")
	as.AddClient("zidane-gateway", clientSecret, nil)
	as.AddClient("workload-1", "", nil)

	// The workload's platform: its signing key, trusted by the
	// authorization server, and the file it keeps the JWT in.
	wlKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	as.TrustWorkloadKey(&wlKey.PublicKey)
	workloadJWT, err := jwt.NewWithClaims(jwt.SigningMethodES256, jwt.RegisteredClaims{
		Issuer: "https://platform.example.com", Subject: "workload-1", Audience: jwt.ClaimStrings{as.URL},
		IssuedAt: jwt.NewNumericDate(time.Now()), ExpiresAt: jwt.NewNumericDate(time.Now().Add(time.Hour)), ID: rand.Text(),
	}).SignedString(wlKey)
	if err != nil {
		t.Fatal(err)
	}
	jwtFile := filepath.Join(t.TempDir(), "workload.jwt")
	if err := os.WriteFile(jwtFile, []byte(workloadJWT), 0o600); err != nil {
		t.Fatal(err)
	}

	rawKey := make([]byte, 32)
	rand.Read(rawKey)
	aggPort, brokerPort := freePort(t), freePort(t)
	caddyfile := strings.Replace(upstreamOAuthCaddyfile(up.URL, aggPort, brokerPort), "\tzidane {\n", fmt.Sprintf(`	zidane {
		upstream platform %s {
			oauth {
				grant jwt_bearer
				client_id workload-1
				assertion_file %s
				dpop required
			}
		}
`, wl.URL, jwtFile), 1)
	caddyfile = strings.Replace(caddyfile, "aggregate remote\n", "aggregate remote platform\n", 1)
	c := startCaddy(t, caddyfile, "REMOTE_SECRET="+clientSecret, "ZIDANE_UPSTREAM_TOKEN_KEY="+base64.StdEncoding.EncodeToString(rawKey))
	g := &oauthGateway{
		c: c, as: as, up: up,
		token:       createToken(t, c, "agent", "--scope", "upstream:remote", "--scope", "upstream:platform"),
		aggURL:      fmt.Sprintf("http://127.0.0.1:%d/mcp", aggPort),
		brokerURL:   fmt.Sprintf("http://127.0.0.1:%d/mcp", brokerPort),
		callbackURL: fmt.Sprintf("http://127.0.0.1:%d/zidane/oauth/callback/remote", aggPort),
	}

	q := g.login(t)
	jkt := q.Get("dpop_jkt")
	if jkt == "" {
		t.Fatalf("the login's authorization request names no DPoP key: %v", q)
	}
	codeReqs := 0
	for _, r := range as.TokenRequests() {
		if r.GrantType != oauthtest.GrantAuthorizationCode {
			continue
		}
		codeReqs++
		if r.DPoP.JKT != jkt {
			t.Errorf("code redeemed with a proof of %q, not the key the code was asked for (%s)", r.DPoP.JKT, jkt)
		}
	}
	if codeReqs != 2 {
		t.Errorf("%d authorization_code requests; want the nonce challenge and one retry", codeReqs)
	}

	cs := g.aggSession(t)
	defer cs.Close()
	g.awaitAggTool(t, cs, "mcp_remote_echo")
	wantOK(t, "aggregated mcp_remote_echo", g.callGo(t, cs, "mcp_remote_echo", map[string]any{"text": "bound"}), "echo: bound")
	g.awaitAggTool(t, cs, "mcp_platform_echo")
	wantOK(t, "aggregated mcp_platform_echo", g.callGo(t, cs, "mcp_platform_echo", map[string]any{"text": "workload"}), "echo: workload")

	for name, m := range map[string]*oauthtest.MCPServer{"remote": up, "platform": wl} {
		schemes := m.Schemes()
		if len(schemes) == 0 {
			t.Errorf("%s: no authorized request", name)
		}
		for _, s := range schemes {
			if s != "DPoP" {
				t.Errorf("%s: a request used the %s scheme", name, s)
			}
		}
		jtis := map[string]bool{}
		challenged := 0
		for _, p := range m.DPoPProofs() {
			if jtis[p.JTI] {
				t.Errorf("%s: proof jti %s sent twice", name, p.JTI)
			}
			jtis[p.JTI] = true
			switch {
			case p.Err == "":
			case strings.Contains(p.Err, "nonce"):
				challenged++
			default:
				t.Errorf("%s: a proof was refused: %s", name, p.Err)
			}
			if p.Nonce != "" && p.Nonce != m.DPoPNonce() {
				t.Errorf("%s: a proof carried another server's nonce", name)
			}
		}
		// One challenge per gateway connection to the upstream at most:
		// the nonce is kept afterwards.
		if challenged == 0 || challenged > 3 {
			t.Errorf("%s: %d nonce challenges; want the first request's, and the nonce kept", name, challenged)
		}
	}
	var grants []string
	for _, r := range as.TokenRequests() {
		if r.GrantType == oauthtest.GrantJWTBearer && r.Error == "" {
			grants = append(grants, r.Assertion)
			if r.DPoP.JKT == "" {
				t.Error("the workload's grant carried no DPoP proof")
			}
		}
	}
	if len(grants) == 0 || grants[0] != workloadJWT {
		t.Errorf("the workload's grant did not present its JWT (%d grants)", len(grants))
	}

	secrets := append(as.Secrets(), workloadJWT, clientSecret)
	for _, f := range filesHolding(t, c.DataDir, secrets) {
		t.Errorf("%s holds a token, the client secret or the workload's JWT in clear", f)
	}
	for _, l := range logLinesHolding(c, secrets) {
		t.Errorf("a log line holds a secret: %s", l)
	}
}

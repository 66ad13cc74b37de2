package e2e

import (
	"encoding/base64"
	"fmt"
	"net/http"
	"net/url"
	"testing"
	"time"
)

// TestSigninAcrossReplicas: codes, consent forms, sign-ins, grants and
// refresh tokens live in the cluster's storage under keys derived from the
// cluster key, so any replica serves any step: a person signs in and is
// shown the consent page on replica A, the form is posted to B, the code
// is redeemed on C, the grant refreshed on B, its access token taken on C;
// the code redeemed again on A is refused and revokes the grant, which C
// then refuses.
func TestSigninAcrossReplicas(t *testing.T) {
	natsURL := startNATSServer(t)
	up := startRecordingUpstream(t)
	clusterKey := "ZIDANE_CLUSTER_KEY=" + base64.StdEncoding.EncodeToString([]byte(randomHex(16)))
	issuer := fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
	replica := func(site string) *Caddy {
		return startCaddy(t, fmt.Sprintf(`{
	admin %s
	storage zidane_nats
	zidane {
		cluster {
			url %s
			lock_ttl 5s
		}
		signin {
			issuer %s
			registration dynamic
		}
	}
}

%s {
	zidane_mcp {
		guard
		resource %s/mcp
	}
	reverse_proxy %s
}
`, AdminPlaceholder, natsURL, issuer, site, issuer, up.addr), clusterKey)
	}
	b := fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
	c := fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
	ra := replica(issuer)
	replica(b)
	replica(c)

	secret := signInLink(t, ra, "erin", "mcp")
	m := registerClient(t, issuer)
	br := newFormBrowser(t, issuer)
	// The consent page is shown by A; its form is posted to B.
	verifier := randomHex(32)
	code := func() string {
		t.Helper()
		q := m.authorizeQuery(verifier, issuer+"/mcp")
		resp, body := br.get(issuer + "/zidane/signin/authorize?" + q.Encode())
		if resp.StatusCode == http.StatusUnauthorized {
			resp, body = br.post("/zidane/signin/link", url.Values{"secret": {secret}})
		}
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("authorization on A: %d\n%s", resp.StatusCode, body)
		}
		br.base = b
		defer func() { br.base = issuer }()
		back := br.consent(body)
		if back.Query().Get("iss") != issuer || back.Query().Get("state") != q.Get("state") {
			t.Fatalf("B sent the browser back with %v", back.Query())
		}
		return back.Query().Get("code")
	}()

	// Redeemed on C.
	m.base = c
	status, tok := m.redeem(code, verifier, issuer+"/mcp")
	if status != http.StatusOK {
		t.Fatalf("the code redeemed on C: %d %v", status, tok)
	}
	// Refreshed on B.
	m.base = b
	status, next := m.token(url.Values{"grant_type": {"refresh_token"}, "refresh_token": {tok["refresh_token"].(string)}})
	if status != http.StatusOK {
		t.Fatalf("the grant refreshed on B: %d %v", status, next)
	}
	access := next["access_token"].(string)
	took := waitStatus(t, c+"/mcp", access, http.StatusOK, 20*time.Second)
	t.Logf("the access token refreshed on B was taken on C after %v", took.Round(time.Millisecond))

	// The code again, on A: refused, and the grant revoked everywhere.
	m.base = issuer
	if status, out := m.redeem(code, verifier, issuer+"/mcp"); status != http.StatusBadRequest || out["error"] != "invalid_grant" {
		t.Errorf("the code redeemed again on A: %d %v", status, out)
	}
	waitStatus(t, c+"/mcp", access, http.StatusUnauthorized, 20*time.Second)
}

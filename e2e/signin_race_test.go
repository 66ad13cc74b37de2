package e2e

import (
	"encoding/base64"
	"fmt"
	"net/http"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/authserver"
	signinidp "github.com/Tahul/caddy-zidane-mcp/authserver/idp"
)

// TestSigninCodeRaceAcrossReplicas: one code redeemed on two replicas of
// a cluster at the same moment is redeemed once: exactly one token
// request wins, the other is refused invalid_grant, and, as for any code
// redeemed twice, the grant the winner got is revoked, which every
// replica then refuses. The same for one refresh token sent to two
// replicas at once: one rotation wins, and the reuse revokes the grant.
// A DPoP proof taken on one replica, at the token endpoint or at the
// resource, is refused on the others.
func TestSigninCodeRaceAcrossReplicas(t *testing.T) {
	natsURL := startNATSServer(t)
	up := startRecordingUpstream(t)
	clusterKey := "ZIDANE_CLUSTER_KEY=" + base64.StdEncoding.EncodeToString([]byte(randomHex(16)))
	issuer := fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
	replica := func(site string) *Caddy {
		return startCaddy(t, fmt.Sprintf(`{
	admin {{ADMIN}}
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
`, natsURL, issuer, site, issuer, up.addr), clusterKey)
	}
	b := fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
	c := fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
	ra := replica(issuer)
	replica(b)
	replica(c)
	resource := issuer + "/mcp"

	secret := signInLink(t, ra, "hana", "mcp")
	m := registerClient(t, issuer)
	br := newFormBrowser(t, issuer)
	verifier := randomHex(32)
	q := m.authorizeQuery(verifier, resource)
	resp, body := br.get(issuer + authserver.AuthorizePath + "?" + q.Encode())
	if resp.StatusCode == http.StatusUnauthorized {
		resp, body = br.post(signinidp.LinkPath, url.Values{"secret": {secret}})
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("authorization on A: %d\n%s", resp.StatusCode, body)
	}
	code := br.consent(body).Query().Get("code")

	// race sends form to the token endpoints of B and C at once.
	race := func(form url.Values) (statuses []int, answers []map[string]any) {
		t.Helper()
		statuses, answers = make([]int, 2), make([]map[string]any, 2)
		clients := []*manualClient{{t: t, base: b, id: m.id, redirect: m.redirect}, {t: t, base: c, id: m.id, redirect: m.redirect}}
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i, mc := range clients {
			wg.Go(func() {
				f := url.Values{}
				for k, v := range form {
					f[k] = v
				}
				<-start
				statuses[i], answers[i] = mc.token(f)
			})
		}
		close(start)
		wg.Wait()
		return statuses, answers
	}
	winner := func(what string, statuses []int, answers []map[string]any) map[string]any {
		t.Helper()
		var won map[string]any
		for i, s := range statuses {
			switch {
			case s == http.StatusOK && won == nil:
				won = answers[i]
			case s == http.StatusBadRequest && answers[i]["error"] == "invalid_grant":
			default:
				t.Fatalf("%s on B and C at once: %v %v; want one 200 and one 400 invalid_grant", what, statuses, answers)
			}
		}
		if won == nil {
			t.Fatalf("%s on B and C at once: no replica redeemed it: %v %v", what, statuses, answers)
		}
		return won
	}

	statuses, answers := race(url.Values{"grant_type": {"authorization_code"}, "code": {code}, "code_verifier": {verifier},
		"redirect_uri": {m.redirect}, "resource": {resource}})
	tok := winner("one code", statuses, answers)
	for _, r := range []string{issuer, b, c} {
		waitStatus(t, r+"/mcp", tok["access_token"].(string), http.StatusUnauthorized, 20*time.Second)
	}

	// A second sign-in, whose refresh token is sent to B and C at once.
	m.base = issuer
	code2, verifier2 := m.code(br, secret, resource)
	status, tok2 := m.redeem(code2, verifier2, resource)
	if status != http.StatusOK {
		t.Fatalf("redeem on A: %d %v", status, tok2)
	}
	waitStatus(t, c+"/mcp", tok2["access_token"].(string), http.StatusOK, 20*time.Second)
	statuses, answers = race(url.Values{"grant_type": {"refresh_token"}, "refresh_token": {tok2["refresh_token"].(string)}})
	next := winner("one refresh token", statuses, answers)
	for _, r := range []string{issuer, b, c} {
		waitStatus(t, r+"/mcp", next["access_token"].(string), http.StatusUnauthorized, 20*time.Second)
	}

	// A DPoP proof is taken once across the cluster: at the token
	// endpoint (a proof that redeemed a code on B is refused on C), and
	// at the resource (a proof B took with the bound token is refused on
	// C and on A).
	key := newDPoPKey(t)
	proof := key.proof(t, http.MethodPost, issuer+authserver.TokenPath, "", "")
	code3, verifier3 := m.code(br, secret, resource)
	m.base = b
	status, bound := m.redeem(code3, verifier3, resource, proof)
	if status != http.StatusOK || bound["token_type"] != "DPoP" {
		t.Fatalf("redeem with a proof on B: %d %v", status, bound)
	}
	m.base = issuer
	code4, verifier4 := m.code(br, secret, resource)
	m.base = c
	if status, out := m.redeem(code4, verifier4, resource, proof); status != http.StatusBadRequest || out["error"] != "invalid_dpop_proof" {
		t.Errorf("B's token endpoint proof again on C: %d %v, want invalid_dpop_proof", status, out)
	}
	access := bound["access_token"].(string)
	onB := key.proof(t, http.MethodPost, resource, access, "")
	if a := postDPoP(t, b+"/mcp", "", "DPoP "+access, []string{onB}, initializeBody); a.status != http.StatusOK {
		t.Fatalf("the bound token with its proof on B: %d %s", a.status, a.body)
	}
	for _, r := range []string{c, issuer} {
		a := postDPoP(t, r+"/mcp", "", "DPoP "+access, []string{onB}, initializeBody)
		wantDPoPRefusal(t, a, "invalid_dpop_proof", "used already")
	}
}

package e2e

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"html"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/Tahul/caddy-zidane-mcp/authserver"
	signinidp "github.com/Tahul/caddy-zidane-mcp/authserver/idp"
	"github.com/Tahul/caddy-zidane-mcp/policy"
)

// TestSigninBrokerToGateway: one gateway brokering to another. Gateway B
// has gateway A's guard site as an upstream with `dpop required` in its
// oauth block; the operator's `caddy zidane login` on B goes through A's
// authorization server (discovery from A's 401, dynamic registration,
// the person's sign-in and consent on A), B redeems the code with a DPoP
// proof, and a client of B's aggregated route calls the server behind A
// through both, B sending A's bound token with a proof on every request.
// A lists the grant, bound to B's key and owned by the person who
// consented; nothing of it reaches B's log or storage in clear.
func TestSigninBrokerToGateway(t *testing.T) {
	upstream := startStatelessEverythingServer(t)
	up := strings.TrimSuffix(strings.TrimPrefix(upstream, "http://"), "/mcp")
	aBase := fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
	a := startCaddy(t, fmt.Sprintf(`{
	admin {{ADMIN}}
	zidane {
		signin {
			issuer %[1]s
			registration dynamic
		}
	}
}

%[1]s {
	zidane_mcp {
		guard
		resource %[1]s/mcp
		dpop required
		dpop_nonce
	}
	reverse_proxy %[2]s
}
`, aBase, up))
	secret := signInLink(t, a, "ivy", "mcp")

	bPort := freePort(t)
	callback := fmt.Sprintf("http://127.0.0.1:%d/zidane/oauth/callback/gw", bPort)
	rawKey := make([]byte, 32)
	rand.Read(rawKey)
	b := startCaddy(t, fmt.Sprintf(`{
	admin {{ADMIN}}
	zidane {
		upstream gw %[1]s/mcp {
			oauth {
				grant authorization_code
				redirect_url %[2]s
				dpop required
			}
		}
	}
}

http://:%[3]d {
	bind 127.0.0.1
	zidane_mcp {
		aggregate gw
	}
}
`, aBase, callback, bPort), "ZIDANE_UPSTREAM_TOKEN_KEY="+base64.StdEncoding.EncodeToString(rawKey))

	stdout, stderr, err := b.Run(t, "zidane", "login", "gw", "--wait", "0")
	if err != nil {
		t.Fatalf("zidane login gw on B: %v\n%s%s", err, stdout, stderr)
	}
	authURL := ""
	for _, f := range strings.Fields(stdout) {
		if strings.HasPrefix(f, aBase+authserver.AuthorizePath+"?") {
			authURL = f
		}
	}
	if authURL == "" {
		t.Fatalf("zidane login printed no authorization URL of A:\n%s", stdout)
	}

	// The person's browser: signed in on A, it consents, and is sent to
	// B's callback, which ends the login.
	br := newFormBrowser(t, aBase)
	resp, body := br.get(authURL)
	if resp.StatusCode == http.StatusUnauthorized {
		resp, body = br.post(signinidp.LinkPath, url.Values{"secret": {secret}})
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("the authorization request answered %d:\n%s", resp.StatusCode, body)
	}
	form := url.Values{"decision": {"allow"}}
	for _, m := range consentField.FindAllStringSubmatch(body, -1) {
		form.Add(m[1], html.UnescapeString(m[2]))
	}
	req, _ := http.NewRequest(http.MethodPost, aBase+authserver.ConsentPath, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", aBase)
	noFollow := &http.Client{Jar: br.hc.Jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err = noFollow.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	back := resp.Header.Get("Location")
	if resp.StatusCode != http.StatusSeeOther || !strings.HasPrefix(back, callback+"?") {
		t.Fatalf("the consent answered %d, Location %q; want B's callback", resp.StatusCode, back)
	}
	resp, err = noFollow.Get(back)
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(page), "Logged in to gw") {
		t.Fatalf("B's callback answered %d:\n%s", resp.StatusCode, page)
	}

	g := &oauthGateway{c: b, token: createToken(t, b, "agent", "--scope", "upstream:gw"), aggURL: fmt.Sprintf("http://127.0.0.1:%d/mcp", bPort)}
	cs := g.aggSession(t)
	defer cs.Close()
	tool := "mcp_gw_test_simple_text"
	g.awaitAggTool(t, cs, tool)
	if ans := g.callGo(t, cs, tool, nil); ans.isError || ans.rpcErr != "" || ans.text == "" {
		t.Fatalf("%s through B and A: %+v", tool, ans)
	}

	var rows []policy.Token
	out := listGrants(t, a, "--owner", "ivy", "--json")
	if err := json.Unmarshal([]byte(out), &rows); err != nil || len(rows) != 1 || rows[0].JKT == "" || rows[0].Resource != aBase+"/mcp" {
		t.Fatalf("ivy's grant on A, bound to B's key: %v\n%s", err, out)
	}
	if strings.Contains(a.Logs(), `"reason":"dpop`) || strings.Contains(a.Logs(), `"reason":"invalid_dpop_proof"`) {
		t.Errorf("A refused one of B's proofs:\n%s", a.Logs())
	}
	code, _ := url.Parse(back)
	for _, s := range []string{secret, code.Query().Get("code")} {
		if strings.Contains(a.Logs()+b.Logs(), s) {
			t.Error("the sign-in secret or the code reached a log")
		}
	}
	for _, f := range filesHolding(t, b.DataDir, []string{code.Query().Get("code")}) {
		t.Errorf("%s holds the code in clear", f)
	}
}

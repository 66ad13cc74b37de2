package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/authserver"
	signinidp "github.com/Tahul/caddy-zidane-mcp/authserver/idp"
	"github.com/Tahul/caddy-zidane-mcp/policy"
)

// signinAnswer is what an endpoint of the authorization server answered:
// the status, the OAuth error (of a JSON body, or of the redirect back to
// the client) and its description, and where it sent the browser.
type signinAnswer struct {
	status      int
	err, reason string
	location    *url.URL
}

// authorizeAnswer sends b to the authorization endpoint with q, signing it
// in with secret when it is not, and reads the refusal: an error page (no
// Location) or a redirect back to the client with error and iss.
func authorizeAnswer(t *testing.T, b *formBrowser, base, secret string, q url.Values) signinAnswer {
	t.Helper()
	resp, body := b.get(base + authserver.AuthorizePath + "?" + q.Encode())
	if resp.StatusCode == http.StatusUnauthorized {
		resp, body = b.post(signinidp.LinkPath, url.Values{"secret": {secret}})
	}
	a := signinAnswer{status: resp.StatusCode, reason: body}
	if loc := resp.Header.Get("Location"); loc != "" {
		u, err := url.Parse(loc)
		if err != nil {
			t.Fatal(err)
		}
		a.location, a.err, a.reason = u, u.Query().Get("error"), u.Query().Get("error_description")
	}
	return a
}

// fromAddress is a transport whose connections leave from the loopback
// address ip, so that the gateway sees a client at another address.
func fromAddress(ip string) *http.Transport {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 10 * time.Second}
	return &http.Transport{DialContext: d.DialContext}
}

func tokenAnswer(status int, out map[string]any) signinAnswer {
	e, _ := out["error"].(string)
	d, _ := out["error_description"].(string)
	return signinAnswer{status: status, err: e, reason: d}
}

// TestSigninRefusals is every refusal of the sign-in flow through the
// built gateway, each with its status, its OAuth error and a word of the
// reason the client is told, and what the refusal must leave behind: a
// code redeemed twice or a refresh token used twice revokes the whole
// grant, whose access tokens the edge then refuses at once; a request
// whose redirect URI the client did not register is never redirected; a
// Client ID Metadata Document on a loopback address is never fetched; a
// revocation ends the grant's open stream; the grants are listed by owner
// and client. Every refusal is audited, and no code, verifier or token
// reaches the log.
func TestSigninRefusals(t *testing.T) {
	base := fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
	other := fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
	c := startCaddy(t, fmt.Sprintf(`{
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
		sessions
		resource %[1]s/mcp
	}
}

%[2]s {
	zidane_mcp {
		sessions
		resource %[2]s/mcp
	}
}
`, base, other))
	secret := signInLink(t, c, "frank", "read", "chat")
	m := registerClient(t, base)
	// Another client, registered with the same redirect URI: what one
	// client holds is no credential for it.
	stranger := registerClient(t, base)
	// The person's browser and the client reach the gateway from two
	// addresses, as they do when a client runs elsewhere than the
	// browser: each stays within its own rate limit at the endpoints.
	b := newFormBrowser(t, base)
	b.hc.Transport = fromAddress("127.0.0.2")
	mcpURL := base + "/mcp"
	var secrets []string

	// A code left unredeemed past its lifetime (60s), taken first so that
	// the other cases run while it ages.
	staleCode, staleVerifier := m.code(b, secret, mcpURL)
	staleAt := time.Now()
	secrets = append(secrets, secret, staleCode, staleVerifier)

	redeemed := func(t *testing.T) map[string]any {
		t.Helper()
		code, verifier := m.code(b, secret, mcpURL)
		status, tok := m.redeem(code, verifier, mcpURL)
		if status != http.StatusOK {
			t.Fatalf("redeem: %d %v", status, tok)
		}
		secrets = append(secrets, code, verifier, tok["access_token"].(string), tok["refresh_token"].(string))
		return tok
	}
	refresh := func(tok string) (int, map[string]any) {
		return m.token(url.Values{"grant_type": {"refresh_token"}, "refresh_token": {tok}})
	}
	wantRefused := func(t *testing.T, what, token string) {
		t.Helper()
		if got, challenge := listToolsStatus(t, mcpURL, token); got != http.StatusUnauthorized {
			t.Errorf("%s: the edge answered %d (%q), want 401 at once", what, got, challenge)
		}
	}

	// The document server of a client that names itself by a Client ID
	// Metadata Document on a loopback address: https, a valid document,
	// and counted, to show the gateway never connected to it.
	var docFetches atomic.Int64
	doc := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		docFetches.Add(1)
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{
			"client_id": "https://" + r.Host + r.URL.Path, "client_name": "loopback document",
			"redirect_uris": []string{m.redirect}, "token_endpoint_auth_method": "none",
		})
	}))
	t.Cleanup(doc.Close)

	// consentTo has the person allow the authorization request q and
	// returns the code.
	consentTo := func(t *testing.T, q url.Values) string {
		t.Helper()
		resp, body := b.get(base + authserver.AuthorizePath + "?" + q.Encode())
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("authorization: %d\n%s", resp.StatusCode, body)
		}
		return b.consent(body).Query().Get("code")
	}
	key := newDPoPKey(t)
	tokenURL := base + authserver.TokenPath

	cases := []struct {
		name string
		// do sends the attack and returns the answer; after checks what
		// it must leave behind.
		do     func(t *testing.T) signinAnswer
		status int
		err    string
		word   string
		// back: the refusal is a redirect to the client's registered
		// redirect URI with iss (RFC 9207); otherwise an answer with no
		// Location at all.
		back  bool
		after func(t *testing.T)
	}{
		{name: "plain PKCE", status: http.StatusFound, err: "invalid_request", word: "S256", back: true,
			do: func(t *testing.T) signinAnswer {
				q := m.authorizeQuery(randomHex(32), mcpURL)
				q.Set("code_challenge_method", "plain")
				q.Set("code_challenge", randomHex(32))
				return authorizeAnswer(t, b, base, secret, q)
			}},
		{name: "no PKCE", status: http.StatusFound, err: "invalid_request", word: "code_challenge", back: true,
			do: func(t *testing.T) signinAnswer {
				q := m.authorizeQuery(randomHex(32), mcpURL)
				q.Del("code_challenge")
				q.Del("code_challenge_method")
				return authorizeAnswer(t, b, base, secret, q)
			}},
		{name: "wrong code_verifier", status: http.StatusBadRequest, err: "invalid_grant", word: "code_verifier",
			do: func(t *testing.T) signinAnswer {
				code, _ := m.code(b, secret, mcpURL)
				return tokenAnswer(m.redeem(code, randomHex(32), mcpURL))
			}},
		{name: "redirect_uri not registered", status: http.StatusBadRequest, err: "", word: "registered",
			do: func(t *testing.T) signinAnswer {
				q := m.authorizeQuery(randomHex(32), mcpURL)
				q.Set("redirect_uri", strings.Replace(m.redirect, "/callback", "/elsewhere", 1))
				return authorizeAnswer(t, b, base, secret, q)
			}},
		{name: "redirect_uri on another host", status: http.StatusBadRequest, err: "", word: "registered",
			do: func(t *testing.T) signinAnswer {
				q := m.authorizeQuery(randomHex(32), mcpURL)
				q.Set("redirect_uri", "https://attacker.example/callback")
				return authorizeAnswer(t, b, base, secret, q)
			}},
		{name: "redirect_uri at the token endpoint differs", status: http.StatusBadRequest, err: "invalid_grant", word: "redirect_uri",
			do: func(t *testing.T) signinAnswer {
				code, verifier := m.code(b, secret, mcpURL)
				return tokenAnswer(m.token(url.Values{"grant_type": {"authorization_code"}, "code": {code}, "code_verifier": {verifier},
					"redirect_uri": {strings.Replace(m.redirect, "/callback", "/elsewhere", 1)}, "resource": {mcpURL}}))
			}},
		{name: "resource not served here", status: http.StatusFound, err: "invalid_target", word: "resource", back: true,
			do: func(t *testing.T) signinAnswer {
				return authorizeAnswer(t, b, base, secret, m.authorizeQuery(randomHex(32), "https://elsewhere.example/mcp"))
			}},
		{name: "resource at the token endpoint differs", status: http.StatusBadRequest, err: "invalid_target", word: "resource",
			do: func(t *testing.T) signinAnswer {
				code, verifier := m.code(b, secret, mcpURL)
				return tokenAnswer(m.redeem(code, verifier, other+"/mcp"))
			}},
		{name: "code redeemed twice", status: http.StatusBadRequest, err: "invalid_grant", word: "code",
			do: func(t *testing.T) signinAnswer {
				code, verifier := m.code(b, secret, mcpURL)
				status, tok := m.redeem(code, verifier, mcpURL)
				if status != http.StatusOK {
					t.Fatalf("first redemption: %d %v", status, tok)
				}
				access, refreshTok := tok["access_token"].(string), tok["refresh_token"].(string)
				secrets = append(secrets, code, verifier, access, refreshTok)
				if got, _ := listToolsStatus(t, mcpURL, access); got != http.StatusOK {
					t.Fatalf("the first redemption's token: %d", got)
				}
				a := tokenAnswer(m.redeem(code, verifier, mcpURL))
				wantRefused(t, "the access token of a code redeemed twice", access)
				if status, out := refresh(refreshTok); status != http.StatusBadRequest || out["error"] != "invalid_grant" {
					t.Errorf("the refresh token of a code redeemed twice: %d %v, want invalid_grant", status, out)
				}
				return a
			}},
		{name: "refresh token used twice", status: http.StatusBadRequest, err: "invalid_grant", word: "refresh",
			do: func(t *testing.T) signinAnswer {
				tok := redeemed(t)
				first := tok["refresh_token"].(string)
				status, next := refresh(first)
				if status != http.StatusOK || next["refresh_token"] == first {
					t.Fatalf("refresh: %d %v, want a new refresh token", status, next)
				}
				secrets = append(secrets, next["access_token"].(string), next["refresh_token"].(string))
				if got, _ := listToolsStatus(t, mcpURL, next["access_token"].(string)); got != http.StatusOK {
					t.Fatalf("the refreshed access token: %d", got)
				}
				a := tokenAnswer(refresh(first))
				wantRefused(t, "the refreshed access token after its old refresh token's reuse", next["access_token"].(string))
				wantRefused(t, "the first access token after the reuse", tok["access_token"].(string))
				if status, out := refresh(next["refresh_token"].(string)); status != http.StatusBadRequest || out["error"] != "invalid_grant" {
					t.Errorf("the current refresh token after the reuse: %d %v, want invalid_grant (the grant is revoked)", status, out)
				}
				return a
			}},
		{name: "code redeemed by another client", status: http.StatusBadRequest, err: "invalid_grant", word: "another client",
			do: func(t *testing.T) signinAnswer {
				code, verifier := m.code(b, secret, mcpURL)
				return tokenAnswer(stranger.redeem(code, verifier, mcpURL))
			}},
		{name: "refresh token of another client", status: http.StatusBadRequest, err: "invalid_grant", word: "another client",
			do: func(t *testing.T) signinAnswer {
				tok := redeemed(t)
				return tokenAnswer(stranger.token(url.Values{"grant_type": {"refresh_token"}, "refresh_token": {tok["refresh_token"].(string)}}))
			}},
		{name: "revocation by another client", status: http.StatusBadRequest, err: "unauthorized_client", word: "another client",
			do: func(t *testing.T) signinAnswer {
				tok := redeemed(t)
				resp, err := http.PostForm(base+authserver.RevokePath, url.Values{"token": {tok["refresh_token"].(string)}, "client_id": {stranger.id}})
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				var out map[string]any
				_ = json.NewDecoder(resp.Body).Decode(&out)
				if got, _ := listToolsStatus(t, mcpURL, tok["access_token"].(string)); got != http.StatusOK {
					t.Errorf("the grant after another client's revocation: %d, want it alive", got)
				}
				return tokenAnswer(resp.StatusCode, out)
			}},
		{name: "code bound by dpop_jkt redeemed without a proof", status: http.StatusBadRequest, err: "invalid_grant", word: "DPoP",
			do: func(t *testing.T) signinAnswer {
				verifier := randomHex(32)
				q := m.authorizeQuery(verifier, mcpURL)
				q.Set("dpop_jkt", key.jkt)
				return tokenAnswer(m.redeem(consentTo(t, q), verifier, mcpURL))
			}},
		{name: "token endpoint proof replayed", status: http.StatusBadRequest, err: "invalid_dpop_proof", word: "used already",
			do: func(t *testing.T) signinAnswer {
				proof := key.proof(t, http.MethodPost, tokenURL, "", "")
				code, verifier := m.code(b, secret, mcpURL)
				if status, tok := m.redeem(code, verifier, mcpURL, proof); status != http.StatusOK || tok["token_type"] != "DPoP" {
					t.Fatalf("redeem with a proof: %d %v", status, tok)
				}
				code, verifier = m.code(b, secret, mcpURL)
				return tokenAnswer(m.redeem(code, verifier, mcpURL, proof))
			}},
		{name: "bound refresh token without a proof", status: http.StatusBadRequest, err: "invalid_grant", word: "DPoP",
			do: func(t *testing.T) signinAnswer {
				code, verifier := m.code(b, secret, mcpURL)
				status, tok := m.redeem(code, verifier, mcpURL, key.proof(t, http.MethodPost, tokenURL, "", ""))
				if status != http.StatusOK || tok["token_type"] != "DPoP" {
					t.Fatalf("redeem with a proof: %d %v", status, tok)
				}
				return tokenAnswer(refresh(tok["refresh_token"].(string)))
			}},
		{name: "client_id document on 127.0.0.1", status: http.StatusBadRequest, err: "", word: "address",
			do: func(t *testing.T) signinAnswer {
				q := m.authorizeQuery(randomHex(32), mcpURL)
				q.Set("client_id", doc.URL+"/client.json")
				return authorizeAnswer(t, b, base, secret, q)
			},
			after: func(t *testing.T) {
				if n := docFetches.Load(); n != 0 {
					t.Errorf("the gateway fetched a client document from 127.0.0.1 (%d requests)", n)
				}
			}},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			// The endpoints' limit per address (a burst of 30) is not what
			// this table tests: each case's browser requests leave from a
			// loopback address of their own, the cookies staying the
			// browser's.
			b.hc.Transport = fromAddress(fmt.Sprintf("127.0.1.%d", i+1))
			a := tc.do(t)
			if a.status != tc.status || a.err != tc.err || !strings.Contains(a.reason, tc.word) {
				t.Errorf("answered %d %q %q; want %d %q with %q in the reason", a.status, a.err, clip(a.reason), tc.status, tc.err, tc.word)
			}
			switch {
			case tc.back && a.location == nil:
				t.Error("the refusal was not sent back to the client")
			case tc.back && (a.location.Scheme+"://"+a.location.Host+a.location.Path != m.redirect || a.location.Query().Get("iss") != base):
				t.Errorf("the refusal went to %s, want the registered %s with iss %s", a.location.Redacted(), m.redirect, base)
			case !tc.back && a.location != nil:
				t.Errorf("the refusal redirected the browser to %s", a.location.Redacted())
			}
			if tc.after != nil {
				tc.after(t)
			}
		})
	}

	t.Run("revocation ends an open stream", func(t *testing.T) {
		tok := redeemed(t)
		access := tok["access_token"].(string)
		init := post(t, mcpURL, access, initializeBody)
		sid := init.header.Get("Mcp-Session-Id")
		if init.status != http.StatusOK || sid == "" {
			t.Fatalf("initialize with the grant's token: %d, session %q", init.status, sid)
		}
		post(t, mcpURL, access, `{"jsonrpc":"2.0","method":"notifications/initialized"}`, "Mcp-Session-Id", sid, "Mcp-Protocol-Version", "2025-11-25")
		req, _ := http.NewRequest(http.MethodGet, mcpURL, nil)
		req.Header.Set("Authorization", "Bearer "+access)
		req.Header.Set("Accept", "text/event-stream")
		req.Header.Set("Mcp-Session-Id", sid)
		req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
		resp, err := http.DefaultClient.Do(req)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("GET stream: %v %v", err, resp)
		}
		ended := make(chan struct{})
		go func() {
			defer close(ended)
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}()
		// RFC 7009, with the refresh token: the client signs out.
		form := url.Values{"token": {tok["refresh_token"].(string)}, "client_id": {m.id}}
		rresp, err := http.PostForm(base+authserver.RevokePath, form)
		if err != nil {
			t.Fatal(err)
		}
		rresp.Body.Close()
		if rresp.StatusCode != http.StatusOK {
			t.Fatalf("revoke: %d", rresp.StatusCode)
		}
		select {
		case <-ended:
		case <-time.After(10 * time.Second):
			t.Fatal("the grant's open stream outlived its revocation by 10s")
		}
		wantRefused(t, "the access token of a revoked grant", access)
	})

	t.Run("token list by owner and client", func(t *testing.T) {
		var rows []policy.Token
		out := listGrants(t, c, "--owner", "frank", "--client", m.id, "--json")
		if err := json.Unmarshal([]byte(out), &rows); err != nil {
			t.Fatalf("token list --json: %v\n%s", err, out)
		}
		live, revoked := 0, 0
		for _, r := range rows {
			if r.Owner != "frank" || r.Client != m.id || r.ClientName != "manual" || r.Resource != mcpURL {
				t.Errorf("a row of frank's grants to %s: %+v", m.id, r)
			}
			if r.Revoked != nil {
				revoked++
			} else {
				live++
			}
		}
		if len(rows) == 0 || revoked == 0 {
			t.Errorf("frank's grants to the client: %d live, %d revoked; want the revoked ones listed", live, revoked)
		}
		if none := listGrants(t, c, "--owner", "someone-else", "--json"); strings.Contains(none, m.id) {
			t.Errorf("another owner's listing shows frank's client:\n%s", none)
		}
	})

	t.Run("code past its lifetime", func(t *testing.T) {
		// The code's lifetime is the server's (60s); wait it out.
		if wait := time.Until(staleAt.Add(authserver.DefaultCodeLifetime + 2*time.Second)); wait > 0 {
			time.Sleep(wait)
		}
		a := tokenAnswer(m.redeem(staleCode, staleVerifier, mcpURL))
		if a.status != http.StatusBadRequest || a.err != "invalid_grant" || !strings.Contains(a.reason, "expired") {
			t.Errorf("an expired code: %d %q %q, want 400 invalid_grant expired", a.status, a.err, a.reason)
		}
	})

	logs := c.Logs()
	for _, s := range secrets {
		if strings.Contains(logs, s) {
			t.Errorf("a code, verifier or token reached caddy's log: %s…", s[:8])
		}
	}
	if n := strings.Count(logs, `"event":"signin_refused"`); n < len(cases) {
		t.Errorf("%d refusals audited, want at least %d", n, len(cases))
	}
}

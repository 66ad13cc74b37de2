package e2e

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/Tahul/caddy-zidane-mcp/authserver"
	signinidp "github.com/Tahul/caddy-zidane-mcp/authserver/idp"
	"github.com/Tahul/caddy-zidane-mcp/broker/upstream"
	"github.com/Tahul/caddy-zidane-mcp/broker/upstreamauth"
	"github.com/Tahul/caddy-zidane-mcp/pinnedfetch"
	"github.com/Tahul/caddy-zidane-mcp/policy"
)

// sentRequest is one request a client sent, as it left the client: its
// credentials and proof, and the status it got.
type sentRequest struct {
	method, url, authz, proof string
	status                    int
}

// wireRecorder is the network under a client's credential layer: it
// records what each request carried, so that a test can replay it.
type wireRecorder struct {
	next http.RoundTripper
	mu   sync.Mutex
	sent []sentRequest
}

func (w *wireRecorder) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := w.next.RoundTrip(r)
	s := sentRequest{method: r.Method, url: r.URL.Scheme + "://" + r.URL.Host + r.URL.Path, authz: r.Header.Get("Authorization"), proof: r.Header.Get("DPoP")}
	if err == nil {
		s.status = resp.StatusCode
	}
	w.mu.Lock()
	w.sent = append(w.sent, s)
	w.mu.Unlock()
	return resp, err
}

func (w *wireRecorder) requests() []sentRequest {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]sentRequest(nil), w.sent...)
}

// TestSigninDPoPClient: the project's own DPoP client, the broker's
// upstream OAuth client (package upstreamauth, as `caddy zidane login`
// and the broker run it), signs in at the gateway's authorization server
// for a site that requires DPoP and sends a nonce: it discovers the
// server from the 401, registers, has a person consent, redeems the code
// with a proof, and calls a tool through the broker's upstream transport,
// every request with the DPoP scheme and a fresh proof (the nonce
// challenge answered). From what it sent on the wire, an attacker's
// replays are refused 401 with the DPoP challenge: a proof sent again, a
// proof the client made for another URL (the token endpoint's), the
// bound token as Bearer, and the token with no proof. The grant is listed
// as bound to the client's key.
func TestSigninDPoPClient(t *testing.T) {
	upstreamURL := startEverythingServer(t)
	up := strings.TrimSuffix(strings.TrimPrefix(upstreamURL, "http://"), "/mcp")
	base := fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
	mcpURL := base + "/mcp"
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
		guard
		resource %[1]s/mcp
		dpop required
		dpop_nonce
	}
	reverse_proxy %[2]s
}
`, base, up))
	secret := signInLink(t, c, "gina", "mcp")

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	key := make([]byte, 32)
	rand.Read(key)
	// The client's OAuth traffic (discovery, registration, the token
	// endpoint) is recorded too.
	oauthWire := &wireRecorder{}
	redirect := fmt.Sprintf("http://127.0.0.1:%d/callback", freePort(t))
	client, err := upstreamauth.New(ctx, "gateway", mcpURL, upstreamauth.Config{
		Grant: upstreamauth.GrantAuthorizationCode, RedirectURL: redirect, ClientName: "e2e broker", DPoP: upstreamauth.DPoPRequired,
	}, upstreamauth.Options{Storage: &certmagic.FileStorage{Path: filepath.Join(t.TempDir(), "storage")}, Key: key,
		HTTPOptions: []pinnedfetch.Option{pinnedfetch.WithCredentials(func(next http.RoundTripper) http.RoundTripper {
			oauthWire.next = next
			return oauthWire
		})}})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()

	// The operator's login, with the test as the person's browser.
	authURL, err := client.BeginLogin(ctx)
	if err != nil {
		t.Fatalf("BeginLogin: %v", err)
	}
	if !strings.HasPrefix(authURL, base+authserver.AuthorizePath+"?") {
		t.Fatalf("the client was sent to %s, not the gateway's authorization endpoint", authURL)
	}
	if u, _ := url.Parse(authURL); u.Query().Get("dpop_jkt") == "" {
		t.Errorf("the authorization request names no DPoP key: %v", u.Query())
	}
	b := newFormBrowser(t, base)
	resp, body := b.get(authURL)
	if resp.StatusCode == http.StatusUnauthorized {
		resp, body = b.post(signinidp.LinkPath, url.Values{"secret": {secret}})
	}
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, "e2e broker") {
		t.Fatalf("the authorization request answered %d:\n%s", resp.StatusCode, body)
	}
	back := b.consent(body)
	if back.Query().Get("iss") != base {
		t.Fatalf("sent back to %s", back.Redacted())
	}
	if err := client.Callback(ctx, back.Query()); err != nil {
		t.Fatalf("Callback: %v", err)
	}
	if st := client.State(); st.State != "ready" {
		t.Fatalf("the client after its login: %+v", st)
	}

	var wire *wireRecorder
	conn, err := upstream.Dial(ctx, upstream.Config{Name: "gateway", Transport: upstream.TransportHTTP, URL: mcpURL}, upstream.ConnOptions{
		ClientInfo: &mcp.Implementation{Name: "e2e-broker", Version: "1"},
		Credentials: func(next http.RoundTripper) http.RoundTripper {
			wire = &wireRecorder{next: next}
			return client.Transport(wire)
		},
	})
	if err != nil {
		t.Fatalf("dial the gateway: %v", err)
	}
	defer conn.Close()
	cs, err := conn.Session(ctx)
	if err != nil {
		t.Fatalf("session at the gateway: %v", err)
	}
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "test_simple_text"})
	if err != nil || res.IsError {
		t.Fatalf("tool call through the gateway: %v %+v", err, res)
	}

	// What went over the wire: DPoP on every request to the resource, one
	// nonce challenge at most, and a request the gateway took.
	var taken *sentRequest
	challenged := 0
	sent := wire.requests()
	for i, s := range sent {
		if s.url != mcpURL {
			continue
		}
		if !strings.HasPrefix(s.authz, "DPoP ") || s.proof == "" {
			t.Errorf("a %s to the resource without the DPoP scheme and a proof (%q)", s.method, strings.Fields(s.authz + " _")[0])
		}
		switch {
		case s.status == http.StatusUnauthorized:
			challenged++
		case s.status == http.StatusOK && s.method == http.MethodPost && taken == nil:
			taken = &sent[i]
		}
	}
	if taken == nil || challenged > 1 {
		t.Fatalf("requests to the resource: %d sent, %d challenged, none taken: %+v", len(sent), challenged, sent)
	}
	access := strings.TrimPrefix(taken.authz, "DPoP ")
	if !strings.HasPrefix(access, policy.AccessPrefix) {
		t.Fatalf("the client sent %.4s…, not a grant's access token", access)
	}

	// The proof the client made at the token endpoint, for its URL.
	tokenProof := ""
	for _, s := range oauthWire.requests() {
		if s.url == base+authserver.TokenPath && s.proof != "" && s.status == http.StatusOK {
			tokenProof = s.proof
		}
	}
	if tokenProof == "" {
		t.Fatalf("the client redeemed its code without a DPoP proof: %+v", oauthWire.requests())
	}

	t.Run("a replayed proof", func(t *testing.T) {
		a := postDPoP(t, mcpURL, "", taken.authz, []string{taken.proof}, initializeBody)
		wantDPoPRefusal(t, a, "invalid_dpop_proof", "used already")
	})
	t.Run("a proof for another URL", func(t *testing.T) {
		a := postDPoP(t, mcpURL, "", taken.authz, []string{tokenProof}, initializeBody)
		wantDPoPRefusal(t, a, "invalid_dpop_proof", "htu")
	})
	t.Run("a bound token as Bearer", func(t *testing.T) {
		a := postDPoP(t, mcpURL, "", "Bearer "+access, nil, initializeBody)
		wantDPoPRefusal(t, a, "invalid_token", "DPoP")
	})
	t.Run("a bound token without a proof", func(t *testing.T) {
		a := postDPoP(t, mcpURL, "", taken.authz, nil, initializeBody)
		wantDPoPRefusal(t, a, "invalid_dpop_proof", "proof")
	})

	out := listGrants(t, c, "--owner", "gina", "--json")
	var rows []policy.Token
	if err := json.Unmarshal([]byte(out), &rows); err != nil || len(rows) != 1 || rows[0].JKT == "" || rows[0].ClientName != "e2e broker" {
		t.Errorf("gina's grant, bound to the client's key: %v\n%s", err, out)
	}
	if strings.Contains(c.Logs(), access) || strings.Contains(c.Logs(), taken.proof) {
		t.Error("the access token or a proof reached caddy's log")
	}
}

// wantDPoPRefusal checks a 401 with a DPoP challenge of error code, whose
// message says word.
func wantDPoPRefusal(t *testing.T, a rawAnswer, code, word string) {
	t.Helper()
	ch, ok := dpopChallenge(t, a)
	if a.status != http.StatusUnauthorized || !ok || ch.Params["error"] != code || !strings.Contains(a.rpc.Error.Message, word) {
		t.Errorf("answered %d, challenge %v (%t), message %q; want 401 with a DPoP challenge %s saying %q", a.status, ch.Params, ok, a.rpc.Error.Message, code, word)
	}
}

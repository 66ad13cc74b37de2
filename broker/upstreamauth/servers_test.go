package upstreamauth

import (
	"bytes"
	"context"
	"crypto"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"
	"github.com/golang-jwt/jwt/v5"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/Tahul/caddy-zidane-mcp/pinnedfetch"
)

// clock is a settable test clock shared by the authorization server, the
// MCP server and the clients.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// asClient is a client known to the test authorization server.
type asClient struct {
	secret string
	pub    crypto.PublicKey
}

type asCode struct {
	client, challenge, redirect, resource string
	scopes                                []string
}

type asToken struct {
	scopes  []string
	expiry  time.Time
	revoked bool
}

type asRefresh struct {
	client    string
	scopes    []string
	resource  string
	redeemed  int
	revoked   bool
	issuedFor string // the access token issued with it
}

// testAS is a small OAuth 2.1 authorization server speaking the
// standard endpoints (RFC 8414 metadata, authorize with PKCE, token,
// RFC 7591 registration, RFC 7009 revocation) on 127.0.0.1.
type testAS struct {
	t    *testing.T
	srv  *httptest.Server
	now  func() time.Time
	ttl  time.Duration
	iss  string // the issuer (srv.URL)
	mu   sync.Mutex
	opts asOptions

	clients   map[string]*asClient
	codes     map[string]*asCode
	access    map[string]*asToken
	refresh   map[string]*asRefresh
	issued    []string // every token and secret handed out
	revoked   []string
	authSeen  []string // client authentication method of each token request
	grants    []string // grant_type of each token request
	scopeReqs []string // scope of each token request
	resources []string // resource of each token request
	authorize []url.Values
	regs      int
	idToken   string            // the ID token the IdP accepts
	jags      map[string]string // ID-JAG -> resource
}

type asOptions struct {
	authMethods     []string // token_endpoint_auth_methods_supported
	scopesSupported []string
	issMode         string // "": omit; "correct"; "wrong"
	issAdvertised   bool
	noRegistration  bool
	noRevocation    bool
	// echoSecret puts the presented client secret in error descriptions,
	// as a careless server might.
	echoSecret bool
	// grantScopes, when set, replaces the scopes a token is granted.
	grantScopes func(requested []string) []string
}

func newTestAS(t *testing.T, now func() time.Time, opts asOptions) *testAS {
	as := &testAS{
		t: t, now: now, ttl: time.Hour, opts: opts,
		clients: map[string]*asClient{}, codes: map[string]*asCode{},
		access: map[string]*asToken{}, refresh: map[string]*asRefresh{},
		jags: map[string]string{},
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /.well-known/oauth-authorization-server", as.metadata)
	mux.HandleFunc("GET /authorize", as.handleAuthorize)
	mux.HandleFunc("POST /token", as.handleToken)
	mux.HandleFunc("POST /register", as.handleRegister)
	mux.HandleFunc("POST /revoke", as.handleRevoke)
	as.srv = httptest.NewServer(mux)
	as.iss = as.srv.URL
	t.Cleanup(as.srv.Close)
	return as
}

func secretValue(prefix string) string { return prefix + "-" + rand.Text() }

func (as *testAS) addClient(id, secret string, pub crypto.PublicKey) {
	as.mu.Lock()
	defer as.mu.Unlock()
	as.clients[id] = &asClient{secret: secret, pub: pub}
}

func (as *testAS) metadata(w http.ResponseWriter, r *http.Request) {
	m := map[string]any{
		"issuer":                           as.iss,
		"authorization_endpoint":           as.iss + "/authorize",
		"token_endpoint":                   as.iss + "/token",
		"response_types_supported":         []string{"code"},
		"grant_types_supported":            []string{"authorization_code", "refresh_token", "client_credentials"},
		"code_challenge_methods_supported": []string{"S256"},
	}
	if len(as.opts.authMethods) > 0 {
		m["token_endpoint_auth_methods_supported"] = as.opts.authMethods
	}
	if len(as.opts.scopesSupported) > 0 {
		m["scopes_supported"] = as.opts.scopesSupported
	}
	if !as.opts.noRegistration {
		m["registration_endpoint"] = as.iss + "/register"
	}
	if !as.opts.noRevocation {
		m["revocation_endpoint"] = as.iss + "/revoke"
	}
	if as.opts.issAdvertised {
		m["authorization_response_iss_parameter_supported"] = true
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(m)
}

func (as *testAS) handleAuthorize(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	as.mu.Lock()
	as.authorize = append(as.authorize, q)
	_, known := as.clients[q.Get("client_id")]
	as.mu.Unlock()
	redirect, err := url.Parse(q.Get("redirect_uri"))
	if err != nil || q.Get("response_type") != "code" || q.Get("code_challenge_method") != "S256" || q.Get("code_challenge") == "" || !known {
		http.Error(w, "bad authorization request", http.StatusBadRequest)
		return
	}
	code := secretValue("code")
	as.mu.Lock()
	as.codes[code] = &asCode{client: q.Get("client_id"), challenge: q.Get("code_challenge"), redirect: q.Get("redirect_uri"), resource: q.Get("resource"), scopes: strings.Fields(q.Get("scope"))}
	as.issued = append(as.issued, code)
	as.mu.Unlock()
	rq := redirect.Query()
	rq.Set("code", code)
	rq.Set("state", q.Get("state"))
	switch as.opts.issMode {
	case "correct":
		rq.Set("iss", as.iss)
	case "wrong":
		rq.Set("iss", "https://evil.example.com")
	}
	redirect.RawQuery = rq.Encode()
	http.Redirect(w, r, redirect.String(), http.StatusFound)
}

func oauthErr(w http.ResponseWriter, status int, code, desc string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(map[string]string{"error": code, "error_description": desc})
}

// authenticate checks the client authentication of a token or revocation
// request and returns the client id and the method it used.
func (as *testAS) authenticate(r *http.Request) (string, string, error) {
	if id, secret, ok := r.BasicAuth(); ok {
		id, _ = url.QueryUnescape(id)
		secret, _ = url.QueryUnescape(secret)
		as.mu.Lock()
		cl := as.clients[id]
		as.mu.Unlock()
		if cl == nil || cl.secret == "" || cl.secret != secret {
			return id, AuthClientSecretBasic, fmt.Errorf("bad client secret %s", secret)
		}
		return id, AuthClientSecretBasic, nil
	}
	id := r.PostForm.Get("client_id")
	as.mu.Lock()
	cl := as.clients[id]
	as.mu.Unlock()
	if cl == nil {
		return id, "", fmt.Errorf("unknown client")
	}
	if secret := r.PostForm.Get("client_secret"); secret != "" {
		if cl.secret != secret {
			return id, AuthClientSecretPost, fmt.Errorf("bad client secret %s", secret)
		}
		return id, AuthClientSecretPost, nil
	}
	if a := r.PostForm.Get("client_assertion"); a != "" {
		if r.PostForm.Get("client_assertion_type") != "urn:ietf:params:oauth:client-assertion-type:jwt-bearer" || cl.pub == nil {
			return id, AuthPrivateKeyJWT, fmt.Errorf("bad assertion type")
		}
		tok, err := jwt.ParseWithClaims(a, &jwt.RegisteredClaims{}, func(*jwt.Token) (any, error) { return cl.pub, nil },
			jwt.WithValidMethods([]string{"RS256", "ES256"}), jwt.WithAudience(as.iss), jwt.WithIssuer(id), jwt.WithSubject(id),
			jwt.WithTimeFunc(as.now), jwt.WithExpirationRequired())
		if err != nil || !tok.Valid {
			return id, AuthPrivateKeyJWT, fmt.Errorf("bad assertion: %v", err)
		}
		return id, AuthPrivateKeyJWT, nil
	}
	if cl.secret != "" || cl.pub != nil {
		return id, AuthNone, fmt.Errorf("confidential client without credentials")
	}
	return id, AuthNone, nil
}

func (as *testAS) issue(w http.ResponseWriter, client string, scopes []string, resource string, withRefresh bool) {
	if as.opts.grantScopes != nil {
		scopes = as.opts.grantScopes(scopes)
	}
	at := secretValue("at")
	resp := map[string]any{"access_token": at, "token_type": "Bearer", "expires_in": int(as.ttl / time.Second)}
	if len(scopes) > 0 {
		resp["scope"] = strings.Join(scopes, " ")
	}
	as.mu.Lock()
	as.access[at] = &asToken{scopes: scopes, expiry: as.now().Add(as.ttl)}
	as.issued = append(as.issued, at)
	if withRefresh {
		rt := secretValue("rt")
		as.refresh[rt] = &asRefresh{client: client, scopes: scopes, resource: resource, issuedFor: at}
		as.issued = append(as.issued, rt)
		resp["refresh_token"] = rt
	}
	as.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(resp)
}

func (as *testAS) handleToken(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil {
		oauthErr(w, 400, "invalid_request", "form")
		return
	}
	f := r.PostForm
	client, method, err := as.authenticate(r)
	as.mu.Lock()
	as.authSeen = append(as.authSeen, method)
	as.grants = append(as.grants, f.Get("grant_type"))
	as.scopeReqs = append(as.scopeReqs, f.Get("scope"))
	as.resources = append(as.resources, f.Get("resource"))
	as.mu.Unlock()
	if err != nil {
		desc := "client authentication failed"
		if as.opts.echoSecret {
			desc += ": " + err.Error()
		}
		oauthErr(w, http.StatusUnauthorized, "invalid_client", desc)
		return
	}
	switch f.Get("grant_type") {
	case "authorization_code":
		as.mu.Lock()
		code := as.codes[f.Get("code")]
		delete(as.codes, f.Get("code"))
		as.mu.Unlock()
		sum := sha256.Sum256([]byte(f.Get("code_verifier")))
		switch {
		case code == nil || code.client != client:
			oauthErr(w, 400, "invalid_grant", "unknown code")
		case base64.RawURLEncoding.EncodeToString(sum[:]) != code.challenge:
			oauthErr(w, 400, "invalid_grant", "PKCE verification failed")
		case f.Get("redirect_uri") != code.redirect:
			oauthErr(w, 400, "invalid_grant", "redirect_uri mismatch")
		case f.Get("resource") != code.resource:
			oauthErr(w, 400, "invalid_target", "resource mismatch")
		default:
			as.issue(w, client, code.scopes, code.resource, true)
		}
	case "refresh_token":
		as.mu.Lock()
		rt := as.refresh[f.Get("refresh_token")]
		ok := rt != nil && rt.client == client && !rt.revoked && rt.redeemed == 0 && f.Get("resource") == rt.resource
		if rt != nil {
			rt.redeemed++
		}
		as.mu.Unlock()
		if !ok {
			oauthErr(w, 400, "invalid_grant", "refresh token unknown, revoked or already used")
			return
		}
		as.issue(w, client, rt.scopes, rt.resource, true)
	case "client_credentials":
		as.issue(w, client, strings.Fields(f.Get("scope")), f.Get("resource"), false)
	case "urn:ietf:params:oauth:grant-type:token-exchange":
		// The IdP side of SEP-990: an ID token for an ID-JAG.
		as.mu.Lock()
		ok := f.Get("subject_token") == as.idToken && as.idToken != "" && f.Get("audience") == as.iss && f.Get("resource") != "" &&
			f.Get("subject_token_type") == "urn:ietf:params:oauth:token-type:id_token" && f.Get("requested_token_type") == "urn:ietf:params:oauth:token-type:id-jag"
		jag := secretValue("jag")
		if ok {
			as.jags[jag] = f.Get("resource")
			as.issued = append(as.issued, jag)
		}
		as.mu.Unlock()
		if !ok {
			oauthErr(w, 400, "invalid_request", "bad token exchange")
			return
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]any{"access_token": jag, "issued_token_type": "urn:ietf:params:oauth:token-type:id-jag", "token_type": "N_A"})
	case "urn:ietf:params:oauth:grant-type:jwt-bearer":
		as.mu.Lock()
		resource, ok := as.jags[f.Get("assertion")]
		delete(as.jags, f.Get("assertion"))
		as.mu.Unlock()
		if !ok {
			oauthErr(w, 400, "invalid_grant", "unknown assertion")
			return
		}
		as.issue(w, client, strings.Fields(f.Get("scope")), resource, false)
	default:
		oauthErr(w, 400, "unsupported_grant_type", f.Get("grant_type"))
	}
}

func (as *testAS) handleRegister(w http.ResponseWriter, r *http.Request) {
	var meta struct {
		RedirectURIs []string `json:"redirect_uris"`
		Method       string   `json:"token_endpoint_auth_method"`
	}
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<16)).Decode(&meta); err != nil || len(meta.RedirectURIs) == 0 {
		oauthErr(w, 400, "invalid_client_metadata", "redirect_uris")
		return
	}
	id, secret := secretValue("dcr-client"), ""
	if meta.Method != AuthNone {
		secret = secretValue("dcr-secret")
	}
	as.mu.Lock()
	as.regs++
	as.clients[id] = &asClient{secret: secret}
	as.issued = append(as.issued, secret)
	as.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	resp := map[string]any{"client_id": id, "redirect_uris": meta.RedirectURIs, "token_endpoint_auth_method": meta.Method}
	if secret != "" {
		resp["client_secret"] = secret
	}
	json.NewEncoder(w).Encode(resp)
}

func (as *testAS) handleRevoke(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil {
		oauthErr(w, 400, "invalid_request", "form")
		return
	}
	if _, _, err := as.authenticate(r); err != nil {
		oauthErr(w, 401, "invalid_client", "client authentication failed")
		return
	}
	tok := r.PostForm.Get("token")
	as.mu.Lock()
	defer as.mu.Unlock()
	as.revoked = append(as.revoked, tok)
	if at := as.access[tok]; at != nil {
		at.revoked = true
	}
	if rt := as.refresh[tok]; rt != nil {
		rt.revoked = true
		if at := as.access[rt.issuedFor]; at != nil {
			at.revoked = true
		}
	}
}

// valid reports whether an access token is usable now, and its scopes.
func (as *testAS) valid(at string) ([]string, bool) {
	as.mu.Lock()
	defer as.mu.Unlock()
	t := as.access[at]
	if t == nil || t.revoked || !as.now().Before(t.expiry) {
		return nil, false
	}
	return t.scopes, true
}

// revokeAll makes every access and refresh token invalid at once (the
// server forgot its grants).
func (as *testAS) revokeAll() {
	as.mu.Lock()
	defer as.mu.Unlock()
	for _, t := range as.access {
		t.revoked = true
	}
	for _, t := range as.refresh {
		t.revoked = true
	}
}

// revokeAccess makes the access tokens invalid, keeping the refresh
// tokens (the resource server lost its cache, a key rotated).
func (as *testAS) revokeAccess() {
	as.mu.Lock()
	defer as.mu.Unlock()
	for _, t := range as.access {
		t.revoked = true
	}
}

func (as *testAS) secrets() []string {
	as.mu.Lock()
	defer as.mu.Unlock()
	return slices.Clone(as.issued)
}

func (as *testAS) counts() (grants []string, authSeen []string) {
	as.mu.Lock()
	defer as.mu.Unlock()
	return slices.Clone(as.grants), slices.Clone(as.authSeen)
}

// testMCP is a go-sdk MCP server behind a bearer check against the test
// authorization server, with its protected resource metadata.
type testMCP struct {
	srv *httptest.Server
	url string
	as  *testAS

	mu          sync.Mutex
	requests    int
	authorized  int
	toolScope   string   // scope tools/call requires
	prmScopes   []string // scopes_supported
	seenBearers []string
}

func newTestMCP(t *testing.T, as *testAS, prmScopes []string, toolScope string) *testMCP {
	m := &testMCP{as: as, toolScope: toolScope, prmScopes: prmScopes}
	server := mcp.NewServer(&mcp.Implementation{Name: "test-upstream", Version: "1"}, nil)
	mcp.AddTool(server, &mcp.Tool{Name: "echo", Description: "echoes"}, func(ctx context.Context, req *mcp.CallToolRequest, in struct {
		Text string `json:"text"`
	}) (*mcp.CallToolResult, any, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "echo: " + in.Text}}}, nil, nil
	})
	handler := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server }, &mcp.StreamableHTTPOptions{Stateless: true, JSONResponse: true})
	mux := http.NewServeMux()
	mux.HandleFunc("GET /.well-known/oauth-protected-resource/mcp", func(w http.ResponseWriter, r *http.Request) {
		doc := map[string]any{"resource": m.url, "authorization_servers": []string{as.iss}}
		if len(m.prmScopes) > 0 {
			doc["scopes_supported"] = m.prmScopes
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(doc)
	})
	mux.HandleFunc("/mcp", func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		r.Body = io.NopCloser(bytes.NewReader(body))
		var msg struct {
			Method string `json:"method"`
		}
		json.Unmarshal(body, &msg)
		m.mu.Lock()
		m.requests++
		m.mu.Unlock()
		prm := m.srv.URL + "/.well-known/oauth-protected-resource/mcp"
		bearer, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		scopes, valid := as.valid(bearer)
		if !ok || !valid {
			w.Header().Set("WWW-Authenticate", fmt.Sprintf(`Bearer error="invalid_token", resource_metadata=%q`, prm))
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		if msg.Method == "tools/call" && m.toolScope != "" && !slices.Contains(scopes, m.toolScope) {
			w.Header().Set("WWW-Authenticate", fmt.Sprintf(`Bearer error="insufficient_scope", scope=%q, resource_metadata=%q`, strings.Join(union(m.prmScopes, []string{m.toolScope}), " "), prm))
			http.Error(w, "forbidden", http.StatusForbidden)
			return
		}
		m.mu.Lock()
		m.authorized++
		m.seenBearers = append(m.seenBearers, bearer)
		m.mu.Unlock()
		handler.ServeHTTP(w, r)
	})
	m.srv = httptest.NewServer(mux)
	m.url = m.srv.URL + "/mcp"
	t.Cleanup(m.srv.Close)
	return m
}

func (m *testMCP) stats() (requests, authorized int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.requests, m.authorized
}

// env is one upstream with its authorization server, and what a test
// needs to build clients for it.
type env struct {
	onState func(Status) // given to the clients built
	t       *testing.T
	clock   *clock
	as      *testAS
	mcp     *testMCP
	store   *certmagic.FileStorage
	key     []byte
	logs    *syncBuffer
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func newEnv(t *testing.T, asOpts asOptions, prmScopes []string, toolScope string) *env {
	t.Helper()
	clk := newClock()
	as := newTestAS(t, clk.Now, asOpts)
	key := make([]byte, 32)
	rand.Read(key)
	return &env{
		t: t, clock: clk, as: as,
		mcp:   newTestMCP(t, as, prmScopes, toolScope),
		store: &certmagic.FileStorage{Path: t.TempDir()},
		key:   key,
		logs:  &syncBuffer{},
	}
}

const testUpstream = "up"

// client builds an upstreamauth client (a gateway replica) for the env.
func (e *env) client(cfg Config) *Client {
	e.t.Helper()
	c, err := New(context.Background(), testUpstream, e.mcp.url, cfg, Options{
		Storage: e.store,
		Key:     e.key,
		Logger:  slog.New(slog.NewJSONHandler(e.logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Now:     e.clock.Now,
		OnState: e.onState,
	})
	if err != nil {
		e.t.Fatalf("New: %v", err)
	}
	e.t.Cleanup(c.Close)
	return c
}

// httpClient is the broker's egress for the upstream: pinned to its
// origin, with c's Transport as the credential layer.
func (e *env) httpClient(c *Client) *http.Client {
	e.t.Helper()
	hc, err := pinnedfetch.New(e.mcp.url, nil, pinnedfetch.WithCredentials(c.Transport))
	if err != nil {
		e.t.Fatal(err)
	}
	return hc
}

// callEcho connects a go-sdk client through c and calls the echo tool.
func (e *env) callEcho(c *Client, text string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	client := mcp.NewClient(&mcp.Implementation{Name: "gateway", Version: "1"}, nil)
	cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: e.mcp.url, HTTPClient: e.httpClient(c), DisableStandaloneSSE: true}, nil)
	if err != nil {
		return err
	}
	defer cs.Close()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"text": text}})
	if err != nil {
		return err
	}
	if res.IsError || len(res.Content) != 1 || res.Content[0].(*mcp.TextContent).Text != "echo: "+text {
		return fmt.Errorf("unexpected result %+v", res)
	}
	return nil
}

// post sends one raw JSON-RPC request through c and returns the answer's
// status.
func (e *env) post(c *Client, replayable bool) (int, error) {
	body := `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`
	req, err := http.NewRequest(http.MethodPost, e.mcp.url, strings.NewReader(body))
	if err != nil {
		return 0, err
	}
	if !replayable {
		req.GetBody = nil
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
	resp, err := e.httpClient(c).Do(req)
	if err != nil {
		return 0, err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, nil
}

// login runs BeginLogin, plays the browser (the redirect is not
// followed) and returns the query of the redirect to the callback.
func (e *env) authorize(c *Client) (url.Values, string) {
	e.t.Helper()
	authURL, err := c.BeginLogin(context.Background())
	if err != nil {
		e.t.Fatalf("BeginLogin: %v", err)
	}
	browser := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := browser.Get(authURL)
	if err != nil {
		e.t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusFound {
		e.t.Fatalf("authorization endpoint answered %d", resp.StatusCode)
	}
	loc, err := url.Parse(resp.Header.Get("Location"))
	if err != nil {
		e.t.Fatal(err)
	}
	return loc.Query(), authURL
}

func (e *env) login(c *Client) {
	e.t.Helper()
	q, _ := e.authorize(c)
	if err := c.Callback(context.Background(), q); err != nil {
		e.t.Fatalf("Callback: %v", err)
	}
}

// stored returns the raw bytes stored for the upstream.
func (e *env) stored() []byte {
	b, err := e.store.Load(context.Background(), StorageKey(testUpstream))
	if err != nil {
		e.t.Fatalf("load: %v", err)
	}
	return b
}

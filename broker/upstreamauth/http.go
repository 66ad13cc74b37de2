package upstreamauth

import (
	"bytes"
	"context"
	"crypto"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/Tahul/caddy-zidane-mcp/pinnedfetch"
)

// Bounds of the OAuth traffic.
const (
	maxMetadataBytes = 1 << 20
	maxTokenBytes    = 1 << 20
	// requestTimeout bounds one discovery, registration, token or
	// revocation request.
	requestTimeout = 30 * time.Second
	// maxOrigins bounds the pinned clients kept (one per origin).
	maxOrigins = 16
)

// egress hands out pinnedfetch clients, one per origin: every discovery,
// registration, token and revocation request goes through a client pinned
// to the origin of its own URL, so credentials sent with it (a Basic
// Authorization, a client secret in the body) never follow a redirect
// elsewhere, HTTPS never downgrades, and plain HTTP goes to loopback only.
type egress struct {
	opts []pinnedfetch.Option

	mu      sync.Mutex
	clients map[string]*http.Client // by origin: redirects followed (GET)
	posts   map[string]*http.Client // by origin: no redirect (POST with credentials)

	// nonces are the DPoP nonces the servers handed out.
	nonces nonces
}

func newEgress(opts []pinnedfetch.Option) *egress {
	return &egress{opts: opts, clients: map[string]*http.Client{}, posts: map[string]*http.Client{}}
}

// client returns the pinned client for raw's origin. follow chooses
// whether redirects are followed: never for requests that carry a client
// credential or a grant in their body, which a 307 would replay to the
// redirect's target.
func (e *egress) client(raw string, follow bool) (*http.Client, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("URL does not parse")
	}
	origin := pinnedfetch.Origin(u)
	e.mu.Lock()
	defer e.mu.Unlock()
	m := e.clients
	if !follow {
		m = e.posts
	}
	if c, ok := m[origin]; ok {
		return c, nil
	}
	opts := e.opts
	if !follow {
		opts = append(append([]pinnedfetch.Option(nil), opts...), pinnedfetch.WithMaxRedirects(0))
	}
	c, err := pinnedfetch.New(raw, nil, opts...)
	if err != nil {
		return nil, err
	}
	if len(m) >= maxOrigins {
		for k, old := range m {
			old.CloseIdleConnections()
			delete(m, k)
			break
		}
	}
	m[origin] = c
	return c, nil
}

func (e *egress) closeIdle() {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, c := range e.clients {
		c.CloseIdleConnections()
	}
	for _, c := range e.posts {
		c.CloseIdleConnections()
	}
}

// shown is a URL as it may appear in messages: without userinfo, query or
// fragment.
func shown(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "an unparsable URL"
	}
	u.User, u.RawQuery, u.Fragment, u.RawFragment = nil, "", "", ""
	return u.String()
}

// errNotFound is a metadata fetch answered with a 4xx: the document is
// not there, try the next location.
var errNotFound = errors.New("not found")

// getJSON fetches a metadata document into v. A 4xx answer gives
// errNotFound; other failures say what went wrong without quoting the
// body.
func (e *egress) getJSON(ctx context.Context, raw string, v any) error {
	if err := checkURL(raw); err != nil {
		return fmt.Errorf("metadata URL %s: %v", shown(raw), err)
	}
	hc, err := e.client(raw, true)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, raw, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Accept", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("GET %s: %v", shown(raw), unwrapURLError(err))
	}
	defer drain(resp)
	if resp.StatusCode >= 400 && resp.StatusCode < 500 {
		return errNotFound
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s answered HTTP %d", shown(raw), resp.StatusCode)
	}
	if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt != "application/json" && !strings.HasSuffix(mt, "+json") {
		return fmt.Errorf("GET %s answered %q, not JSON", shown(raw), clip(mt, 64))
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxMetadataBytes+1))
	if err != nil {
		return fmt.Errorf("GET %s: reading the answer: %v", shown(raw), err)
	}
	if len(body) > maxMetadataBytes {
		return fmt.Errorf("GET %s: the document is larger than %d bytes", shown(raw), maxMetadataBytes)
	}
	if err := json.Unmarshal(body, v); err != nil {
		return fmt.Errorf("GET %s: the document is not valid JSON metadata", shown(raw))
	}
	return nil
}

func drain(resp *http.Response) {
	io.CopyN(io.Discard, resp.Body, 4<<10)
	resp.Body.Close()
}

// unwrapURLError drops the *url.Error wrapper, whose message quotes the
// whole URL.
func unwrapURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// clientAuth is how the gateway authenticates to one token endpoint.
type clientAuth struct {
	method   string // AuthClientSecretBasic, ...
	clientID string
	secret   string
	key      crypto.Signer
	alg      string
	kid      string
	// audience of a client assertion: the issuer, else the token endpoint.
	audience string
}

// apply adds the client authentication to a token request.
func (a clientAuth) apply(req *http.Request, form url.Values, now time.Time) error {
	switch a.method {
	case AuthClientSecretBasic:
		// RFC 6749 §2.3.1: both parts form-urlencoded before Basic.
		req.SetBasicAuth(url.QueryEscape(a.clientID), url.QueryEscape(a.secret))
	case AuthClientSecretPost:
		form.Set("client_id", a.clientID)
		form.Set("client_secret", a.secret)
	case AuthPrivateKeyJWT:
		assertion, err := a.assertion(now)
		if err != nil {
			return err
		}
		form.Set("client_id", a.clientID)
		form.Set("client_assertion_type", "urn:ietf:params:oauth:client-assertion-type:jwt-bearer")
		form.Set("client_assertion", assertion)
	default: // none
		// A jwt_bearer grant may name no client at all (RFC 7523 §3.1):
		// the assertion's subject is who asks.
		if a.clientID != "" {
			form.Set("client_id", a.clientID)
		}
	}
	return nil
}

// assertion signs the RFC 7523 client assertion: iss and sub are the
// client id, aud the authorization server, a fresh jti, five minutes of
// validity.
func (a clientAuth) assertion(now time.Time) (string, error) {
	var method jwt.SigningMethod = jwt.SigningMethodRS256
	if a.alg == "ES256" {
		method = jwt.SigningMethodES256
	}
	jti := make([]byte, 16)
	rand.Read(jti)
	tok := jwt.NewWithClaims(method, jwt.RegisteredClaims{
		Issuer:    a.clientID,
		Subject:   a.clientID,
		Audience:  jwt.ClaimStrings{a.audience},
		IssuedAt:  jwt.NewNumericDate(now),
		NotBefore: jwt.NewNumericDate(now.Add(-30 * time.Second)),
		ExpiresAt: jwt.NewNumericDate(now.Add(5 * time.Minute)),
		ID:        base64.RawURLEncoding.EncodeToString(jti),
	})
	if a.kid != "" {
		tok.Header["kid"] = a.kid
	}
	s, err := tok.SignedString(a.key)
	if err != nil {
		return "", errors.New("signing the client assertion failed")
	}
	return s, nil
}

// tokenResponse is a successful token endpoint answer (RFC 6749 §5.1,
// RFC 8693 §2.2.1).
type tokenResponse struct {
	AccessToken     string          `json:"access_token"`
	TokenType       string          `json:"token_type"`
	RefreshToken    string          `json:"refresh_token"`
	ExpiresIn       json.RawMessage `json:"expires_in"`
	Scope           string          `json:"scope"`
	IssuedTokenType string          `json:"issued_token_type"`
}

// expiresIn reads expires_in, which some servers send as a string.
func (t *tokenResponse) expiresIn() time.Duration {
	s := strings.Trim(string(t.ExpiresIn), `"`)
	var n int64
	if _, err := fmt.Sscan(s, &n); err != nil || n <= 0 {
		return 0
	}
	return time.Duration(min(n, int64(10*365*24*3600))) * time.Second
}

// postForm sends a token (or revocation) request: the form, the client
// authentication, with key a DPoP proof (RFC 9449 §5), no redirect
// followed. It returns the body of a 2xx answer; an error answer becomes
// an *oauthError with the server's code and a bounded description, never
// the request. A use_dpop_nonce answer (§8) with a nonce not tried yet
// gets one retry, with a fresh proof and client assertion.
//
// This is written here rather than with x/oauth2's Exchange and
// TokenSource because those cannot send the resource indicator (RFC 8707)
// on a refresh, cannot present a fresh private_key_jwt assertion per
// request, cannot add a DPoP proof, retry with the secret in a second place
// when the auth style is auto-detected, and quote the raw response body in
// their errors.
func (e *egress) postForm(ctx context.Context, endpoint string, form url.Values, auth *clientAuth, key *dpopKey, now time.Time, redact func(string) string) ([]byte, error) {
	name := shown(endpoint)
	if err := checkURL(endpoint); err != nil {
		return nil, fmt.Errorf("endpoint %s: %v", name, err)
	}
	hc, err := e.client(endpoint, false)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	for attempt := 0; ; attempt++ {
		data, used, oe, err := e.postOnce(ctx, hc, endpoint, form, auth, key, now, redact)
		if err != nil {
			return nil, err
		}
		if oe == nil {
			return data, nil
		}
		if key != nil && attempt == 0 && oe.Code == "use_dpop_nonce" {
			if n := e.nonces.get(nonceAS, mustParse(endpoint)); n != "" && n != used {
				continue
			}
		}
		return nil, oe
	}
}

// postOnce is one attempt of postForm: the answer's body, the DPoP nonce
// its proof carried, and the server's refusal.
func (e *egress) postOnce(ctx context.Context, hc *http.Client, endpoint string, form url.Values, auth *clientAuth, key *dpopKey, now time.Time, redact func(string) string) ([]byte, string, *oauthError, error) {
	name := shown(endpoint)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint, nil)
	if err != nil {
		return nil, "", nil, err
	}
	form = cloneValues(form)
	if auth != nil {
		if err := auth.apply(req, form, now); err != nil {
			return nil, "", nil, err
		}
	}
	var used string
	if key != nil {
		used = e.nonces.get(nonceAS, req.URL)
		proof, err := key.proof(http.MethodPost, req.URL, "", used, now)
		if err != nil {
			return nil, "", nil, err
		}
		req.Header.Set("DPoP", proof)
	}
	body := form.Encode()
	req.Body = io.NopCloser(strings.NewReader(body))
	req.ContentLength = int64(len(body))
	req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(strings.NewReader(body)), nil }
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Accept", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return nil, "", nil, fmt.Errorf("POST %s: %s", name, redact(unwrapURLError(err).Error()))
	}
	defer drain(resp)
	if key != nil {
		e.nonces.note(nonceAS, req.URL, resp.Header)
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxTokenBytes+1))
	if err != nil {
		return nil, "", nil, fmt.Errorf("POST %s: reading the answer: %v", name, err)
	}
	if len(data) > maxTokenBytes {
		return nil, "", nil, fmt.Errorf("POST %s: the answer is larger than %d bytes", name, maxTokenBytes)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		oe := &oauthError{Endpoint: name, Status: resp.StatusCode}
		var body struct {
			Error       string `json:"error"`
			Description string `json:"error_description"`
		}
		if json.Unmarshal(data, &body) == nil {
			oe.Code = clip(redact(body.Error), 64)
			oe.Description = clip(redact(body.Description), 200)
		}
		return nil, used, oe, nil
	}
	return data, used, nil, nil
}

func cloneValues(v url.Values) url.Values {
	out := make(url.Values, len(v))
	for k, vs := range v {
		out[k] = slices.Clone(vs)
	}
	return out
}

// mustParse parses a URL that checkURL accepted.
func mustParse(raw string) *url.URL {
	u, err := url.Parse(raw)
	if err != nil {
		return &url.URL{}
	}
	return u
}

// requestToken posts a grant to a token endpoint, with key a DPoP proof,
// and decodes the answer: a Bearer token, a DPoP one when key is set, or
// an issued token of another type (token exchange).
func (e *egress) requestToken(ctx context.Context, endpoint string, form url.Values, auth *clientAuth, key *dpopKey, now time.Time, redact func(string) string) (*tokenResponse, error) {
	data, err := e.postForm(ctx, endpoint, form, auth, key, now, redact)
	if err != nil {
		return nil, err
	}
	var tr tokenResponse
	if err := json.Unmarshal(data, &tr); err != nil {
		// A form-encoded answer (GitHub's, without Accept) is not read:
		// it was asked for JSON.
		return nil, fmt.Errorf("POST %s: the answer is not a JSON token response", shown(endpoint))
	}
	if tr.AccessToken == "" {
		return nil, fmt.Errorf("POST %s: the answer has no access_token", shown(endpoint))
	}
	if tr.TokenType != "" && !strings.EqualFold(tr.TokenType, "bearer") && !(key != nil && strings.EqualFold(tr.TokenType, "dpop")) && tr.IssuedTokenType == "" {
		return nil, fmt.Errorf("POST %s: the token type %q is not Bearer", shown(endpoint), clip(tr.TokenType, 32))
	}
	return &tr, nil
}

// postJSON sends a dynamic client registration request (RFC 7591).
func (e *egress) postJSON(ctx context.Context, endpoint string, v any) (int, []byte, error) {
	name := shown(endpoint)
	if err := checkURL(endpoint); err != nil {
		return 0, nil, fmt.Errorf("endpoint %s: %v", name, err)
	}
	hc, err := e.client(endpoint, false)
	if err != nil {
		return 0, nil, err
	}
	payload, err := json.Marshal(v)
	if err != nil {
		return 0, nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint, bytes.NewReader(payload))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return 0, nil, fmt.Errorf("POST %s: %v", name, unwrapURLError(err))
	}
	defer drain(resp)
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxTokenBytes+1))
	if err != nil || len(data) > maxTokenBytes {
		return 0, nil, fmt.Errorf("POST %s: the answer could not be read within %d bytes", name, maxTokenBytes)
	}
	return resp.StatusCode, data, nil
}

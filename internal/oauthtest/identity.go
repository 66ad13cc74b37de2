package oauthtest

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/golang-jwt/jwt/v5"
)

// Token types of RFC 8693 and SEP-990.
const (
	TokenTypeAccessToken = "urn:ietf:params:oauth:token-type:access_token"
	TokenTypeIDToken     = tokenTypeIDToken
	TokenTypeIDJAG       = tokenTypeIDJAG
	// IDJAGType is the typ header of an ID-JAG.
	IDJAGType = "oauth-id-jag+jwt"
)

// An AuthServer also plays the company IdP for the tests of a person's
// token without a browser: it signs ID tokens ([AuthServer.IDToken]) with
// a key of its own published at /jwks, and trades one of them, at its
// token endpoint, for an ID-JAG (a JWT it signs, SEP-990) naming the
// audience and resource asked for. Another AuthServer, the upstream's,
// trusts it with [AuthServer.TrustIdP]: it then takes that IdP's ID
// tokens as RFC 8693 subject tokens and its ID-JAGs as RFC 7523
// assertions, checking each against the IdP's published keys, and issues
// access tokens for the user the token names (its sub), which
// [AuthServer.UserOf] reports.

// idpState is what an AuthServer keeps to play an IdP, or to trust one.
type idpState struct {
	key *ecdsa.PrivateKey
	kid string
	// jagTTL is the lifetime of the ID-JAGs issued; jagOverride, when
	// set, changes an ID-JAG's claims before it is signed (a hostile IdP).
	jagTTL      time.Duration
	jagOverride func(claims jwt.MapClaims)
	// trusted is the IdP this server's exchange and jwt-bearer grants
	// accept tokens of.
	trusted *trustedIdP
}

type trustedIdP struct {
	issuer, audience string
	jwksURL          string
}

func newIdPState() idpState {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		panic(err)
	}
	return idpState{key: k, kid: NewSecret("kid"), jagTTL: 5 * time.Minute}
}

// JWKSURL is where the server publishes the public key of the tokens it
// signs as an IdP.
func (as *AuthServer) JWKSURL() string { return as.URL + "/jwks" }

func (as *AuthServer) handleJWKS(w http.ResponseWriter, r *http.Request) {
	set := jose.JSONWebKeySet{Keys: []jose.JSONWebKey{{Key: &as.idp.key.PublicKey, KeyID: as.idp.kid, Algorithm: "ES256", Use: "sig"}}}
	writeJSON(w, http.StatusOK, set)
}

// IDToken signs an ID token for user (its sub), issued to the client
// audience, that expires after ttl (a negative ttl: expired already).
func (as *AuthServer) IDToken(user, audience string, ttl time.Duration) string {
	now := as.now()
	return as.sign(jwt.MapClaims{"iss": as.URL, "sub": user, "aud": audience, "iat": now.Unix(), "exp": now.Add(ttl).Unix()}, "JWT")
}

// SetIDJAG changes the ID-JAGs the server issues as an IdP: ttl their
// lifetime (0 keeps it), and override, when not nil, changes their claims
// before they are signed (an IdP that names another audience or
// resource).
func (as *AuthServer) SetIDJAG(ttl time.Duration, override func(claims jwt.MapClaims)) {
	as.mu.Lock()
	defer as.mu.Unlock()
	if ttl != 0 {
		as.idp.jagTTL = ttl
	}
	as.idp.jagOverride = override
}

// TrustIdP makes the server take the ID tokens and ID-JAGs of the IdP
// issuer (keys at jwksURL): ID tokens issued to audience (the gateway's
// client at the IdP) as subject tokens of the token exchange grant, and
// ID-JAGs whose aud is this server as jwt-bearer assertions.
func (as *AuthServer) TrustIdP(issuer, jwksURL, audience string) {
	as.mu.Lock()
	defer as.mu.Unlock()
	as.idp.trusted = &trustedIdP{issuer: issuer, audience: audience, jwksURL: jwksURL}
}

func (as *AuthServer) sign(claims jwt.MapClaims, typ string) string {
	t := jwt.NewWithClaims(jwt.SigningMethodES256, claims)
	t.Header["kid"] = as.idp.kid
	t.Header["typ"] = typ
	s, err := t.SignedString(as.idp.key)
	if err != nil {
		panic(err)
	}
	as.mu.Lock()
	as.issued = append(as.issued, s)
	as.mu.Unlock()
	return s
}

// verifyOwn checks a JWT this server signed; it returns its claims.
func (as *AuthServer) verifyOwn(raw string) (jwt.MapClaims, error) {
	claims := jwt.MapClaims{}
	_, err := jwt.ParseWithClaims(raw, claims, func(*jwt.Token) (any, error) { return &as.idp.key.PublicKey, nil },
		jwt.WithValidMethods([]string{"ES256"}), jwt.WithIssuer(as.URL), jwt.WithTimeFunc(as.now), jwt.WithExpirationRequired())
	return claims, err
}

// verifyTrusted checks a JWT of the trusted IdP against its published
// keys: signature, iss, exp, and aud; it returns the claims.
func (as *AuthServer) verifyTrusted(raw, audience, typ string) (jwt.MapClaims, error) {
	as.mu.Lock()
	idp := as.idp.trusted
	as.mu.Unlock()
	if idp == nil {
		return nil, errors.New("no IdP is trusted")
	}
	set, err := fetchJWKS(idp.jwksURL)
	if err != nil {
		return nil, err
	}
	claims := jwt.MapClaims{}
	tok, err := jwt.ParseWithClaims(raw, claims, func(t *jwt.Token) (any, error) {
		kid, _ := t.Header["kid"].(string)
		for _, k := range set.Keys {
			if k.KeyID == kid || kid == "" {
				return k.Key, nil
			}
		}
		return nil, fmt.Errorf("no key %q at the IdP", kid)
	}, jwt.WithValidMethods([]string{"ES256", "RS256", "PS256", "EdDSA"}), jwt.WithIssuer(idp.issuer), jwt.WithAudience(audience),
		jwt.WithTimeFunc(as.now), jwt.WithExpirationRequired())
	if err != nil {
		return nil, err
	}
	if typ != "" && !strings.EqualFold(fmt.Sprint(tok.Header["typ"]), typ) {
		return nil, fmt.Errorf("the token's typ is %v, not %s", tok.Header["typ"], typ)
	}
	return claims, nil
}

func fetchJWKS(u string) (*jose.JSONWebKeySet, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nil, err
	}
	var set jose.JSONWebKeySet
	if err := json.Unmarshal(b, &set); err != nil {
		return nil, fmt.Errorf("the IdP's keys do not read: %v", err)
	}
	return &set, nil
}

// exchangeForPerson serves a token exchange grant of the new kinds, and
// reports whether it did: an ID token of the trusted IdP for an access
// token (RFC 8693, the client authenticated as the actor), or, playing the
// IdP, an ID token it signed for an ID-JAG.
func (as *AuthServer) exchangeForPerson(w http.ResponseWriter, f url.Values, client string) bool {
	switch f.Get("requested_token_type") {
	case TokenTypeAccessToken, "":
		if f.Get("subject_token_type") != TokenTypeIDToken {
			as.refused(w, http.StatusBadRequest, "invalid_request", "subject_token_type must be an ID token")
			return true
		}
		as.mu.Lock()
		cl := as.clients[client]
		idp := as.idp.trusted
		as.mu.Unlock()
		if cl == nil || (cl.secret == "" && cl.pub == nil) {
			as.refused(w, http.StatusUnauthorized, "invalid_client", "the actor of a token exchange authenticates")
			return true
		}
		if idp == nil {
			as.refused(w, http.StatusBadRequest, "invalid_grant", "no IdP is trusted")
			return true
		}
		claims, err := as.verifyTrusted(f.Get("subject_token"), idp.audience, "")
		if err != nil {
			as.refused(w, http.StatusBadRequest, "invalid_grant", "subject token refused: "+err.Error())
			return true
		}
		// An actor token (RFC 8693 §2.1) is a workload's JWT whose key
		// the server trusts (TrustWorkloadKey).
		if actor := f.Get("actor_token"); actor != "" || f.Get("actor_token_type") != "" {
			if f.Get("actor_token_type") != "urn:ietf:params:oauth:token-type:jwt" {
				as.refused(w, http.StatusBadRequest, "invalid_request", "actor_token_type must be jwt")
				return true
			}
			if err := as.checkWorkload(actor); err != nil {
				as.refused(w, http.StatusBadRequest, "invalid_grant", "actor token refused: "+err.Error())
				return true
			}
		}
		sub, _ := claims["sub"].(string)
		if sub == "" {
			as.refused(w, http.StatusBadRequest, "invalid_grant", "subject token has no sub")
			return true
		}
		as.noteUser(sub)
		as.issueExchanged(w, client, strings.Fields(f.Get("scope")), f.Get("resource"), sub)
		return true
	case TokenTypeIDJAG:
		claims, err := as.verifyOwn(f.Get("subject_token"))
		if err != nil {
			// Not one of its own ID tokens: the fixed token of
			// SetIDToken may still be it.
			return false
		}
		if f.Get("subject_token_type") != TokenTypeIDToken || f.Get("audience") == "" || f.Get("resource") == "" {
			as.refused(w, http.StatusBadRequest, "invalid_request", "bad token exchange")
			return true
		}
		as.mu.Lock()
		ttl, override := as.idp.jagTTL, as.idp.jagOverride
		as.mu.Unlock()
		now := as.now()
		jag := jwt.MapClaims{"iss": as.URL, "sub": claims["sub"], "aud": f.Get("audience"), "resource": f.Get("resource"),
			"client_id": client, "jti": NewSecret("jti"), "iat": now.Unix(), "exp": now.Add(ttl).Unix()}
		if s := f.Get("scope"); s != "" {
			jag["scope"] = s
		}
		if override != nil {
			override(jag)
		}
		signed := as.sign(jag, IDJAGType)
		writeJSON(w, http.StatusOK, map[string]any{"access_token": signed, "issued_token_type": TokenTypeIDJAG, "token_type": "N_A", "expires_in": int(ttl / time.Second)})
		return true
	}
	return false
}

// redeemIDJAG serves a jwt-bearer grant whose assertion is an ID-JAG of
// the trusted IdP, and reports whether it did.
func (as *AuthServer) redeemIDJAG(w http.ResponseWriter, f url.Values, client, jkt string) bool {
	as.mu.Lock()
	trusted := as.idp.trusted != nil
	as.mu.Unlock()
	if !trusted {
		return false
	}
	var probe jwt.RegisteredClaims
	tok, _, err := jwt.NewParser().ParseUnverified(f.Get("assertion"), &probe)
	if err != nil || !strings.EqualFold(fmt.Sprint(tok.Header["typ"]), IDJAGType) {
		return false
	}
	claims, err := as.verifyTrusted(f.Get("assertion"), as.URL, IDJAGType)
	if err != nil {
		as.refused(w, http.StatusBadRequest, "invalid_grant", "ID-JAG refused: "+err.Error())
		return true
	}
	resource, _ := claims["resource"].(string)
	if resource == "" || resource != f.Get("resource") {
		as.refused(w, http.StatusBadRequest, "invalid_target", "the ID-JAG is for another resource")
		return true
	}
	sub, _ := claims["sub"].(string)
	if sub == "" {
		as.refused(w, http.StatusBadRequest, "invalid_grant", "the ID-JAG has no sub")
		return true
	}
	as.noteUser(sub)
	as.issue(w, client, strings.Fields(f.Get("scope")), resource, noRefresh, jkt, sub)
	return true
}

// issueExchanged answers a token exchange with an access token for user,
// with the issued_token_type RFC 8693 asks for.
func (as *AuthServer) issueExchanged(w http.ResponseWriter, client string, scopes []string, resource, user string) {
	rec := httptestRecorder()
	as.issue(rec, client, scopes, resource, noRefresh, "", user)
	var body map[string]any
	_ = json.Unmarshal(rec.body, &body)
	body["issued_token_type"] = TokenTypeAccessToken
	writeJSON(w, rec.status, body)
}

// noteUser records that a token was issued for user by exchange.
func (as *AuthServer) noteUser(user string) {
	as.mu.Lock()
	defer as.mu.Unlock()
	as.exchangedUsers = append(as.exchangedUsers, user)
}

// ExchangedUsers returns the users the server issued a token for by token
// exchange or ID-JAG, in order.
func (as *AuthServer) ExchangedUsers() []string {
	as.mu.Lock()
	defer as.mu.Unlock()
	return slices.Clone(as.exchangedUsers)
}

// recorder is the smallest http.ResponseWriter that keeps an answer.
type recorder struct {
	h      http.Header
	status int
	body   []byte
}

func httptestRecorder() *recorder { return &recorder{h: http.Header{}, status: http.StatusOK} }

func (r *recorder) Header() http.Header         { return r.h }
func (r *recorder) WriteHeader(s int)           { r.status = s }
func (r *recorder) Write(b []byte) (int, error) { r.body = append(r.body, b...); return len(b), nil }

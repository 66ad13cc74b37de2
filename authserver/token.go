package authserver

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/dpop"
	"github.com/Tahul/caddy-zidane-mcp/policy"
)

// Grants keeps the grants and their tokens: *policy.TokenStore.
type Grants interface {
	// CreateGrant records a grant and issues its first tokens.
	CreateGrant(ctx context.Context, spec policy.GrantSpec, now time.Time) (policy.Issued, error)
	// RefreshGrant rotates a grant's refresh token; a spent one presented
	// again revokes the grant (policy.ErrGrantReused).
	RefreshGrant(ctx context.Context, req policy.RefreshRequest, now time.Time) (policy.Issued, error)
	// RevokeCredential revokes the grant a token of client belongs to;
	// a token it does not know is no error (RFC 7009 §2.2).
	RevokeCredential(ctx context.Context, token, client string) error
	// Revoke revokes the grant of that id, with its tokens.
	Revoke(ctx context.Context, nameOrID string) (policy.Token, error)
}

// oauthError is a refusal at the token or revocation endpoint (RFC 6749
// §5.2).
type oauthError struct {
	status      int
	code        string
	description string
}

func (s *Server) refuseJSON(w http.ResponseWriter, r *http.Request, e oauthError, ref Refusal) {
	// ref.Reason, if any, adds to the audit what the client is not told.
	ref.Error, ref.Reason = e.code, e.description+ref.Reason
	s.audit(r, ref)
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	h.Set("Pragma", "no-cache")
	if e.status == http.StatusUnauthorized {
		// RFC 6749 §5.2: a 401 names the scheme the client may use.
		h.Set("WWW-Authenticate", `Basic realm="token", error="invalid_client"`)
	}
	w.WriteHeader(e.status)
	_ = json.NewEncoder(w).Encode(map[string]string{"error": e.code, "error_description": e.description})
}

// tokenResponse is RFC 6749 §5.1's.
type tokenResponse struct {
	AccessToken  string `json:"access_token"`
	TokenType    string `json:"token_type"`
	ExpiresIn    int64  `json:"expires_in"`
	RefreshToken string `json:"refresh_token,omitempty"`
	Scope        string `json:"scope"`
}

// readClientRequest reads a form posted to the token or revocation
// endpoint by a public client. This server registers public clients alone
// (token_endpoint_auth_method none): a request that authenticates, with
// an Authorization header, a client_secret or a client assertion, is
// refused before its body is used, so that no secret is taken, kept or
// compared, and a client that believes it has one learns that it does
// not.
func (s *Server) readClientRequest(w http.ResponseWriter, r *http.Request) (map[string][]string, bool) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", "POST")
		s.refuseJSON(w, r, oauthError{http.StatusMethodNotAllowed, "invalid_request", "post the request as a form"}, Refusal{})
		return nil, false
	}
	if r.Header.Get("Authorization") != "" {
		s.refuseJSON(w, r, oauthError{http.StatusUnauthorized, "invalid_client", "this server's clients are public (token_endpoint_auth_method none): send client_id in the body and no credentials"}, Refusal{})
		return nil, false
	}
	f, err := readForm(r)
	if err != nil {
		s.refuseJSON(w, r, oauthError{http.StatusBadRequest, "invalid_request", err.Error()}, Refusal{})
		return nil, false
	}
	client := f.Get("client_id")
	for _, p := range []string{"client_secret", "client_assertion", "client_assertion_type"} {
		if _, ok := f[p]; ok {
			s.refuseJSON(w, r, oauthError{http.StatusUnauthorized, "invalid_client", "this server's clients are public (token_endpoint_auth_method none): send no " + p}, Refusal{Client: client})
			return nil, false
		}
	}
	if client == "" {
		s.refuseJSON(w, r, oauthError{http.StatusBadRequest, "invalid_request", "send client_id: this server's clients are public and name themselves"}, Refusal{})
		return nil, false
	}
	return f, true
}

// proofKey verifies the request's DPoP proof, if it has one, for a POST
// to the configured token endpoint URL, and returns its key's thumbprint:
// empty without a proof (the tokens will be Bearer).
func (s *Server) proofKey(w http.ResponseWriter, r *http.Request, client string) (string, bool) {
	proofs := r.Header.Values("DPoP")
	if len(proofs) == 0 {
		return "", true
	}
	if len(proofs) > 1 {
		s.refuseJSON(w, r, oauthError{http.StatusBadRequest, "invalid_dpop_proof", "send one DPoP header"}, Refusal{Client: client})
		return "", false
	}
	now := s.cfg.Now()
	p, err := s.dpop.Verify(r.Context(), dpop.Request{Proof: proofs[0], Method: http.MethodPost, URL: s.token, Now: now})
	if err == nil {
		return p.JKT, true
	}
	reason := "the DPoP proof is refused"
	var de *dpop.Error
	if errors.As(err, &de) {
		reason = de.Reason
	}
	switch {
	case errors.Is(err, dpop.ErrUseNonce):
		if s.dpop.Nonces != nil {
			w.Header().Set("DPoP-Nonce", s.dpop.Nonces.Issue(now))
		}
		s.refuseJSON(w, r, oauthError{http.StatusBadRequest, "use_dpop_nonce", reason}, Refusal{Client: client})
	case errors.Is(err, dpop.ErrUnavailable):
		s.refuseJSON(w, r, oauthError{http.StatusServiceUnavailable, "temporarily_unavailable", "the DPoP replay check is unavailable; try again shortly"}, Refusal{Client: client})
	default:
		s.refuseJSON(w, r, oauthError{http.StatusBadRequest, "invalid_dpop_proof", reason}, Refusal{Client: client})
	}
	return "", false
}

func (s *Server) serveToken(w http.ResponseWriter, r *http.Request) {
	f, ok := s.readClientRequest(w, r)
	if !ok {
		return
	}
	client := f["client_id"][0]
	switch gt := first(f, "grant_type"); gt {
	case "authorization_code", "refresh_token":
	case "":
		s.refuseJSON(w, r, oauthError{http.StatusBadRequest, "invalid_request", "send grant_type: authorization_code or refresh_token"}, Refusal{Client: client})
		return
	default:
		s.refuseJSON(w, r, oauthError{http.StatusBadRequest, "unsupported_grant_type", "the grant types are authorization_code and refresh_token"}, Refusal{Client: client})
		return
	}
	// The parameters are checked before the proof, whose jti the replay
	// check then spends.
	var res Resource
	if uri, ok := f["resource"]; ok {
		if res, ok = s.resource(uri[0]); !ok {
			s.refuseJSON(w, r, oauthError{http.StatusBadRequest, "invalid_target", "the resource is not one this server issues tokens for"}, Refusal{Client: client})
			return
		}
	}
	if first(f, "grant_type") == "authorization_code" {
		code, verifier, redirect := first(f, "code"), first(f, "code_verifier"), first(f, "redirect_uri")
		switch {
		case code == "":
			s.refuseJSON(w, r, oauthError{http.StatusBadRequest, "invalid_request", "send the code"}, Refusal{Client: client})
			return
		case verifier == "":
			s.refuseJSON(w, r, oauthError{http.StatusBadRequest, "invalid_request", "send the PKCE code_verifier"}, Refusal{Client: client})
			return
		case !isVerifier(verifier):
			s.refuseJSON(w, r, oauthError{http.StatusBadRequest, "invalid_request", "the code_verifier is not 43 to 128 unreserved characters (RFC 7636)"}, Refusal{Client: client})
			return
		case redirect == "":
			s.refuseJSON(w, r, oauthError{http.StatusBadRequest, "invalid_request", "send the redirect_uri of the authorization request"}, Refusal{Client: client})
			return
		}
		jkt, ok := s.proofKey(w, r, client)
		if !ok {
			return
		}
		s.codeGrant(w, r, client, code, verifier, redirect, res.URL, jkt)
		return
	}
	refresh := first(f, "refresh_token")
	if refresh == "" {
		s.refuseJSON(w, r, oauthError{http.StatusBadRequest, "invalid_request", "send the refresh_token"}, Refusal{Client: client})
		return
	}
	var scopes []string
	if sc, ok := f["scope"]; ok {
		scopes = strings.Fields(sc[0])
		if len(scopes) == 0 || len(scopes) > maxScopes {
			s.refuseJSON(w, r, oauthError{http.StatusBadRequest, "invalid_scope", fmt.Sprintf("name 1 to %d scopes, or leave scope out for the grant's", maxScopes)}, Refusal{Client: client})
			return
		}
	}
	jkt, ok := s.proofKey(w, r, client)
	if !ok {
		return
	}
	now := s.cfg.Now()
	issued, err := s.cfg.Grants.RefreshGrant(r.Context(), policy.RefreshRequest{Refresh: refresh, Client: client, Resource: res.URL, JKT: jkt, Scopes: scopes}, now)
	if err != nil {
		s.refuseJSON(w, r, grantError(err), Refusal{Client: client, Resource: res.URL})
		return
	}
	s.answerTokens(w, issued, now)
}

// grantError maps the token store's refusals onto OAuth's (RFC 6749
// §5.2, RFC 8707 §2). The store's texts say what to do and carry no
// secret; a failure of its own is not the client's to read.
func grantError(err error) oauthError {
	switch {
	case errors.Is(err, policy.ErrGrantReused), errors.Is(err, policy.ErrRefreshInvalid):
		return oauthError{http.StatusBadRequest, "invalid_grant", err.Error()}
	case errors.Is(err, policy.ErrScopeWidened):
		return oauthError{http.StatusBadRequest, "invalid_scope", err.Error()}
	case errors.Is(err, policy.ErrTargetInvalid):
		return oauthError{http.StatusBadRequest, "invalid_target", err.Error()}
	}
	return oauthError{http.StatusInternalServerError, "server_error", "the grant could not be issued; try again later"}
}

// codeGrant redeems code for client. Every mismatch is invalid_grant
// (RFC 6749 §5.2) and spends the code.
func (s *Server) codeGrant(w http.ResponseWriter, r *http.Request, client, code, verifier, redirect, resource, jkt string) {
	now := s.cfg.Now()
	var issued policy.Issued
	var rec codeRecord
	err := s.redeemCode(r.Context(), code, func(c *codeRecord) error {
		rec = *c
		switch {
		case c.Client != client:
			return errRedeem("the code was issued to another client")
		case c.Redirect != redirect:
			return errRedeem("the redirect_uri is not the authorization request's")
		case subtle.ConstantTimeCompare([]byte(s256(verifier)), []byte(c.Challenge)) != 1:
			return errRedeem("the code_verifier does not match the code_challenge")
		case resource != "" && resource != c.Resource:
			return errRedeemTarget
		case c.JKT != "" && jkt != c.JKT:
			return errRedeem("the code is bound to a DPoP key (dpop_jkt): send a DPoP proof signed with that key")
		}
		return nil
	}, func(c *codeRecord) (string, error) {
		var err error
		issued, err = s.cfg.Grants.CreateGrant(r.Context(), policy.GrantSpec{
			Owner:      c.Owner,
			Client:     c.Client,
			ClientName: c.ClientName,
			Resource:   c.Resource,
			Scopes:     c.Scopes,
			JKT:        jkt,
			AccessTTL:  s.cfg.AccessLifetime,
			RefreshTTL: s.cfg.RefreshLifetime,
		}, now)
		return issued.GrantID, err
	})
	ref := Refusal{Client: client, Owner: rec.Owner, Resource: rec.Resource}
	var reused errCodeReused
	switch {
	case err == nil:
		s.answerTokens(w, issued, now)
	case errors.As(err, &reused):
		if reused.grant != "" {
			if _, rerr := s.cfg.Grants.Revoke(r.Context(), reused.grant); rerr != nil {
				ref.Reason = "; the grant could not be revoked: " + rerr.Error()
			}
		}
		s.refuseJSON(w, r, oauthError{http.StatusBadRequest, "invalid_grant", reused.Error()}, ref)
	case errors.Is(err, errRedeemTarget):
		s.refuseJSON(w, r, oauthError{http.StatusBadRequest, "invalid_target", err.Error()}, ref)
	case errors.Is(err, errCodeUnknown), errors.Is(err, errCodeExpired), errors.As(err, new(errRedeem)):
		s.refuseJSON(w, r, oauthError{http.StatusBadRequest, "invalid_grant", err.Error()}, ref)
	default:
		s.refuseJSON(w, r, grantError(err), ref)
	}
}

func (s *Server) answerTokens(w http.ResponseWriter, issued policy.Issued, now time.Time) {
	typ := "Bearer"
	if issued.JKT != "" {
		typ = "DPoP"
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	h.Set("Pragma", "no-cache")
	_ = json.NewEncoder(w).Encode(tokenResponse{
		AccessToken:  issued.Access,
		TokenType:    typ,
		ExpiresIn:    int64(issued.AccessExpires.Sub(now) / time.Second),
		RefreshToken: issued.Refresh,
		Scope:        strings.Join(issued.Scopes, " "),
	})
}

// serveRevoke is RFC 7009's endpoint: a client revokes its own grant with
// either of its tokens. A token the server does not know is answered as a
// revoked one, so that the endpoint tells nobody which tokens exist.
func (s *Server) serveRevoke(w http.ResponseWriter, r *http.Request) {
	f, ok := s.readClientRequest(w, r)
	if !ok {
		return
	}
	client := f["client_id"][0]
	tok := first(f, "token")
	if tok == "" {
		s.refuseJSON(w, r, oauthError{http.StatusBadRequest, "invalid_request", "send the token to revoke"}, Refusal{Client: client})
		return
	}
	err := s.cfg.Grants.RevokeCredential(r.Context(), tok, client)
	switch {
	case err == nil:
		w.Header().Set("Cache-Control", "no-store")
		w.WriteHeader(http.StatusOK)
	case errors.Is(err, policy.ErrClientMismatch):
		s.refuseJSON(w, r, oauthError{http.StatusBadRequest, "unauthorized_client", "the token was issued to another client"}, Refusal{Client: client})
	default:
		s.refuseJSON(w, r, oauthError{http.StatusServiceUnavailable, "temporarily_unavailable", "the token could not be revoked now; try again"}, Refusal{Client: client})
	}
}

func first(f map[string][]string, name string) string {
	if v := f[name]; len(v) > 0 {
		return v[0]
	}
	return ""
}

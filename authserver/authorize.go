package authserver

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
)

// authzError is a refusal at the authorization endpoint after the
// redirect URI was checked: it goes back to the client (RFC 6749
// §4.1.2.1).
type authzError struct {
	code, reason string
}

// serveAuthorize runs the checks of an authorization request, in the
// order RFC 6749 §4.1.2.1 asks: until the client and its redirect URI are
// known good, a refusal is a page shown to the person, never a redirect
// (it would go wherever the request said); after, it is a redirect to that
// URI with error, state and iss.
func (s *Server) serveAuthorize(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet {
		w.Header().Set("Allow", "GET")
		s.refusePage(w, r, http.StatusMethodNotAllowed, Refusal{Error: "invalid_request", Reason: "the authorization endpoint is reached with GET"})
		return
	}
	if len(r.URL.RawQuery) > maxQuery {
		s.refusePage(w, r, http.StatusRequestURITooLong, Refusal{Error: "invalid_request", Reason: fmt.Sprintf("the request's query is over %d bytes", maxQuery)})
		return
	}
	q, qerr := readValues(r.URL.RawQuery)
	var dup errDuplicate
	if qerr != nil && !errors.As(qerr, &dup) {
		s.refusePage(w, r, http.StatusBadRequest, Refusal{Error: "invalid_request", Reason: qerr.Error()})
		return
	}
	if qerr != nil && (dup.name == "client_id" || dup.name == "redirect_uri") {
		// Two of these would give two answers to where to redirect.
		s.refusePage(w, r, http.StatusBadRequest, Refusal{Error: "invalid_request", Reason: qerr.Error()})
		return
	}
	clientID := q.Get("client_id")
	if clientID == "" {
		s.refusePage(w, r, http.StatusBadRequest, Refusal{Error: "invalid_request", Reason: "the request has no client_id"})
		return
	}
	client, err := s.cfg.Clients.Resolve(r.Context(), clientID)
	switch {
	case errors.Is(err, ErrClientUnavailable):
		w.Header().Set("Retry-After", "60")
		s.refusePage(w, r, http.StatusServiceUnavailable, Refusal{Error: "temporarily_unavailable", Client: clientID, Reason: "the client could not be looked up just now; try again in a minute: " + err.Error()})
		return
	case err != nil:
		s.refusePage(w, r, http.StatusBadRequest, Refusal{Error: "invalid_client", Client: clientID, Reason: "the client is not known here: " + err.Error()})
		return
	}
	redirect := q.Get("redirect_uri")
	if redirect == "" {
		s.refusePage(w, r, http.StatusBadRequest, Refusal{Error: "invalid_request", Client: clientID, Reason: "the request has no redirect_uri; send the one the client registered"})
		return
	}
	if err := checkRedirectShape(redirect); err != nil {
		s.refusePage(w, r, http.StatusBadRequest, Refusal{Error: "invalid_request", Client: clientID, Reason: err.Error()})
		return
	}
	if !client.AllowsRedirect(redirect) {
		s.refusePage(w, r, http.StatusBadRequest, Refusal{Error: "invalid_request", Client: clientID, Reason: "the redirect_uri is not one the client registered (redirect URIs are compared exactly, but for a loopback one's port)"})
		return
	}
	// From here on, refusals go back to the client.
	state := q.Get("state")
	back := func(e authzError, resource string) {
		s.audit(r, Refusal{Error: e.code, Reason: e.reason, Client: clientID, Resource: resource})
		v := url.Values{"error": {e.code}, "error_description": {e.reason}, "iss": {s.issuer}}
		if state != "" && len(state) <= maxState {
			v.Set("state", state)
		}
		http.Redirect(w, r, withParams(redirect, v), http.StatusFound)
	}
	if qerr != nil {
		back(authzError{"invalid_request", qerr.Error()}, "")
		return
	}
	p, aerr := s.readAuthorization(q)
	if aerr != nil {
		back(*aerr, q.Get("resource"))
		return
	}
	p.Client = client.ClientID()
	if p.Name = client.DisplayName(); p.Name == p.Client {
		// A client that gives no name is shown by its client_id, which
		// the grant records already, and which may be longer than a
		// grant's name may be.
		p.Name = ""
	}
	p.Redirect = redirect
	p.State = state

	person, ok := s.cfg.People.Current(r)
	if !ok {
		s.cfg.People.SignIn(w, r, r.URL.RequestURI())
		return
	}
	p.Owner = person.Owner
	p.Offered = scopesIn(p.Asked, person.Scopes)
	if len(p.Offered) == 0 {
		back(authzError{"access_denied", "the person signed in may grant none of the scopes asked for"}, p.Resource)
		return
	}
	s.showConsent(w, r, client, person, p)
}

// readAuthorization reads the request's parameters after the client and
// its redirect URI: response type, PKCE, resource, scopes, dpop_jkt.
func (s *Server) readAuthorization(q url.Values) (pending, *authzError) {
	var p pending
	if rt := q.Get("response_type"); rt != "code" {
		return p, &authzError{"unsupported_response_type", "the only response_type is code"}
	}
	if len(q.Get("state")) > maxState {
		return p, &authzError{"invalid_request", fmt.Sprintf("the state is over %d bytes", maxState)}
	}
	switch m := q.Get("code_challenge_method"); m {
	case "S256":
	case "":
		return p, &authzError{"invalid_request", "PKCE is required: send code_challenge with code_challenge_method=S256"}
	default:
		return p, &authzError{"invalid_request", "the only code_challenge_method is S256 (plain is refused)"}
	}
	p.Challenge = q.Get("code_challenge")
	if !isB64SHA256(p.Challenge) {
		return p, &authzError{"invalid_request", "the code_challenge is not an S256 challenge (43 base64url characters)"}
	}
	if _, ok := q["resource"]; !ok {
		return p, &authzError{"invalid_target", "the request has no resource; send resource= the URL of the MCP server the token is for (RFC 8707)"}
	}
	res, ok := s.resource(q.Get("resource"))
	if !ok {
		return p, &authzError{"invalid_target", "the resource is not one this server issues tokens for; send the URL its protected-resource metadata names"}
	}
	p.Resource = res.URL
	scope := q.Get("scope")
	if scope == "" {
		p.Asked = res.Scopes
	} else {
		asked := strings.Fields(scope)
		if len(asked) > maxScopes {
			return p, &authzError{"invalid_scope", fmt.Sprintf("the request names over %d scopes", maxScopes)}
		}
		for _, sc := range asked {
			if !contains(res.Scopes, sc) {
				return p, &authzError{"invalid_scope", fmt.Sprintf("the resource knows no scope %q; its scopes are in its metadata's scopes_supported", clip(sc))}
			}
			if !contains(p.Asked, sc) {
				p.Asked = append(p.Asked, sc)
			}
		}
	}
	if jkt, ok := q["dpop_jkt"]; ok {
		if !isB64SHA256(jkt[0]) {
			return p, &authzError{"invalid_request", "the dpop_jkt is not a JWK SHA-256 thumbprint (43 base64url characters)"}
		}
		p.JKT = jkt[0]
	}
	return p, nil
}

// resource returns the configured resource uri names, with its scheme and
// host compared without case.
func (s *Server) resource(uri string) (Resource, bool) {
	c := canonicalResource(uri)
	if c == "" {
		return Resource{}, false
	}
	if res, ok := s.cfg.Resources.Resource(c); ok {
		return res, true
	}
	for _, res := range s.cfg.Resources.All() {
		if canonicalResource(res.URL) == c {
			return res, true
		}
	}
	return Resource{}, false
}

package authserver

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/internal/formpost"
	"github.com/Tahul/caddy-zidane-mcp/internal/seal"
)

// pending is an authorization request the person is asked about: what the
// consent form carries, sealed, so that the person's answer applies to
// exactly the request that was checked.
type pending struct {
	Client    string   `json:"c"`
	Name      string   `json:"n,omitempty"`
	Redirect  string   `json:"r"`
	State     string   `json:"s,omitempty"`
	Resource  string   `json:"res"`
	Challenge string   `json:"pkce"`
	JKT       string   `json:"jkt,omitempty"`
	Owner     string   `json:"o"`
	Asked     []string `json:"a"`
	Offered   []string `json:"sc"` // the scopes asked that the person may grant
	Expires   int64    `json:"exp"`
}

// consentCookie names the cookie that binds a consent form to the browser
// it was shown in. __Host- (on https) keeps it to this origin's root,
// set by this origin alone.
func (s *Server) consentCookie() string {
	if s.secure {
		return "__Host-zidane-consent"
	}
	return "zidane-consent"
}

// browserBinding returns the browser's consent binding, setting a new one
// when it has none.
func (s *Server) browserBinding(w http.ResponseWriter, r *http.Request) string {
	if c, err := r.Cookie(s.consentCookie()); err == nil && len(c.Value) == 43 {
		return c.Value
	}
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	v := base64.RawURLEncoding.EncodeToString(b)
	http.SetCookie(w, &http.Cookie{
		Name:     s.consentCookie(),
		Value:    v,
		Path:     "/",
		HttpOnly: true,
		Secure:   s.secure,
		SameSite: http.SameSiteStrictMode,
		MaxAge:   int(s.cfg.ConsentLifetime / time.Second),
	})
	return v
}

// csrf is the form's CSRF token: a MAC of the browser's binding and of the
// sealed request, so that it is good for this browser and this request
// alone.
func (s *Server) csrf(binding, sealed string) string {
	m := hmac.New(sha256.New, s.csrfKey)
	sum := sha256.Sum256([]byte(sealed))
	m.Write(seal.AD(binding, string(sum[:])))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// sealAD binds a sealed request to the client it is for: opened with
// another client's id (a form for client A posted as client B's), it
// fails.
func sealAD(client string) []byte { return seal.AD("consent", client) }

func (s *Server) showConsent(w http.ResponseWriter, r *http.Request, client Client, person Person, p pending) {
	p.Expires = s.cfg.Now().Add(s.cfg.ConsentLifetime).Unix()
	raw, err := json.Marshal(p)
	if err != nil {
		s.refusePage(w, r, http.StatusInternalServerError, Refusal{Error: "server_error", Client: p.Client, Reason: "the consent form could not be made"})
		return
	}
	sealed := base64.RawURLEncoding.EncodeToString(s.consent.Seal(nil, raw, sealAD(p.Client)))
	binding := s.browserBinding(w, r)
	redirectHost := ""
	loopback := false
	if u, err := url.Parse(p.Redirect); err == nil {
		redirectHost = u.Hostname()
		loopback = isLoopbackHost(redirectHost)
	}
	var notOffered []string
	for _, sc := range p.Asked {
		if !contains(p.Offered, sc) {
			notOffered = append(notOffered, sc)
		}
	}
	s.page(w, http.StatusOK, consentPage{
		Issuer:       s.issuer,
		Action:       ConsentPath,
		ClientID:     p.Client,
		ClientName:   client.DisplayName(),
		RedirectHost: redirectHost,
		Loopback:     loopback,
		Resource:     p.Resource,
		Scopes:       p.Offered,
		NotOffered:   notOffered,
		Person:       person.Name,
		Owner:        person.Owner,
		Request:      sealed,
		CSRF:         s.csrf(binding, sealed),
	})
}

// serveConsent takes the person's answer. Every check that the form is
// this browser's, for this request, from this person, comes before any
// redirect; the redirect goes to the URI sealed in the form, which the
// authorization endpoint checked against the client's.
func (s *Server) serveConsent(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", "POST")
		s.refusePage(w, r, http.StatusMethodNotAllowed, Refusal{Error: "invalid_request", Reason: "the consent form is posted"})
		return
	}
	if o := r.Header.Get("Origin"); o != "" && !formpost.OriginIs(o, s.origin) {
		s.refusePage(w, r, http.StatusForbidden, Refusal{Error: "invalid_request", Reason: "the consent form was posted from another origin"})
		return
	}
	f, err := readForm(r, "scope")
	if err != nil {
		s.refusePage(w, r, http.StatusBadRequest, Refusal{Error: "invalid_request", Reason: err.Error()})
		return
	}
	clientID, sealed, token := f.Get("client_id"), f.Get("request"), f.Get("csrf")
	if clientID == "" || sealed == "" || token == "" {
		s.refusePage(w, r, http.StatusBadRequest, Refusal{Error: "invalid_request", Client: clientID, Reason: "the form lacks its client_id, request or csrf field; start the sign-in again from the client"})
		return
	}
	blob, err := base64.RawURLEncoding.DecodeString(sealed)
	var p pending
	if err == nil {
		var raw []byte
		raw, err = s.consent.Open(nil, blob, sealAD(clientID))
		if err == nil {
			err = json.Unmarshal(raw, &p)
		}
	}
	if err != nil {
		s.refusePage(w, r, http.StatusBadRequest, Refusal{Error: "invalid_request", Client: clientID, Reason: "the form's request is not one this server made for this client; start the sign-in again from the client"})
		return
	}
	cookie, cerr := r.Cookie(s.consentCookie())
	if cerr != nil || !hmac.Equal([]byte(token), []byte(s.csrf(cookie.Value, sealed))) {
		s.refusePage(w, r, http.StatusForbidden, Refusal{Error: "invalid_request", Client: p.Client, Resource: p.Resource, Reason: "the form's CSRF token is not this browser's for this request; start the sign-in again from the client"})
		return
	}
	if s.cfg.Now().Unix() > p.Expires {
		s.refusePage(w, r, http.StatusBadRequest, Refusal{Error: "invalid_request", Client: p.Client, Resource: p.Resource, Reason: "the consent form expired; start the sign-in again from the client"})
		return
	}
	person, ok := s.cfg.People.Current(r)
	if !ok || person.Owner != p.Owner {
		s.refusePage(w, r, http.StatusForbidden, Refusal{Error: "access_denied", Client: p.Client, Resource: p.Resource, Reason: "the person signed in on this browser is not the one the form was shown to; start the sign-in again from the client"})
		return
	}
	switch err := s.answerOnce(r.Context(), sealed, time.Unix(p.Expires, 0)); {
	case errors.Is(err, errFormAnswered):
		s.refusePage(w, r, http.StatusBadRequest, Refusal{Error: "invalid_request", Client: p.Client, Owner: p.Owner, Resource: p.Resource, Reason: err.Error()})
		return
	case err != nil:
		s.refusePage(w, r, http.StatusServiceUnavailable, Refusal{Error: "temporarily_unavailable", Client: p.Client, Owner: p.Owner, Resource: p.Resource, Reason: "the answer could not be recorded; start the sign-in again from the client"})
		return
	}
	back := func(v url.Values) {
		v.Set("iss", s.issuer)
		if p.State != "" {
			v.Set("state", p.State)
		}
		http.Redirect(w, r, withParams(p.Redirect, v), http.StatusSeeOther)
	}
	deny := func(reason string) {
		s.audit(r, Refusal{Error: "access_denied", Client: p.Client, Owner: p.Owner, Resource: p.Resource, Reason: reason})
		back(url.Values{"error": {"access_denied"}, "error_description": {reason}})
	}
	if f.Get("decision") != "allow" {
		deny("the person declined")
		return
	}
	granted := f["scope"]
	for _, sc := range granted {
		if !contains(p.Offered, sc) {
			s.refusePage(w, r, http.StatusBadRequest, Refusal{Error: "invalid_scope", Client: p.Client, Owner: p.Owner, Resource: p.Resource, Reason: "the form grants a scope the request did not offer; start the sign-in again from the client"})
			return
		}
	}
	// The form offered what the person could grant when it was shown; a
	// sign-in since (the IdP took a group away) may have narrowed that,
	// and the grant is what the person may grant now.
	for _, sc := range granted {
		if !contains(person.Scopes, sc) {
			s.refusePage(w, r, http.StatusForbidden, Refusal{Error: "access_denied", Client: p.Client, Owner: p.Owner, Resource: p.Resource, Reason: "you may no longer grant " + clip(sc) + " since you last signed in; start the sign-in again from the client"})
			return
		}
	}
	granted = scopesIn(p.Offered, granted) // the offered order, each once
	if len(granted) == 0 {
		deny("the person granted no scope")
		return
	}
	code, err := s.issueCode(r.Context(), codeRecord{
		Client:     p.Client,
		ClientName: p.Name,
		Redirect:   p.Redirect,
		Resource:   p.Resource,
		Challenge:  p.Challenge,
		JKT:        p.JKT,
		Owner:      p.Owner,
		Scopes:     granted,
	})
	if err != nil {
		s.audit(r, Refusal{Error: "server_error", Client: p.Client, Owner: p.Owner, Resource: p.Resource, Reason: "the code could not be stored"})
		back(url.Values{"error": {"server_error"}, "error_description": {"the authorization could not be stored; try again"}})
		return
	}
	back(url.Values{"code": {code}})
}

package caddymodule

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/broker/upstream"

	"github.com/caddyserver/caddy/v2"

	"github.com/Tahul/caddy-zidane-mcp/broker/upstreamauth"
	"github.com/Tahul/caddy-zidane-mcp/cluster"
	"github.com/Tahul/caddy-zidane-mcp/policy"
	"github.com/Tahul/caddy-zidane-mcp/storage"
)

func init() {
	caddy.RegisterModule(adminAPI{})
}

// adminAPI serves /zidane/ on Caddy's admin endpoint, so that the CLI
// changes a running server's tokens at once. Caddy builds it with New() on
// every config load, so it finds the live token store at request time.
// Every request but GET needs the admin key (see adminkey.go).
type adminAPI struct {
	storage storage.Storage
}

// CaddyModule returns the Caddy module information.
func (adminAPI) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "admin.api.zidane", New: func() caddy.Module { return new(adminAPI) }}
}

// Provision remembers the config's storage and makes sure it holds the
// admin key, which the routes that change state require.
func (a *adminAPI) Provision(ctx caddy.Context) error {
	a.storage = ctx.Storage()
	_, err := loadAdminKey(adminKeyStorage(a.storage), true)
	return err
}

// store is the storage the admin routes act on: the running config's.
// Caddy starts a config's admin routes before it provisions its apps, and
// keeps them when the config then fails to load, with the storage that
// config opened and its failure closed: the running app's is the one that
// lives.
func (a *adminAPI) store() storage.Storage {
	if app := liveApp(); app != nil && app.storage != nil {
		return app.storage
	}
	return a.storage
}

// Routes implements caddy.AdminRouter.
func (a *adminAPI) Routes() []caddy.AdminRoute {
	return []caddy.AdminRoute{
		{Pattern: "/zidane/tokens", Handler: a.keyed(a.handleTokens)},
		{Pattern: "/zidane/tokens/", Handler: a.keyed(a.handleTokens)},
		{Pattern: "/zidane/upstreams", Handler: a.keyed(a.handleUpstreams)},
		{Pattern: "/zidane/upstreams/", Handler: a.keyed(a.handleUpstreamRestart)},
		{Pattern: "/zidane/tools", Handler: a.keyed(a.handleTools)},
		{Pattern: "/zidane/tools/", Handler: a.keyed(a.handleTools)},
		{Pattern: "/zidane/audit/checkpoints/", Handler: a.keyed(a.handleAuditCheckpoint)},
		{Pattern: "/zidane/signin/links", Handler: a.keyed(a.handleSigninLinks)},
		{Pattern: "/zidane/connections", Handler: a.keyed(a.handleConnections)},
		{Pattern: "/zidane/connections/", Handler: a.keyed(a.handleConnections)},
		{Pattern: "/zidane/approvals", Handler: a.keyedReads(a.handleApprovals)},
		{Pattern: "/zidane/approvals/", Handler: a.keyedReads(a.handleApprovals)},
	}
}

// createTokenRequest is the body of POST /zidane/tokens.
type createTokenRequest struct {
	Name    string   `json:"name"`
	Scopes  []string `json:"scopes"`
	Kind    string   `json:"kind,omitempty"`
	Expires string   `json:"expires,omitempty"`
	Roots   []string `json:"roots,omitempty"`
	Owner   string   `json:"owner,omitempty"`
}

// createTokenResponse carries the secret, once.
type createTokenResponse struct {
	Token  string       `json:"token"`
	Record policy.Token `json:"record"`
}

func (a *adminAPI) handleTokens(w http.ResponseWriter, r *http.Request) error {
	ts, key, err := loadTokens(a.store(), time.Second, 30*time.Second)
	if err != nil {
		return caddy.APIError{HTTPStatus: http.StatusInternalServerError, Err: err}
	}
	defer tokenPool.Delete(key)
	store := ts.store
	rest := strings.Trim(strings.TrimPrefix(r.URL.Path, "/zidane/tokens"), "/")

	switch {
	case r.Method == http.MethodGet && rest == "":
		q := r.URL.Query()
		for _, name := range []string{"owner", "client"} {
			if len(q[name]) > 1 {
				return caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: fmt.Errorf("give %s at most once", name)}
			}
		}
		return writeJSON(w, http.StatusOK, redact(policy.FilterTokens(store.List(), q.Get("owner"), q.Get("client"))))
	case r.Method == http.MethodPost && rest == "":
		var req createTokenRequest
		dec := json.NewDecoder(io.LimitReader(r.Body, 64<<10))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&req); err != nil {
			return caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: fmt.Errorf("decoding the token request: %v", err)}
		}
		spec, err := req.spec()
		if err != nil {
			return caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: err}
		}
		secret, tok, err := store.Create(r.Context(), spec)
		if err != nil {
			return caddy.APIError{HTTPStatus: storeStatus(err, http.StatusBadRequest), Err: err}
		}
		tok.SHA256 = ""
		return writeJSON(w, http.StatusCreated, createTokenResponse{Token: secret, Record: tok})
	case r.Method == http.MethodDelete && rest == "" && r.URL.Query().Get("session") != "":
		rev, err := store.RevokeSession(r.Context(), r.URL.Query().Get("session"))
		if err != nil {
			status := storeStatus(err, http.StatusBadRequest)
			if errors.Is(err, policy.ErrTokenNotFound) {
				status = http.StatusNotFound
			}
			return caddy.APIError{HTTPStatus: status, Err: err}
		}
		return writeJSON(w, http.StatusOK, rev)
	case r.Method == http.MethodDelete && policy.IsJWTID(rest):
		rev, err := store.RevokeSubject(r.Context(), rest)
		if err != nil {
			return caddy.APIError{HTTPStatus: storeStatus(err, http.StatusBadRequest), Err: err}
		}
		return writeJSON(w, http.StatusOK, rev)
	case r.Method == http.MethodDelete && rest != "":
		tok, err := store.Revoke(r.Context(), rest)
		if err != nil {
			status := storeStatus(err, http.StatusBadRequest)
			if errors.Is(err, policy.ErrTokenNotFound) {
				status = http.StatusNotFound
			}
			return caddy.APIError{HTTPStatus: status, Err: err}
		}
		tok.SHA256 = ""
		return writeJSON(w, http.StatusOK, tok)
	default:
		return caddy.APIError{HTTPStatus: http.StatusMethodNotAllowed,
			Err: fmt.Errorf("use GET /zidane/tokens[?owner=NAME&client=ID] or POST /zidane/tokens, DELETE /zidane/tokens/<name-or-id|jwt:sub>, or DELETE /zidane/tokens?session=<session id>")}
	}
}

// upstreamListing is one entry of GET /zidane/upstreams: the upstream as
// configured (redacted), and, for one with an oauth block, the state of its
// token (never the token).
type upstreamListing struct {
	Upstream upstream.Config
	Auth     *upstreamauth.Status
}

// MarshalJSON writes the upstream's fields and an "auth" object beside
// them.
func (l upstreamListing) MarshalJSON() ([]byte, error) {
	b, err := json.Marshal(l.Upstream)
	if err != nil || l.Auth == nil {
		return b, err
	}
	auth, err := json.Marshal(l.Auth)
	if err != nil {
		return nil, err
	}
	if string(b) == "{}" {
		return []byte(`{"auth":` + string(auth) + `}`), nil
	}
	return append(append(append(b[:len(b)-1:len(b)-1], `,"auth":`...), auth...), '}'), nil
}

// handleUpstreams answers GET /zidane/upstreams: the running config's
// upstreams, as configured (placeholders kept) and with every literal
// secret in headers and env replaced by <redacted>.
func (a *adminAPI) handleUpstreams(w http.ResponseWriter, r *http.Request) error {
	if r.Method != http.MethodGet {
		return caddy.APIError{HTTPStatus: http.StatusMethodNotAllowed, Err: fmt.Errorf("use GET /zidane/upstreams")}
	}
	list := []upstreamListing{}
	if app := liveApp(); app != nil {
		for _, u := range app.upstreams {
			l := upstreamListing{Upstream: u.Redacted()}
			if c := app.OAuthClient(u.Name); c != nil {
				st := c.State()
				l.Auth = &st
			}
			list = append(list, l)
		}
	}
	sort.Slice(list, func(i, j int) bool { return list[i].Upstream.Name < list[j].Upstream.Name })
	return writeJSON(w, http.StatusOK, list)
}

// handleUpstreamRestart answers POST /zidane/upstreams/<name>/restart: the
// upstream's connections on every aggregated route end, and the next use
// connects afresh (a stdio upstream gets a new process); and POST
// /zidane/upstreams/<name>/retire, which also leaves a shared stdio
// upstream's process stopped until a call needs it.
func (a *adminAPI) handleUpstreamRestart(w http.ResponseWriter, r *http.Request) error {
	rest := strings.TrimPrefix(r.URL.Path, "/zidane/upstreams/")
	name, action, ok := strings.Cut(rest, "/")
	switch action {
	case "login", "logout", "auth":
		return a.handleUpstreamAuth(w, r, name, action)
	}
	if r.Method != http.MethodPost || !ok || name == "" || (action != "restart" && action != "retire") {
		return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: fmt.Errorf("use POST /zidane/upstreams/<name>/restart or /zidane/upstreams/<name>/retire")}
	}
	n, err := liveAggregates.restart(r.Context(), name, action == "retire")
	if err != nil {
		return caddy.APIError{HTTPStatus: http.StatusInternalServerError, Err: err}
	}
	// On NATS storage every other replica carries it out too.
	shared, aerr := announceAction(a.store(), cluster.Action{Kind: action, Upstream: name})
	if aerr != nil {
		return caddy.APIError{HTTPStatus: http.StatusBadGateway,
			Err: fmt.Errorf("upstream %q: done on this replica (%d routes), but not announced to the others: %v", name, n, aerr)}
	}
	if n == 0 && !shared {
		return caddy.APIError{HTTPStatus: http.StatusNotFound,
			Err: fmt.Errorf("no running aggregated route serves upstream %q (the pass-through route keeps no connection to %s)", name, action)}
	}
	return writeJSON(w, http.StatusOK, map[string]any{"upstream": name, "routes": n, "replicas": shared})
}

func (req createTokenRequest) spec() (policy.TokenSpec, error) {
	exp, err := policy.ParseExpiry(req.Expires)
	if err != nil {
		return policy.TokenSpec{}, err
	}
	return policy.TokenSpec{Name: req.Name, Scopes: req.Scopes, Kind: policy.Kind(req.Kind), Expires: exp, Roots: req.Roots, Owner: req.Owner}, nil
}

// redact drops the hashes from a listing: they are not secrets, but a
// listing has no use for them and they would help an offline guess.
func redact(list []policy.Token) []policy.Token {
	for i := range list {
		list[i].SHA256 = ""
	}
	return list
}

// storeStatus is the status of an admin write that failed with err: 503
// when shared storage did not answer (the write may be retried), else
// fallback.
func storeStatus(err error, fallback int) int {
	if errors.Is(err, cluster.ErrUnavailable) {
		return http.StatusServiceUnavailable
	}
	return fallback
}

func writeJSON(w http.ResponseWriter, status int, v any) error {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	return json.NewEncoder(w).Encode(v)
}

var (
	_ caddy.AdminRouter = (*adminAPI)(nil)
	_ caddy.Provisioner = (*adminAPI)(nil)
)

package caddymodule

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"

	"github.com/caddyserver/caddy/v2"

	"github.com/Tahul/caddy-zidane-mcp/pins"
)

// handleTools answers the pinned definitions:
//
//	GET  /zidane/tools                          -> every namespace's pins
//	GET  /zidane/tools/<ns>                     -> one namespace's
//	GET  /zidane/tools/<ns>/<name>              -> the item's pending change, field by field
//	POST /zidane/tools/<ns>/<name>/approve      -> pins the pending change whose digest is {"digest": …}
//	POST /zidane/tools/<ns>/<name>/reject       -> marks it rejected
//
// Segments are path-escaped: a guarded site's namespace is
// guard:<resource>. An item is a tool unless ?kind= names another kind
// (prompt, resource, resource_template, server); a resource's name is its
// URI, the server's items are instructions and serverInfo.
func (a *adminAPI) handleTools(w http.ResponseWriter, r *http.Request) error {
	app := liveApp()
	if app == nil || app.pins == nil {
		return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: errors.New("no zidane app is running")}
	}
	store := app.pins.store
	var parts []string
	if rest := strings.Trim(strings.TrimPrefix(r.URL.EscapedPath(), "/zidane/tools"), "/"); rest != "" {
		for _, p := range strings.Split(rest, "/") {
			s, err := url.PathUnescape(p)
			if err != nil || s == "" {
				return caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: fmt.Errorf("path segment %q: escape each of namespace and tool as one path segment", p)}
			}
			parts = append(parts, s)
		}
	}
	bad := func(err error) error { return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: err} }
	kind, err := pins.ParseKind(r.URL.Query().Get("kind"))
	if err != nil {
		return caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: err}
	}
	switch {
	case r.Method == http.MethodGet && len(parts) <= 1:
		ns := ""
		if len(parts) == 1 {
			ns = parts[0]
		}
		list, err := store.List(ns)
		if err != nil {
			return bad(err)
		}
		if list == nil {
			list = []pins.Namespace{}
		}
		return writeJSON(w, http.StatusOK, list)
	case r.Method == http.MethodGet && len(parts) == 2:
		d, err := store.DiffOf(parts[0], kind, parts[1])
		if err != nil {
			return bad(err)
		}
		return writeJSON(w, http.StatusOK, d)
	case r.Method == http.MethodPost && len(parts) == 3 && (parts[2] == "approve" || parts[2] == "reject"):
		var req struct {
			Digest string `json:"digest"`
		}
		body, err := io.ReadAll(io.LimitReader(r.Body, 4096))
		if err != nil {
			return caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: err}
		}
		if len(strings.TrimSpace(string(body))) > 0 {
			if err := json.Unmarshal(body, &req); err != nil {
				return caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: fmt.Errorf("the body must be {\"digest\": \"sha256:…\"} or empty: %v", err)}
			}
		}
		decide := store.Approve
		if parts[2] == "reject" {
			decide = store.Reject
		} else if req.Digest == "" {
			return caddy.APIError{HTTPStatus: http.StatusBadRequest,
				Err: errors.New(`approve needs {"digest": "sha256:…"}, the pending digest its diff shows, so that only the change read is approved`)}
		}
		ev, err := decide(r.Context(), parts[0], kind, parts[1], req.Digest)
		if err != nil {
			return caddy.APIError{HTTPStatus: http.StatusConflict, Err: err}
		}
		return writeJSON(w, http.StatusOK, map[string]any{"namespace": ev.Namespace, "kind": ev.Item.String(), "name": ev.Name, "outcome": ev.Kind,
			"old_digest": ev.Old, "new_digest": ev.New, "changed_fields": pins.ChangedFields(ev.Diff)})
	}
	return caddy.APIError{HTTPStatus: http.StatusMethodNotAllowed,
		Err: errors.New("use GET /zidane/tools[/<namespace>[/<name>]], or POST /zidane/tools/<namespace>/<name>/approve or /reject, with ?kind= for an item that is not a tool")}
}

package caddymodule

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/policy"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// JSON-RPC error codes of refusals. -32700 and -32600 are the spec's; the
// others sit in the implementation-defined server-error range.
const (
	codeParse        = -32700
	codeInvalid      = -32600
	codeUnauthorized = -32001
	codeForbidden    = -32003
	codeTooLarge     = -32013
	codeRateLimited  = -32029
)

// refuse answers a refused request with status, a JSON-RPC error body that
// says what to do, the headers the status calls for, an audit line and the
// refusal metrics. It returns nil: the refusal is the response.
func (h *Handler) refuse(w http.ResponseWriter, r *http.Request, rf refusal, status int, reason, msg string) error {
	rf.status, rf.reason, rf.message = status, reason, msg
	if status == http.StatusUnauthorized {
		challenge := fmt.Sprintf(`Bearer resource_metadata=%q`, h.metadataURL(r))
		if reason != "no_token" {
			challenge += fmt.Sprintf(`, error="invalid_token", error_description=%q`, quoteSafe(msg))
		}
		w.Header().Set("WWW-Authenticate", challenge)
	}
	return h.writeRefusal(w, rf)
}

// refuseScope answers 403 insufficient_scope, naming the scopes that would
// grant the call.
func (h *Handler) refuseScope(w http.ResponseWriter, r *http.Request, rf refusal, need []string) error {
	what := rf.call.Method
	if rf.call.Tool != "" {
		what = "tool " + rf.call.Tool
		if rf.call.Verb != "" {
			what += " verb " + rf.call.Verb
		}
	}
	rf.status, rf.reason = http.StatusForbidden, "insufficient_scope"
	if len(need) > 0 {
		rf.message = fmt.Sprintf("token %q lacks a scope for %s: it needs one of %s", rf.p.Name, what, strings.Join(need, ", "))
	} else {
		rf.message = fmt.Sprintf("no scope grants %s on this endpoint", what)
	}
	challenge := fmt.Sprintf(`Bearer resource_metadata=%q, error="insufficient_scope"`, h.metadataURL(r))
	if len(need) > 0 {
		challenge += fmt.Sprintf(`, scope=%q`, strings.Join(need, " "))
	}
	challenge += fmt.Sprintf(`, error_description=%q`, quoteSafe(rf.message))
	w.Header().Set("WWW-Authenticate", challenge)
	return h.writeRefusal(w, rf)
}

// refuseRateLimited answers 429 with Retry-After in whole seconds.
func (h *Handler) refuseRateLimited(w http.ResponseWriter, r *http.Request, rf refusal, reason string, retry time.Duration, msg string) error {
	rf.status, rf.reason, rf.message = http.StatusTooManyRequests, reason, msg
	w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(retry.Seconds()))))
	return h.writeRefusal(w, rf)
}

func (h *Handler) writeRefusal(w http.ResponseWriter, rf refusal) error {
	rf.log(h.audit)
	metricRequests.WithLabelValues("refused").Inc()
	metricRefusals.WithLabelValues(rf.reason).Inc()
	code := codeForbidden
	switch {
	case rf.status == http.StatusUnauthorized:
		code = codeUnauthorized
	case rf.status == http.StatusServiceUnavailable:
		code = -32000
	case rf.status == http.StatusTooManyRequests:
		code = codeRateLimited
	case rf.status == http.StatusRequestEntityTooLarge:
		code = codeTooLarge
	case rf.status == http.StatusBadRequest && strings.Contains(rf.message, "invalid JSON"):
		code = codeParse
	case rf.status == http.StatusBadRequest:
		code = codeInvalid
	}
	id := json.RawMessage("null")
	if rf.call.ID != nil {
		id = rf.call.ID
	}
	body, _ := json.Marshal(struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Error   struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
			Data    any    `json:"data,omitempty"`
		} `json:"error"`
	}{JSONRPC: "2.0", ID: id, Error: struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
		Data    any    `json:"data,omitempty"`
	}{Code: code, Message: rf.message, Data: map[string]string{"reason": rf.reason}}})
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(rf.status)
	_, err := w.Write(body)
	if err != nil {
		return caddyhttp.Error(rf.status, err)
	}
	return nil
}

// quoteSafe keeps a header parameter on one line and free of quotes.
func quoteSafe(s string) string {
	return strings.Map(func(r rune) rune {
		if r == '"' || r == '\\' || r < 0x20 || r == 0x7f {
			return '\''
		}
		return r
	}, s)
}

// resourceURL is the absolute URL of the protected resource for r.
func (h *Handler) resourceURL(r *http.Request) string {
	if h.resURL.IsAbs() {
		return h.resURL.String()
	}
	return requestOrigin(r) + h.resURL.Path
}

// metadataURL is where r's client finds the RFC 9728 metadata.
func (h *Handler) metadataURL(r *http.Request) string {
	if h.resURL.IsAbs() {
		u := *h.resURL
		u.Path = wellKnownResource + strings.TrimSuffix(h.resURL.Path, "/")
		return u.String()
	}
	return requestOrigin(r) + wellKnownResource + strings.TrimSuffix(h.resURL.Path, "/")
}

func requestOrigin(r *http.Request) string {
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	return scheme + "://" + r.Host
}

// servesMetadata says whether path is one of the metadata documents.
func (h *Handler) servesMetadata(path string) bool {
	return path == wellKnownResource || path == wellKnownResource+strings.TrimSuffix(h.resURL.Path, "/")
}

// serveMetadata answers RFC 9728 protected-resource metadata.
func (h *Handler) serveMetadata(w http.ResponseWriter, r *http.Request) error {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		return caddyhttp.Error(http.StatusMethodNotAllowed, fmt.Errorf("metadata is read with GET"))
	}
	doc := map[string]any{
		"resource":                 h.resourceURL(r),
		"bearer_methods_supported": []string{"header"},
		"resource_name":            "caddy-zidane-mcp",
		"scopes_supported":         h.scopeNames(),
	}
	if h.JWT != nil {
		doc["authorization_servers"] = []string{h.JWT.Issuer}
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "max-age=300")
	return json.NewEncoder(w).Encode(doc)
}

func (h *Handler) scopeNames() []string {
	seen := map[string]bool{}
	var out []string
	rules := h.Scopes
	if !h.NoDefaultScopes {
		rules = append(policy.DefaultRules(), rules...)
	}
	for _, r := range rules {
		if !seen[r.Scope] {
			seen[r.Scope] = true
			out = append(out, r.Scope)
		}
	}
	return out
}

package caddymodule

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/Tahul/caddy-zidane-mcp/edge"
	"github.com/Tahul/caddy-zidane-mcp/message"
	"github.com/Tahul/caddy-zidane-mcp/policy"
)

// refuse answers a refused request with the verdict's status, a JSON-RPC
// error body that says what to do, the headers the status calls for, an
// audit line and the refusal metrics. It returns nil: the refusal is the
// response.
func (h *Handler) refuse(w http.ResponseWriter, r *http.Request, rf refusal, v edge.Verdict) error {
	rf.status, rf.reason, rf.message = v.Status, v.Reason, v.Message
	traceSteps(r).refused(rf)
	if v.ToolError {
		return h.writeToolError(w, rf)
	}
	switch {
	case v.Status == http.StatusUnauthorized:
		challenge := fmt.Sprintf(`Bearer resource_metadata=%q`, h.metadataURL(r))
		if v.Reason != "no_token" {
			challenge += fmt.Sprintf(`, error="invalid_token", error_description=%q`, quoteSafe(v.Message))
		}
		w.Header().Set("WWW-Authenticate", challenge)
	case v.Reason == edge.ReasonScope:
		challenge := fmt.Sprintf(`Bearer resource_metadata=%q, error="insufficient_scope"`, h.metadataURL(r))
		if len(v.Need) > 0 {
			challenge += fmt.Sprintf(`, scope=%q`, strings.Join(v.Need, " "))
		}
		challenge += fmt.Sprintf(`, error_description=%q`, quoteSafe(v.Message))
		w.Header().Set("WWW-Authenticate", challenge)
	}
	if v.RetryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(v.RetryAfter.Seconds()))))
	}
	if v.Allow != "" {
		w.Header().Set("Allow", v.Allow)
	}
	return h.writeRefusal(w, rf, v.Code, v.Data)
}

// refuseRateLimited answers 429 with Retry-After in whole seconds.
func (h *Handler) refuseRateLimited(w http.ResponseWriter, r *http.Request, rf refusal, reason string, retry time.Duration, msg string) error {
	v := edge.Refuse(http.StatusTooManyRequests, reason, msg)
	v.RetryAfter = retry
	return h.refuse(w, r, rf, v)
}

func (h *Handler) writeRefusal(w http.ResponseWriter, rf refusal, code int, extra map[string]any) error {
	rf.log(h.audit)
	metricRequests.WithLabelValues("refused").Inc()
	metricRefusals.WithLabelValues(rf.reason).Inc()
	if code == 0 {
		switch rf.status {
		case http.StatusUnauthorized:
			code = message.CodeUnauthorized
		case http.StatusServiceUnavailable:
			code = message.CodeUnavailable
		case http.StatusTooManyRequests:
			code = message.CodeRateLimited
		case http.StatusRequestEntityTooLarge:
			code = message.CodeTooLarge
		case http.StatusBadRequest, http.StatusNotFound, http.StatusMethodNotAllowed, http.StatusUnsupportedMediaType:
			code = message.CodeInvalidRequest
		default:
			code = message.CodeForbidden
		}
	}
	id := json.RawMessage("null")
	if raw := rf.call.ID.Raw(); raw != nil {
		id = raw
	}
	data := map[string]any{"reason": rf.reason}
	for k, v := range extra {
		data[k] = v
	}
	body, _ := json.Marshal(struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Error   rpcError        `json:"error"`
	}{JSONRPC: "2.0", ID: id, Error: rpcError{Code: code, Message: rf.message, Data: data}})
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(rf.status)
	_, err := w.Write(body)
	if err != nil {
		return caddyhttp.Error(rf.status, err)
	}
	return nil
}

// writeToolError answers a refused tools/call with a tool error: a result
// whose content says why, with isError set, which the model reads (a
// JSON-RPC error would read as the gateway failing). It is audited and
// counted as the other refusals are.
func (h *Handler) writeToolError(w http.ResponseWriter, rf refusal) error {
	rf.log(h.audit)
	metricRequests.WithLabelValues("refused").Inc()
	metricRefusals.WithLabelValues(rf.reason).Inc()
	type content struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	body, _ := json.Marshal(struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Result  struct {
			Content []content `json:"content"`
			IsError bool      `json:"isError"`
		} `json:"result"`
	}{JSONRPC: "2.0", ID: rf.call.ID.Raw(), Result: struct {
		Content []content `json:"content"`
		IsError bool      `json:"isError"`
	}{Content: []content{{Type: "text", Text: rf.message}}, IsError: true}})
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	_, err := w.Write(body)
	return err
}

type rpcError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
	Data    any    `json:"data,omitempty"`
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

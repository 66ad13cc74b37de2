package edge

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"

	"github.com/Tahul/caddy-zidane-mcp/message"
)

// WriteRefusal answers a request refused with v: its status, a JSON-RPC
// error whose message says what to do and whose data carries the reason,
// and the headers the status calls for (the WWW-Authenticate challenge of
// a 401 or an insufficient_scope 403, which points at res's metadata for
// r; Retry-After; Allow). A v with ToolError answers a tools/call with a
// tool error instead (see [Verdict]). id is the refused call's JSON-RPC id,
// nil for none. The error is the write's: the answer is the refusal.
func WriteRefusal(w http.ResponseWriter, r *http.Request, res ProtectedResource, v Verdict, id json.RawMessage) error {
	if v.ToolError {
		return writeToolError(w, v.Message, id)
	}
	if v.Result != nil {
		return writeResult(w, v.Result, id)
	}
	if c := Challenge(v, res, r); c != "" {
		w.Header().Set("WWW-Authenticate", c)
	}
	if c := DPoPChallenge(v, res, r); c != "" {
		w.Header().Add("WWW-Authenticate", c)
	}
	if v.DPoPNonce != "" {
		w.Header().Set("DPoP-Nonce", v.DPoPNonce)
	}
	if v.RetryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(v.RetryAfter.Seconds()))))
	}
	if v.Allow != "" {
		w.Header().Set("Allow", v.Allow)
	}
	if id == nil {
		id = json.RawMessage("null")
	}
	data := map[string]any{"reason": v.Reason}
	for k, val := range v.Data {
		data[k] = val
	}
	body, _ := json.Marshal(struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Error   rpcError        `json:"error"`
	}{JSONRPC: "2.0", ID: id, Error: rpcError{Code: RefusalCode(v), Message: v.Message, Data: data}})
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(v.Status)
	_, err := w.Write(body)
	return err
}

type rpcError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
	Data    any    `json:"data,omitempty"`
}

// RefusalCode is the JSON-RPC error code of the refusal v: its own Code,
// else the code of its status, each code meaning one thing (a failed
// credential and an unknown session are told apart).
func RefusalCode(v Verdict) int {
	if v.Code != 0 {
		return v.Code
	}
	switch v.Status {
	case http.StatusUnauthorized:
		return message.CodeUnauthorized
	case http.StatusServiceUnavailable:
		return message.CodeUnavailable
	case http.StatusTooManyRequests:
		return message.CodeRateLimited
	case http.StatusRequestEntityTooLarge:
		return message.CodeTooLarge
	case http.StatusBadRequest, http.StatusNotFound, http.StatusMethodNotAllowed, http.StatusUnsupportedMediaType:
		return message.CodeInvalidRequest
	default:
		return message.CodeForbidden
	}
}

// Challenge is the WWW-Authenticate value of the refusal v of r, or ""
// when v calls for none: a 401 names where res's metadata is, and, but
// for a request without a credential, error="invalid_token" with the
// message; an insufficient_scope refusal adds the scopes that would grant
// the call. go-sdk's auth.RequireBearerToken writes no error= parameter,
// which clients read to tell a bad token from a missing scope: this
// writes its own.
//
// A site that takes DPoP-bound tokens only has no Bearer challenge (see
// [DPoPChallenge]), and a refusal whose error is DPoP's puts it there.
func Challenge(v Verdict, res ProtectedResource, r *http.Request) string {
	if res.DPoPRequired {
		return ""
	}
	switch {
	case v.Status == http.StatusUnauthorized:
		c := fmt.Sprintf(`Bearer resource_metadata=%q`, res.MetadataURL(r))
		if v.Reason != ReasonNoToken && v.DPoPError == "" {
			c += fmt.Sprintf(`, error="invalid_token", error_description=%q`, quoteSafe(v.Message))
		}
		return c
	case v.Reason == ReasonScope:
		c := fmt.Sprintf(`Bearer resource_metadata=%q, error="insufficient_scope"`, res.MetadataURL(r))
		if len(v.Need) > 0 {
			c += fmt.Sprintf(`, scope=%q`, strings.Join(v.Need, " "))
		}
		return c + fmt.Sprintf(`, error_description=%q`, quoteSafe(v.Message))
	}
	return ""
}

// DPoPChallenge is the DPoP challenge (RFC 9449 §7.1) of the refusal v of
// r, beside or instead of the Bearer one, or "" when res checks no proofs
// or v calls for none: a 401 names the metadata and the algorithms, and
// v's DPoP error when it has one; on a site that takes bound tokens only,
// it carries what the Bearer challenge would (invalid_token,
// insufficient_scope).
func DPoPChallenge(v Verdict, res ProtectedResource, r *http.Request) string {
	if len(res.DPoPAlgs) == 0 {
		return ""
	}
	code := v.DPoPError
	switch {
	case v.Status == http.StatusUnauthorized:
		if code == "" && res.DPoPRequired && v.Reason != ReasonNoToken {
			code = "invalid_token"
		}
	case v.Reason == ReasonScope && res.DPoPRequired:
		code = "insufficient_scope"
	default:
		return ""
	}
	c := fmt.Sprintf(`DPoP resource_metadata=%q, algs=%q`, res.MetadataURL(r), strings.Join(res.DPoPAlgs, " "))
	if code == "" {
		return c
	}
	c += fmt.Sprintf(`, error=%q`, code)
	if code == "insufficient_scope" && len(v.Need) > 0 {
		c += fmt.Sprintf(`, scope=%q`, strings.Join(v.Need, " "))
	}
	return c + fmt.Sprintf(`, error_description=%q`, quoteSafe(v.Message))
}

// writeToolError answers a refused tools/call with a tool error: a result
// whose content says why, with isError set, which the model reads (a
// JSON-RPC error would read as the gateway failing).
func writeToolError(w http.ResponseWriter, msg string, id json.RawMessage) error {
	type content struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	type result struct {
		Content []content `json:"content"`
		IsError bool      `json:"isError"`
	}
	body, _ := json.Marshal(struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Result  result          `json:"result"`
	}{JSONRPC: "2.0", ID: id, Result: result{Content: []content{{Type: "text", Text: msg}}, IsError: true}})
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	_, err := w.Write(body)
	return err
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

// writeResult answers a call with the gateway's own JSON-RPC result.
func writeResult(w http.ResponseWriter, result map[string]any, id json.RawMessage) error {
	if id == nil {
		id = json.RawMessage("null")
	}
	body, err := json.Marshal(struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Result  map[string]any  `json:"result"`
	}{JSONRPC: "2.0", ID: id, Result: result})
	if err != nil {
		return err
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	_, err = w.Write(body)
	return err
}

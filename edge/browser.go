package edge

import (
	"fmt"
	"net"
	"net/http"
	"strings"

	"golang.org/x/net/http/httpguts"

	"github.com/Tahul/caddy-zidane-mcp/pinnedfetch"
	"github.com/Tahul/caddy-zidane-mcp/policy"
)

// CheckHostOrigin is step 1: with localhostProtection, on a loopback
// listener a Host that is not loopback is a DNS-rebinding attempt (the
// spec's localhost rule); a browser Origin must be one origins allows.
func CheckHostOrigin(r *http.Request, origins *policy.Origins, localhostProtection bool) Verdict {
	if v := CheckHost(r, localhostProtection); !v.Allowed() {
		return v
	}
	if origin := r.Header.Get("Origin"); !origins.Allowed(origin, r.Host) {
		return Refuse(http.StatusForbidden, "origin",
			fmt.Sprintf("Origin %q is not allowed to call this MCP endpoint; an operator can add it to allowed_origins", origin))
	}
	return Verdict{}
}

// CheckHost refuses, with localhostProtection, a request that arrived on a
// loopback listener with a Host that is not this machine: a page of
// another site whose name a DNS rebinding pointed here.
func CheckHost(r *http.Request, localhostProtection bool) Verdict {
	if localhostProtection && onLoopbackListener(r) && !policy.HostIsLoopback(r.Host) {
		return Refuse(http.StatusForbidden, "host",
			fmt.Sprintf("Host %q is not this machine: this endpoint listens on loopback only; if a proxy in front sets another Host, set disable_localhost_protection", r.Host))
	}
	return Verdict{}
}

// onLoopbackListener reports whether r arrived on a loopback address.
func onLoopbackListener(r *http.Request) bool {
	addr, _ := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
	return pinnedfetch.IsLoopbackSocket(addr)
}

// allowedCORSHeaders are the request headers a preflight always allows
// (DPoP: a bound token's proof, RFC 9449).
const allowedCORSHeaders = "Authorization, DPoP, Content-Type, Accept, Mcp-Session-Id, Mcp-Protocol-Version, Last-Event-ID, Mcp-Method, Mcp-Name"

// maxCORSParamHeaders bounds the Mcp-Param-* names a preflight is allowed.
const maxCORSParamHeaders = 64

// corsAllowHeaders is what a preflight allows: the MCP headers, and the
// Mcp-Param-* headers (2026-07-28, one per x-mcp-header binding, so no
// fixed list names them) that the browser asks for, each a plain header
// name; the edge checks their values against the body like any client's.
func corsAllowHeaders(requested []string) string {
	out := allowedCORSHeaders
	n := 0
	for _, line := range requested {
		for name := range strings.SplitSeq(line, ",") {
			name = strings.TrimSpace(name)
			if n < maxCORSParamHeaders && len(name) <= 128 && len(name) > len("mcp-param-") &&
				strings.EqualFold(name[:len("mcp-param-")], "mcp-param-") && httpguts.ValidHeaderFieldName(name) {
				out += ", " + name
				n++
			}
		}
	}
	return out
}

// Preflight sets the CORS headers of a browser's request, whose Origin
// [CheckHostOrigin] allowed, and answers its preflight request, saying
// whether it did.
func Preflight(w http.ResponseWriter, r *http.Request) bool {
	origin := r.Header.Get("Origin")
	if origin == "" {
		return false
	}
	h := w.Header()
	h.Set("Access-Control-Allow-Origin", origin)
	h.Add("Vary", "Origin")
	h.Set("Access-Control-Expose-Headers", "Mcp-Session-Id, WWW-Authenticate, Retry-After, DPoP-Nonce")
	if r.Method != http.MethodOptions || r.Header.Get("Access-Control-Request-Method") == "" {
		return false
	}
	h.Set("Access-Control-Allow-Methods", "GET, POST, DELETE, OPTIONS")
	h.Set("Access-Control-Allow-Headers", corsAllowHeaders(r.Header.Values("Access-Control-Request-Headers")))
	h.Set("Access-Control-Max-Age", "600")
	w.WriteHeader(http.StatusNoContent)
	return true
}

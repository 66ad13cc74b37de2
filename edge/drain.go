package edge

import (
	"net/http"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/message"
)

// ReasonDraining refuses a new session on a replica that is shutting down.
const ReasonDraining = "draining"

// Drain is the rule of a replica that is shutting down: it finishes the
// sessions it holds and opens none. A request that would open a
// 2025-11-25 MCP session (an initialize without a session id) is refused
// 503 with a Retry-After, so that the client opens it on another replica;
// every other request is allowed: a 2026-07-28 request opens no session,
// and a request on a session goes on where the session is held. b is the
// request's body as read, nil for none.
func Drain(httpMethod string, header http.Header, b *message.Body) Verdict {
	if httpMethod != http.MethodPost || header.Get("Mcp-Session-Id") != "" || b == nil {
		return Verdict{}
	}
	for _, c := range b.Calls {
		if c.Method == "initialize" {
			v := Refuse(http.StatusServiceUnavailable, ReasonDraining,
				"this gateway replica is shutting down and opens no new session: retry, and the load balancer sends you to another replica")
			v.RetryAfter = time.Second
			return v
		}
	}
	return Verdict{}
}

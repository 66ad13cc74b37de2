package edge

import (
	"encoding/json"
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

// HealthPath answers a load balancer's health check on every site the
// edge serves, without a token.
const HealthPath = "/zidane/healthz"

// Health is what a replica's health check says of it.
type Health struct {
	// Draining: the replica is shutting down.
	Draining bool
	// Cluster: the replica's storage is a cluster's (NATS), and
	// Connected, whether NATS is reachable now.
	Cluster, Connected bool
}

// ServeHealth answers GET HealthPath: status "ok" (200) while the replica
// takes new work, "draining" (503) once it is shutting down, so that the
// balancer sends new sessions elsewhere; and on a cluster's storage
// whether NATS is reachable, which does not fail the check (each replica
// then limits on its own, and every replica loses NATS at once).
func ServeHealth(w http.ResponseWriter, r *http.Request, h Health) {
	w.Header().Set("Cache-Control", "no-store")
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "use GET "+HealthPath, http.StatusMethodNotAllowed)
		return
	}
	status, code := "ok", http.StatusOK
	if h.Draining {
		status, code = "draining", http.StatusServiceUnavailable
	}
	out := map[string]string{"status": status, "storage": "local"}
	if h.Cluster {
		out["storage"], out["nats"] = "nats", "away"
		if h.Connected {
			out["nats"] = "connected"
		}
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(out)
}

package caddymodule

import (
	"net/http"

	"github.com/caddyserver/caddy/v2"

	"github.com/Tahul/caddy-zidane-mcp/cluster"
)

// HealthzPath answers a load balancer's health check on every site that
// zidane_mcp serves, without a token: 200 while the replica takes new
// work, 503 once it is shutting down.
const HealthzPath = "/zidane/healthz"

// draining says whether this process is shutting down (a variable for
// tests).
var draining = caddyExiting

func caddyExiting() bool { return caddy.Exiting() }

// serveHealthz answers GET HealthzPath with the replica's state: status
// "ok" (200) or "draining" (503), and on NATS storage whether NATS is
// reachable, which does not fail the check (each replica then limits on
// its own, and every replica loses NATS at once).
func (h *Handler) serveHealthz(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Cache-Control", "no-store")
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "use GET "+HealthzPath, http.StatusMethodNotAllowed)
		return
	}
	status, code := "ok", http.StatusOK
	if draining() {
		status, code = "draining", http.StatusServiceUnavailable
	}
	out := map[string]string{"status": status, "storage": "local"}
	if h.app != nil {
		if cs, ok := h.app.storage.(*cluster.Storage); ok {
			out["storage"], out["nats"] = "nats", "away"
			if cs.Connected() {
				out["nats"] = "connected"
			}
		}
	}
	_ = writeJSON(w, code, out)
}

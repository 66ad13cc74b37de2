package caddymodule

import (
	"net/http"

	"github.com/caddyserver/caddy/v2"

	"github.com/Tahul/caddy-zidane-mcp/cluster"
	"github.com/Tahul/caddy-zidane-mcp/edge"
)

// HealthzPath answers a load balancer's health check (edge.ServeHealth).
const HealthzPath = edge.HealthPath

// draining says whether this process is shutting down (a variable for
// tests).
var draining = caddyExiting

func caddyExiting() bool { return caddy.Exiting() }

// serveHealthz answers the health check with this replica's state.
func (h *Handler) serveHealthz(w http.ResponseWriter, r *http.Request) {
	health := edge.Health{Draining: draining()}
	if h.app != nil {
		if cs, ok := h.app.storage.(*cluster.Storage); ok {
			health.Cluster, health.Connected = true, cs.Connected()
		}
	}
	edge.ServeHealth(w, r, health)
}

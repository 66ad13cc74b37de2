package caddymodule

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// Collectors are created once per process and registered on every config's
// registry (Caddy gives each config a fresh one), so counts survive reloads.
var (
	metricRequests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "zidane", Subsystem: "mcp", Name: "requests_total",
		Help: "Requests seen by zidane_mcp, by decision (allowed or refused).",
	}, []string{"decision"})
	metricRefusals = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "zidane", Subsystem: "mcp", Name: "refusals_total",
		Help: "Refused requests by reason.",
	}, []string{"reason"})
	metricRateLimited = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "zidane", Subsystem: "mcp", Name: "rate_limited_total",
		Help: "Requests refused by a rate limit, by bucket kind (token or ip).",
	}, []string{"bucket"})
	metricTokenRequests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "zidane", Subsystem: "mcp", Name: "token_requests_total",
		Help: "Allowed requests per token name: which tokens are in use. Never labelled by secret.",
	}, []string{"token"})

	// metricAllowed is requests_total{decision="allowed"}, looked up once:
	// every allowed request counts on it.
	metricAllowed = metricRequests.WithLabelValues("allowed")
)

func registerMetrics(reg *prometheus.Registry) error {
	if reg == nil {
		return nil
	}
	for _, c := range []prometheus.Collector{metricRequests, metricRefusals, metricRateLimited, metricTokenRequests} {
		if err := reg.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if !errors.As(err, &are) {
				return err
			}
		}
	}
	return nil
}

package caddymodule

import (
	"errors"
	"net/http"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/Tahul/caddy-zidane-mcp/broker"
	"github.com/Tahul/caddy-zidane-mcp/policy"
	"github.com/Tahul/caddy-zidane-mcp/sessions"
)

// Collectors are created once per process and registered on every config's
// registry (Caddy gives each config a fresh one), so counts survive reloads.
// They are named as Caddy names its own (caddy_http_…): namespace caddy,
// subsystem zidane. Every label takes a value from a set fixed by the code
// or by the config (a refusal reason, an upstream's name, a route kind),
// never a token's, a child token's or a JWT subject's name: one series per
// user or per session would grow without bound.
var (
	metricRequests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "caddy", Subsystem: "zidane", Name: "requests_total",
		Help: "Requests seen by zidane_mcp, by decision (allowed or refused).",
	}, []string{"decision"})
	metricRefusals = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "caddy", Subsystem: "zidane", Name: "refusals_total",
		Help: "Refused requests by reason.",
	}, []string{"reason"})
	metricRateLimited = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "caddy", Subsystem: "zidane", Name: "rate_limited_total",
		Help: "Requests refused by a rate limit, by bucket kind (token or ip).",
	}, []string{"bucket"})
	metricCredentialRequests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "caddy", Subsystem: "zidane", Name: "credential_requests_total",
		Help: "Allowed requests by the kind of principal (user or machine) and of credential (token, child_token or jwt).",
	}, []string{"kind", "credential"})
	metricUpstreamCalls = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: "caddy", Subsystem: "zidane", Name: "upstream_call_duration_seconds",
		Help: "Time from a request's arrival to the end of the upstream's answer, for the calls the routes send to upstream MCP servers (POST), by upstream, route kind (broker, aggregate, egress, guard) and outcome (ok, error, canceled, auth_required, http_4xx, http_5xx).",
		// Caddy's own request histograms use the default buckets too;
		// tool calls that run an agent or a build take minutes, so the
		// range goes past the default 10s.
		Buckets: append(prometheus.DefBuckets, 30, 60, 120, 300),
	}, []string{"upstream", "route", "outcome"})
	metricSessionsOpen = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "caddy", Subsystem: "zidane", Name: "sessions_open",
		Help: "Agent sessions on this replica that have not ended.",
	}, func() float64 { open, _ := sessionCounts(); return float64(open) })
	metricAgentsRunning = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "caddy", Subsystem: "zidane", Name: "agents_running",
		Help: "Agent processes on this replica that run or are being launched (what max_agents bounds).",
	}, func() float64 { _, agents := sessionCounts(); return float64(agents) })

	// metricAllowed is requests_total{decision="allowed"}, looked up once:
	// every allowed request counts on it.
	metricAllowed = metricRequests.WithLabelValues("allowed")
)

func registerMetrics(reg *prometheus.Registry) error {
	if reg == nil {
		return nil
	}
	for _, c := range []prometheus.Collector{metricRequests, metricRefusals, metricRateLimited, metricCredentialRequests,
		metricUpstreamCalls, metricSessionsOpen, metricAgentsRunning} {
		if err := reg.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if !errors.As(err, &are) {
				return err
			}
		}
	}
	return nil
}

// countAllowed counts an allowed request by what kind of principal and
// credential made it.
func countAllowed(p policy.Principal) {
	metricAllowed.Inc()
	metricCredentialRequests.WithLabelValues(string(p.Kind), credentialKind(p)).Inc()
}

// credentialKind is the bounded name of p's credential.
func credentialKind(p policy.Principal) string {
	switch {
	case p.Source == "jwt":
		return "jwt"
	case p.Parent != "":
		return "child_token"
	default:
		return "token"
	}
}

// observeUpstreamCall puts one upstream call on the latency histogram.
// Only POSTs are calls: a GET is a stream that lasts as long as the
// client listens, and a DELETE ends a session.
func observeUpstreamCall(c broker.CallRecord) {
	if c.HTTPMethod != http.MethodPost {
		return
	}
	metricUpstreamCalls.WithLabelValues(c.Upstream, routeKind(c.Route), callOutcome(c)).Observe(c.Duration.Seconds())
}

// routeKind is the mode part of a route identity ("broker:github",
// "aggregate", "egress:github", "guard:https://…"), which holds the
// resource URL for a guard: the label keeps the mode alone.
func routeKind(route string) string {
	kind, _, _ := strings.Cut(route, ":")
	kind, _, _ = strings.Cut(kind, "|")
	return kind
}

// callOutcome keeps the outcomes the broker names, and folds an upstream's
// other answers (their status text) into their status class.
func callOutcome(c broker.CallRecord) string {
	switch c.Outcome {
	case broker.OutcomeOK, broker.OutcomeError, broker.OutcomeCanceled, broker.OutcomeAuthRequired:
		return c.Outcome
	}
	switch {
	case c.Status >= 500:
		return "http_5xx"
	case c.Status >= 400:
		return "http_4xx"
	}
	return broker.OutcomeError
}

// liveEngines are the session engines of this process, for the gauges.
// They are kept here, not read from sessionsPool, whose Range waits for an
// engine that is being built (restoring its sessions from storage) and
// would hold a scrape that long.
var liveEngines sync.Map // *sessions.Engine -> struct{}

// sessionCounts sums the open sessions and running agents of every
// session engine in this process.
func sessionCounts() (open, agents int) {
	liveEngines.Range(func(k, _ any) bool {
		o, a := k.(*sessions.Engine).Counts()
		open += o
		agents += a
		return true
	})
	return open, agents
}

package caddymodule

import (
	"net/http"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/Tahul/caddy-zidane-mcp/edge"
)

// refuse answers a refused request (edge.WriteRefusal) after its audit
// line and the refusal metrics. It returns nil: the refusal is the
// response.
func (h *Handler) refuse(w http.ResponseWriter, r *http.Request, rf refusal, v edge.Verdict) error {
	rf.status, rf.reason, rf.message = v.Status, v.Reason, v.Message
	traceSteps(r).refused(rf)
	rf.log(h.audit)
	metricRequests.WithLabelValues("refused").Inc()
	metricRefusals.WithLabelValues(rf.reason).Inc()
	// The challenge needs the resource's URL alone.
	err := edge.WriteRefusal(w, r, edge.ProtectedResource{URL: h.resURL}, v, rf.call.ID.Raw())
	if err != nil && !v.ToolError {
		return caddyhttp.Error(v.Status, err)
	}
	return err
}

// refuseRateLimited answers 429 with Retry-After in whole seconds.
func (h *Handler) refuseRateLimited(w http.ResponseWriter, r *http.Request, rf refusal, reason string, retry time.Duration, msg string) error {
	v := edge.Refuse(http.StatusTooManyRequests, reason, msg)
	v.RetryAfter = retry
	return h.refuse(w, r, rf, v)
}

// protectedResource is what this site's RFC 9728 metadata says.
func (h *Handler) protectedResource() edge.ProtectedResource {
	res := edge.ProtectedResource{URL: h.resURL, Scopes: h.scopes.Names()}
	if h.JWT != nil {
		res.AuthorizationServers = []string{h.JWT.Issuer}
	}
	return res
}

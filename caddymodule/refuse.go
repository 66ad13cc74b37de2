package caddymodule

import (
	"net/http"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/Tahul/caddy-zidane-mcp/edge"
)

// refuse answers a refused request (edge.WriteRefusal) after its audit
// line and the refusal metrics. It returns nil: the refusal is the
// response.
func (h *Handler) refuse(w http.ResponseWriter, r *http.Request, rf refusal, v edge.Verdict) error {
	rf.status, rf.reason, rf.message = v.Status, v.Reason, v.Message
	rf.rule, rf.ruleError = v.Rule, v.RuleError
	traceSteps(r).refused(rf)
	rf.log(h.audit)
	metricRequests.WithLabelValues("refused").Inc()
	metricRefusals.WithLabelValues(rf.reason).Inc()
	// The challenge needs the resource's URL and DPoP settings alone.
	err := edge.WriteRefusal(w, r, h.challengeResource(), v, rf.call.ID.Raw())
	if err != nil && !v.ToolError {
		return caddyhttp.Error(v.Status, err)
	}
	return err
}

// challengeResource is what a refusal's challenges say of this site.
func (h *Handler) challengeResource() edge.ProtectedResource {
	res := edge.ProtectedResource{URL: h.resURL, DPoPRequired: h.dpop.Required}
	if h.dpop.On() {
		res.DPoPAlgs = edge.DPoPAlgorithms()
	}
	return res
}

// protectedResource is what this site's RFC 9728 metadata says.
func (h *Handler) protectedResource() edge.ProtectedResource {
	res := h.challengeResource()
	res.Scopes = h.offered
	if h.JWT != nil {
		res.AuthorizationServers = []string{h.JWT.Issuer}
	}
	// The gateway's own authorization server first: it is the one that
	// signs a person in for any MCP client.
	if iss := h.app.signinIssuer(); iss != "" {
		res.AuthorizationServers = append([]string{iss}, res.AuthorizationServers...)
	}
	return res
}

package caddymodule

import (
	"fmt"
	"log/slog"
	"net/http"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"
	"go.uber.org/zap/exp/zapslog"

	"github.com/Tahul/caddy-zidane-mcp/broker"
	"github.com/Tahul/caddy-zidane-mcp/edge"
	"github.com/Tahul/caddy-zidane-mcp/pinnedfetch"
)

// guardUpstreamName names the guarded server in the pass-through's
// messages and its upstream_call and redirect audit lines.
const guardUpstreamName = "guard"

// buildGuardUpstream sets up `guard { upstream URL }`: the broker's
// pass-through to the guarded server in place of the next handler, under
// the guard's route identity (so its sealed session ids are the guard's),
// with the guard's upstream headers and max_response. Caddy's
// reverse_proxy would forward every header of the client's but
// Authorization; the pass-through sends only the MCP transport's, and the
// operator's upstream headers, to the configured URL only.
func (h *Handler) buildGuardUpstream(ctx caddy.Context, app *App, g *edge.Guard, sessionKey []byte) (edge.Route, error) {
	u := broker.Upstream{Name: guardUpstreamName, URL: h.Guard.Upstream, MaxResponse: h.Guard.MaxResponse}
	for _, k := range sortedMapKeys(h.Guard.UpstreamHeaders) {
		if broker.ReservedUpstreamHeader(http.CanonicalHeaderKey(k)) {
			return nil, fmt.Errorf("guard upstream_header %s: with upstream, the guard sets or passes this header itself (the MCP transport's headers and framing); remove the upstream_header", k)
		}
	}
	// The values are resolved here, once, and handed over as they are:
	// the pass-through attaches them in its egress client, on the pinned
	// origin only, and never expands them.
	headers, err := guardHeaderValues(h.Guard.UpstreamHeaders)
	if err != nil {
		return nil, err
	}
	logger := ctx.Logger().Named("guard")
	// The guard dials the one host the operator configured, whatever
	// address it resolves to, as the reverse_proxy it replaces would; it
	// follows no redirect, so no answer of the server's can send it to
	// another host.
	allowPrivate := false
	pt, err := broker.NewPassThrough(u, broker.PassThroughOptions{
		Headers: headers,
		// The URL holds no placeholder (checkGuardUpstream): nothing to
		// look up.
		Lookup:               func(string) (string, bool) { return "", false },
		NoRedirects:          true,
		DenyPrivateAddresses: &allowPrivate,
		SessionKey:           sessionKey,
		Route:                g.Route,
		MaxBodyBytes:         h.MaxBodyBytes,
		AnswerBudget:         app.answerBudget,
		OnDecision:           func(d pinnedfetch.Decision) { auditRedirect(h.audit, u.Name, d) },
		OnCall:               func(c broker.CallRecord) { auditUpstreamCall(h.audit, c) },
		OnRefusal: func(r broker.Refusal) {
			metricRefusals.WithLabelValues(r.Reason).Inc()
			auditBrokerRefusal(h.audit, r)
		},
		Logger: slog.New(zapslog.NewHandler(logger.Core())),
	})
	if err != nil {
		return nil, fmt.Errorf("guard upstream: %w", err)
	}
	h.passThrough = pt
	for _, k := range sortedMapKeys(headers) {
		if headers[k] == "" {
			logger.Warn("guard upstream_header is empty, and is sent so", zap.String("header", k))
		}
	}
	return &edge.GuardUpstream{Guard: g, Handler: pt}, nil
}

// guardHeaderValues resolves the guard's upstream headers once. Only
// placeholders known before any request (such as {env.VAR} and
// {file.PATH}) can be: a request's placeholder would let the client choose
// what the server is sent. A placeholder that resolves empty is refused:
// "Bearer {env.UNSET}" would send "Bearer ". Errors name the header and
// the placeholder, never a value.
func guardHeaderValues(headers map[string]string) (map[string]string, error) {
	if len(headers) == 0 {
		return nil, nil
	}
	repl := caddy.NewReplacer()
	out := make(map[string]string, len(headers))
	for _, k := range sortedMapKeys(headers) {
		v, err := repl.ReplaceOrErr(headers[k], true, true)
		if err != nil {
			return nil, fmt.Errorf("guard upstream_header %s: with upstream, its value is read once, when Caddy starts, so give a placeholder known then and not empty, such as {env.VAR} or {file.PATH}: %w", k, err)
		}
		out[k] = v
	}
	return out, nil
}

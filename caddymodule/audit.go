package caddymodule

import (
	"context"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"
	"go.uber.org/zap/exp/zapslog"
	"go.uber.org/zap/zapcore"

	"github.com/Tahul/caddy-zidane-mcp/approvals"
	"github.com/Tahul/caddy-zidane-mcp/clustersessions"
	"github.com/Tahul/caddy-zidane-mcp/edge"
	"github.com/Tahul/caddy-zidane-mcp/mcpendpoint"
	"github.com/Tahul/caddy-zidane-mcp/message"
	"github.com/Tahul/caddy-zidane-mcp/policy"
	"github.com/Tahul/caddy-zidane-mcp/sessions"
)

// auditLoggerName is the logger every audit line goes to. A Caddy `log`
// block with `include http.handlers.zidane_mcp.audit` routes it to a file.
const auditLoggerName = "http.handlers.zidane_mcp.audit"

// auditLoggerOf is the audit logger of the configuration of ctx: the
// handler module's logger, named audit, which Caddy's logging matches
// against each log's include and exclude lists as it does any module's
// (caddy.Logging.Logger). A handler writes the lines of its requests here.
func auditLoggerOf(ctx caddy.Context) *zap.Logger {
	return ctx.Logger(Handler{}).Named("audit")
}

// auditLogger is the audit logger for everything outside a handler's
// request: the admin API, the CLI's changes through it, pooled stores and
// clients, watchers and background goroutines. Each line it writes goes
// through the audit logger of the configuration running at that moment
// (see auditConfig), so holding it across reloads is right. caddy.Log(),
// Caddy's default logger, is not: it never reaches a log block that
// includes the audit logger by name, and the README's config excludes the
// audit logger from the default log.
//
// To write an audit event: auditLogger().Info(msg, zap.String("event",
// kind), …) (Warn for a refusal); in a handler's request, h.audit.
func auditLogger() *zap.Logger { return runningAuditLogger }

var runningAuditLogger = zap.New(auditCore{}).Named(auditLoggerName)

// The configurations the audit logger can write through: Caddy's running
// one first; with none running, the last the zidane app started (Caddy
// stops a config after it takes it off as the running one, and Caddy's
// log writers outlive their config), else the one it is provisioning (the
// first config's events before it starts, such as an OAuth client's).
var (
	auditStarted      atomic.Pointer[caddy.Context]
	auditProvisioning atomic.Pointer[caddy.Context]
	auditTarget       atomic.Pointer[auditTargetCore] // the core of the last config written through
)

type auditTargetCore struct {
	ctx  context.Context // the config's, which identifies it
	core zapcore.Core
}

// auditConfig is the configuration whose audit logger takes a line now,
// or the zero Context when there is none.
func auditConfig() caddy.Context {
	if ctx := caddy.ActiveContext(); ctx.Context != nil {
		return ctx
	}
	if ctx := auditStarted.Load(); ctx != nil {
		return *ctx
	}
	if ctx := auditProvisioning.Load(); ctx != nil {
		return *ctx
	}
	return caddy.Context{}
}

// currentAuditCore is the core of auditConfig's audit logger, built once
// per configuration.
func currentAuditCore() zapcore.Core {
	ctx := auditConfig()
	if ctx.Context == nil {
		return caddy.Log().Core() // no configuration was ever loaded
	}
	if t := auditTarget.Load(); t != nil && t.ctx == ctx.Context {
		return t.core
	}
	t := &auditTargetCore{ctx: ctx.Context, core: auditLoggerOf(ctx).Core()}
	auditTarget.Store(t)
	return t.core
}

// auditCore is the core of auditLogger: it hands each entry to the core of
// the audit logger of the configuration running when it is written.
type auditCore struct{ fields []zapcore.Field }

func (c auditCore) target() zapcore.Core {
	core := currentAuditCore()
	if len(c.fields) > 0 {
		core = core.With(c.fields)
	}
	return core
}

func (c auditCore) Enabled(l zapcore.Level) bool { return currentAuditCore().Enabled(l) }

func (c auditCore) With(fields []zapcore.Field) zapcore.Core {
	return auditCore{fields: append(slices.Clip(c.fields), fields...)}
}

func (c auditCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	return c.target().Check(e, ce)
}

func (c auditCore) Write(e zapcore.Entry, fields []zapcore.Field) error {
	return c.target().Write(e, fields)
}

func (c auditCore) Sync() error { return currentAuditCore().Sync() }

// auditSlog is auditLogger for a package that logs with log/slog.
func auditSlog() *slog.Logger {
	return slog.New(zapslog.NewHandler(auditLogger().Core(), zapslog.WithName(auditLoggerName)))
}

// auditTokenEvent records a token lifecycle change. It names the token and
// its id, never the secret or its hash. A grant's events are named for the
// grant (grant_created, grant_refreshed, grant_refresh_reused,
// grant_revoked) and name its client and resource.
func auditTokenEvent(ev policy.TokenEvent) {
	t := ev.Token
	event, msg := "token_"+ev.Action, "token "+ev.Action
	if strings.HasPrefix(ev.Action, "grant_") {
		event, msg = ev.Action, strings.ReplaceAll(ev.Action, "_", " ")
	}
	fields := []zap.Field{
		zap.String("event", event),
		zap.String("token_id", t.ID),
		zap.String("token_name", t.Name),
		zap.String("kind", string(t.Kind)),
		zap.Strings("scopes", t.Scopes),
	}
	if t.Owner != "" {
		fields = append(fields, zap.String("owner", t.Owner))
	}
	if t.Parent != "" {
		fields = append(fields, zap.String("parent", t.Parent))
	}
	if t.Session != "" {
		fields = append(fields, zap.String("session", t.Session), zap.String("purpose", string(t.Purpose)))
	}
	if t.IsGrant() {
		fields = append(fields, zap.String("client", t.Client), zap.String("resource", t.Resource), zap.Bool("dpop_bound", t.JKT != ""))
		if t.Refresh != nil {
			fields = append(fields, zap.Uint64("generation", t.Refresh.Generation))
		}
	}
	if t.Expires != nil {
		fields = append(fields, zap.Time("expires", *t.Expires))
	}
	auditLogger().Info(msg, fields...)
}

// refusal is everything the audit log says about a refused request.
type refusal struct {
	status   int
	reason   string // short machine word: origin, no_token, invalid_token, …
	message  string // what the client is told, and what to do
	p        policy.Principal
	clientIP string
	via      string // on a request another replica forwarded: that replica's address (clientIP is the client's)
	origin   string
	method   string // HTTP method
	call     message.Call
	// rule, when an operator's rule refused the call, is its place
	// ("global policy, rule 2"); ruleError is why it failed closed, if
	// it did (the client is told the rule's message alone).
	rule, ruleError string
}

func (rf refusal) log(l *zap.Logger) {
	fields := []zap.Field{
		zap.String("event", "refused"),
		zap.Int("status", rf.status),
		zap.String("reason", rf.reason),
		zap.String("detail", rf.message),
		zap.String("client_ip", rf.clientIP),
		zap.String("http_method", rf.method),
	}
	if rf.via != "" {
		fields = append(fields, zap.String("via", rf.via))
	}
	if rf.origin != "" {
		fields = append(fields, zap.String("origin", rf.origin))
	}
	if rf.p.TokenID != "" {
		fields = append(fields, zap.String("token_id", rf.p.TokenID), zap.String("token_name", rf.p.Name))
	}
	if rf.call.Method != "" {
		fields = append(fields, zap.String("rpc_method", rf.call.Method))
	}
	if rf.call.Tool != "" {
		fields = append(fields, zap.String("tool", rf.call.Tool))
	}
	if rf.call.Verb != "" {
		fields = append(fields, zap.String("verb", rf.call.Verb))
	}
	if rf.rule != "" {
		fields = append(fields, zap.String("rule", rf.rule), zap.String("effect", "deny"))
		if rf.ruleError != "" {
			fields = append(fields, zap.String("rule_error", rf.ruleError))
		}
	}
	l.Warn("request refused", fields...)
}

// logApprovalAnswer records an answer to a held call's approval, or a
// refused answer: which approval, of whose call, by whom.
func logApprovalAnswer(e approvals.Event) {
	fields := []zap.Field{
		zap.String("event", "approval_"+e.Action),
		zap.String("approval", e.ID),
		zap.String("rule", e.Rule),
		zap.String("site", e.Site),
		zap.String("caller", e.Caller),
		zap.String("by", e.By),
		zap.String("by_token_id", e.With),
	}
	if e.Round != "" {
		fields = append(fields, zap.String("round", e.Round))
	}
	what := "approval answered"
	if e.Round != "" {
		what = "approved call's round"
	}
	if e.Err != nil {
		auditLogger().Warn(what+" refused", append(fields, zap.String("reason", e.Err.Error()))...)
		return
	}
	auditLogger().Info(what, fields...)
}

// logRuleAllowed records a call that an operator's allow rule let
// through: who called what, and which rule, never the arguments.
func logRuleAllowed(l *zap.Logger, p policy.Principal, rd edge.RuleDecision, clientIP string) {
	fields := []zap.Field{
		zap.String("event", "rule_allowed"),
		zap.String("rule", rd.Rule),
		zap.String("effect", rd.Effect),
		zap.String("rpc_method", rd.Call.Method),
		zap.String("token_id", p.TokenID),
		zap.String("token_name", p.Name),
		zap.String("client_ip", clientIP),
	}
	switch {
	case rd.Call.Tool != "":
		fields = append(fields, zap.String("tool", rd.Call.Tool))
	case rd.Call.Prompt != "":
		fields = append(fields, zap.String("prompt", rd.Call.Prompt))
	}
	l.Info("call allowed by a rule", fields...)
}

// logToolCall records an allowed tool call: who called which tool and verb,
// never its arguments.
func logToolCall(l *zap.Logger, p policy.Principal, c message.Call, clientIP string) {
	ce := l.Check(zap.InfoLevel, "tool call")
	if ce == nil {
		return // the audit log is off at this level: build nothing
	}
	fields := []zap.Field{
		zap.String("event", "tool_call"),
		zap.String("tool", c.Tool),
		zap.String("token_id", p.TokenID),
		zap.String("token_name", p.Name),
		zap.String("kind", string(p.Kind)),
		zap.String("client_ip", clientIP),
	}
	if c.Verb != "" {
		fields = append(fields, zap.String("verb", c.Verb))
	}
	ce.Write(fields...)
}

// auditDrop records an answer the listing filter kept from the client:
// one it could not match to a request of the client's, or not read
// unambiguously, or too large to filter. r is the request as the route
// serves it, with its principal.
func (h *Handler) auditDrop(r *http.Request, d edge.Drop) {
	p, _ := policy.PrincipalFrom(r.Context())
	metricRefusals.WithLabelValues(d.Reason).Inc()
	fields := []zap.Field{
		zap.String("event", "answer_dropped"),
		zap.String("reason", d.Reason),
		zap.String("token_id", p.TokenID),
		zap.String("token_name", p.Name),
		zap.String("client_ip", clientIP(r)),
		zap.String("http_method", r.Method),
	}
	if d.Item != "" {
		fields = append(fields, zap.String("item", d.Item))
	}
	if d.ID != "" {
		fields = append(fields, zap.String("rpc_id", d.ID))
	}
	if d.Approval != "" {
		fields = append(fields, zap.String("approval", d.Approval))
	}
	h.audit.Warn("answer dropped", fields...)
}

// auditLaunchDenied records an agent launch the session engine refused
// because the session's directory has become the gateway's own since the
// session was created: no tool call answers that refusal.
func auditLaunchDenied(owner sessions.Owner, sessionID string, err error) {
	metricRefusals.WithLabelValues("denied_path").Inc()
	auditLogger().Warn("agent launch refused",
		zap.String("event", "launch_refused"),
		zap.String("reason", "denied_path"),
		zap.String("detail", err.Error()),
		zap.String("token_id", owner.TokenID),
		zap.String("token_name", owner.TokenName),
		zap.String("session", sessionID))
}

// auditToolRefusal records a tool call the sessions endpoint refused on its
// own rules: a session of another owner, or an orchestrator's tools beyond
// its creator's scopes. It names the caller, never the session's owner.
func auditToolRefusal(r mcpendpoint.Refusal) {
	metricRefusals.WithLabelValues(r.Reason).Inc()
	fields := []zap.Field{
		zap.String("event", "tool_refused"),
		zap.String("reason", r.Reason),
		zap.String("detail", r.Message),
		zap.String("token_id", r.Principal.TokenID),
		zap.String("token_name", r.Principal.Name),
		zap.String("tool", r.Tool),
		zap.String("verb", r.Verb),
	}
	if r.Target != "" {
		fields = append(fields, zap.String("target", r.Target))
	}
	auditLogger().Warn("tool call refused", fields...)
}

// auditRPCRefusal records a request of another replica about a session
// this node runs, refused for whom it acts for (clustersessions): a
// caller this node does not take, or a claim of more than its credential
// grants here. Only a holder of the cluster key sends either, or a
// replica whose token store or jwt settings differ from this one's.
func auditRPCRefusal(r clustersessions.Refusal) {
	metricRefusals.WithLabelValues(r.Reason).Inc()
	auditLogger().Warn("request of another replica refused",
		zap.String("event", "refused"),
		zap.String("reason", r.Reason),
		zap.String("detail", r.Message),
		zap.String("token_id", r.TokenID),
		zap.String("from_node", r.From),
		zap.String("rpc_verb", r.Method),
		zap.String("target", r.ID),
	)
}

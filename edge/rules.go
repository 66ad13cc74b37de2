package edge

import (
	"net/http"

	"github.com/Tahul/caddy-zidane-mcp/approvals"
	"github.com/Tahul/caddy-zidane-mcp/message"
	"github.com/Tahul/caddy-zidane-mcp/policy"
	"github.com/Tahul/caddy-zidane-mcp/policy/rules"
)

// The route variable of the operator's rules: which route decides.
const (
	RuleRouteGuard     = "guard"
	RuleRouteBroker    = "broker"
	RuleRouteAggregate = "aggregate"
	RuleRouteSessions  = "sessions"
)

// ReasonRule is the refusal of a call by a deny rule of the operator's
// (or by a rule that failed closed).
const ReasonRule = "denied_by_rule"

// ruleVerdict applies the operator's rules (package policy/rules) to c on
// the route named route, where v is what the route's own checks decided.
// The rules come after every other check and before the scopes' word is
// final:
//
//   - a refusal other than insufficient_scope (a machine token on the
//     sessions endpoint, a tool the upstream's lists keep back, a header
//     that disagrees with the body) stands, and no rule runs;
//   - a deny rule that holds, or any rule that fails closed, refuses the
//     call with 403 denied_by_rule and the rule's message, never its
//     expression: a JSON-RPC error, as a scope refusal is answered, so
//     that a batch is refused whole either way;
//   - an allow rule that holds lets through a call that the scopes alone
//     refuse, when grantable says a rule may grant it: on the aggregated
//     route only a call that one upstream serves, the rule's upstream;
//   - otherwise the scopes decide.
//
// An approve rule that holds refuses the call with ReasonApproval and the
// call to hold (Verdict.Held), which [Approvals.Settle] holds for a
// person's approval or lets through once approved; where nothing settles
// it, it stays a refusal.
//
// The verdict names the deciding rule (Rule, RuleEffect) for the audit
// line, allowed or not.
func ruleVerdict(set *rules.Set, route string, p policy.Principal, c message.Call, upstream string, grantable bool, v Verdict) Verdict {
	if set.Len() == 0 || c.IsResponse() || (!v.Allowed() && v.Reason != ReasonScope) {
		return v
	}
	rv := set.Decide(ruleInput(route, p, c, upstream))
	switch rv.Effect {
	case rules.Deny, rules.Approve:
		r := Verdict{Status: http.StatusForbidden, Reason: ReasonRule, Message: rv.Rule.Message,
			Rule: rv.Rule.Where, RuleEffect: string(rv.Effect)}
		if rv.Err != nil {
			r.RuleEffect = string(rules.Deny)
			r.RuleError = rv.Err.Error()
			return r
		}
		if rv.Effect == rules.Approve {
			r.Reason = ReasonApproval
			r.Message += " (this call needs a person's approval)"
			r.Held = &approvals.Call{Rule: rv.Rule.Where, Message: rv.Rule.Message, Self: rv.Rule.Self,
				Route: route, Upstream: upstream, Method: c.Method, Tool: c.Tool, Prompt: c.Prompt, URI: c.URI,
				Owner: p.OwnerID(), Credential: p.TokenID, Arguments: c.Arguments}
		}
		return r
	case rules.Allow:
		switch {
		case v.Allowed():
		case grantable:
			v = Verdict{}
		default:
			return v
		}
		v.Rule, v.RuleEffect = rv.Rule.Where, string(rules.Allow)
	}
	return v
}

// ruleVisible is what the rules make of a listed item that the route's
// own checks show (shown) or hide, on the same terms as ruleVerdict: a
// deny rule that holds whatever the arguments hides it, an allow rule
// that may hold shows one hidden for want of a scope (grantable), and
// otherwise the route's checks decide. A call of an item shown may still
// be refused on its arguments.
func ruleVisible(set *rules.Set, route string, p policy.Principal, it Item, upstream string, grantable, shown bool) bool {
	if set.Len() == 0 {
		return shown
	}
	switch set.Listed(ruleInput(route, p, it.Use(), upstream)) {
	case rules.Deny:
		return false
	case rules.Allow:
		return shown || grantable
	}
	return shown
}

// ruleInput is c as the rules read it.
func ruleInput(route string, p policy.Principal, c message.Call, upstream string) rules.Input {
	in := rules.Input{
		Principal: rules.Principal{Owner: p.OwnerID(), Token: p.TokenID, Kind: string(p.Kind), Source: p.Source,
			Client: p.Client, Scopes: p.Scopes},
		ClaimsJWT: p.Claims,
		Method:    c.Method,
		Tool:      c.Tool,
		Prompt:    c.Prompt,
		URI:       c.URI,
		Arguments: c.Arguments,
		Upstream:  upstream,
		Route:     route,
	}
	if c.Method == "completion/complete" {
		// A completion names a prompt or a resource by its ref: the
		// rules over that prompt or resource see it.
		in.Prompt, in.URI = c.Ref.Name, c.Ref.URI
		if c.Ref.Type != "ref/prompt" {
			in.Prompt = ""
		}
	}
	return in
}

// RuleDecision is a call a rule allowed, for its audit line.
type RuleDecision struct {
	Call message.Call
	// Rule is the rule's place (rules.Spec.Where); Effect is "allow".
	Rule, Effect string
}

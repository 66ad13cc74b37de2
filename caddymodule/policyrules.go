package caddymodule

import (
	"fmt"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/Tahul/caddy-zidane-mcp/policy/rules"
)

// PolicyRule is one of the operator's rules over calls (package
// policy/rules, docs/policy.md), in a site's `policy` or the global one.
type PolicyRule struct {
	// Effect is deny, approve or allow.
	Effect string `json:"effect"`
	// Expr is the rule's CEL expression; the rule holds when it is true.
	Expr string `json:"expr"`
	// Message is what a refused caller is told (deny, approve: required).
	Message string `json:"message,omitempty"`
	// Self lets the caller approve their own call (approve rules only).
	Self bool `json:"self,omitempty"`
}

// errApproveLater is the refusal of an approve rule: the approvals it
// needs are not built yet, and a rule that held calls no one could
// approve would refuse them, which a deny rule says plainly.
const errApproveLater = "approve rules are not available yet: this version of the gateway cannot hold a call for a person's approval; write the rule as deny for now, with a message that says whom to ask"

// compilePolicy compiles the rules of one policy block; where names the
// block in errors and audit lines ("global policy", or a site's).
func compilePolicy(where string, list []PolicyRule) (*rules.Set, error) {
	specs := make([]rules.Spec, 0, len(list))
	for i, r := range list {
		sp := rules.Spec{Effect: rules.Effect(r.Effect), Expr: r.Expr, Message: r.Message, Self: r.Self,
			Where: fmt.Sprintf("%s, rule %d", where, i+1)}
		if sp.Effect == rules.Approve {
			return nil, fmt.Errorf("%s: %s", sp.Where, errApproveLater)
		}
		specs = append(specs, sp)
	}
	return rules.Compile(specs)
}

// parsePolicy reads a policy block:
//
//	policy {
//		deny    "<expr>" "<message>"
//		approve "<expr>" "<message>" [self]
//		allow   "<expr>" ["<message>"]
//	}
//
// Each rule is compiled as it is read, so that an error names its line.
func parsePolicy(d *caddyfile.Dispenser) ([]PolicyRule, error) {
	if d.NextArg() {
		return nil, d.Err(`policy takes no value, only a block of rules: policy { deny "<expr>" "<message>" }`)
	}
	var list []PolicyRule
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		r := PolicyRule{Effect: d.Val()}
		args := d.RemainingArgs()
		switch r.Effect {
		case "deny":
			if len(args) != 2 {
				return nil, d.Errf(`policy deny takes an expression and a message: deny "tool.name == 'drop_table'" "dropping tables is not allowed here"`)
			}
		case "approve":
			return nil, d.Errf("policy %s", errApproveLater)
		case "allow":
			if len(args) != 1 && len(args) != 2 {
				return nil, d.Errf(`policy allow takes an expression and, if you like, a message: allow "'db' in principal.scopes"`)
			}
		default:
			return nil, d.Errf("unknown policy rule %q: use deny, approve or allow", r.Effect)
		}
		r.Expr = args[0]
		if len(args) > 1 {
			r.Message = args[1]
		}
		if _, err := rules.Compile([]rules.Spec{{Effect: rules.Effect(r.Effect), Expr: r.Expr, Message: r.Message, Where: "policy " + r.Effect}}); err != nil {
			return nil, d.Errf("%v", err)
		}
		list = append(list, r)
	}
	if len(list) == 0 {
		return nil, d.Err("policy has no rules: give deny, approve or allow rules in its block, or leave it out")
	}
	return list, nil
}

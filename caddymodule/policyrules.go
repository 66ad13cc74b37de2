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

// compilePolicy compiles the rules of one policy block; where names the
// block in errors and audit lines ("global policy", or a site's).
func compilePolicy(where string, list []PolicyRule) (*rules.Set, error) {
	specs := make([]rules.Spec, 0, len(list))
	for i, r := range list {
		sp := rules.Spec{Effect: rules.Effect(r.Effect), Expr: r.Expr, Message: r.Message, Self: r.Self,
			Where: fmt.Sprintf("%s, rule %d", where, i+1)}
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
			if len(args) == 2 && args[1] == "self" {
				return nil, d.Errf(`policy approve needs a message before self, which is what the caller is told: approve "tool.name == 'deploy'" "deploys need a second person" self`)
			}
			if len(args) == 3 && args[2] == "self" {
				r.Self, args = true, args[:2]
			}
			if len(args) != 2 {
				return nil, d.Errf(`policy approve takes an expression, a message and, to let the caller approve their own call, self: approve "tool.name == 'deploy'" "deploys need a second person"`)
			}
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
		if _, err := rules.Compile([]rules.Spec{{Effect: rules.Effect(r.Effect), Expr: r.Expr, Message: r.Message, Self: r.Self, Where: "policy " + r.Effect}}); err != nil {
			return nil, d.Errf("%v", err)
		}
		list = append(list, r)
	}
	if len(list) == 0 {
		return nil, d.Err("policy has no rules: give deny, approve or allow rules in its block, or leave it out")
	}
	return list, nil
}

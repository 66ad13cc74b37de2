package rules

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"reflect"
	"strings"

	"cel.dev/cel-go/cel"
	"cel.dev/cel-go/common/types"
	"cel.dev/cel-go/common/types/ref"
	"cel.dev/cel-go/ext"
	"cel.dev/cel-go/interpreter"
)

// Effect is what a rule that holds does to a call.
type Effect string

// The effects, strongest first.
const (
	Deny    Effect = "deny"
	Approve Effect = "approve"
	Allow   Effect = "allow"
)

// CostLimit bounds one rule's evaluation, in CEL's cost units (about one
// per operation, and per few bytes a string function reads): a rule over
// it denies the call. It lets a rule read a large argument a few times
// (a regular expression over 64 KiB), never loop over one without end.
const CostLimit = 100_000

// Spec is a rule as the config writes it.
type Spec struct {
	Effect Effect
	// Expr is the CEL expression; the rule holds when it is true.
	Expr string
	// Message is what a refused (or held) caller is told; never the
	// expression. Deny and approve rules need one.
	Message string
	// Where names the rule in errors and audit lines, such as
	// `global policy, rule 2` or `mcp.example.com policy, rule 1`.
	Where string
	// Self lets the caller approve their own call (approve rules only).
	Self bool
}

// Rule is a compiled rule.
type Rule struct {
	Spec
	prg     cel.Program // the call-time program
	partial cel.Program // the list-time program, with args unknown
}

// Set is the rules in force for a route, global ones first.
type Set struct {
	rules []*Rule
	env   *cel.Env
}

// The variables' types. Their `cel` tags are the names rules use; a
// change here is a change of the rule language (docs/policy.md).
type principalVar struct {
	Owner  string   `cel:"owner"`
	Token  string   `cel:"token"`
	Kind   string   `cel:"kind"`
	Source string   `cel:"source"`
	Client string   `cel:"client"`
	Scopes []string `cel:"scopes"`
}

type toolVar struct {
	Name string `cel:"name"`
}

type resourceVar struct {
	URI string `cel:"uri"`
}

var (
	principalType = cel.ObjectType("rules.principalVar")
	toolType      = cel.ObjectType("rules.toolVar")
	resourceType  = cel.ObjectType("rules.resourceVar")
)

func newEnv() (*cel.Env, error) {
	return cel.NewEnv(
		ext.NativeTypes(reflect.TypeOf(&principalVar{}), reflect.TypeOf(&toolVar{}), reflect.TypeOf(&resourceVar{}), ext.ParseStructTags(true)),
		ext.Strings(),
		cel.OptionalTypes(),
		cel.CrossTypeNumericComparisons(true),
		cel.Variable("principal", principalType),
		cel.Variable("method", cel.StringType),
		cel.Variable("tool", toolType),
		cel.Variable("prompt", toolType),
		cel.Variable("resource", resourceType),
		cel.Variable("claims", cel.MapType(cel.StringType, cel.DynType)),
		cel.Variable("args", cel.MapType(cel.StringType, cel.DynType)),
		cel.Variable("upstream", cel.StringType),
		cel.Variable("route", cel.StringType),
	)
}

// Compile type-checks and compiles specs, in order. An error names the
// rule (its Where) and says what is wrong with it.
func Compile(specs []Spec) (*Set, error) {
	env, err := newEnv()
	if err != nil {
		return nil, fmt.Errorf("rules: the rule language did not start: %w", err)
	}
	s := &Set{env: env}
	for _, sp := range specs {
		r, err := compile(env, sp)
		if err != nil {
			return nil, err
		}
		s.rules = append(s.rules, r)
	}
	return s, nil
}

func compile(env *cel.Env, sp Spec) (*Rule, error) {
	where := sp.Where
	if where == "" {
		where = "a rule"
	}
	switch sp.Effect {
	case Deny, Approve:
		if strings.TrimSpace(sp.Message) == "" {
			return nil, fmt.Errorf("%s: a %s rule needs a message, which is what the caller is told", where, sp.Effect)
		}
	case Allow:
	default:
		return nil, fmt.Errorf("%s: %q is no effect; use deny, approve or allow", where, sp.Effect)
	}
	if sp.Self && sp.Effect != Approve {
		return nil, fmt.Errorf("%s: self applies to approve rules", where)
	}
	if strings.TrimSpace(sp.Expr) == "" {
		return nil, fmt.Errorf("%s: the rule has no expression", where)
	}
	ast, iss := env.Compile(sp.Expr)
	if iss != nil && iss.Err() != nil {
		return nil, fmt.Errorf("%s: %s does not compile: %s", where, quote(sp.Expr), oneLine(iss.Err().Error()))
	}
	if !ast.OutputType().IsExactType(cel.BoolType) {
		return nil, fmt.Errorf("%s: %s is a %s, not a bool; a rule holds or does not", where, quote(sp.Expr), ast.OutputType())
	}
	prg, err := env.Program(ast, cel.CostLimit(CostLimit), cel.EvalOptions(cel.OptOptimize))
	if err != nil {
		return nil, fmt.Errorf("%s: %s: %w", where, quote(sp.Expr), err)
	}
	partial, err := env.Program(ast, cel.CostLimit(CostLimit), cel.EvalOptions(cel.OptPartialEval))
	if err != nil {
		return nil, fmt.Errorf("%s: %s: %w", where, quote(sp.Expr), err)
	}
	return &Rule{Spec: sp, prg: prg, partial: partial}, nil
}

func quote(expr string) string {
	if len(expr) > 80 {
		expr = expr[:77] + "..."
	}
	return fmt.Sprintf("%q", expr)
}

// oneLine folds CEL's multi-line message (which draws a caret under the
// expression) into one line for a config error.
func oneLine(s string) string {
	var parts []string
	for _, l := range strings.Split(s, "\n") {
		l = strings.TrimSpace(l)
		if l == "" || strings.HasPrefix(l, "|") {
			continue
		}
		parts = append(parts, l)
	}
	return strings.Join(parts, "; ")
}

// Len is how many rules s holds; a nil Set holds none.
func (s *Set) Len() int {
	if s == nil {
		return 0
	}
	return len(s.rules)
}

// Join returns the rules of s followed by those of t (global rules, then
// a site's), sharing their compiled programs.
func Join(s, t *Set) *Set {
	if s.Len() == 0 {
		return t
	}
	if t.Len() == 0 {
		return s
	}
	return &Set{rules: append(append([]*Rule(nil), s.rules...), t.rules...), env: s.env}
}

// Principal is who calls, as the rules see it.
type Principal struct {
	Owner, Token, Kind, Source, Client string
	Scopes                             []string
}

// Input is one call.
type Input struct {
	Principal Principal
	// Claims are the JWT's or the sign-in's claims, when known. (A
	// variable of its own: CEL's Go struct types hold no dyn field.)
	Claims map[string]any
	Method string
	// Tool, Prompt and URI are the call's tool name, prompt name and
	// resource URI, as the edge read them ("" when the call has none).
	Tool, Prompt, URI string
	// Arguments is the raw arguments object the edge read (nil: none).
	Arguments []byte
	Upstream  string
	Route     string
}

// Verdict is the rules' decision on a call.
type Verdict struct {
	// Effect is what the deciding rule does; "" when no rule held, and the
	// scopes decide.
	Effect Effect
	// Rule is the deciding rule (nil when none held).
	Rule *Rule
	// Err is why the deciding rule failed closed, when it did (the
	// caller is told the rule's message; the audit line carries Err).
	Err error
}

// ErrArguments is the verdict's Err for arguments that are not one JSON
// object: the call is denied before any rule runs.
var ErrArguments = errors.New("the arguments are not a JSON object")

// Decide runs every rule on in. Deny wins over approve, approve over
// allow; among rules of one effect, the first in order decides.
func (s *Set) Decide(in Input) Verdict {
	if s.Len() == 0 {
		return Verdict{}
	}
	if !objectOrNone(in.Arguments) {
		return Verdict{Effect: Deny, Rule: s.rules[0], Err: ErrArguments}
	}
	act := &activation{in: in, withArgs: true}
	var approve, allow *Rule
	for _, r := range s.rules {
		out, _, err := r.prg.Eval(act)
		holds, failed := result(out, err)
		switch {
		case failed != nil && (r.Effect != Allow || overCost(failed)):
			// Fail closed: a deny rule that cannot be read may hold, and
			// an approve rule that cannot be read cannot bind an approval.
			return Verdict{Effect: Deny, Rule: r, Err: failed}
		case failed != nil, !holds:
			continue
		case r.Effect == Deny:
			return Verdict{Effect: Deny, Rule: r}
		case r.Effect == Approve && approve == nil:
			approve = r
		case r.Effect == Allow && allow == nil:
			allow = r
		}
	}
	switch {
	case approve != nil:
		return Verdict{Effect: Approve, Rule: approve}
	case allow != nil:
		return Verdict{Effect: Allow, Rule: allow}
	}
	return Verdict{}
}

// Listed says how a listing treats an item for in's principal, with the
// arguments unknown: Deny when a deny rule refuses it whatever the
// arguments (the item is left out), Allow when an allow rule may let it
// through (it is shown, as a call may succeed), "" when the scopes decide.
func (s *Set) Listed(in Input) Effect {
	if s.Len() == 0 {
		return ""
	}
	act, err := interpreter.NewPartialActivation(&activation{in: in}, cel.AttributePattern("args"))
	if err != nil {
		return Deny
	}
	var maybeAllow bool
	for _, r := range s.rules {
		out, _, err := r.partial.Eval(act)
		if types.IsUnknown(out) {
			if r.Effect == Allow {
				maybeAllow = true
			}
			continue
		}
		holds, failed := result(out, err)
		switch {
		case r.Effect == Deny && (holds || failed != nil):
			return Deny
		case r.Effect == Allow && holds:
			maybeAllow = true
		}
	}
	if maybeAllow {
		return Allow
	}
	return ""
}

// result reads a program's answer: whether the rule holds, or why it
// could not be read.
func result(out ref.Val, err error) (bool, error) {
	if err != nil {
		return false, err
	}
	if b, ok := out.(types.Bool); ok {
		return bool(b), nil
	}
	return false, fmt.Errorf("the rule gave %v, not a bool", out)
}

func overCost(err error) bool {
	var ec interpreter.EvalCancelledError
	return errors.As(err, &ec) && ec.Cause == interpreter.CostLimitExceeded
}

// activation is the variables of one call. The arguments are decoded
// when a rule first reads them, once per call: a rule set whose rules
// decide on the tool's name alone never decodes them.
type activation struct {
	in        Input
	withArgs  bool
	args      ref.Val
	principal *principalVar
}

func (a *activation) ResolveName(name string) (any, bool) {
	in := &a.in
	switch name {
	case "principal":
		if a.principal == nil {
			scopes := in.Principal.Scopes
			if scopes == nil {
				scopes = []string{}
			}
			a.principal = &principalVar{Owner: in.Principal.Owner, Token: in.Principal.Token, Kind: in.Principal.Kind,
				Source: in.Principal.Source, Client: in.Principal.Client, Scopes: scopes}
		}
		return a.principal, true
	case "claims":
		if in.Claims == nil {
			return noClaims, true
		}
		return in.Claims, true
	case "method":
		return in.Method, true
	case "tool":
		return &toolVar{Name: in.Tool}, true
	case "prompt":
		return &toolVar{Name: in.Prompt}, true
	case "resource":
		return &resourceVar{URI: in.URI}, true
	case "args":
		if !a.withArgs {
			return nil, false
		}
		if a.args == nil {
			v, err := decodeArgs(in.Arguments)
			if err != nil {
				v = types.WrapErr(err)
			}
			a.args = v
		}
		return a.args, true
	case "upstream":
		return in.Upstream, true
	case "route":
		return in.Route, true
	}
	return nil, false
}

func (a *activation) Parent() interpreter.Activation { return nil }

var noClaims = map[string]any{}

// objectOrNone reports whether raw is an object, or empty or null (no
// arguments), by its first byte: the edge's reader has read it as JSON.
func objectOrNone(raw []byte) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) == 0 || raw[0] == '{' || bytes.Equal(raw, []byte("null"))
}

var noArgs = types.NewRefValMap(types.DefaultTypeAdapter, map[ref.Val]ref.Val{})

// decodeArgs reads the arguments object. The edge's reader has refused
// duplicate and case-variant keys already, so encoding/json reads the
// object the backend will read; numbers are read exactly (json.Number),
// and made ints where they are integers within int64.
func decodeArgs(raw []byte) (ref.Val, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return noArgs, nil
	}
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, ErrArguments
	}
	if _, ok := v.(map[string]any); !ok {
		return nil, ErrArguments
	}
	return celValue(v), nil
}

// celValue makes a decoded JSON value a CEL value once, so that a rule
// that reads an argument many times (a comprehension) pays for each read
// what CEL's cost counts, not a new reflection over the whole value.
func celValue(v any) ref.Val {
	switch x := v.(type) {
	case map[string]any:
		m := make(map[ref.Val]ref.Val, len(x))
		for k, e := range x {
			m[types.String(k)] = celValue(e)
		}
		return types.NewRefValMap(types.DefaultTypeAdapter, m)
	case []any:
		l := make([]ref.Val, len(x))
		for i, e := range x {
			l[i] = celValue(e)
		}
		return types.NewRefValList(types.DefaultTypeAdapter, l)
	case json.Number:
		if i, err := x.Int64(); err == nil {
			return types.Int(i)
		}
		f, err := x.Float64()
		if err != nil || math.IsInf(f, 0) {
			// Larger than a double: kept as its text, which no number
			// equals, so a rule comparing it fails closed.
			return types.String(x.String())
		}
		return types.Double(f)
	case string:
		return types.String(x)
	case bool:
		return types.Bool(x)
	case nil:
		return types.NullValue
	}
	return types.NewErr("unexpected JSON value %T", v)
}

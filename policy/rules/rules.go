package rules

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"cel.dev/cel-go/cel"
	celast "cel.dev/cel-go/common/ast"
	"cel.dev/cel-go/common/cost"
	"cel.dev/cel-go/common/operators"
	"cel.dev/cel-go/common/types"
	"cel.dev/cel-go/common/types/ref"
	"cel.dev/cel-go/ext"
	"cel.dev/cel-go/interpreter"

	"github.com/Tahul/caddy-zidane-mcp/message"
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
	// tools, when set, are the only tool names the rule can hold for: its
	// expression is a conjunction with tool.name == 'x' (or tool.name in
	// [...]) among its terms. A call of another tool is not evaluated: the
	// rule is false for it (in CEL, a false term makes a conjunction
	// false, whatever errors the others would give).
	tools []string
}

// Set is the rules in force for a route, global ones first.
type Set struct {
	rules []*Rule
	env   *cel.Env
}

// The variables. Those written with a dot (principal.owner, tool.name)
// are variables of their own, each a string or list, which the rules
// read without reflecting over a Go struct: a rule reads its variables on
// every call. A change here is a change of the rule language
// (docs/policy.md).
var variables = []cel.EnvOption{
	cel.Variable("principal.owner", cel.StringType),
	cel.Variable("principal.token", cel.StringType),
	cel.Variable("principal.kind", cel.StringType),
	cel.Variable("principal.source", cel.StringType),
	cel.Variable("principal.client", cel.StringType),
	cel.Variable("principal.scopes", cel.ListType(cel.StringType)),
	cel.Variable("method", cel.StringType),
	cel.Variable("tool.name", cel.StringType),
	cel.Variable("prompt.name", cel.StringType),
	cel.Variable("resource.uri", cel.StringType),
	cel.Variable("claims", cel.MapType(cel.StringType, cel.DynType)),
	cel.Variable("args", cel.MapType(cel.StringType, cel.DynType)),
	cel.Variable("upstream", cel.StringType),
	cel.Variable("route", cel.StringType),
}

// fieldsOf says what a variable group holds, for an error that names
// the group alone (CEL says "undeclared reference to 'principal'" for
// principal.email).
var fieldsOf = map[string]string{
	"principal": "principal.owner, .token, .kind, .source, .client and .scopes",
	"tool":      "tool.name",
	"prompt":    "prompt.name",
	"resource":  "resource.uri",
}

func newEnv() (*cel.Env, error) {
	return cel.NewEnv(append([]cel.EnvOption{ext.Strings(), cel.OptionalTypes(), cel.CrossTypeNumericComparisons(true)}, variables...)...)
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
		msg := oneLine(iss.Err().Error())
		for group, fields := range fieldsOf {
			if strings.Contains(msg, "undeclared reference to '"+group+"'") {
				msg += fmt.Sprintf(" (the variables are %s)", fields)
			}
		}
		return nil, fmt.Errorf("%s: %s does not compile: %s", where, quote(sp.Expr), msg)
	}
	if !ast.OutputType().IsExactType(cel.BoolType) {
		return nil, fmt.Errorf("%s: %s is a %s, not a bool; a rule holds or does not", where, quote(sp.Expr), ast.OutputType())
	}
	opts := []cel.ProgramOption{cel.EvalOptions(cel.OptOptimize)}
	if est, err := env.EstimateCost(ast, sizes{}); err != nil || est.Max > CostLimit {
		// Tracked as it runs. A rule whose cost is bounded under the limit
		// whatever its inputs (see sizes) needs no tracking, which was most
		// of what such a rule cost a call.
		opts = append(opts, cel.CostLimit(CostLimit))
	}
	prg, err := env.Program(ast, opts...)
	if err != nil {
		return nil, fmt.Errorf("%s: %s: %w", where, quote(sp.Expr), err)
	}
	partial, err := env.Program(ast, cel.CostLimit(CostLimit), cel.EvalOptions(cel.OptPartialEval))
	if err != nil {
		return nil, fmt.Errorf("%s: %s: %w", where, quote(sp.Expr), err)
	}
	return &Rule{Spec: sp, prg: prg, partial: partial, tools: toolTerms(ast.NativeRep().Expr())}, nil
}

// toolTerms are the tool names a conjunction e requires, by its terms
// tool.name == 'x' and tool.name in ['x', 'y'] (the first such term); nil
// when it requires none.
func toolTerms(e celast.Expr) []string {
	if e.Kind() != celast.CallKind {
		return nil
	}
	c := e.AsCall()
	args := c.Args()
	switch c.FunctionName() {
	case operators.LogicalAnd:
		for _, a := range args {
			if t := toolTerms(a); t != nil {
				return t
			}
		}
	case operators.Equals:
		if len(args) == 2 {
			if isToolName(args[0]) {
				return literalStrings(args[1:])
			}
			if isToolName(args[1]) {
				return literalStrings(args[:1])
			}
		}
	case operators.In:
		if len(args) == 2 && isToolName(args[0]) && args[1].Kind() == celast.ListKind {
			return literalStrings(args[1].AsList().Elements())
		}
	}
	return nil
}

func isToolName(e celast.Expr) bool {
	return e.Kind() == celast.IdentKind && e.AsIdent() == "tool.name"
}

// literalStrings are the values of es when each is a string literal.
func literalStrings(es []celast.Expr) []string {
	out := make([]string, 0, len(es))
	for _, e := range es {
		if e.Kind() != celast.LiteralKind {
			return nil
		}
		s, ok := e.AsLiteral().(types.String)
		if !ok {
			return nil
		}
		out = append(out, string(s))
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// sizes bounds the inputs of a rule for CEL's static cost estimate: no
// string, list or map a rule reads is larger than maxInputSize, the
// edge's largest body by default (the arguments, the names and URIs of a
// call; a JWT is smaller still), and a credential holds at most
// maxScopes scopes. A rule whose estimate under these bounds stays within
// CostLimit runs untracked: at worst, with a larger body configured, its
// work grows with the body, as reading the body does; a rule that could
// cost more (a comprehension over an argument, a regular expression over
// one) is tracked and stopped at the limit.
type sizes struct{}

const (
	maxInputSize = 1 << 20
	maxScopes    = 1024
)

func (sizes) EstimateSize(n cost.AstNode) *cost.SizeEstimate {
	if p := n.Path(); len(p) > 0 && p[0] == "principal.scopes" {
		return &cost.SizeEstimate{Min: 0, Max: maxScopes}
	}
	if len(n.Path()) > 0 {
		return &cost.SizeEstimate{Min: 0, Max: maxInputSize}
	}
	return nil
}

func (sizes) EstimateCallCost(string, string, *cost.AstNode, []cost.AstNode) *cost.CallEstimate {
	return nil
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
	// ClaimsJWT, when Claims is nil, is a verified JWT's payload as the
	// token carries it (base64url JSON), decoded when a rule first reads
	// claims, as the arguments are.
	ClaimsJWT string
	Method    string
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
		if r.tools != nil && !slices.Contains(r.tools, in.Tool) {
			continue
		}
		out, _, err := r.prg.Eval(act)
		holds, failed := result(out, err)
		failed = withoutValues(failed)
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

// ruleError is why a rule failed, told without the call's values.
type ruleError struct {
	msg   string
	cause error
}

func (e *ruleError) Error() string { return e.msg }
func (e *ruleError) Unwrap() error { return e.cause }

// ownErrors begin the messages of this package's reading of the arguments
// and claims, which name no value of the call.
var ownErrors = []string{"the object ", "the array ", "the number ", "the string ", "the integer ",
	"the token's claims ", "an empty JSON value", "the rule gave "}

// withoutValues is err for an audit line: CEL's messages quote the values
// they failed on (`no such key: <a key read from an argument>`, a regular
// expression an argument supplies, a timestamp's text), which may be a
// secret the caller passed, so they are told by their kind.
func withoutValues(err error) error {
	if err == nil || overCost(err) {
		return err
	}
	msg := err.Error()
	for _, p := range ownErrors {
		if strings.HasPrefix(msg, p) {
			return err
		}
	}
	kind := "it failed on a value of this call"
	switch {
	case strings.HasPrefix(msg, "no such key"):
		kind = "a key it reads is missing"
	case strings.HasPrefix(msg, "no such overload"), strings.HasPrefix(msg, "no matching overload"):
		kind = "a value is of a type it does not read"
	case strings.HasPrefix(msg, "index out of range"):
		kind = "an index it reads is out of range"
	case strings.HasPrefix(msg, "error parsing regexp"):
		kind = "a regular expression did not compile"
	}
	return &ruleError{msg: "the rule could not be evaluated: " + kind, cause: err}
}

func overCost(err error) bool {
	var ec interpreter.EvalCancelledError
	return errors.As(err, &ec) && ec.Cause == interpreter.CostLimitExceeded
}

// activation is the variables of one call. The arguments are decoded
// when a rule first reads them, once per call: a rule set whose rules
// decide on the tool's name alone never decodes them.
type activation struct {
	in       Input
	withArgs bool
	args     ref.Val
	claims   ref.Val
	scopes   ref.Val
	// The string variables as CEL values, made once per call: the rules
	// of a set read the same few (tool.name) again and again.
	owner, token, kind, source, client, method, tool, prompt, uri, upstream, route ref.Val
}

// str is s as a CEL value, kept in *v.
func (a *activation) str(v *ref.Val, s string) ref.Val {
	if *v == nil {
		*v = types.String(s)
	}
	return *v
}

func (a *activation) ResolveName(name string) (any, bool) {
	in := &a.in
	switch name {
	case "principal.owner":
		return a.str(&a.owner, in.Principal.Owner), true
	case "principal.token":
		return a.str(&a.token, in.Principal.Token), true
	case "principal.kind":
		return a.str(&a.kind, in.Principal.Kind), true
	case "principal.source":
		return a.str(&a.source, in.Principal.Source), true
	case "principal.client":
		return a.str(&a.client, in.Principal.Client), true
	case "principal.scopes":
		if a.scopes == nil {
			a.scopes = types.NewStringList(types.DefaultTypeAdapter, in.Principal.Scopes)
		}
		return a.scopes, true
	case "claims":
		switch {
		case in.Claims != nil:
			return in.Claims, true
		case in.ClaimsJWT != "":
			if a.claims == nil {
				a.claims = decodeClaims(in.ClaimsJWT)
			}
			return a.claims, true
		}
		return noClaims, true
	case "method":
		return a.str(&a.method, in.Method), true
	case "tool.name":
		return a.str(&a.tool, in.Tool), true
	case "prompt.name":
		return a.str(&a.prompt, in.Prompt), true
	case "resource.uri":
		return a.str(&a.uri, in.URI), true
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
		return a.str(&a.upstream, in.Upstream), true
	case "route":
		return a.str(&a.route, in.Route), true
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

// decodeClaims reads a JWT's payload as the arguments are read (numbers
// exact, ints where they are integers): a payload that is not one JSON
// object fails the rules that read it closed.
func decodeClaims(payload string) ref.Val {
	raw, err := base64.RawURLEncoding.DecodeString(payload)
	if err != nil {
		return types.NewErr("the token's claims are not base64url")
	}
	if !objectOrNone(raw) || len(bytes.TrimSpace(raw)) == 0 {
		return types.NewErr("the token's claims are not a JSON object")
	}
	if message.Validate(raw) != nil {
		// The edge's reader has not read the claims as it reads the
		// arguments: claims with a key twice, two keys equal once folded,
		// "__proto__" or a lone surrogate, anywhere, are read differently
		// by the token's verifier (encoding/json takes the last key and
		// matches in any case) and by rules iterating their keys.
		return types.NewErr("the token's claims hold keys that readers read differently (a key twice, or in two cases)")
	}
	v, err := decodeArgs(raw)
	if err != nil {
		return types.NewErr("the token's claims are not a JSON object")
	}
	return v
}

var noArgs = types.NewRefValMap(types.DefaultTypeAdapter, map[ref.Val]ref.Val{})

// decodeArgs reads the arguments object, lazily (see jsonObject). The
// edge's reader has refused duplicate and case-variant keys already, so
// the rules read the object the backend will read.
func decodeArgs(raw []byte) (ref.Val, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return noArgs, nil
	}
	if raw[0] != '{' || !json.Valid(raw) {
		return nil, ErrArguments
	}
	return &jsonObject{raw: raw}, nil
}

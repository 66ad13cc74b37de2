package caddymodule

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
)

const policySite = "http://127.0.0.1:9 {\n\troute {\n\t\tzidane_mcp {\n\t\t\tguard\n%s\n\t\t}\n\t\trespond 204\n\t}\n}\n"

// TestPolicyCaddyfileErrorsNameTheLine: a rule that does not compile is
// refused when the Caddyfile is adapted, with its line and CEL's reason.
func TestPolicyCaddyfileErrorsNameTheLine(t *testing.T) {
	cases := []struct {
		global, site string
		want         []string
	}{
		{"", "policy {\ndeny \"request.path == '/x'\" \"no\"\n}", []string{"Caddyfile:9", "undeclared reference to 'request'"}},
		{"", "policy {\nallow \"true\"\ndeny \"principal.email == 'x'\" \"no\"\n}", []string{"Caddyfile:10", "email"}},
		{"", "policy {\ndeny \"tool.name\" \"no\"\n}", []string{"Caddyfile:9", "not a bool"}},
		{"", "policy {\ndeny \"args.q.matches('(')\" \"no\"\n}", []string{"Caddyfile:9", "error parsing regexp"}},
		{"", "policy {\ndeny \"true\"\n}", []string{"Caddyfile:9", "deny takes an expression and a message"}},
		{"", "policy {\napprove \"true\"\n}", []string{"Caddyfile:9", "approve takes an expression, a message"}},
		{"", "policy {\napprove \"true\" self\n}", []string{"Caddyfile:9", "message before self"}},
		{"", "policy {\napprove \"true\" \"ask\" selfish\n}", []string{"Caddyfile:9", "approve takes an expression, a message"}},
		{"", "policy {\napprove \"true\" \"ask\" self self\n}", []string{"Caddyfile:9", "approve takes an expression, a message"}},
		{"", "policy {\ndeny \"true\" \"no\" self\n}", []string{"Caddyfile:9", "deny takes an expression and a message"}},
		{"", "policy {\nallow \"true\" \"yes\" self\n}", []string{"Caddyfile:9", "allow takes an expression"}},
		{"", "policy {\npermit \"true\"\n}", []string{"Caddyfile:9", `unknown policy rule "permit"`}},
		{"", "policy {\n}", []string{"policy has no rules"}},
		{"", "policy {\nallow \"true\"\n}\npolicy {\nallow \"true\"\n}", []string{"policy given twice"}},
		{"zidane {\npolicy {\ndeny \"tool.nam == 'x'\" \"no\"\n}\n}", "", []string{"Caddyfile:5", "nam"}},
	}
	for _, c := range cases {
		caddyfile := fmt.Sprintf("{\n\tadmin off\n%s\n}\n", c.global)
		if c.global == "" {
			caddyfile = "{\n\tadmin off\n}\n"
		}
		caddyfile += fmt.Sprintf(policySite, c.site)
		_, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(caddyfile), nil)
		if err == nil {
			t.Errorf("accepted:\n%s", caddyfile)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("error %q does not say %q\n%s", err, w, caddyfile)
			}
		}
	}
}

// TestPolicyJSONErrorsNameTheRule: a JSON config is compiled when it is
// provisioned, naming the rule by its block and number.
func TestPolicyJSONErrorsNameTheRule(t *testing.T) {
	cases := []struct {
		app, site string // JSON lists of rules
		want      []string
	}{
		{`[{"effect":"allow","expr":"true"},{"effect":"deny","expr":"nope","message":"m"}]`, ``, []string{"global policy, rule 2", "undeclared reference to 'nope'"}},
		{``, `[{"effect":"deny","expr":"true"}]`, []string{"/mcp policy, rule 1", "needs a message"}},
		{``, `[{"effect":"approve","expr":"true"}]`, []string{"/mcp policy, rule 1", "needs a message"}},
		{``, `[{"effect":"deny","expr":"true","message":"no","self":true}]`, []string{"/mcp policy, rule 1", "self applies to approve rules"}},
		{`[{"effect":"permit","expr":"true"}]`, ``, []string{"global policy, rule 1", "no effect"}},
		{``, `[{"effect":"allow","expr":"true","self":true}]`, []string{"/mcp policy, rule 1", "self applies to approve rules"}},
	}
	for _, c := range cases {
		err := validatePolicyJSON(t, c.app, c.site)
		if err == nil {
			t.Errorf("accepted: app %s site %s", c.app, c.site)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("error %q does not say %q", err, w)
			}
		}
	}
	if err := validatePolicyJSON(t, ``, `[{"effect":"approve","expr":"tool.name == 'deploy'","message":"ask","self":true}]`); err != nil {
		t.Fatalf("an approve rule with self is refused: %v", err)
	}
	if err := validatePolicyJSON(t, `[{"effect":"deny","expr":"tool.name == 'x'","message":"no x"}]`, `[{"effect":"allow","expr":"'db' in principal.scopes"}]`); err != nil {
		t.Fatalf("a valid policy is refused: %v", err)
	}
}

// validatePolicyJSON provisions a guard site whose app and handler carry
// the given policy lists, as `caddy validate` does.
func validatePolicyJSON(t *testing.T, app, site string) error {
	t.Helper()
	caddyfile := fmt.Sprintf("{\n\tadmin off\n\tstorage file_system %s\n}\n", t.TempDir()) + fmt.Sprintf(policySite, "")
	raw, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(caddyfile), nil)
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if err := json.Unmarshal(raw, &cfg); err != nil {
		t.Fatal(err)
	}
	apps := cfg["apps"].(map[string]any)
	if app != "" {
		var list any
		if err := json.Unmarshal([]byte(app), &list); err != nil {
			t.Fatal(err)
		}
		apps["zidane"] = map[string]any{"policy": list}
	}
	if site != "" {
		var list any
		if err := json.Unmarshal([]byte(site), &list); err != nil {
			t.Fatal(err)
		}
		if !setHandlerPolicy(apps["http"], list) {
			t.Fatalf("no zidane_mcp handler in %s", raw)
		}
	}
	out, _ := json.Marshal(cfg)
	var c caddy.Config
	if err := json.Unmarshal(out, &c); err != nil {
		t.Fatal(err)
	}
	return caddy.Validate(&c)
}

// setHandlerPolicy sets the policy of the zidane_mcp handler somewhere in v.
func setHandlerPolicy(v any, list any) bool {
	switch x := v.(type) {
	case map[string]any:
		if x["handler"] == "zidane_mcp" {
			x["policy"] = list
			return true
		}
		for _, e := range x {
			if setHandlerPolicy(e, list) {
				return true
			}
		}
	case []any:
		for _, e := range x {
			if setHandlerPolicy(e, list) {
				return true
			}
		}
	}
	return false
}

// TestPolicyDocsExamples: every rule docs/policy.md shows in a caddyfile
// block compiles, as the Caddyfile adapter reads it.
func TestPolicyDocsExamples(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "docs", "policy.md"))
	if err != nil {
		t.Fatal(err)
	}
	blocks := strings.Split(string(raw), "```caddyfile\n")[1:]
	n := 0
	for _, b := range blocks {
		b, _, _ = strings.Cut(b, "```")
		for _, line := range strings.Split(b, "\n") {
			line = strings.TrimSpace(line)
			if !strings.HasPrefix(line, "deny ") && !strings.HasPrefix(line, "allow ") {
				continue
			}
			n++
			caddyfile := "{\n\tadmin off\n}\n" + fmt.Sprintf(policySite, "policy {\n"+line+"\n}")
			if _, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(caddyfile), nil); err != nil {
				t.Errorf("docs/policy.md: %s\n%v", line, err)
			}
		}
	}
	if n < 10 {
		t.Fatalf("docs/policy.md shows %d rules, want its examples (10 or more)", n)
	}
}

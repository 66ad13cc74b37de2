package upstream

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

func TestExpand(t *testing.T) {
	env := map[string]string{"TOKEN": "t0k", "EMPTY": "", "HOST": "api.example.com", "_X1": "x"}
	tests := []struct {
		in       string
		want     string
		warnings []string // substrings, one per warning
	}{
		{"plain text", "plain text", nil},
		{"", "", nil},
		{"${TOKEN}", "t0k", nil},
		{"Bearer ${TOKEN}", "Bearer t0k", nil},
		{"${env:TOKEN}", "t0k", nil},
		{"https://${HOST}/mcp?t=${TOKEN}", "https://api.example.com/mcp?t=t0k", nil},
		{"${TOKEN}${TOKEN}", "t0kt0k", nil},
		{"${_X1}", "x", nil},
		{"${TOKEN:-fallback}", "t0k", nil},
		{"${MISSING:-fallback}", "fallback", nil},
		{"${EMPTY:-fallback}", "fallback", nil},
		{"${env:MISSING:-fb}", "fb", nil},
		{"${MISSING:-}", "", nil},
		{"${MISSING:-a:-b}", "a:-b", nil},
		{"${EMPTY}", "", nil},
		{"${MISSING}", "${MISSING}", []string{"${MISSING} is not set; left as written: set MISSING in the environment"}},
		{"${env:MISSING}", "${env:MISSING}", []string{"${MISSING} is not set"}},
		{"a ${MISSING} b ${MISSING}", "a ${MISSING} b ${MISSING}", []string{"${MISSING} is not set"}},
		{"$TOKEN", "$TOKEN", nil},
		{"$${TOKEN}", "$t0k", nil},
		{"${", "${", []string{"not closed"}},
		{"x ${TOKEN", "x ${TOKEN", []string{"${TOKEN… is not closed"}},
		{"${}", "${}", []string{"not a placeholder"}},
		{"${1ABC}", "${1ABC}", []string{"${1ABC} is not a placeholder"}},
		{"${input:token}", "${input:token}", []string{"${input:token} is not a placeholder"}},
		{"${TOKEN-x}", "${TOKEN-x}", []string{"${TOKEN…"}},
		{"${A:-${TOKEN}}", "${TOKEN}", nil},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, warnings := Expand(tt.in, mapLookup(env), false)
			if got != tt.want {
				t.Errorf("Expand(%q) = %q, want %q", tt.in, got, tt.want)
			}
			if len(warnings) != len(tt.warnings) {
				t.Fatalf("warnings = %q, want %d matching %q", warnings, len(tt.warnings), tt.warnings)
			}
			for i, w := range tt.warnings {
				if !strings.Contains(warnings[i], w) {
					t.Errorf("warning %q does not contain %q", warnings[i], w)
				}
			}
		})
	}
}

func TestExpandWarningsNeverHoldDefaults(t *testing.T) {
	for _, in := range []string{"${KEY:=sk-live-1}", "${KEY-sk-live-1}", "${KEY:sk-live-1}", "${KEY sk-live-1"} {
		_, warnings := Expand(in, mapLookup(nil), false)
		if len(warnings) == 0 {
			t.Errorf("Expand(%q): no warning", in)
		}
		for _, w := range warnings {
			if strings.Contains(w, "sk-live") {
				t.Errorf("Expand(%q) warning leaks the text: %q", in, w)
			}
		}
	}
}

func TestExpandUntrustedNeverReadsTheEnvironment(t *testing.T) {
	t.Setenv("ZIDANE_TEST_SECRET", "from-env")
	lookup := func(name string) (string, bool) {
		t.Fatalf("lookup(%q) called for an untrusted source", name)
		return "", false
	}
	tests := []struct {
		in, want string
		warned   bool
	}{
		{"${ZIDANE_TEST_SECRET}", "", true},
		{"${env:ZIDANE_TEST_SECRET}", "", true},
		{"${ZIDANE_TEST_SECRET:-public}", "public", false},
		{"Bearer ${ZIDANE_TEST_SECRET:-}", "Bearer ", false},
		{"${input:x}", "${input:x}", true},
		{"no placeholders", "no placeholders", false},
	}
	for _, tt := range tests {
		for _, lk := range []func(string) (string, bool){lookup, nil} {
			got, warnings := Expand(tt.in, lk, true)
			if got != tt.want {
				t.Errorf("Expand(%q, untrusted) = %q, want %q", tt.in, got, tt.want)
			}
			if tt.warned != (len(warnings) > 0) {
				t.Errorf("Expand(%q, untrusted) warnings = %q", tt.in, warnings)
			}
		}
	}

	u := Config{
		Name: "evil", Transport: "stdio", Command: "${ZIDANE_TEST_SECRET:-npx}", Args: []string{"${ZIDANE_TEST_SECRET}"},
		Env: map[string]string{"T": "${ZIDANE_TEST_SECRET}"}, Cwd: "${HOME}", FromUntrusted: true,
	}
	e, warnings := u.Expanded(lookup)
	if e.Command != "npx" || e.Args[0] != "" || e.Env["T"] != "" || e.Cwd != "" {
		t.Errorf("untrusted Expanded = %+v", e)
	}
	if len(warnings) != 3 {
		t.Errorf("warnings = %q", warnings)
	}
	if e2, _ := u.Expanded(nil); e2.Env["T"] != "" {
		t.Error("untrusted Expanded(nil) read the environment")
	}
}

func TestExpandNilLookupReadsTheEnvironment(t *testing.T) {
	t.Setenv("ZIDANE_TEST_TOKEN", "abc")
	if got, _ := Expand("${ZIDANE_TEST_TOKEN}", nil, false); got != "abc" {
		t.Errorf("Expand with nil lookup = %q", got)
	}
}

func TestExpanded(t *testing.T) {
	env := map[string]string{"TOKEN": "t0k", "HOST": "api.example.com", "DIR": "/srv"}
	u := Config{
		Name: "a", Transport: "http", URL: "https://${HOST}/mcp",
		Headers: map[string]string{"Authorization": "Bearer ${TOKEN}", "X-Missing": "${NOPE}"},
		Source:  "mcp.json",
	}
	e, warnings := u.Expanded(mapLookup(env))
	if e.URL != "https://api.example.com/mcp" || e.Headers["Authorization"] != "Bearer t0k" || e.Headers["X-Missing"] != "${NOPE}" {
		t.Errorf("Expanded = %+v", e)
	}
	if len(warnings) != 1 || !strings.Contains(warnings[0], `upstream "a": headers.X-Missing: ${NOPE} is not set`) {
		t.Errorf("warnings = %q", warnings)
	}
	if u.URL != "https://${HOST}/mcp" || u.Headers["Authorization"] != "Bearer ${TOKEN}" {
		t.Errorf("Expanded changed the original: %+v", u)
	}

	s := Config{
		Name: "s", Transport: "stdio", Command: "${DIR}/bin/server", Args: []string{"--token", "${TOKEN}", "--x=${X:-1}"},
		Env: map[string]string{"GITHUB_TOKEN": "${env:TOKEN}"}, Cwd: "${DIR}",
	}
	e, warnings = s.Expanded(mapLookup(env))
	want := Config{
		Name: "s", Transport: "stdio", Command: "/srv/bin/server", Args: []string{"--token", "t0k", "--x=1"},
		Env: map[string]string{"GITHUB_TOKEN": "t0k"}, Cwd: "/srv",
	}
	if !reflect.DeepEqual(e, want) || len(warnings) != 0 {
		t.Errorf("Expanded = %+v, %q", e, warnings)
	}
	if s.Args[1] != "${TOKEN}" || s.Env["GITHUB_TOKEN"] != "${env:TOKEN}" {
		t.Error("Expanded changed the original's args or env")
	}
}

func TestRedacted(t *testing.T) {
	u := Config{
		Name: "a", Transport: "http", URL: "https://x.example/mcp?key=sk-q1&team=${TEAM}&flag#frag-sk",
		Headers: map[string]string{
			"Authorization": "Bearer sk-h1",
			"X-Ref":         "${API_KEY}",
			"X-Env":         "${env:API_KEY}",
			"X-Default":     "${API_KEY:-sk-h2}",
			"X-Mixed":       "Bearer ${API_KEY}",
			"X-Empty":       "",
		},
		Env: map[string]string{"TOKEN": "sk-e1", "REF": "${TOKEN}"},
	}
	r := u.Redacted()
	wantHeaders := map[string]string{
		"Authorization": Redaction,
		"X-Ref":         "${API_KEY}",
		"X-Env":         "${env:API_KEY}",
		"X-Default":     "${API_KEY:-<redacted>}",
		"X-Mixed":       Redaction,
		"X-Empty":       "",
	}
	if !reflect.DeepEqual(r.Headers, wantHeaders) {
		t.Errorf("headers = %v", r.Headers)
	}
	if !reflect.DeepEqual(r.Env, map[string]string{"TOKEN": Redaction, "REF": "${TOKEN}"}) {
		t.Errorf("env = %v", r.Env)
	}
	if r.URL != "https://x.example/mcp?key=<redacted>&team=${TEAM}&flag" {
		t.Errorf("url = %q", r.URL)
	}
	out, _ := json.Marshal(r)
	if strings.Contains(string(out), "sk-") {
		t.Errorf("redacted JSON holds a secret: %s", out)
	}
	if u.Headers["Authorization"] != "Bearer sk-h1" || u.Env["TOKEN"] != "sk-e1" {
		t.Error("Redacted changed the original")
	}
}

func TestHasPlaceholder(t *testing.T) {
	for s, want := range map[string]bool{
		"${A}": true, "x${env:A}y": true, "${A:-b}": true, "$A": false, "${1}": false,
		"${input:x}": false, "${input:x} ${B}": true, "${": false, "": false,
	} {
		if got := HasPlaceholder(s); got != want {
			t.Errorf("HasPlaceholder(%q) = %v, want %v", s, got, want)
		}
	}
}

func FuzzExpand(f *testing.F) {
	for _, s := range []string{"", "${A}", "${A:-b}", "${env:A}", "${env:A:-}", "${", "}${", "${1}", "$${A}}", "${A:-${B}}", "\xff${A}"} {
		f.Add(s, false)
		f.Add(s, true)
	}
	f.Fuzz(func(t *testing.T, s string, untrusted bool) {
		called := false
		lookup := func(name string) (string, bool) {
			called = true
			if !validVar(name) {
				t.Fatalf("lookup of invalid name %q", name)
			}
			if name == "A" {
				return "value-of-A", true
			}
			return "", false
		}
		out, warnings := Expand(s, lookup, untrusted)
		if untrusted && called {
			t.Fatalf("Expand(%q, untrusted) called lookup", s)
		}
		if untrusted && strings.Contains(out, "value-of-A") && !strings.Contains(s, "value-of-A") {
			t.Fatalf("Expand(%q, untrusted) = %q holds an environment value", s, out)
		}
		if !strings.Contains(s, "${") && (out != s || warnings != nil) {
			t.Fatalf("Expand(%q) = %q, %q; want it unchanged", s, out, warnings)
		}
		if !untrusted && !HasPlaceholder(s) && out != s {
			t.Fatalf("Expand(%q) = %q; without placeholders nothing changes", s, out)
		}
	})
}

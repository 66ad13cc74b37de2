package upstream

import (
	"fmt"
	"os"
	"sort"
	"strings"
)

// Redaction is what [Config.Redacted] shows in place of a secret.
const Redaction = "<redacted>"

// Expand replaces the environment placeholders in s and returns the result
// with warnings for a person to read. The forms are those of Claude Code and
// VS Code configs:
//
//   - ${VAR} is the value of VAR;
//   - ${VAR:-default} is VAR's value, or default when VAR is unset or empty;
//   - ${env:VAR} (and ${env:VAR:-default}) is the same as ${VAR}.
//
// VAR is letters, digits and '_', not starting with a digit. A default is
// literal text up to the first '}': it cannot hold '}' and is not expanded
// itself. An unset VAR without a default is left as written and a warning
// names it; so is anything else between "${" and "}" (such as VS Code's
// ${input:id}), and an unclosed "${". Warnings name variables, never values
// or defaults.
//
// lookup reads a variable; nil means [os.LookupEnv]. With untrusted set, for
// a config whose source must not read this process's environment, lookup is
// never called: every placeholder becomes its default, else the empty
// string (with a warning).
func Expand(s string, lookup func(string) (string, bool), untrusted bool) (out string, warnings []string) {
	if !strings.Contains(s, "${") {
		return s, nil
	}
	if lookup == nil && !untrusted {
		lookup = os.LookupEnv
	}
	var b strings.Builder
	b.Grow(len(s))
	for {
		i := strings.Index(s, "${")
		if i < 0 {
			b.WriteString(s)
			break
		}
		b.WriteString(s[:i])
		s = s[i:]
		end := strings.IndexByte(s, '}')
		if end < 0 {
			warnings = appendWarning(warnings, fmt.Sprintf("%s is not closed with '}'; left as written", shownPlaceholder(s[2:], false)))
			b.WriteString(s)
			break
		}
		whole := s[:end+1]
		s = s[end+1:]
		p, ok := parsePlaceholder(whole[2:end])
		if !ok {
			warnings = appendWarning(warnings, fmt.Sprintf("%s is not a placeholder the broker expands (use ${VAR}, ${VAR:-default} or ${env:VAR}); left as written", shownPlaceholder(whole[2:end], true)))
			b.WriteString(whole)
			continue
		}
		if untrusted {
			if !p.hasDefault {
				warnings = appendWarning(warnings, fmt.Sprintf("${%s} is empty: a config from an untrusted source cannot read the environment; give it a default with ${%s:-…}", p.name, p.name))
			}
			b.WriteString(p.def)
			continue
		}
		v, set := lookup(p.name)
		switch {
		case p.hasDefault && v == "":
			b.WriteString(p.def)
		case set:
			b.WriteString(v)
		default:
			warnings = appendWarning(warnings, fmt.Sprintf("${%s} is not set; left as written: set %s in the environment of the Caddy process, or give a default with ${%s:-…}", p.name, p.name, p.name))
			b.WriteString(whole)
		}
	}
	return b.String(), warnings
}

// HasPlaceholder reports whether s holds a placeholder that [Expand]
// would replace.
func HasPlaceholder(s string) bool {
	_, ok := FirstPlaceholder(s)
	return ok
}

// FirstPlaceholder returns the variable of the first placeholder in s that
// [Expand] would replace, scanning the way Expand does.
func FirstPlaceholder(s string) (string, bool) {
	for {
		i := strings.Index(s, "${")
		if i < 0 {
			return "", false
		}
		s = s[i:]
		end := strings.IndexByte(s, '}')
		if end < 0 {
			return "", false
		}
		if p, ok := parsePlaceholder(s[2:end]); ok {
			return p.name, true
		}
		s = s[end+1:]
	}
}

type placeholder struct {
	name       string
	def        string
	hasDefault bool
	envPrefix  bool
}

// parsePlaceholder reads what is between "${" and "}".
func parsePlaceholder(inner string) (placeholder, bool) {
	var p placeholder
	if rest, ok := strings.CutPrefix(inner, "env:"); ok {
		inner, p.envPrefix = rest, true
	}
	name, def, hasDefault := strings.Cut(inner, ":-")
	if !validVar(name) {
		return placeholder{}, false
	}
	p.name, p.def, p.hasDefault = name, def, hasDefault
	return p, true
}

func validVar(name string) bool {
	if name == "" || '0' <= name[0] && name[0] <= '9' {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}

// shownPlaceholder quotes the start of a placeholder that is not expanded:
// its name, and a lowercase prefix such as "input:", up to the first
// character that could not belong to them, so that a mistyped default (a
// secret, perhaps) never reaches a warning. An unclosed placeholder always
// ends in "…".
func shownPlaceholder(inner string, closed bool) string {
	n := 0
	for n < len(inner) && n < 40 {
		c := inner[n]
		if c == ':' && n > 0 && n <= 10 && isLowerWord(inner[:n]) {
			n++
			continue
		}
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_') {
			break
		}
		n++
	}
	if closed && n == len(inner) {
		return "${" + inner + "}"
	}
	return "${" + inner[:n] + "…"
}

func isLowerWord(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 'a' || s[i] > 'z' {
			return false
		}
	}
	return true
}

func appendWarning(list []string, w string) []string {
	for _, x := range list {
		if x == w {
			return list
		}
	}
	return append(list, w)
}

// Expanded returns u with the placeholders in its URL, header values,
// command, args, env values and cwd expanded ([Expand]), reading variables
// through lookup (nil means [os.LookupEnv]) unless u.FromUntrusted. Call it
// only where a transport is built, and check the URL there with
// [Config.Endpoint]; keep the unexpanded Upstream everywhere else.
// Warnings name the upstream and the field.
func (u Config) Expanded(lookup func(string) (string, bool)) (Config, []string) {
	e := u.clone()
	var warnings []string
	expand := func(field, s string) string {
		out, ws := Expand(s, lookup, u.FromUntrusted)
		for _, w := range ws {
			warnings = append(warnings, fmt.Sprintf("upstream %q: %s: %s", u.Name, field, w))
		}
		return out
	}
	e.URL = expand("url", u.URL)
	for _, k := range sortedKeys(e.Headers) {
		e.Headers[k] = expand("headers."+k, e.Headers[k])
	}
	e.Command = expand("command", u.Command)
	for i := range e.Args {
		e.Args[i] = expand(fmt.Sprintf("args[%d]", i), e.Args[i])
	}
	for _, k := range sortedKeys(e.Env) {
		e.Env[k] = expand("env."+k, e.Env[k])
	}
	e.Cwd = expand("cwd", u.Cwd)
	if o := e.OAuth; o != nil {
		o.ClientID = expand("oauth.client_id", o.ClientID)
		o.ClientSecret = expand("oauth.client_secret", o.ClientSecret)
		o.PrivateKey = expand("oauth.private_key", o.PrivateKey)
		o.IDPClientID = expand("oauth.idp_client_id", o.IDPClientID)
		o.IDPClientSecret = expand("oauth.idp_client_secret", o.IDPClientSecret)
	}
	return e, warnings
}

// Redacted returns u as a listing or the admin API may show it: header
// values, env values and URL query values become "<redacted>" unless they
// are a single placeholder, which stays (with its default, if any,
// redacted: ${TOKEN:-<redacted>}). Command, args and cwd are shown as they
// are, so keep secrets out of args: pass them in env.
func (u Config) Redacted() Config {
	r := u.clone()
	for k, v := range r.Headers {
		r.Headers[k] = redactValue(v)
	}
	for k, v := range r.Env {
		r.Env[k] = redactValue(v)
	}
	r.URL = redactQuery(r.URL)
	if o := r.OAuth; o != nil {
		o.ClientSecret = redactValue(o.ClientSecret)
		o.PrivateKey = redactValue(o.PrivateKey)
		o.IDPClientSecret = redactValue(o.IDPClientSecret)
	}
	return r
}

// redactValue keeps a value that is exactly one placeholder, since it names
// a variable rather than holding a secret, and hides anything else.
func redactValue(v string) string {
	if v == "" {
		return ""
	}
	if strings.HasPrefix(v, "${") && strings.IndexByte(v, '}') == len(v)-1 {
		if p, ok := parsePlaceholder(v[2 : len(v)-1]); ok {
			prefix := ""
			if p.envPrefix {
				prefix = "env:"
			}
			if p.hasDefault {
				return "${" + prefix + p.name + ":-" + Redaction + "}"
			}
			return v
		}
	}
	return Redaction
}

// redactQuery hides the query values of a URL (some servers take a key
// there) and drops its fragment, working on the text so that placeholders
// survive.
func redactQuery(raw string) string {
	if i := strings.IndexByte(raw, '#'); i >= 0 {
		raw = raw[:i]
	}
	base, query, ok := strings.Cut(raw, "?")
	if !ok {
		return raw
	}
	pairs := strings.Split(query, "&")
	for i, pair := range pairs {
		if k, v, hasValue := strings.Cut(pair, "="); hasValue {
			pairs[i] = k + "=" + redactValue(v)
		}
	}
	return base + "?" + strings.Join(pairs, "&")
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

package caddymodule

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"sort"
	"strings"

	"github.com/Tahul/caddy-zidane-mcp/broker/upstream"

	"github.com/Tahul/caddy-zidane-mcp/pinnedfetch"
)

// Secrets never sit in the config as literals: Caddy's admin API serves
// the running config at /config/ and writes it to autosave.json, so a
// literal header value or client secret would be readable by anything that
// reaches either. They are given as placeholders and read from Caddy's
// environment where they are used. Each check runs when a Caddyfile is
// adapted (with the line) and at Provision (for JSON configs).

// plainHeaders may hold literal values: they carry no credential.
var plainHeaders = map[string]bool{
	"Accept":               true,
	"Accept-Language":      true,
	"Content-Type":         true,
	"User-Agent":           true,
	"Mcp-Protocol-Version": true,
}

// secretName matches the names of variables and query parameters that
// hold credentials.
var secretName = regexp.MustCompile(`(?i)KEY|TOKEN|SECRET|PASSWORD|PASSWD|AUTH|CREDENTIAL`)

// caddyPlaceholder matches a runtime placeholder of Caddy's replacer, such
// as {env.UPSTREAM_TOKEN} (a Caddyfile's shorthands such as {host} are
// written out with their dots when it is adapted). A ${VAR} is not one:
// the replacer would leave the $ and drop {VAR}.
var caddyPlaceholder = regexp.MustCompile(`(^|[^$])\{[A-Za-z][A-Za-z0-9_\-]*\.[A-Za-z0-9_.\-/]+\}`)

// literalError says that field holds a literal secret and how to give it.
func literalError(field, placeholder string) error {
	return fmt.Errorf("%s holds a literal value: Caddy's admin API and autosave.json would show it; give it as %s and set VAR in caddy's environment (a {$VAR} in a Caddyfile is replaced when the Caddyfile is read, so it counts as literal)", field, placeholder)
}

// literal reports whether v is a secret given as it is: not empty and
// holding no ${VAR} placeholder of the broker's.
func literal(v string) bool { return v != "" && !upstream.HasPlaceholder(v) }

// checkUpstreamSecrets refuses an upstream of the config with a literal
// secret: a header value (but the plainHeaders), an env value whose name
// looks secret, a password or secret-looking query value in its URL, an
// OAuth client secret or private key.
func checkUpstreamSecrets(u upstream.Config) error {
	const ph = "${VAR}"
	for _, k := range sortedMapKeys(u.Headers) {
		if !plainHeaders[http.CanonicalHeaderKey(k)] && literal(u.Headers[k]) {
			return literalError(fmt.Sprintf("header %s of upstream %s", k, u.Name), ph)
		}
	}
	for _, k := range sortedMapKeys(u.Env) {
		if secretName.MatchString(k) && literal(u.Env[k]) {
			return literalError(fmt.Sprintf("env %s of upstream %s", k, u.Name), ph)
		}
	}
	if parsed, err := url.Parse(u.URL); err == nil {
		if pw, ok := parsed.User.Password(); ok && literal(pw) {
			return literalError(fmt.Sprintf("the password in the URL of upstream %s", u.Name), ph)
		}
	}
	if _, query, ok := strings.Cut(u.URL, "?"); ok {
		query, _, _ = strings.Cut(query, "#")
		for _, pair := range strings.Split(query, "&") {
			if k, v, _ := strings.Cut(pair, "="); secretName.MatchString(k) && literal(v) {
				return literalError(fmt.Sprintf("query parameter %s in the URL of upstream %s", k, u.Name), ph)
			}
		}
	}
	if o := u.OAuth; o != nil {
		for _, f := range []struct{ name, v string }{
			{"client_secret", o.ClientSecret}, {"private_key", o.PrivateKey}, {"idp_client_secret", o.IDPClientSecret},
		} {
			if literal(f.v) {
				hint := ph
				if f.name == "private_key" {
					hint = "private_key_file <path>, or ${VAR}"
				}
				return literalError(fmt.Sprintf("oauth %s of upstream %s", f.name, u.Name), hint)
			}
		}
	}
	return nil
}

// checkAgentEnv refuses a literal value for an agent's env variable whose
// name looks secret (ANTHROPIC_API_KEY, GITHUB_TOKEN…).
func checkAgentEnv(agent string, env map[string]string) error {
	for _, k := range sortedMapKeys(env) {
		if secretName.MatchString(k) && literal(env[k]) {
			return literalError(fmt.Sprintf("env %s of agent %s", k, agent), "${VAR}")
		}
	}
	return nil
}

// checkGuardHeaders refuses a literal credential among guard mode's
// upstream headers, whose values go through Caddy's replacer, and a name
// that no request could carry.
func checkGuardHeaders(headers map[string]string) error {
	seen := map[string]string{}
	for _, k := range sortedMapKeys(headers) {
		if !upstream.ValidHeaderName(k) {
			return fmt.Errorf("guard upstream_header %q is not a valid HTTP header name: use letters, digits and '-', such as X-Api-Key", k)
		}
		if other, ok := seen[http.CanonicalHeaderKey(k)]; ok {
			return fmt.Errorf("guard upstream_header %s and %s are one header (names are not case-sensitive); give it once", other, k)
		}
		seen[http.CanonicalHeaderKey(k)] = k
		v := headers[k]
		if !plainHeaders[http.CanonicalHeaderKey(k)] && v != "" && !caddyPlaceholder.MatchString(v) {
			return literalError(fmt.Sprintf("guard upstream_header %s", k), "{env.VAR}")
		}
	}
	return nil
}

// checkGuardUpstream refuses a guard upstream URL that breaks the
// remote-URL rule (https, or plain http to loopback only; no userinfo) or
// that carries a secret-looking query value: the server's credential goes
// in upstream_header, as a placeholder. Errors never quote the URL's
// query.
func checkGuardUpstream(raw string) error {
	u, err := url.Parse(raw)
	if err != nil || !u.IsAbs() {
		return errors.New("guard upstream: give the MCP server's absolute URL, such as https://mcp.internal.example/mcp, or http://127.0.0.1:9000/mcp on this host")
	}
	if upstream.HasPlaceholder(raw) || caddyPlaceholder.MatchString(raw) {
		return errors.New("guard upstream: the URL takes no placeholder; write it as it is, and send a credential with upstream_header")
	}
	if err := pinnedfetch.CheckRemoteURL(u); err != nil {
		return fmt.Errorf("guard upstream: %w", err)
	}
	for k, vs := range u.Query() {
		for _, v := range vs {
			if secretName.MatchString(k) && v != "" {
				return fmt.Errorf("guard upstream: query parameter %s looks like a secret, which would show in the admin API and autosave.json; send it with upstream_header as a placeholder such as {env.VAR} instead", k)
			}
		}
	}
	return nil
}

// checkTokenKey refuses upstream_token_key given as the key itself.
func checkTokenKey(v string) error {
	if v != "" && !caddyPlaceholder.MatchString(v) {
		return literalError("upstream_token_key", "{env.VAR} (or leave it out and set ZIDANE_UPSTREAM_TOKEN_KEY)")
	}
	return nil
}

// checkSecrets runs every check on the app's config.
func (a *App) checkSecrets() error {
	if err := checkTokenKey(a.UpstreamTokenKey); err != nil {
		return fmt.Errorf("zidane: %w", err)
	}
	for _, u := range a.Upstreams {
		if err := checkUpstreamSecrets(u); err != nil {
			return fmt.Errorf("zidane: %w", err)
		}
	}
	names := make([]string, 0, len(a.Agents))
	for n := range a.Agents {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if ac := a.Agents[n]; ac != nil {
			if err := checkAgentEnv(n, ac.Env); err != nil {
				return fmt.Errorf("zidane: %w", err)
			}
		}
	}
	return nil
}

func sortedMapKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

package acpclient

import (
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"
)

// PassedEnv lists the variables an agent process inherits from the
// gateway's environment: PATH and LANG, which hold no secret and without
// which programs misbehave. Everything else (API keys, tokens, cloud
// credentials, the gateway's HOME, USER, TMPDIR, XDG_* directories) stays
// out unless the agent's configuration names it in Env.
var PassedEnv = []string{"PATH", "LANG"}

// Defaults of the passed variables when the gateway has none.
var envDefaults = map[string]string{
	"PATH": "/usr/local/bin:/usr/bin:/bin",
	"LANG": "C.UTF-8",
}

// Env builds an agent's environment: the PassedEnv variables (the
// gateway's, else a default), then fixed (HOME and TMPDIR of the session,
// taken as they are), then extra, which overrides both. In a value of
// extra, ${NAME} is replaced by the gateway's NAME, so a configuration can
// name a secret without holding it; a ${NAME} that is not set is an error
// rather than an empty credential. lookup is os.LookupEnv outside tests.
func Env(fixed, extra map[string]string, lookup func(string) (string, bool)) ([]string, error) {
	if lookup == nil {
		lookup = os.LookupEnv
	}
	vars := map[string]string{}
	for _, name := range PassedEnv {
		if v, ok := lookup(name); ok && v != "" {
			vars[name] = v
		} else {
			vars[name] = envDefaults[name]
		}
	}
	for name, v := range fixed {
		if v != "" {
			vars[name] = v
		}
	}
	for name, value := range extra {
		if name == "" || strings.ContainsAny(name, "=\x00") {
			return nil, fmt.Errorf("agent env: %q is not a valid variable name", name)
		}
		v, err := expand(value, lookup)
		if err != nil {
			return nil, fmt.Errorf("agent env %s: %w", name, err)
		}
		vars[name] = v
	}
	env := make([]string, 0, len(vars))
	for name, v := range vars {
		env = append(env, name+"="+v)
	}
	sort.Strings(env)
	return env, nil
}

// expand replaces ${NAME} only: a bare $ stays as it is, because values
// such as passwords may contain one.
func expand(s string, lookup func(string) (string, bool)) (string, error) {
	var b strings.Builder
	for {
		i := strings.Index(s, "${")
		if i < 0 {
			b.WriteString(s)
			return b.String(), nil
		}
		j := strings.IndexByte(s[i:], '}')
		if j < 0 {
			return "", errors.New("a ${ is not closed with }: write ${NAME}")
		}
		name := s[i+2 : i+j]
		v, ok := lookup(name)
		if !ok {
			return "", fmt.Errorf("${%s} is not set in the gateway's environment: set %s in caddy's environment", name, name)
		}
		b.WriteString(s[:i])
		b.WriteString(v)
		s = s[i+j+1:]
	}
}

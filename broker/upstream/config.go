package upstream

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/url"
	"strings"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/broker/upstreamauth"
	"github.com/Tahul/caddy-zidane-mcp/pinnedfetch"
	"github.com/Tahul/caddy-zidane-mcp/pins"
	"github.com/Tahul/caddy-zidane-mcp/policy"
)

// Transports an upstream can be reached over.
const (
	// TransportHTTP is MCP's streamable HTTP transport.
	TransportHTTP = "http"
	// TransportSSE is the older HTTP+SSE transport (a GET event stream and
	// POSTs to the endpoint it announces).
	TransportSSE = "sse"
	// TransportStdio runs the server as a local process and speaks JSON-RPC
	// on its stdin and stdout.
	TransportStdio = "stdio"
)

// MaxNameLength bounds an upstream name.
const MaxNameLength = 64

// Upstream is one upstream MCP server the broker connects to. It is part of
// the Caddy JSON config, and [LoadMCPJSON] reads it from the mcp.json files
// people already have.
//
// Values may hold environment placeholders (${VAR}, ${VAR:-default},
// ${env:VAR}; see [Expand]) so that secrets stay in the environment. They are
// expanded only where a transport is built ([Config.Expanded]): a
// normalized Upstream, config written back to disk and the admin API's view
// ([Config.Redacted]) keep them as written.
type Config struct {
	// Name identifies the upstream: letters, digits, '-' and '_', at most
	// 64 characters. Its tools are offered to clients as
	// mcp_<name>_<tool> (see [NamespaceTool]). Names are unique across
	// every configured source.
	Name string `json:"name"`

	// Transport is how the broker reaches the server: "http" (streamable
	// HTTP), "sse" (the older HTTP+SSE transport) or "stdio" (a local
	// process). Left empty it is inferred: a url means "http", or "sse"
	// when the URL's path ends in /sse; a command means "stdio".
	// "streamable-http" and "streamableHttp" are accepted for "http".
	Transport string `json:"transport,omitempty"`

	// URL is the server's MCP endpoint, for the http and sse transports.
	// It must be https://, or http:// to localhost, 127.0.0.0/8 or [::1]
	// only, without user:password@. A URL written without placeholders is
	// checked when the config loads; one with placeholders is checked
	// after expansion, when its transport is built.
	URL string `json:"url,omitempty"`

	// Headers are sent with every request to the server (http and sse),
	// for example {"Authorization": "Bearer ${GITHUB_TOKEN}"}. They never
	// reach a client, an agent or a listing.
	Headers map[string]string `json:"headers,omitempty"`

	// Command is the program to run for a stdio server, looked up in PATH
	// when it has no slash, e.g. "npx" or "/usr/local/bin/my-server".
	Command string `json:"command,omitempty"`

	// Args are the command's arguments.
	Args []string `json:"args,omitempty"`

	// Env is added to the stdio server's environment, for example
	// {"GITHUB_TOKEN": "${GITHUB_TOKEN}"}.
	Env map[string]string `json:"env,omitempty"`

	// Cwd is the stdio server's working directory. Empty means Caddy's.
	Cwd string `json:"cwd,omitempty"`

	// ToolsAllow, when set, offers only the tools whose upstream name
	// matches one of these patterns; `*` matches any run of characters.
	ToolsAllow []string `json:"tools_allow,omitempty"`

	// ToolsDeny hides the tools whose upstream name matches one of these
	// patterns, even when ToolsAllow matches them too.
	ToolsDeny []string `json:"tools_deny,omitempty"`

	// Scope is the inbound scope a client's token must carry to see and
	// use this upstream (letters, digits and ':._-'). Empty leaves the
	// decision to the route's scope rules.
	Scope string `json:"scope,omitempty"`

	// Timeout bounds the wait for the server to start answering a request
	// (its response headers; a stream that has started is never cut). In
	// JSON it is a duration string such as "30s" or an integer of
	// nanoseconds. Zero means the broker's default, 2 minutes.
	Timeout time.Duration `json:"timeout,omitempty"`

	// MaxResponse bounds what one answer of the server may hold, in
	// bytes: a POST's answer whole (a JSON body, or all the events of its
	// stream), and each event of a GET stream. Past it the call fails
	// with an error naming the upstream and the limit, and the gateway
	// drops its session with the upstream. Zero means
	// [DefaultMaxResponse], 16 MiB. For stdio servers go-sdk's own bound
	// of 16 MiB per message applies instead.
	MaxResponse int64 `json:"max_response,omitempty"`

	// Shared, for stdio servers, runs one process for every client (true,
	// the default) rather than one per client session. Give false for
	// servers that keep per-client state.
	Shared *bool `json:"shared,omitempty"`

	// OAuth, when set, makes the broker this upstream's OAuth client (http
	// and sse): it obtains the access token (client credentials, or an
	// operator's login with the authorization code grant), keeps it
	// encrypted in storage, refreshes it, and adds it to every request on
	// the upstream's origin. Its client_secret, private_key and
	// idp_client_secret may be ${VAR} placeholders, expanded like headers.
	OAuth *upstreamauth.Config `json:"oauth,omitempty"`

	// Pin is what the gateway does when one of the upstream's tools
	// changes its definition after it was first listed (package pins):
	// "strict" (withhold it until an operator approves), "warn" (let it
	// through, audited) or "off". Empty means strict for a remote server,
	// warn for one on loopback or run with stdio. A config from an
	// untrusted source cannot set it (see PinMode).
	Pin string `json:"pin,omitempty"`

	// NewTools is what the gateway does with a tool the upstream lists
	// after its tools were listed whole (package pins): "hold" (a change
	// waiting for approval: with pin strict it is withheld until an
	// operator approves it) or "allow" (pinned on first sight). Empty
	// means hold for a remote server, allow for one on loopback or run
	// with stdio. A config from an untrusted source cannot set it.
	NewTools string `json:"new_tools,omitempty"`

	// FromUntrusted marks a config that came from a source which must not
	// read this process's environment, such as a file a session supplied:
	// its placeholders resolve to their defaults, else to empty. Loaders
	// set it; it is kept when the config is written back.
	FromUntrusted bool `json:"from_untrusted,omitempty"`

	// Source says where the config came from (a file name, "Caddy
	// config"), for error messages. Loaders set it.
	Source string `json:"source,omitempty"`
}

// UnmarshalJSON reads an Upstream, accepting Timeout as a duration string
// ("30s", "1m30s") or as an integer of nanoseconds, like Caddy's durations.
func (u *Config) UnmarshalJSON(b []byte) error {
	type plain Config
	aux := struct {
		*plain
		Timeout json.RawMessage `json:"timeout,omitempty"`
	}{plain: (*plain)(u)}
	if err := json.Unmarshal(b, &aux); err != nil {
		return err
	}
	u.Timeout = 0
	if len(aux.Timeout) == 0 || string(aux.Timeout) == "null" {
		return nil
	}
	d, err := parseTimeout(aux.Timeout, time.Nanosecond)
	if err != nil {
		return fmt.Errorf("upstream %q: timeout: %w", u.Name, err)
	}
	u.Timeout = d
	return nil
}

// parseTimeout reads a JSON duration: a Go duration string, or a number of
// units.
func parseTimeout(raw json.RawMessage, unit time.Duration) (time.Duration, error) {
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		d, err := time.ParseDuration(s)
		if err != nil {
			return 0, fmt.Errorf("%q is not a duration; write it like \"30s\" or \"2m\"", s)
		}
		return d, nil
	}
	var n float64
	if err := json.Unmarshal(raw, &n); err != nil {
		return 0, fmt.Errorf("%s is not a duration; write it like \"30s\"", raw)
	}
	f := n * float64(unit)
	if math.IsNaN(f) || f >= math.MaxInt64 || f <= math.MinInt64 {
		return 0, fmt.Errorf("%s is out of range", raw)
	}
	return time.Duration(f), nil
}

// IsShared reports whether a stdio upstream's process serves every client
// ([Config.Shared], true unless set to false).
func (u Config) IsShared() bool {
	return u.Shared == nil || *u.Shared
}

// AllowsTool reports whether the upstream tool named tool (its own name, not
// the namespaced one) is offered, after ToolsAllow and ToolsDeny. An
// allowed name is matched as spelled; a denied one under every spelling
// an upstream could resolve to it (policy.GlobFold), since a server that
// looks names up without case would run a denied tool for DELETE_REPO.
func (u Config) AllowsTool(tool string) bool {
	if len(u.ToolsAllow) > 0 && !matchAny(u.ToolsAllow, tool) {
		return false
	}
	for _, p := range u.ToolsDeny {
		if policy.GlobFold(p, tool) {
			return false
		}
	}
	return true
}

func matchAny(patterns []string, s string) bool {
	for _, p := range patterns {
		if policy.Glob(p, s) {
			return true
		}
	}
	return false
}

// Normalize returns u with its transport canonical or inferred and its maps
// and slices copied, and checks it ([Config.Validate]). Placeholders are
// kept as written.
//
// The transport is inferred when it is empty: a URL means "http", or "sse"
// when its path ends in /sse; a command means "stdio". An upstream with
// both, or with neither, is an error that names it.
func Normalize(u Config) (Config, error) {
	n := u.clone()
	if n.Transport != "" {
		t, ok := canonicalTransport(n.Transport)
		if !ok {
			return u, fmt.Errorf("%s: transport %q is not known; use \"http\" (streamable HTTP), \"sse\" or \"stdio\"", Describe(u), u.Transport)
		}
		n.Transport = t
	} else {
		switch {
		case n.URL != "" && n.Command != "":
			return u, fmt.Errorf("%s: has both url and command; keep url for an http or sse server, or command for a stdio one", Describe(u))
		case n.URL != "":
			n.Transport = inferHTTPTransport(n.URL)
		case n.Command != "":
			n.Transport = TransportStdio
		default:
			return u, fmt.Errorf("%s: cannot tell how to reach it: set url (an https:// MCP endpoint) or command (a program that speaks MCP on stdio)", Describe(u))
		}
	}
	if err := n.Validate(); err != nil {
		return u, err
	}
	return n, nil
}

// Validate checks a normalized upstream: its name, a known transport with
// the fields it needs and none of another transport's, the URL rule for a
// URL without placeholders, header and environment names, tool patterns,
// scope and timeout. Errors name the upstream and its source and say what to
// change.
func (u Config) Validate() error {
	if err := checkName(u); err != nil {
		return err
	}
	where := Describe(u)
	switch u.Transport {
	case TransportHTTP, TransportSSE:
		if u.URL == "" {
			return fmt.Errorf("%s: transport %q needs url, the server's MCP endpoint", where, u.Transport)
		}
		if stray := stdioFields(u); stray != "" {
			return fmt.Errorf("%s: %s applies to stdio servers, not to transport %q; remove it", where, stray, u.Transport)
		}
		if !HasPlaceholder(u.URL) {
			if _, err := checkURL(u.URL); err != nil {
				return fmt.Errorf("%s: url: %w", where, err)
			}
		}
		for name, value := range u.Headers {
			if !ValidHeaderName(name) {
				return fmt.Errorf("%s: header name %q is not a valid HTTP header name", where, name)
			}
			if strings.ContainsAny(value, "\r\n\x00") {
				return fmt.Errorf("%s: header %s: the value holds a line break or NUL; remove it", where, name)
			}
		}
	case TransportStdio:
		if u.Command == "" {
			return fmt.Errorf("%s: transport \"stdio\" needs command, the program to run", where)
		}
		if u.URL != "" {
			return fmt.Errorf("%s: url applies to http and sse servers, not to transport \"stdio\"; remove it", where)
		}
		if len(u.Headers) > 0 {
			return fmt.Errorf("%s: headers apply to http and sse servers, not to transport \"stdio\"; pass credentials in env", where)
		}
		if u.OAuth != nil {
			return fmt.Errorf("%s: oauth applies to http and sse servers, not to transport \"stdio\"; pass credentials in env", where)
		}
		for name := range u.Env {
			if name == "" || strings.ContainsAny(name, "=\x00") {
				return fmt.Errorf("%s: env name %q is not valid: it must be non-empty without '=' or NUL", where, name)
			}
		}
	case "":
		return fmt.Errorf("%s: no transport; normalize the config first, or set transport to \"http\", \"sse\" or \"stdio\"", where)
	default:
		return fmt.Errorf("%s: transport %q is not known; use \"http\" (streamable HTTP), \"sse\" or \"stdio\"", where, u.Transport)
	}
	for _, list := range []struct {
		field    string
		patterns []string
	}{{"tools_allow", u.ToolsAllow}, {"tools_deny", u.ToolsDeny}} {
		for _, p := range list.patterns {
			if p == "" {
				return fmt.Errorf("%s: %s holds an empty pattern; remove it, or use \"*\" for every tool", where, list.field)
			}
		}
	}
	if u.Scope != "" && !validScope(u.Scope) {
		return fmt.Errorf("%s: scope %q: use letters, digits and ':._-', starting with a letter or digit, at most 64 characters", where, u.Scope)
	}
	if u.MaxResponse < 0 {
		return fmt.Errorf("%s: max_response %d is negative; give a positive size such as 16MiB, or leave it out for the default", where, u.MaxResponse)
	}
	if u.Pin != "" {
		if _, err := pins.ParseMode(u.Pin); err != nil {
			return fmt.Errorf("%s: %w", where, err)
		}
	}
	if u.NewTools != "" {
		if _, err := pins.ParseNewTools(u.NewTools); err != nil {
			return fmt.Errorf("%s: %w", where, err)
		}
	}
	if u.Timeout < 0 {
		return fmt.Errorf("%s: timeout %v is negative; give a positive duration, or leave it out for the default", where, u.Timeout)
	}
	return nil
}

// PinMode is the upstream's pin mode: Pin, or its default (strict for a
// remote server, warn for one on loopback or run with stdio). A config
// from an untrusted source gets the default, whatever it says: a session
// that supplies a server must not turn the check of that server off.
func (u Config) PinMode() pins.Mode {
	if u.Pin != "" && !u.FromUntrusted {
		if m, err := pins.ParseMode(u.Pin); err == nil {
			return m
		}
	}
	if u.Local() {
		return pins.Warn
	}
	return pins.Strict
}

// PinPolicy is how the upstream's items are pinned: PinMode, and NewTools
// or its default (hold for a remote server, allow for a local one). A
// config from an untrusted source gets the defaults.
func (u Config) PinPolicy() pins.Policy {
	p := pins.Policy{Mode: u.PinMode(), NewTools: pins.HoldNew}
	if u.Local() {
		p.NewTools = pins.AllowNew
	}
	if u.NewTools != "" && !u.FromUntrusted {
		if n, err := pins.ParseNewTools(u.NewTools); err == nil {
			p.NewTools = n
		}
	}
	return p
}

// Local reports whether the upstream is a server under the operator's hand
// on this host: run with stdio, or at a loopback address (a URL whose host
// is a loopback IP or localhost, with no placeholder in it). Any other is
// remote.
func (u Config) Local() bool {
	if u.Transport == TransportStdio {
		return true
	}
	parsed, err := url.Parse(u.URL)
	return err == nil && !HasPlaceholder(u.URL) && pinnedfetch.IsLoopbackHost(parsed.Hostname())
}

// Endpoint parses the URL of an http or sse upstream and applies the
// remote-URL rule ([pinnedfetch.CheckRemoteURL]). Call it on the result of
// [Config.Expanded], where the transport is built: a URL that still holds
// a placeholder (its variable was unset) is refused.
func (u Config) Endpoint() (*url.URL, error) {
	if u.URL == "" {
		return nil, fmt.Errorf("%s: has no url", Describe(u))
	}
	if v, ok := FirstPlaceholder(u.URL); ok {
		return nil, fmt.Errorf("%s: url still holds the placeholder for %s: set %s in the environment of the Caddy process, or give a default with ${%s:-…}", Describe(u), v, v, v)
	}
	parsed, err := checkURL(u.URL)
	if err != nil {
		return nil, fmt.Errorf("%s: url: %w", Describe(u), err)
	}
	return parsed, nil
}

// checkURL parses raw and applies the remote-URL rule. Its errors never
// quote the URL itself (a query may hold a key): pinnedfetch's are redacted.
func checkURL(raw string) (*url.URL, error) {
	parsed, err := url.Parse(raw)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return nil, fmt.Errorf("it is not a valid URL (%v); write an absolute https:// URL", err)
	}
	if err := pinnedfetch.CheckRemoteURL(parsed); err != nil {
		return nil, err
	}
	return parsed, nil
}

// MergeUpstreams concatenates lists of upstreams from several sources. Two
// upstreams with one name are an error that names both sources; every such
// clash is reported.
func MergeUpstreams(lists ...[]Config) ([]Config, error) {
	var (
		all  []Config
		seen = map[string]Config{}
		errs []error
	)
	for _, list := range lists {
		for _, u := range list {
			if prev, ok := seen[u.Name]; ok {
				errs = append(errs, fmt.Errorf("upstream %q is defined twice: in %s and in %s; rename or remove one", u.Name, sourceName(prev), sourceName(u)))
				continue
			}
			seen[u.Name] = u
			all = append(all, u)
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return all, nil
}

func (u Config) clone() Config {
	n := u
	n.Headers = cloneMap(u.Headers)
	n.Env = cloneMap(u.Env)
	n.Args = cloneSlice(u.Args)
	n.ToolsAllow = cloneSlice(u.ToolsAllow)
	n.ToolsDeny = cloneSlice(u.ToolsDeny)
	if u.Shared != nil {
		b := *u.Shared
		n.Shared = &b
	}
	if u.OAuth != nil {
		o := *u.OAuth
		o.Scopes = cloneSlice(u.OAuth.Scopes)
		n.OAuth = &o
	}
	return n
}

func cloneMap(m map[string]string) map[string]string {
	if m == nil {
		return nil
	}
	c := make(map[string]string, len(m))
	for k, v := range m {
		c[k] = v
	}
	return c
}

func cloneSlice(s []string) []string {
	if s == nil {
		return nil
	}
	return append([]string(nil), s...)
}

// canonicalTransport maps the transport spellings found in mcp.json files
// to this package's names.
func canonicalTransport(t string) (string, bool) {
	switch strings.ToLower(strings.TrimSpace(t)) {
	case "http", "streamable-http", "streamablehttp", "streamable_http", "streamable":
		return TransportHTTP, true
	case "sse":
		return TransportSSE, true
	case "stdio":
		return TransportStdio, true
	}
	return "", false
}

// inferHTTPTransport reads the transport from a URL: a path ending in /sse
// is the older SSE transport, anything else streamable HTTP. It looks at the
// text, so a URL with placeholders is read the same way.
func inferHTTPTransport(raw string) string {
	p := raw
	if i := strings.IndexAny(p, "?#"); i >= 0 {
		p = p[:i]
	}
	if strings.HasSuffix(strings.TrimRight(p, "/"), "/sse") {
		return TransportSSE
	}
	return TransportHTTP
}

// stdioFields names the first stdio-only field that u sets.
func stdioFields(u Config) string {
	switch {
	case u.Command != "":
		return "command"
	case len(u.Args) > 0:
		return "args"
	case len(u.Env) > 0:
		return "env"
	case u.Cwd != "":
		return "cwd"
	case u.Shared != nil:
		return "shared"
	}
	return ""
}

func checkName(u Config) error {
	if u.Name == "" {
		return fmt.Errorf("an upstream%s has no name; give it one of letters, digits, '-' and '_'", fromSource(u))
	}
	if len(u.Name) > MaxNameLength {
		return fmt.Errorf("upstream name %q%s is %d characters long; use at most %d", u.Name, fromSource(u), len(u.Name), MaxNameLength)
	}
	if !ValidName(u.Name) {
		return fmt.Errorf("upstream name %q%s: use letters, digits, '-' and '_' only, for example %q", u.Name, fromSource(u), suggestName(u.Name))
	}
	return nil
}

// ValidName reports whether name is a valid upstream name: 1 to 64 ASCII
// letters, digits, '-' and '_'.
func ValidName(name string) bool {
	if name == "" || len(name) > MaxNameLength {
		return false
	}
	for i := 0; i < len(name); i++ {
		if !nameByte(name[i]) {
			return false
		}
	}
	return true
}

func nameByte(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_'
}

func suggestName(name string) string {
	var b strings.Builder
	for i := 0; i < len(name) && b.Len() < MaxNameLength; i++ {
		if nameByte(name[i]) {
			b.WriteByte(name[i])
		} else if b.Len() > 0 && !strings.HasSuffix(b.String(), "_") {
			b.WriteByte('_')
		}
	}
	s := strings.TrimRight(b.String(), "_")
	if s == "" {
		return "my_server"
	}
	return s
}

func validScope(s string) bool {
	if s == "" || len(s) > 64 || !(nameByte(s[0]) && s[0] != '-' && s[0] != '_') {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !nameByte(c) && c != ':' && c != '.' {
			return false
		}
	}
	return true
}

// ValidHeaderName reports whether s is an RFC 9110 token, as a header name
// must be.
func ValidHeaderName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' {
			continue
		}
		if !strings.ContainsRune("!#$%&'*+-.^_`|~", rune(c)) {
			return false
		}
	}
	return true
}

// Describe names an upstream and its source for an error message.
func Describe(u Config) string {
	return fmt.Sprintf("upstream %q%s", u.Name, fromSource(u))
}

func fromSource(u Config) string {
	if u.Source == "" {
		return ""
	}
	return " (from " + u.Source + ")"
}

func sourceName(u Config) string {
	if u.Source == "" {
		return "an unnamed source"
	}
	return u.Source
}

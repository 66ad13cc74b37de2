package upstream

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"time"
)

// MaxMCPJSONServers bounds the servers one document may define.
const MaxMCPJSONServers = 1024

// LoadMCPJSON reads upstream configs from an mcp.json document, in any of
// the shapes people already have:
//
//   - a name-keyed map under "mcpServers" (Claude Desktop, Claude Code,
//     Cursor), under "servers" (VS Code), or bare: {"github": {...}};
//   - a list of configs, each with a "name";
//   - a single config with a "name".
//
// In a config, "type" and "transport" are read alike ("http",
// "streamable-http", "streamableHttp", "sse", "stdio"); "url", "httpUrl"
// (streamable HTTP), "sseUrl" (SSE) and "serverUrl" (Windsurf) give the
// endpoint; "headers", "command" (a string, or a list whose head is the
// program), "args", "env" and "cwd" are as in [Config]. Also read:
// "timeout" (a number of milliseconds, or a duration string such as "30s"),
// "includeTools"/"toolsAllow"/"tools_allow", "excludeTools"/"toolsDeny"/
// "tools_deny", "scope" and "shared". An entry with "disabled": true is
// skipped. Numbers and booleans in headers, env and args are taken as their
// JSON text.
//
// Anything else (VS Code's "inputs" and "envFile", Cline's "autoApprove", a
// second top-level key) is ignored, and each ignored field is reported in
// warnings, which name source, server and field and never a value.
//
// Every upstream gets Source set to source and is normalized ([Normalize]);
// placeholders stay as written. A caller that loads a file from an
// untrusted place sets FromUntrusted on the results. Errors name the source
// and the entry; all of them are reported, joined, and then no upstream is
// returned.
func LoadMCPJSON(data []byte, source string) (upstreams []Config, warnings []string, err error) {
	l := loader{source: source}
	data = bytes.TrimSpace(data)
	if len(data) == 0 {
		return nil, nil, fmt.Errorf("%s is empty; give a JSON object such as {\"mcpServers\": {\"name\": {\"url\": \"https://…\"}}}", source)
	}
	switch data[0] {
	case '[':
		l.list(data, "")
	case '{':
		l.document(data)
	default:
		return nil, nil, fmt.Errorf("%s is not a JSON object or array; give {\"mcpServers\": {…}}, a list of servers, or one server", source)
	}
	if len(l.errs) == 0 && len(l.ups) > MaxMCPJSONServers {
		l.errs = append(l.errs, fmt.Errorf("%s defines %d servers; at most %d are allowed", source, len(l.ups), MaxMCPJSONServers))
	}
	if len(l.errs) > 0 {
		return nil, l.warnings, errors.Join(l.errs...)
	}
	return l.ups, l.warnings, nil
}

type loader struct {
	source   string
	ups      []Config
	warnings []string
	errs     []error
	names    map[string]string // name → where it was defined
}

func (l *loader) fail(format string, args ...any) {
	l.errs = append(l.errs, fmt.Errorf(l.source+": "+format, args...))
}

func (l *loader) warn(format string, args ...any) {
	l.warnings = append(l.warnings, fmt.Sprintf(l.source+": "+format, args...))
}

// wrapperKeys hold a name-keyed map (or a list) of servers.
var wrapperKeys = []string{"mcpServers", "servers"}

// entryKeys mark an object as a single config rather than a map of them:
// a config has one of these with a value that is not an object.
var entryKeys = map[string]bool{
	"name": true, "type": true, "transport": true, "url": true, "httpUrl": true,
	"sseUrl": true, "serverUrl": true, "command": true, "args": true,
}

func (l *loader) document(data []byte) {
	members, err := objectMembers(data)
	if err != nil {
		l.fail("%v", err)
		return
	}
	var wrapped bool
	for _, m := range members {
		for _, k := range wrapperKeys {
			if m.key == k && (isKind(m.value, '{') || isKind(m.value, '[')) {
				wrapped = true
			}
		}
	}
	if wrapped {
		for _, m := range members {
			switch {
			case (m.key == "mcpServers" || m.key == "servers") && isKind(m.value, '{'):
				l.keyed(m.value, m.key)
			case (m.key == "mcpServers" || m.key == "servers") && isKind(m.value, '['):
				l.list(m.value, m.key)
			default:
				l.warn("top-level field %q is not used by the broker; ignored", m.key)
			}
		}
		return
	}
	for _, m := range members {
		if entryKeys[m.key] && !isKind(m.value, '{') {
			l.entry(data, "", "the server")
			return
		}
	}
	l.keyed(data, "")
}

// keyed reads a name-keyed map of servers.
func (l *loader) keyed(data []byte, under string) {
	members, err := objectMembers(data)
	if err != nil {
		l.fail("%s: %v", orTop(under), err)
		return
	}
	for _, m := range members {
		if !isKind(m.value, '{') {
			l.fail("%q%s is not a server config; give an object such as {\"url\": \"https://…\"} or {\"command\": \"…\"}", m.key, inWrapper(under))
			continue
		}
		l.entry(m.value, m.key, fmt.Sprintf("server %q", m.key))
	}
}

// list reads an array of servers, each with a name.
func (l *loader) list(data []byte, under string) {
	var items []json.RawMessage
	if err := json.Unmarshal(data, &items); err != nil {
		l.fail("%s: %v", orTop(under), err)
		return
	}
	for i, item := range items {
		where := fmt.Sprintf("entry %d%s", i+1, inWrapper(under))
		if !isKind(item, '{') {
			l.fail("%s is not a server config; give an object with a name", where)
			continue
		}
		l.entry(item, "", where)
	}
}

// entry reads one server config. key is its name in a name-keyed map, or
// empty; where says which entry it is for messages.
func (l *loader) entry(data []byte, key, where string) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(data, &fields); err != nil {
		l.fail("%s: %v", where, err)
		return
	}
	e := entryReader{l: l, fields: fields, where: where}
	u := Config{Source: l.source}
	name := e.str("name")
	switch {
	case key != "":
		u.Name = key
		if name != "" && name != key {
			l.warn("%s: its \"name\" %q is ignored; the key names the server", where, name)
		}
	case name == "":
		l.fail("%s has no name; add \"name\": \"…\" (letters, digits, '-' and '_')", where)
		return
	default:
		u.Name = name
		where = fmt.Sprintf("server %q", name)
		e.where = where
	}
	if e.boolean("disabled") {
		l.warn("%s is disabled; skipped", where)
		return
	}

	e.transportAndURL(&u)

	u.Headers = e.stringMap("headers")
	u.Command, u.Args = e.command()
	u.Env = e.stringMap("env")
	u.Cwd = e.str("cwd")
	u.Scope = e.str("scope")
	u.ToolsAllow = e.stringList("includeTools", "toolsAllow", "tools_allow")
	u.ToolsDeny = e.stringList("excludeTools", "toolsDeny", "tools_deny")
	if raw, ok := e.take("shared"); ok && string(raw) != "null" {
		var b bool
		if err := json.Unmarshal(raw, &b); err != nil {
			e.failf("\"shared\" must be true or false")
		} else {
			u.Shared = &b
		}
	}
	if raw, ok := e.take("timeout"); ok && string(raw) != "null" {
		d, err := parseTimeout(raw, time.Millisecond)
		if err != nil {
			e.failf("\"timeout\": %v (a number is milliseconds)", err)
		}
		u.Timeout = d
	}

	for _, k := range sortedRawKeys(fields) {
		l.warn("%s: field %q is not used by the broker; ignored", where, k)
	}
	if e.failed {
		return
	}
	n, err := Normalize(u)
	if err != nil {
		l.errs = append(l.errs, err)
		return
	}
	if l.names == nil {
		l.names = map[string]string{}
	}
	if prev, dup := l.names[n.Name]; dup {
		l.fail("upstream %q is defined twice (%s and %s); rename or remove one", n.Name, prev, where)
		return
	}
	l.names[n.Name] = where
	l.ups = append(l.ups, n)
}

// transportAndURL reads the transport ("type" or "transport") and the URL
// (under any of the names clients use) of u, and checks that they agree.
func (e *entryReader) transportAndURL(u *Config) {
	typ, transport := e.str("type"), e.str("transport")
	if typ != "" && transport != "" && !sameTransport(typ, transport) {
		e.failf("\"type\" %q and \"transport\" %q disagree; keep one", typ, transport)
	}
	u.Transport = transport
	if u.Transport == "" {
		u.Transport = typ
	}

	var urlKeys []string
	for _, k := range []string{"url", "httpUrl", "sseUrl", "serverUrl"} {
		if v := e.str(k); v != "" {
			urlKeys = append(urlKeys, k)
			u.URL = v
		}
	}
	if len(urlKeys) > 1 {
		e.failf("has %s; keep one", strings.Join(urlKeys, " and "))
	}
	if len(urlKeys) == 1 {
		implied := map[string]string{"httpUrl": TransportHTTP, "sseUrl": TransportSSE}[urlKeys[0]]
		switch t, known := canonicalTransport(u.Transport); {
		case implied == "":
		case u.Transport == "":
			u.Transport = implied
		case known && t != implied:
			e.failf("%s means transport %q but its type is %q; keep one", urlKeys[0], implied, u.Transport)
		}
	}
}

// entryReader takes fields out of one config, so that what is left at the
// end is what the broker does not use.
type entryReader struct {
	l      *loader
	fields map[string]json.RawMessage
	where  string
	failed bool
}

func (e *entryReader) failf(format string, args ...any) {
	e.failed = true
	e.l.fail(e.where+": "+format, args...)
}

func (e *entryReader) take(key string) (json.RawMessage, bool) {
	raw, ok := e.fields[key]
	delete(e.fields, key)
	return raw, ok
}

func (e *entryReader) str(key string) string {
	raw, ok := e.take(key)
	if !ok || string(raw) == "null" {
		return ""
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		e.failf("%q must be a string", key)
	}
	return s
}

func (e *entryReader) boolean(key string) bool {
	raw, ok := e.take(key)
	if !ok || string(raw) == "null" {
		return false
	}
	var b bool
	if err := json.Unmarshal(raw, &b); err != nil {
		e.failf("%q must be true or false", key)
	}
	return b
}

// stringList reads lists of strings given under any of keys (spellings of
// one field) and joins them.
func (e *entryReader) stringList(keys ...string) []string {
	var out []string
	for _, key := range keys {
		raw, ok := e.take(key)
		if !ok || string(raw) == "null" {
			continue
		}
		var list []string
		if err := json.Unmarshal(raw, &list); err != nil {
			e.failf("%q must be a list of strings", key)
			continue
		}
		out = append(out, list...)
	}
	return out
}

func (e *entryReader) stringMap(key string) map[string]string {
	raw, ok := e.take(key)
	if !ok || string(raw) == "null" {
		return nil
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		e.failf("%q must be an object of names to strings", key)
		return nil
	}
	out := make(map[string]string, len(m))
	for k, v := range m {
		s, ok := scalarText(v)
		if !ok {
			e.failf("%s.%s must be a string", key, k)
			continue
		}
		out[k] = s
	}
	return out
}

// command reads "command" and "args", taking a list-valued command as the
// program and its first arguments.
func (e *entryReader) command() (string, []string) {
	var (
		cmd  string
		args []string
	)
	if raw, ok := e.take("command"); ok && string(raw) != "null" {
		if isKind(raw, '[') {
			list := e.scalarList("command", raw)
			if len(list) > 0 {
				cmd, args = list[0], list[1:]
			}
		} else if err := json.Unmarshal(raw, &cmd); err != nil {
			e.failf("\"command\" must be a string")
		}
	}
	if raw, ok := e.take("args"); ok && string(raw) != "null" {
		args = append(args, e.scalarList("args", raw)...)
	}
	return cmd, args
}

func (e *entryReader) scalarList(key string, raw json.RawMessage) []string {
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil {
		e.failf("%q must be a list of strings", key)
		return nil
	}
	out := make([]string, 0, len(items))
	for i, item := range items {
		s, ok := scalarText(item)
		if !ok {
			e.failf("%s[%d] must be a string", key, i)
			continue
		}
		out = append(out, s)
	}
	return out
}

// scalarText reads a string, or takes a number or boolean as its JSON text.
func scalarText(raw json.RawMessage) (string, bool) {
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, true
	}
	raw = bytes.TrimSpace(raw)
	if string(raw) == "true" || string(raw) == "false" {
		return string(raw), true
	}
	if _, err := strconv.ParseFloat(string(raw), 64); err == nil {
		return string(raw), true
	}
	return "", false
}

func sameTransport(a, b string) bool {
	ca, oka := canonicalTransport(a)
	cb, okb := canonicalTransport(b)
	return oka && okb && ca == cb
}

type member struct {
	key   string
	value json.RawMessage
}

// objectMembers returns an object's members in document order; a key given
// twice is an error, since encoding/json would silently keep the last.
func objectMembers(data []byte) ([]member, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	if tok, err := dec.Token(); err != nil {
		return nil, fmt.Errorf("not valid JSON: %v", err)
	} else if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, errors.New("not a JSON object")
	}
	var (
		out  []member
		seen = map[string]bool{}
	)
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, fmt.Errorf("not valid JSON: %v", err)
		}
		key, _ := tok.(string)
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, fmt.Errorf("not valid JSON at %q: %v", key, err)
		}
		if seen[key] {
			return nil, fmt.Errorf("%q is given twice; keep one", key)
		}
		seen[key] = true
		out = append(out, member{key: key, value: v})
	}
	if _, err := dec.Token(); err != nil {
		return nil, fmt.Errorf("not valid JSON: %v", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("not valid JSON: text after the object")
	}
	return out, nil
}

func isKind(raw json.RawMessage, delim byte) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) > 0 && raw[0] == delim
}

func sortedRawKeys(m map[string]json.RawMessage) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func orTop(under string) string {
	if under == "" {
		return "the document"
	}
	return strconv.Quote(under)
}

func inWrapper(under string) string {
	if under == "" {
		return ""
	}
	return " in " + strconv.Quote(under)
}

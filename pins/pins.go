// Package pins pins what upstream MCP servers give a model to read: the
// first time the gateway sees an item listed (a tool, prompt, resource or
// resource template) or the server's instructions and serverInfo, it
// records a digest of every member of it that a client shows or passes to
// a model. A later listing whose definition differs is a change that an
// operator approves or rejects; until then, in strict mode, the item is
// withheld from listings and its use refused (a "rug pull", where an
// upstream rewrites a tool's description after it was approved, redirects
// an agent without any call being refused otherwise). A tool that appears
// after a namespace's tools were listed whole may wait for approval too
// (Policy.NewTools).
//
// Pins live in storage, one document per namespace (an upstream, or a
// guarded site), and every change to that document is a read-modify-write
// under the storage's lock (storage.Update), so replicas on one shared
// storage never undo each other's approvals. Decisions are made on the
// in-memory copy, which is loaded before the namespace decides anything:
// a restart never pins a changed item afresh. The copy is read again when
// another process writes (Reload, from a watch) and polled as a safety net
// (Run), and a read older than the copy never replaces it.
package pins

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"hash"
	"slices"
	"strings"

	"github.com/Tahul/caddy-zidane-mcp/policy"
)

// Mode is what a namespace does with a changed item.
type Mode uint8

const (
	// Strict withholds a changed item from listings and refuses its use
	// until an operator approves the change.
	Strict Mode = iota
	// Warn lets a changed item through, and records and audits the change.
	Warn
	// Off pins nothing.
	Off
)

func (m Mode) String() string {
	switch m {
	case Strict:
		return "strict"
	case Warn:
		return "warn"
	}
	return "off"
}

// ParseMode reads a mode as the configuration spells it.
func ParseMode(s string) (Mode, error) {
	switch s {
	case "strict":
		return Strict, nil
	case "warn":
		return Warn, nil
	case "off":
		return Off, nil
	}
	return 0, fmt.Errorf("pin %q: use strict, warn or off", s)
}

// NewTools is what a namespace does with a tool first seen after its
// tools were listed whole (see Store.ToolsListed).
type NewTools uint8

const (
	// AllowNew pins such a tool on first sight, as the first listing's.
	AllowNew NewTools = iota
	// HoldNew records it as a change waiting for approval: with pin
	// strict it is withheld and its calls refused until approved.
	HoldNew
)

func (n NewTools) String() string {
	if n == HoldNew {
		return "hold"
	}
	return "allow"
}

// ParseNewTools reads new_tools as the configuration spells it.
func ParseNewTools(s string) (NewTools, error) {
	switch s {
	case "allow":
		return AllowNew, nil
	case "hold":
		return HoldNew, nil
	}
	return 0, fmt.Errorf("new_tools %q: use allow or hold", s)
}

// Policy is how a namespace pins.
type Policy struct {
	Mode     Mode
	NewTools NewTools
}

// Kind is the kind of item a namespace pins.
type Kind uint8

// The kinds of item. Server is the server's own: its instructions and
// its serverInfo, each an item of its own (ServerInstructions,
// ServerInfo), since a server may answer with one and not the other.
const (
	Tool Kind = iota
	Prompt
	Resource
	ResourceTemplate
	Server
	numKinds
)

// The names of the two Server items.
const (
	ServerInstructions = "instructions"
	ServerInfo         = "serverInfo"
)

var kindNames = [numKinds]string{"tool", "prompt", "resource", "resource_template", "server"}

func (k Kind) String() string {
	if k < numKinds {
		return kindNames[k]
	}
	return "unknown"
}

// ParseKind reads a kind as String spells it; "" is Tool.
func ParseKind(s string) (Kind, error) {
	if s == "" {
		return Tool, nil
	}
	for k, n := range kindNames {
		if n == s {
			return Kind(k), nil
		}
	}
	return 0, fmt.Errorf("kind %q: use tool, prompt, resource, resource_template or server", s)
}

// nameMember is the member of a listed item that names it, set to the
// upstream's own name before the digest (the aggregated route lists a
// tool or prompt under another).
func (k Kind) nameMember() string {
	switch k {
	case Tool, Prompt:
		return "name"
	case Resource:
		return "uri"
	case ResourceTemplate:
		return "uriTemplate"
	}
	return ""
}

// legacyFields are the members of a tool that pins made before every
// member was pinned covered, in the order their digest took them. A
// digest takes them first, in this order, and the other members after,
// sorted; so a tool that has none of the others keeps the digest it had,
// and a pin made then stays meaningful (see Definition.V).
var legacyFields = []string{"name", "title", "description", "inputSchema", "outputSchema", "annotations"}

// Bounds of what a namespace pins.
const (
	// MaxDefinition bounds one item's pinned definition, canonical.
	MaxDefinition = 256 << 10
	// MaxItems bounds the items of one kind in one namespace.
	MaxItems = 4096
	// maxDocument bounds a namespace's stored document.
	maxDocument = 16 << 20
)

// currentVersion is Definition.V of a definition that covers every member.
const currentVersion = 2

// Definition is the canonical form of an item's pinned members and its
// digest.
type Definition struct {
	Digest string                     `json:"digest"`
	Fields map[string]json.RawMessage `json:"fields"`
	// V is 2 for a definition of every member; 0 for a tool's pinned by an
	// older gateway, which covered legacyFields only.
	V int `json:"v,omitempty"`
	// legacy is the digest of legacyFields alone (tools), to compare with
	// a pin of V 0.
	legacy string
}

// Canonical returns the definition of an item of kind named name (the
// upstream's own name, uri or uriTemplate) from its listed object: every
// member but those that describe the item's content rather than instruct
// a model (a resource's size and its annotations' lastModified, which
// change whenever its content does, as long as they are a number and a
// date: text there is pinned as any member is). Each member is re-encoded in one form
// (object keys sorted, numbers as spelled, no HTML escaping), so a server
// that re-serializes the same definition differently has not changed it;
// the digest is SHA-256 over the members in order (legacyFields, then the
// others sorted). The listing the object came from was read by package
// message, so no key of it is ambiguous.
func Canonical(kind Kind, name string, obj map[string]json.RawMessage) (Definition, error) {
	d := Definition{Fields: make(map[string]json.RawMessage, len(obj)+1), V: currentVersion}
	nm := kind.nameMember()
	members := make([]string, 0, len(obj)+1)
	for k := range obj {
		if k != nm {
			members = append(members, k)
		}
	}
	if nm != "" {
		members = append(members, nm)
	}
	members = orderFields(members)
	h := sha256.New()
	var legacy hash.Hash
	if kind == Tool {
		legacy = sha256.New()
	}
	size := 0
	for _, f := range members {
		raw := obj[f]
		if f == nm {
			raw, _ = json.Marshal(name)
		}
		c, err := canonicalJSON(raw)
		if err != nil {
			return Definition{}, fmt.Errorf("%s %q: %s does not read as JSON: %w", kind, name, f, err)
		}
		if string(c) == "null" && f != nm {
			continue // absent and null read alike
		}
		if kind == Resource || kind == ResourceTemplate {
			if f == "size" && isNumber(c) {
				continue
			}
			if f == "annotations" {
				if c, err = withoutDate(c, "lastModified"); err != nil {
					return Definition{}, fmt.Errorf("%s %q: annotations: %w", kind, name, err)
				}
			}
		}
		size += len(c)
		if size > MaxDefinition {
			return Definition{}, fmt.Errorf("%s %q: its definition is over %d bytes, more than the gateway pins", kind, name, MaxDefinition)
		}
		d.Fields[f] = c
		// A legacy member's name is written as it is (as pins of V 0
		// were); another's as a JSON string, which no legacy name spells
		// and which holds no NUL, so no two definitions hash alike.
		label := f
		isLegacy := slices.Contains(legacyFields, f)
		if !isLegacy {
			q, _ := json.Marshal(f)
			label = string(q)
		}
		fmt.Fprintf(h, "%s\x00%d\x00", label, len(c))
		h.Write(c)
		if legacy != nil && isLegacy {
			fmt.Fprintf(legacy, "%s\x00%d\x00", label, len(c))
			legacy.Write(c)
		}
	}
	d.Digest = "sha256:" + hex.EncodeToString(h.Sum(nil))
	if legacy != nil {
		d.legacy = "sha256:" + hex.EncodeToString(legacy.Sum(nil))
	}
	return d, nil
}

// orderFields sorts member names as digests and diffs take them:
// legacyFields first, in their order, then the others by name.
func orderFields(names []string) []string {
	slices.SortFunc(names, func(a, b string) int {
		ia, ib := slices.Index(legacyFields, a), slices.Index(legacyFields, b)
		switch {
		case ia >= 0 && ib >= 0:
			return ia - ib
		case ia >= 0:
			return -1
		case ib >= 0:
			return 1
		}
		return strings.Compare(a, b)
	})
	return names
}

func canonicalJSON(raw []byte) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	var out bytes.Buffer
	enc := json.NewEncoder(&out)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimRight(out.Bytes(), "\n"), nil
}

// isNumber reports whether canonical JSON c is a number.
func isNumber(c []byte) bool {
	return len(c) > 0 && (c[0] == '-' || c[0] >= '0' && c[0] <= '9')
}

// maxDate bounds what withoutDate takes for a date.
const maxDate = 64

// isDate reports whether canonical JSON c is a string that can only be a
// date and time (digits, the separators and zone letters of ISO 8601, at
// most maxDate bytes): it is left out of a pin because it follows the
// content, and so may carry no words that a client would show.
func isDate(c []byte) bool {
	if len(c) < 2 || len(c) > maxDate+2 || c[0] != '"' || c[len(c)-1] != '"' {
		return false
	}
	for _, b := range c[1 : len(c)-1] {
		if !(b >= '0' && b <= '9' || strings.IndexByte("-:.,+ TZtzW", b) >= 0) {
			return false
		}
	}
	return true
}

// withoutDate returns canonical JSON c without its member name, when c is
// an object and that member is a date (isDate); a member that holds
// anything else stays, and is pinned.
func withoutDate(c []byte, name string) ([]byte, error) {
	var m map[string]json.RawMessage
	if json.Unmarshal(c, &m) != nil {
		return c, nil
	}
	if v, ok := m[name]; !ok || !isDate(v) {
		return c, nil
	}
	delete(m, name)
	b, err := json.Marshal(m)
	if err != nil {
		return nil, err
	}
	return canonicalJSON(b)
}

// FieldDiff is one member that differs between two definitions; Old or
// New is nil where it is absent.
type FieldDiff struct {
	Field string          `json:"field"`
	Old   json.RawMessage `json:"old,omitempty"`
	New   json.RawMessage `json:"new,omitempty"`
}

// Diff lists the members in which a and b differ, in digest order.
func Diff(a, b Definition) []FieldDiff {
	names := make([]string, 0, len(a.Fields)+len(b.Fields))
	for f := range a.Fields {
		names = append(names, f)
	}
	for f := range b.Fields {
		if _, ok := a.Fields[f]; !ok {
			names = append(names, f)
		}
	}
	var out []FieldDiff
	for _, f := range orderFields(names) {
		if !bytes.Equal(a.Fields[f], b.Fields[f]) {
			out = append(out, FieldDiff{Field: f, Old: a.Fields[f], New: b.Fields[f]})
		}
	}
	return out
}

// ChangedFields names the fields of a diff.
func ChangedFields(d []FieldDiff) []string {
	out := make([]string, 0, len(d))
	for _, f := range d {
		out = append(out, f.Field)
	}
	return out
}

// validName reports whether a namespace or item name may be stored.
func validName(s string) bool {
	return s != "" && len(s) <= 2048 && !strings.ContainsFunc(s, func(r rune) bool { return r < 0x20 || r == 0x7f })
}

// foldName is policy.FoldName: the form in which two names an upstream
// could resolve to one item are equal.
func foldName(s string) string { return policy.FoldName(s) }

// sortedNames returns m's keys in order.
func sortedNames[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

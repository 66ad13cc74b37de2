// Package pins pins the definitions of upstream MCP servers' tools: the
// first time the gateway sees a tool listed, it records a digest of the
// parts of its definition that instruct a model (name, title, description,
// input and output schema, annotations). A later listing whose definition
// differs is a change that an operator approves or rejects; until then, in
// strict mode, the tool is withheld from listings and calls to it are
// refused (a "rug pull", where an upstream rewrites a tool's description
// after it was approved, redirects an agent without any call being
// refused otherwise).
//
// Pins live in storage, one document per namespace (an upstream, or a
// guarded site), and every change to that document is a read-modify-write
// under the storage's lock (storage.Update), so replicas on one shared
// storage never undo each other's approvals. Decisions are made on the
// in-memory copy, which is loaded before the namespace decides anything:
// a restart never pins a changed tool afresh.
package pins

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// Mode is what a namespace does with a changed tool.
type Mode uint8

const (
	// Strict withholds a changed tool from listings and refuses calls to
	// it until an operator approves the change.
	Strict Mode = iota
	// Warn lets a changed tool through, and records and audits the change.
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

// Fields are the parts of a tool's definition a pin covers, in the order
// diffs list them.
var Fields = []string{"name", "title", "description", "inputSchema", "outputSchema", "annotations"}

// Bounds of what a namespace pins.
const (
	// MaxDefinition bounds one tool's pinned definition, canonical.
	MaxDefinition = 256 << 10
	// MaxTools bounds the tools of one namespace.
	MaxTools = 4096
	// maxDocument bounds a namespace's stored document.
	maxDocument = 16 << 20
)

// Definition is the canonical form of a tool's pinned fields and its
// digest.
type Definition struct {
	Digest string                     `json:"digest"`
	Fields map[string]json.RawMessage `json:"fields"`
}

// Canonical returns the definition of the tool named name (the upstream's
// own name for it) from its listed object. Each field is re-encoded in one
// form (object keys sorted, numbers as spelled, no HTML escaping), so a
// server that re-serializes the same definition differently has not
// changed it; the digest is SHA-256 over the fields in order. The listing
// the object came from was read by package message, so no key of it is
// ambiguous.
func Canonical(name string, tool map[string]json.RawMessage) (Definition, error) {
	d := Definition{Fields: make(map[string]json.RawMessage, len(Fields))}
	nameJSON, _ := json.Marshal(name)
	h := sha256.New()
	size := 0
	for _, f := range Fields {
		raw := tool[f]
		if f == "name" {
			raw = nameJSON
		}
		if raw == nil {
			continue
		}
		c, err := canonicalJSON(raw)
		if err != nil {
			return Definition{}, fmt.Errorf("tool %q: %s does not read as JSON: %w", name, f, err)
		}
		if string(c) == "null" && f != "name" {
			continue // absent and null read alike
		}
		size += len(c)
		if size > MaxDefinition {
			return Definition{}, fmt.Errorf("tool %q: its definition is over %d bytes, more than the gateway pins", name, MaxDefinition)
		}
		d.Fields[f] = c
		fmt.Fprintf(h, "%s\x00%d\x00", f, len(c))
		h.Write(c)
	}
	d.Digest = "sha256:" + hex.EncodeToString(h.Sum(nil))
	return d, nil
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

// FieldDiff is one field that differs between two definitions; Old or New
// is nil where the field is absent.
type FieldDiff struct {
	Field string          `json:"field"`
	Old   json.RawMessage `json:"old,omitempty"`
	New   json.RawMessage `json:"new,omitempty"`
}

// Diff lists the fields in which a and b differ, in Fields order.
func Diff(a, b Definition) []FieldDiff {
	var out []FieldDiff
	for _, f := range Fields {
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

// validName reports whether a namespace or tool name may be stored.
func validName(s string) bool {
	return s != "" && len(s) <= 256 && !strings.ContainsFunc(s, func(r rune) bool { return r < 0x20 || r == 0x7f })
}

// sortedNames returns m's keys in order.
func sortedNames[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

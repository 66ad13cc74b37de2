package hostile

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
)

// The bodies are built as text, not marshalled: a case must be able to
// write a key twice, spell it with an escape or with bytes that are not
// UTF-8, and put something after the value, which no encoder does.

// member is one "key":value of an object, both as raw JSON text: key
// holds its quotes and is written exactly as given.
type member struct{ key, value string }

// object is a JSON object's members, in order.
type object []member

func (o object) String() string {
	var b strings.Builder
	b.WriteByte('{')
	for i, m := range o {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(m.key)
		b.WriteByte(':')
		b.WriteString(m.value)
	}
	b.WriteByte('}')
	return b.String()
}

// key is the raw text of a plain key.
func key(name string) string { return `"` + name + `"` }

// str is a JSON string holding s, escaped as JSON requires and no more
// (encoding/json would also turn invalid UTF-8 into U+FFFD).
func str(s string) string {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(s); err != nil {
		panic(err)
	}
	return strings.TrimSuffix(b.String(), "\n")
}

// parse reads a JSON object into its members, keeping each value's text.
// Test data that is not an object is a bug in the caller: it panics.
func parse(text string) object {
	dec := json.NewDecoder(strings.NewReader(text))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		panic(fmt.Sprintf("hostile: %q is not a JSON object", text))
	}
	var o object
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			panic(fmt.Sprintf("hostile: %q: %v", text, err))
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			panic(fmt.Sprintf("hostile: %q: %v", text, err))
		}
		o = append(o, member{key: str(tok.(string)), value: string(v)})
	}
	return o
}

// get returns the value of the plain key name.
func (o object) get(name string) (string, bool) {
	for _, m := range o {
		if m.key == key(name) {
			return m.value, true
		}
	}
	return "", false
}

// set replaces the value of the plain key name.
func (o object) set(name, value string) object {
	out := make(object, len(o))
	for i, m := range o {
		if m.key == key(name) {
			m.value = value
		}
		out[i] = m
	}
	return out
}

// rename writes the plain key name as rawKey instead, keeping its value.
func (o object) rename(name, rawKey string) object {
	out := make(object, len(o))
	for i, m := range o {
		if m.key == key(name) {
			m.key = rawKey
		}
		out[i] = m
	}
	return out
}

// with appends members.
func (o object) with(ms ...member) object {
	return append(append(object{}, o...), ms...)
}

// before puts m first.
func (o object) before(m member) object {
	return append(object{m}, o...)
}

// at applies edit to the object that path leads to from o (o itself when
// path is empty) and returns o with the result in place.
func (o object) at(path []string, edit func(object) object) object {
	if len(path) == 0 {
		return edit(o)
	}
	v, ok := o.get(path[0])
	if !ok {
		panic(fmt.Sprintf("hostile: no %q in %s", path[0], o))
	}
	return o.set(path[0], parse(v).at(path[1:], edit).String())
}

// valueAt returns the value at path from o.
func (o object) valueAt(path []string) (string, bool) {
	v, ok := o.get(path[0])
	if !ok || len(path) == 1 {
		return v, ok
	}
	if !strings.HasPrefix(strings.TrimSpace(v), "{") {
		return "", false
	}
	return parse(v).valueAt(path[1:])
}

// stringAt returns the string at the plain key name of the object text
// params, "" when there is none.
func stringAt(params, name string) string {
	if params == "" {
		return ""
	}
	v, ok := parse(params).get(name)
	if !ok {
		return ""
	}
	var s string
	if json.Unmarshal([]byte(v), &s) != nil {
		return ""
	}
	return s
}

// request is the envelope of call c with id, as a client writes it.
func request(id string, c Call) object {
	o := object{{key("jsonrpc"), `"2.0"`}, {key("id"), id}, {key("method"), str(c.Method)}}
	if c.Params != "" {
		o = append(o, member{key("params"), c.Params})
	}
	return o
}

// batch is a JSON array of the bodies.
func batch(bodies ...string) string { return "[" + strings.Join(bodies, ",") + "]" }

// differingPath is the path of keys, from params down, to the first value
// where d and f differ that both carry: ["name"] for two tools, ["uri"] for
// two resources, ["arguments", "verb"] for two verbs of one tool. It
// descends while both values are objects. Nil when the params share no key
// with different values.
func differingPath(d, f string) []string {
	if d == "" || f == "" {
		return nil
	}
	od, of := parse(d), parse(f)
	for _, m := range of {
		var name string
		if json.Unmarshal([]byte(m.key), &name) != nil {
			continue
		}
		dv, ok := od.get(name)
		if !ok || compact(dv) == compact(m.value) {
			continue
		}
		if isObject(dv) && isObject(m.value) {
			if sub := differingPath(dv, m.value); sub != nil {
				return append([]string{name}, sub...)
			}
		}
		return []string{name}
	}
	return nil
}

func isObject(v string) bool { return strings.HasPrefix(strings.TrimSpace(v), "{") }

func compact(v string) string {
	var b bytes.Buffer
	if json.Compact(&b, []byte(v)) != nil {
		return v
	}
	return b.String()
}

// Spellings of a key that readers disagree on. Each takes the plain name
// and returns a raw key, or "" when the trick does not apply to it.

// titleCase is Name for name: encoding/json v1 reads it as name, go-sdk and
// the TypeScript SDK do not.
func titleCase(name string) string {
	return key(strings.ToUpper(name[:1]) + name[1:])
}

// upperCase is NAME for name.
func upperCase(name string) string { return key(strings.ToUpper(name)) }

// mixedCase is nAmE for name.
func mixedCase(name string) string {
	b := []byte(name)
	for i := range b {
		if i%2 == 1 && b[i] >= 'a' && b[i] <= 'z' {
			b[i] -= 'a' - 'A'
		}
	}
	return key(string(b))
}

// escaped spells name's second letter as a \u escape: n\u0061me reads as
// name in every decoder, and as something else in a reader that matches
// raw bytes.
func escaped(name string) string { return escapedAt(name, 1) }

// escapedAt spells the byte at i of name as a \u escape.
func escapedAt(name string, i int) string {
	return key(name[:i] + fmt.Sprintf(`\u%04x`, name[i]) + name[i+1:])
}

// folded swaps an s for ſ (U+017F) or a k for the Kelvin sign (U+212A):
// Unicode simple case folding, which encoding/json v1 applies to field
// names, takes them to s and k. "" when name has neither.
func folded(name string) string {
	if i := strings.IndexByte(name, 's'); i >= 0 {
		return key(name[:i] + "ſ" + name[i+1:])
	}
	if i := strings.IndexByte(name, 'k'); i >= 0 {
		return key(name[:i] + "\u212a" + name[i+1:])
	}
	return ""
}

// escapeValue spells the first letter of the JSON string v as a \u escape,
// which every decoder reads back as the same string.
func escapeValue(v string) (string, bool) {
	var s string
	if json.Unmarshal([]byte(v), &s) != nil {
		return "", false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' {
			head := strings.TrimSuffix(str(s[:i]), `"`)
			tail := strings.TrimPrefix(str(s[i+1:]), `"`)
			return head + fmt.Sprintf(`\u%04x`, c) + tail, true
		}
	}
	return "", false
}

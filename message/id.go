package message

import (
	"bytes"
	"encoding/json"
	"strconv"
)

// maxSafeInt is 2^53-1, the largest integer every reader holds exactly:
// JavaScript numbers are float64, and go-sdk reads an id through a float64
// too.
const maxSafeInt = 1<<53 - 1

type idKind uint8

const (
	idNone idKind = iota
	idInt
	idString
)

// ID is a JSON-RPC request id as a value: an integer or a string, or zero
// (none: a notification, or a response to a request whose id could not be
// read). IDs are comparable with ==, and equal exactly when their Keys are.
type ID struct {
	kind idKind
	n    int64
	s    string
}

func intID(n int64) ID     { return ID{kind: idInt, n: n} }
func stringID(s string) ID { return ID{kind: idString, s: s} }

// IsZero reports whether id is none.
func (id ID) IsZero() bool { return id.kind == idNone }

// Key returns a canonical key: equal ids have equal keys, 7 and "7"
// differ, "x" and "\u0078" are equal. It is the canonical JSON (Raw).
func (id ID) Key() string {
	switch id.kind {
	case idInt:
		return strconv.FormatInt(id.n, 10)
	case idString:
		return string(id.Raw())
	}
	return ""
}

// Raw returns the id as canonical JSON: 7, -3, "x" (a string as
// encoding/json writes it, without HTML escaping); nil for zero.
func (id ID) Raw() json.RawMessage {
	switch id.kind {
	case idInt:
		return strconv.AppendInt(nil, id.n, 10)
	case idString:
		if simpleString(id.s) {
			out := make([]byte, 0, len(id.s)+2)
			out = append(out, '"')
			out = append(out, id.s...)
			return append(out, '"')
		}
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		enc.SetEscapeHTML(false)
		_ = enc.Encode(id.s) // a string always encodes
		return bytes.TrimSuffix(buf.Bytes(), []byte{'\n'})
	}
	return nil
}

// simpleString reports whether s encodes as itself between quotes.
func simpleString(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' {
			return false
		}
	}
	return true
}

// String returns the id for logs: its canonical JSON, or "" for zero.
func (id ID) String() string { return id.Key() }

// ParseID reads one JSON value as an id, by the JSON-level rules of Read
// (strict UTF-8, no lone surrogates, nothing after the value). It is for
// matching an upstream's answer to the request it answers, and an upstream
// may spell an integer id 7.0 or 7e0: any number whose value is an integer
// within ±(2^53-1) is that integer (-0 is 0). A string has its escapes
// decoded. "null" is the zero ID, without error.
func ParseID(raw []byte) (ID, error) {
	var r reader
	r.init(raw, nil, nil)
	r.bom()
	r.ws()
	if r.i >= len(raw) {
		return ID{}, r.syntax(r.i, "no id; send a JSON string, integer or null")
	}
	var id ID
	at := r.i
	var err error
	switch c := raw[r.i]; {
	case c == '"':
		var s, e int
		var fl uint8
		if s, e, fl, err = r.str(); err == nil {
			id = stringID(r.text(s, e, fl))
		}
	case c == '-' || c >= '0' && c <= '9':
		var s, e int
		if s, e, err = r.number(); err == nil {
			n, ok := answerInt(raw[s:e])
			if !ok {
				r.ambiguous(at, "a numeric id must have an integer value within ±(2^53-1); readers round others differently")
			}
			id = intID(n)
		}
	case c == 'n':
		err = r.literal("null")
	default:
		r.malformed(at, "an id must be a string, an integer or null")
		err = r.value(0)
	}
	if err == nil {
		r.ws()
		if r.i < len(raw) {
			err = r.syntax(r.i, "bytes after the id; send one JSON value")
		}
	}
	if err := r.result(err); err != nil {
		return ID{}, err
	}
	return id, nil
}

// requestInt reads a request's numeric id: a plain integer in canonical
// form (no fraction, no exponent, no -0) within ±(2^53-1). Readers agree on
// nothing else: go-sdk truncates 1.5 to 1 where JavaScript keeps 1.5, and
// above 2^53 JavaScript rounds where Go readers may not.
func requestInt(b []byte) (int64, bool) {
	neg := b[0] == '-'
	d := b
	if neg {
		d = b[1:]
	}
	if len(d) == 0 || len(d) > 16 || (neg && len(d) == 1 && d[0] == '0') {
		return 0, false
	}
	var n int64
	for _, c := range d {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	if n > maxSafeInt {
		return 0, false
	}
	if neg {
		n = -n
	}
	return n, true
}

// answerInt reads any validated JSON number whose value is an integer
// within ±(2^53-1): 7, 7.0, 7e0, 0.7e1, 700e-2, -0.
func answerInt(b []byte) (int64, bool) {
	neg := b[0] == '-'
	if neg {
		b = b[1:]
	}
	// Mantissa digits, and the exponent that places them.
	var mant []byte
	i := 0
	for i < len(b) && b[i] >= '0' && b[i] <= '9' {
		i++
	}
	mant = append(mant, b[:i]...)
	exp := 0
	if i < len(b) && b[i] == '.' {
		j := i + 1
		for j < len(b) && b[j] >= '0' && b[j] <= '9' {
			j++
		}
		mant = append(mant, b[i+1:j]...)
		exp = -(j - i - 1)
		i = j
	}
	if i < len(b) { // exponent
		i++
		eneg := false
		if b[i] == '+' || b[i] == '-' {
			eneg = b[i] == '-'
			i++
		}
		e := 0
		for ; i < len(b); i++ {
			if e < 1e6 {
				e = e*10 + int(b[i]-'0')
			}
		}
		if eneg {
			e = -e
		}
		exp += e
	}
	// Drop leading zeros, and trailing zeros into the exponent.
	for len(mant) > 0 && mant[0] == '0' {
		mant = mant[1:]
	}
	for len(mant) > 0 && mant[len(mant)-1] == '0' {
		mant = mant[:len(mant)-1]
		exp++
	}
	if len(mant) == 0 {
		return 0, true // 0, -0, 0.0e5
	}
	if exp < 0 || len(mant)+exp > 16 {
		return 0, false
	}
	var n int64
	for _, c := range mant {
		n = n*10 + int64(c-'0')
	}
	for ; exp > 0; exp-- {
		n *= 10
	}
	if n > maxSafeInt {
		return 0, false
	}
	if neg {
		n = -n
	}
	return n, true
}

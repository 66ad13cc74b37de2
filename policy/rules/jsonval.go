package rules

import (
	"encoding/json"
	"math"
	"reflect"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"cel.dev/cel-go/common/types"
	"cel.dev/cel-go/common/types/ref"
	"cel.dev/cel-go/common/types/traits"
)

// jsonObject is a JSON object (the call's arguments, a JWT's claims, or an
// object within them) as the rules read it: from its text, one key at a
// time, when a rule reads that key. A call whose rules read one argument
// costs one scan of the object and the decoding of that value, not the
// decoding of every argument into Go and then CEL values, which was most of
// a rule's cost. Iterating, sizing or comparing the object whole decodes it
// once (full).
//
// A key is looked up as the backends behind the edge may read it: Go's
// encoding/json matches a struct field to a key in any case (and folds K
// and ſ), JavaScript matches exactly. The edge's reader refuses an object
// with two keys equal once folded, so at most one key of the object is the
// one asked for in any reader's matching. When that key is spelled
// otherwise than the rule asks (`Environment` for args.environment), the
// lookup is an error: a rule reading it fails closed (a deny rule denies, an
// allow rule does not hold), rather than read the key as absent where a Go
// backend reads it as present. A key found twice (which a JWT's claims, not
// read by the edge's reader, could hold) is an error too.
type jsonObject struct {
	raw  []byte // '{' to '}', valid JSON
	full traits.Mapper
	// scans counts the readings of raw for lookups: one for each of the
	// first scansBeforeIndex, one more to index it for all the others.
	scans int
	index *memberIndex
}

var (
	_ traits.Mapper = (*jsonObject)(nil)
	_ ref.Val       = (*jsonObject)(nil)
)

// Find looks key up in the object's text.
func (o *jsonObject) Find(key ref.Val) (ref.Val, bool) {
	k, ok := key.(types.String)
	if !ok {
		if types.IsUnknownOrError(key) {
			return key, false
		}
		return nil, false // a JSON key is a string: no other key is found
	}
	if o.scans < scansBeforeIndex {
		// Most calls read a few keys: they are read from the text,
		// without an index to build.
		o.scans++
		return lookup(o.raw, string(k))
	}
	if o.index == nil {
		o.scans++
		o.index = indexMembers(o.raw)
	}
	return o.index.lookup(string(k))
}

func (o *jsonObject) Get(key ref.Val) ref.Val {
	v, found := o.Find(key)
	if !found {
		return types.ValOrErr(v, "no such key: %v", key)
	}
	return v
}

func (o *jsonObject) Contains(key ref.Val) ref.Val {
	v, found := o.Find(key)
	if types.IsUnknownOrError(v) {
		return v
	}
	return types.Bool(found)
}

// whole decodes the object once, for what reads all of it.
func (o *jsonObject) whole() traits.Mapper {
	if o.full == nil {
		m := map[ref.Val]ref.Val{}
		var bad ref.Val
		eachMember(o.raw, func(k string, v []byte) bool {
			if _, dup := m[types.String(k)]; dup {
				bad = types.NewErr("the object has the key %q twice", k)
				return false
			}
			m[types.String(k)] = jsonValue(v)
			return true
		})
		if bad != nil {
			m = map[ref.Val]ref.Val{} // read as empty; the lookups fail
		}
		o.full = types.NewRefValMap(types.DefaultTypeAdapter, m)
	}
	return o.full
}

func (o *jsonObject) Iterator() traits.Iterator { return o.whole().Iterator() }
func (o *jsonObject) Size() ref.Val             { return o.whole().Size() }
func (o *jsonObject) Equal(other ref.Val) ref.Val {
	if p, ok := other.(*jsonObject); ok {
		other = p.whole()
	}
	return o.whole().Equal(other)
}
func (o *jsonObject) ConvertToNative(t reflect.Type) (any, error) {
	return o.whole().ConvertToNative(t)
}
func (o *jsonObject) ConvertToType(t ref.Type) ref.Val {
	switch t {
	case types.MapType:
		return o
	case types.TypeType:
		return types.MapType
	}
	return o.whole().ConvertToType(t)
}
func (o *jsonObject) Type() ref.Type { return types.MapType }
func (o *jsonObject) Value() any     { return o.whole().Value() }

// lookup finds key among the members of the object raw (see jsonObject).
func lookup(raw []byte, key string) (ref.Val, bool) {
	var (
		found  []byte
		n      int
		folded bool
	)
	ok := eachMember(raw, func(k string, v []byte) bool {
		switch {
		case k == key:
			found, n = v, n+1
		case !folded && strings.EqualFold(k, key):
			folded = true
		}
		return true
	})
	switch {
	case !ok:
		return types.NewErr("the object is not valid JSON"), false
	case n > 1:
		return types.NewErr("the object has the key %q twice", key), false
	case folded:
		return types.NewErr("the object has the key %q in another case or folding, which a server may read as it: spell it %q", key, key), false
	case n == 0:
		return nil, false
	}
	return jsonValue(found), true
}

// scansBeforeIndex is how many lookups of an object read its text before
// it is indexed.
const scansBeforeIndex = 4

// memberIndex is an object's members by key, for the second and later
// lookups: a rule reading arguments in a loop (a deny list written in the
// rule) reads the text once, not once per element, which CEL's cost,
// counting a lookup as one, does not see. Its lookups answer as lookup
// does, and a value read once is kept (a long string is not copied again,
// a nested object keeps its own index).
type memberIndex struct {
	bad    bool
	exact  map[string]*member
	folded map[string]int // members by key folded (see foldKey)
}

type member struct {
	raw []byte
	n   int
	val ref.Val
}

func indexMembers(raw []byte) *memberIndex {
	ix := &memberIndex{exact: map[string]*member{}, folded: map[string]int{}}
	ix.bad = !eachMember(raw, func(k string, v []byte) bool {
		m := ix.exact[k]
		if m == nil {
			m = &member{raw: v}
			ix.exact[k] = m
		}
		m.n++
		ix.folded[foldKey(k)]++
		return true
	})
	return ix
}

func (ix *memberIndex) lookup(key string) (ref.Val, bool) {
	m := ix.exact[key]
	n := 0
	if m != nil {
		n = m.n
	}
	switch {
	case ix.bad:
		return types.NewErr("the object is not valid JSON"), false
	case n > 1:
		return types.NewErr("the object has the key %q twice", key), false
	case ix.folded[foldKey(key)] > n:
		return types.NewErr("the object has the key %q in another case or folding, which a server may read as it: spell it %q", key, key), false
	case n == 0:
		return nil, false
	}
	if m.val == nil {
		m.val = jsonValue(m.raw)
	}
	return m.val, true
}

// foldKey folds s rune by rune to the least rune of its unicode.SimpleFold
// orbit, so that two keys fold equal exactly when strings.EqualFold (and
// encoding/json, matching a struct field) says they are equal.
func foldKey(s string) string {
	var b strings.Builder
	b.Grow(len(s))
	for _, r := range s {
		for {
			f := unicode.SimpleFold(r)
			if f <= r {
				r = f
				break
			}
			r = f
		}
		b.WriteRune(r)
	}
	return b.String()
}

// eachMember calls f with each member of the object raw, its key decoded
// and its value's text, until f returns false; it reports whether raw
// was read to its end.
func eachMember(raw []byte, f func(k string, v []byte) bool) bool {
	i := skipSpace(raw, 1)
	if i < len(raw) && raw[i] == '}' {
		return true
	}
	for i < len(raw) {
		ke := skipString(raw, i)
		if ke < 0 {
			return false
		}
		k, ok := jsonString(raw[i:ke])
		if !ok {
			return false
		}
		i = skipSpace(raw, ke)
		if i >= len(raw) || raw[i] != ':' {
			return false
		}
		vs := skipSpace(raw, i+1)
		ve := skipValue(raw, vs)
		if ve < 0 {
			return false
		}
		if !f(k, raw[vs:ve]) {
			return true
		}
		i = skipSpace(raw, ve)
		if i >= len(raw) {
			return false
		}
		switch raw[i] {
		case '}':
			return true
		case ',':
			i = skipSpace(raw, i+1)
		default:
			return false
		}
	}
	return false
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// skipString returns the index after the string that starts at b[i], or
// -1.
func skipString(b []byte, i int) int {
	if i >= len(b) || b[i] != '"' {
		return -1
	}
	for i++; i < len(b); i++ {
		switch b[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
	return -1
}

// skipValue returns the index after the value that starts at b[i], or -1.
func skipValue(b []byte, i int) int {
	if i >= len(b) {
		return -1
	}
	switch b[i] {
	case '"':
		return skipString(b, i)
	case '{', '[':
		depth := 0
		for ; i < len(b); i++ {
			switch b[i] {
			case '"':
				e := skipString(b, i)
				if e < 0 {
					return -1
				}
				i = e - 1
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return i + 1
				}
			}
		}
		return -1
	}
	for ; i < len(b); i++ {
		switch b[i] {
		case ',', '}', ']', ' ', '\t', '\n', '\r':
			return i
		}
	}
	return i
}

// jsonString decodes the JSON string s, quotes included: as it is when it
// has no escape and is valid UTF-8 (most keys and values), else as
// encoding/json decodes it, which is what a Go backend reads.
func jsonString(s []byte) (string, bool) {
	body := s[1 : len(s)-1]
	if !hasByte(body, '\\') && utf8.Valid(body) {
		return string(body), true
	}
	var out string
	if err := json.Unmarshal(s, &out); err != nil {
		return "", false
	}
	return out, true
}

func hasByte(b []byte, c byte) bool {
	for _, x := range b {
		if x == c {
			return true
		}
	}
	return false
}

// maxSafeInteger is the largest integer every reader reads exactly.
const maxSafeInteger = 1<<53 - 1

// jsonValue is the CEL value of the JSON value v: an object stays text
// until read (jsonObject); a number written as an integer is an int, and an
// error beyond ±(2^53-1); others are doubles, and one beyond a double is
// kept as its text, which no number equals, so that a rule comparing it
// fails closed.
func jsonValue(v []byte) ref.Val {
	if len(v) == 0 {
		return types.NewErr("an empty JSON value")
	}
	switch v[0] {
	case '{':
		return &jsonObject{raw: v}
	case '[':
		var elems []ref.Val
		i := skipSpace(v, 1)
		if i < len(v) && v[i] == ']' {
			return types.NewRefValList(types.DefaultTypeAdapter, elems)
		}
		for i < len(v) {
			e := skipValue(v, i)
			if e < 0 {
				return types.NewErr("the array is not valid JSON")
			}
			ev := jsonValue(v[i:e])
			if types.IsError(ev) {
				// A list with a value that cannot be read is not read
				// whole: CEL's `in` would pass over the element.
				return ev
			}
			elems = append(elems, ev)
			i = skipSpace(v, e)
			if i >= len(v) {
				break
			}
			if v[i] == ']' {
				return types.NewRefValList(types.DefaultTypeAdapter, elems)
			}
			i = skipSpace(v, i+1)
		}
		return types.NewErr("the array is not valid JSON")
	case '"':
		s, ok := jsonString(v)
		if !ok {
			return types.NewErr("the string is not valid JSON")
		}
		return types.String(s)
	case 't':
		return types.True
	case 'f':
		return types.False
	case 'n':
		return types.NullValue
	}
	s := string(v)
	if !strings.ContainsAny(s, ".eE") {
		// An integer beyond ±(2^53-1): JavaScript (the TypeScript SDK's
		// server, JSON.parse) rounds it to a double, Go and Python read it
		// exactly, so no one value is what every backend reads; the rule
		// reading it fails closed (as package message refuses such an id).
		i, err := strconv.ParseInt(s, 10, 64)
		if err != nil || i > maxSafeInteger || i < -maxSafeInteger {
			return types.NewErr("the integer is beyond ±(2^53-1), which readers differ on (JavaScript rounds it): send it as a string")
		}
		return types.Int(i)
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil && !math.IsInf(f, 0) {
		return types.NewErr("the number is not valid JSON")
	}
	if math.IsInf(f, 0) {
		return types.String(s)
	}
	return types.Double(f)
}

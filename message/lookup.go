package message

import "bytes"

// Lookup returns the value at path in obj, a JSON object that Read
// accepted as part of a message (such as Call.Arguments): each part of
// path is a key spelled exactly so once its escapes are decoded, the way
// go-sdk looks up a tool's argument. ok is false when a part is absent,
// when a value on the way is not an object, or when obj is not JSON.
//
// It reads with the same reader as Read, so that the edge, which binds an
// argument to a header, never reads the client's body with a decoder of
// its own. Read has already refused any object with two keys that readers
// could take for one, so an exact match is every reader's match.
func Lookup(obj []byte, path []string) (value []byte, ok bool) {
	r := getReader(obj)
	defer putReader(r)
	r.ws()
	for _, part := range path {
		if r.peek() != '{' {
			return nil, false
		}
		it, err := r.openObject(1)
		if err != nil {
			return nil, false
		}
		found := false
		for {
			k, more, err := r.nextKey(&it)
			if err != nil {
				return nil, false
			}
			if !more {
				break
			}
			if r.keyText(k) == part {
				found = true
				break
			}
			if err := r.value(1); err != nil {
				return nil, false
			}
		}
		if !found {
			return nil, false
		}
	}
	start := r.i
	if err := r.value(1); err != nil {
		return nil, false
	}
	return bytes.TrimSpace(obj[start:r.i]), true
}

// keyText is k's content with its escapes decoded.
func (r *reader) keyText(k keyRef) string {
	key := r.b[k.start:k.end]
	if bytes.IndexByte(key, '\\') < 0 {
		return string(key)
	}
	return string(appendUnescaped(nil, key))
}

// Scalar reads value, a JSON value that Lookup returned: a string's
// content decoded (isString true), or the literal text of a number, true,
// false or null (isString false). ok is false for an object, an array or
// anything that is not JSON.
func Scalar(value []byte) (text string, isString, ok bool) {
	r := getReader(value)
	defer putReader(r)
	switch c := r.peek(); {
	case c == '"':
		s, e, fl, err := r.str()
		if err != nil || r.i != len(value) {
			return "", false, false
		}
		return r.text(s, e, fl), true, true
	case c == '{' || c == '[' || c == 0:
		return "", false, false
	}
	if err := r.value(1); err != nil || r.i != len(value) {
		return "", false, false
	}
	return string(value), false, true
}

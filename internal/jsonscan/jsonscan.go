// Package jsonscan is a small validating JSON scanner for a hot path that
// reads a few fields of an upstream's tools/call result and must decline
// whatever it cannot read exactly as encoding/json does (the broker's
// aggregated fast path, which decides by it whether a result needs
// normalizing). It never decodes escapes: a caller that needs a string's
// content takes plain strings only. It reads no client's message: package
// message is the one reader of those.
package jsonscan

// MaxDepth bounds the nesting SkipValue accepts.
const MaxDepth = 32

// Scanner reads JSON from B, at offset I.
type Scanner struct {
	B []byte
	I int
}

// WS skips whitespace.
func (s *Scanner) WS() {
	for s.I < len(s.B) {
		switch s.B[s.I] {
		case ' ', '\t', '\r', '\n':
			s.I++
		default:
			return
		}
	}
}

// Peek returns the next byte, or 0 at the end.
func (s *Scanner) Peek() byte {
	if s.I < len(s.B) {
		return s.B[s.I]
	}
	return 0
}

// PlainString reads a string of printable ASCII without escapes and
// returns its content.
func (s *Scanner) PlainString() (string, bool) {
	if s.Peek() != '"' {
		return "", false
	}
	start := s.I + 1
	for j := start; j < len(s.B); j++ {
		c := s.B[j]
		switch {
		case c == '"':
			s.I = j + 1
			return string(s.B[start:j]), true
		case c == '\\' || c < 0x20 || c >= 0x7f:
			return "", false
		}
	}
	return "", false
}

// SkipString validates and skips any JSON string.
func (s *Scanner) SkipString() bool {
	if s.Peek() != '"' {
		return false
	}
	for j := s.I + 1; j < len(s.B); j++ {
		c := s.B[j]
		switch {
		case c == '"':
			s.I = j + 1
			return true
		case c < 0x20:
			return false
		case c == '\\':
			j++
			if j >= len(s.B) {
				return false
			}
			switch s.B[j] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				if j+4 >= len(s.B) {
					return false
				}
				for k := j + 1; k <= j+4; k++ {
					if !isHex(s.B[k]) {
						return false
					}
				}
				j += 4
			default:
				return false
			}
		}
	}
	return false
}

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

// IsDigit reports whether c is an ASCII digit.
func IsDigit(c byte) bool { return c >= '0' && c <= '9' }

// SkipNumber validates and skips a JSON number.
func (s *Scanner) SkipNumber() bool {
	j := s.I
	if j < len(s.B) && s.B[j] == '-' {
		j++
	}
	switch {
	case j < len(s.B) && s.B[j] == '0':
		j++
	case j < len(s.B) && s.B[j] >= '1' && s.B[j] <= '9':
		for j < len(s.B) && IsDigit(s.B[j]) {
			j++
		}
	default:
		return false
	}
	if j < len(s.B) && s.B[j] == '.' {
		j++
		if j >= len(s.B) || !IsDigit(s.B[j]) {
			return false
		}
		for j < len(s.B) && IsDigit(s.B[j]) {
			j++
		}
	}
	if j < len(s.B) && (s.B[j] == 'e' || s.B[j] == 'E') {
		j++
		if j < len(s.B) && (s.B[j] == '+' || s.B[j] == '-') {
			j++
		}
		if j >= len(s.B) || !IsDigit(s.B[j]) {
			return false
		}
		for j < len(s.B) && IsDigit(s.B[j]) {
			j++
		}
	}
	s.I = j
	return true
}

// Literal reads lit (true, false, null).
func (s *Scanner) Literal(lit string) bool {
	if len(s.B)-s.I >= len(lit) && string(s.B[s.I:s.I+len(lit)]) == lit {
		s.I += len(lit)
		return true
	}
	return false
}

// SkipValue validates and skips any JSON value, nested at most MaxDepth
// levels below depth.
func (s *Scanner) SkipValue(depth int) bool {
	if depth > MaxDepth {
		return false
	}
	s.WS()
	switch c := s.Peek(); {
	case c == '"':
		return s.SkipString()
	case c == '-' || IsDigit(c):
		return s.SkipNumber()
	case c == 't':
		return s.Literal("true")
	case c == 'f':
		return s.Literal("false")
	case c == 'n':
		return s.Literal("null")
	case c == '{':
		return s.Object(func(string) bool { return s.SkipValue(depth + 1) }, false)
	case c == '[':
		return s.Array(func() bool { return s.SkipValue(depth + 1) })
	}
	return false
}

// Array reads an array, calling elem with the scanner on each element,
// which elem must consume.
func (s *Scanner) Array(elem func() bool) bool {
	s.WS()
	if s.Peek() != '[' {
		return false
	}
	s.I++
	s.WS()
	if s.Peek() == ']' {
		s.I++
		return true
	}
	for {
		s.WS()
		if !elem() {
			return false
		}
		s.WS()
		switch s.Peek() {
		case ',':
			s.I++
		case ']':
			s.I++
			return true
		default:
			return false
		}
	}
}

// Object reads an object, calling member for each key with the scanner on
// its value, which member must consume. With plainKeys, keys must be plain
// strings (see PlainString); any key is validated otherwise, and member
// gets "\x00" for one that is not plain.
func (s *Scanner) Object(member func(key string) bool, plainKeys bool) bool {
	s.WS()
	if s.Peek() != '{' {
		return false
	}
	s.I++
	s.WS()
	if s.Peek() == '}' {
		s.I++
		return true
	}
	for {
		s.WS()
		start := s.I
		key, plain := s.PlainString()
		if !plain {
			if plainKeys {
				return false
			}
			s.I = start
			if !s.SkipString() {
				return false
			}
			key = "\x00" // not plain: matches no field name
		}
		s.WS()
		if s.Peek() != ':' {
			return false
		}
		s.I++
		s.WS()
		if !member(key) {
			return false
		}
		s.WS()
		switch s.Peek() {
		case ',':
			s.I++
		case '}':
			s.I++
			return true
		default:
			return false
		}
	}
}

// FoldsTo reports whether key equals name but for ASCII case, as
// encoding/json would match it to that field, without being name itself.
func FoldsTo(key, name string) bool {
	if key == name || len(key) != len(name) {
		return false
	}
	for i := 0; i < len(key); i++ {
		a, b := key[i], name[i]
		if a >= 'A' && a <= 'Z' {
			a += 'a' - 'A'
		}
		if a != b {
			return false
		}
	}
	return true
}

// FoldsToAny reports whether key folds to one of names (see FoldsTo).
func FoldsToAny(key string, names ...string) bool {
	for _, n := range names {
		if FoldsTo(key, n) {
			return true
		}
	}
	return false
}

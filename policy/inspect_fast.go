package policy

// A fast reading of the common JSON-RPC request, for the edge's hot path.
//
// encoding/json decodes a 150-byte tools/call in about a microsecond in a
// hot loop, but an edge that serves one call at a time meets it with cold
// caches, where its reflection-driven decoder cost about 15 µs a call and
// 3–5% of a one-session benchmark's throughput. inspectFast reads the
// messages clients actually send — one object, plain ASCII keys written
// exactly as the spec spells them, no escapes in the strings it keeps — and
// declines everything else, which inspectOne (encoding/json) then reads as
// before. Declining is always safe; accepting must give exactly the Call
// that inspectOne gives, which FuzzInspectFast checks. That is why it
// declines, rather than interprets, anything encoding/json might read
// differently: keys in another case or with escapes (encoding/json matches
// field names case-insensitively, with Unicode folding), duplicate keys,
// non-ASCII or escaped kept strings (it replaces invalid UTF-8), keys that
// are not plain ASCII in the objects whose fields it reads (an escape or a
// Unicode fold could spell a field name), ids other than plain integers and
// simple strings, nesting over 32 levels.

const fastMaxDepth = 32

type fastScanner struct {
	b []byte
	i int
}

func (s *fastScanner) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\r', '\n':
			s.i++
		default:
			return
		}
	}
}

func (s *fastScanner) peek() byte {
	if s.i < len(s.b) {
		return s.b[s.i]
	}
	return 0
}

// plainString reads a string of printable ASCII without escapes and
// returns its content.
func (s *fastScanner) plainString() (string, bool) {
	if s.peek() != '"' {
		return "", false
	}
	start := s.i + 1
	for j := start; j < len(s.b); j++ {
		c := s.b[j]
		switch {
		case c == '"':
			s.i = j + 1
			return string(s.b[start:j]), true
		case c == '\\' || c < 0x20 || c >= 0x7f:
			return "", false
		}
	}
	return "", false
}

// skipString validates and skips any JSON string.
func (s *fastScanner) skipString() bool {
	if s.peek() != '"' {
		return false
	}
	for j := s.i + 1; j < len(s.b); j++ {
		c := s.b[j]
		switch {
		case c == '"':
			s.i = j + 1
			return true
		case c < 0x20:
			return false
		case c == '\\':
			j++
			if j >= len(s.b) {
				return false
			}
			switch s.b[j] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				if j+4 >= len(s.b) {
					return false
				}
				for k := j + 1; k <= j+4; k++ {
					if !isHex(s.b[k]) {
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

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// skipNumber validates and skips a JSON number.
func (s *fastScanner) skipNumber() bool {
	j := s.i
	if j < len(s.b) && s.b[j] == '-' {
		j++
	}
	switch {
	case j < len(s.b) && s.b[j] == '0':
		j++
	case j < len(s.b) && s.b[j] >= '1' && s.b[j] <= '9':
		for j < len(s.b) && isDigit(s.b[j]) {
			j++
		}
	default:
		return false
	}
	if j < len(s.b) && s.b[j] == '.' {
		j++
		if j >= len(s.b) || !isDigit(s.b[j]) {
			return false
		}
		for j < len(s.b) && isDigit(s.b[j]) {
			j++
		}
	}
	if j < len(s.b) && (s.b[j] == 'e' || s.b[j] == 'E') {
		j++
		if j < len(s.b) && (s.b[j] == '+' || s.b[j] == '-') {
			j++
		}
		if j >= len(s.b) || !isDigit(s.b[j]) {
			return false
		}
		for j < len(s.b) && isDigit(s.b[j]) {
			j++
		}
	}
	s.i = j
	return true
}

func (s *fastScanner) literal(lit string) bool {
	if len(s.b)-s.i >= len(lit) && string(s.b[s.i:s.i+len(lit)]) == lit {
		s.i += len(lit)
		return true
	}
	return false
}

// skipValue validates and skips any JSON value, nested at most
// fastMaxDepth levels.
func (s *fastScanner) skipValue(depth int) bool {
	if depth > fastMaxDepth {
		return false
	}
	s.ws()
	switch c := s.peek(); {
	case c == '"':
		return s.skipString()
	case c == '-' || isDigit(c):
		return s.skipNumber()
	case c == 't':
		return s.literal("true")
	case c == 'f':
		return s.literal("false")
	case c == 'n':
		return s.literal("null")
	case c == '{':
		return s.object(func(string) bool { return s.skipValue(depth + 1) }, false)
	case c == '[':
		s.i++
		s.ws()
		if s.peek() == ']' {
			s.i++
			return true
		}
		for {
			if !s.skipValue(depth + 1) {
				return false
			}
			s.ws()
			switch s.peek() {
			case ',':
				s.i++
			case ']':
				s.i++
				return true
			default:
				return false
			}
		}
	}
	return false
}

// object reads an object, calling member for each key with the scanner on
// its value, which member must consume. With plainKeys, keys must be plain
// strings (see plainString); any key is validated otherwise, and member
// gets "" for one that is not plain.
func (s *fastScanner) object(member func(key string) bool, plainKeys bool) bool {
	s.ws()
	if s.peek() != '{' {
		return false
	}
	s.i++
	s.ws()
	if s.peek() == '}' {
		s.i++
		return true
	}
	for {
		s.ws()
		start := s.i
		key, plain := s.plainString()
		if !plain {
			if plainKeys {
				return false
			}
			s.i = start
			if !s.skipString() {
				return false
			}
			key = "\x00" // not plain: matches no field name
		}
		s.ws()
		if s.peek() != ':' {
			return false
		}
		s.i++
		s.ws()
		if !member(key) {
			return false
		}
		s.ws()
		switch s.peek() {
		case ',':
			s.i++
		case '}':
			s.i++
			return true
		default:
			return false
		}
	}
}

// foldsTo reports whether key equals name but for ASCII case, as
// encoding/json would match it to that field, without being name itself.
func foldsTo(key, name string) bool {
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

// inspectFast reads raw as inspectOne does, or declines (false).
func inspectFast(raw []byte) (Call, bool) {
	s := &fastScanner{b: raw}
	var (
		c                         Call
		seen                      [4]bool // jsonrpc, id, method, params
		jsonrpcOK, hasMethod      bool
		tool, verb                string
		hasName, hasArgs, hasVerb bool
		paramsObject              bool
	)
	top := func(key string) bool {
		for _, f := range []string{"jsonrpc", "id", "method", "params", "result", "error"} {
			if foldsTo(key, f) {
				return false
			}
		}
		switch key {
		case "jsonrpc":
			if seen[0] {
				return false
			}
			seen[0] = true
			v, ok := s.plainString()
			jsonrpcOK = ok && v == "2.0"
			return jsonrpcOK
		case "id":
			if seen[1] {
				return false
			}
			seen[1] = true
			start := s.i
			if s.peek() == '"' {
				if _, ok := s.plainString(); !ok {
					return false
				}
			} else {
				if s.peek() == '-' || !s.skipNumber() {
					return false
				}
				for _, b := range raw[start:s.i] {
					if !isDigit(b) {
						return false // plain integers only
					}
				}
			}
			c.ID = append([]byte(nil), raw[start:s.i]...)
			return true
		case "method":
			if seen[2] {
				return false
			}
			seen[2] = true
			m, ok := s.plainString()
			if !ok || m == "" {
				return false
			}
			c.Method, hasMethod = m, true
			return true
		case "params":
			if seen[3] {
				return false
			}
			seen[3] = true
			paramsObject = true
			return s.object(func(key string) bool {
				if foldsTo(key, "name") || foldsTo(key, "arguments") {
					return false
				}
				switch key {
				case "name":
					if hasName {
						return false
					}
					hasName = true
					v, ok := s.plainString()
					tool = v
					return ok
				case "arguments":
					if hasArgs {
						return false
					}
					hasArgs = true
					return s.object(func(key string) bool {
						if foldsTo(key, "verb") {
							return false
						}
						if key == "verb" {
							if hasVerb {
								return false
							}
							hasVerb = true
							v, ok := s.plainString()
							verb = v
							return ok
						}
						return s.skipValue(2)
					}, true)
				}
				return s.skipValue(1)
			}, true)
		}
		// result, error and unknown keys: inspectOne's business.
		return false
	}
	if !s.object(top, true) {
		return Call{}, false
	}
	s.ws()
	if s.i != len(raw) || !jsonrpcOK || !hasMethod {
		return Call{}, false
	}
	if c.IsToolCall() {
		if !paramsObject || tool == "" {
			return Call{}, false
		}
		c.Tool = tool
		if hasVerb {
			c.Verb = verb
		}
	}
	return c, true
}

package policy

import "github.com/Tahul/caddy-zidane-mcp/internal/jsonscan"

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

// inspectFast reads raw as inspectOne does, or declines (false).
func inspectFast(raw []byte) (Call, bool) {
	s := &jsonscan.Scanner{B: raw}
	var (
		c                         Call
		seen                      [4]bool // jsonrpc, id, method, params
		jsonrpcOK, hasMethod      bool
		tool, verb                string
		hasName, hasArgs, hasVerb bool
		paramsObject              bool
	)
	top := func(key string) bool {
		if jsonscan.RPCKeyVariant(key) {
			return false
		}
		switch key {
		case "jsonrpc":
			if seen[0] {
				return false
			}
			seen[0] = true
			jsonrpcOK = s.Version()
			return jsonrpcOK
		case "id":
			if seen[1] {
				return false
			}
			seen[1] = true
			id, ok := s.ID()
			c.ID = append([]byte(nil), id...)
			return ok
		case "method":
			if seen[2] {
				return false
			}
			seen[2] = true
			m, ok := s.PlainString()
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
			return s.Object(func(key string) bool {
				if jsonscan.FoldsToAny(key, "name", "arguments") {
					return false
				}
				switch key {
				case "name":
					if hasName {
						return false
					}
					hasName = true
					v, ok := s.PlainString()
					tool = v
					return ok
				case "arguments":
					if hasArgs {
						return false
					}
					hasArgs = true
					return s.Object(func(key string) bool {
						if jsonscan.FoldsTo(key, "verb") {
							return false
						}
						if key == "verb" {
							if hasVerb {
								return false
							}
							hasVerb = true
							v, ok := s.PlainString()
							verb = v
							return ok
						}
						return s.SkipValue(2)
					}, true)
				}
				return s.SkipValue(1)
			}, true)
		}
		// result, error and unknown keys: inspectOne's business.
		return false
	}
	if !s.Object(top, true) {
		return Call{}, false
	}
	s.WS()
	if s.I != len(raw) || !jsonrpcOK || !hasMethod {
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

package broker

import (
	"github.com/Tahul/caddy-zidane-mcp/internal/jsonscan"
)

// The fast path's reading of an upstream's answer without encoding/json,
// for the common shape; anything else is declined and read by
// encoding/json as before (fastAnswer, normalizeFastResult). As for the
// edge's inspection (package policy), the cost that matters is a cold
// encoding/json decoder on every call of a lightly loaded route.

// scanEnvelope reads a JSON-RPC answer {"jsonrpc":"2.0","id":…,"result"|"error":…}
// with plain keys and a plain string or unsigned integer id, returning the
// raw id and the raw result or error.
func scanEnvelope(data []byte) (id, result, rpcErr []byte, ok bool) {
	s := &jsonscan.Scanner{B: data}
	var seenJ, seenID, seenR, seenE bool
	top := func(key string) bool {
		if jsonscan.RPCKeyVariant(key) {
			return false
		}
		switch key {
		case "jsonrpc":
			if seenJ {
				return false
			}
			seenJ = true
			return s.Version()
		case "id":
			if seenID {
				return false
			}
			seenID = true
			var ok bool
			id, ok = s.ID()
			return ok
		case "result", "error":
			if seenR || seenE {
				return false
			}
			if key == "result" {
				seenR = true
			} else {
				seenE = true
			}
			start := s.I
			if s.Peek() != '{' || !s.SkipValue(0) {
				return false
			}
			if key == "result" {
				result = data[start:s.I]
			} else {
				rpcErr = data[start:s.I]
			}
			return true
		}
		return false
	}
	if !s.Object(top, true) {
		return nil, nil, nil, false
	}
	s.WS()
	if s.I != len(data) || !seenJ || !seenID || seenR == seenE {
		return nil, nil, nil, false
	}
	return id, result, rpcErr, true
}

// scanTextResult reports whether a tools/call result has a content list
// whose blocks all have type "text", and its isError. ok is false when it
// cannot tell as encoding/json would (another shape, keys in another case
// or not plain, duplicates).
func scanTextResult(raw []byte) (textOnly, isError, ok bool) {
	s := &jsonscan.Scanner{B: raw}
	var hasContent, seenErr bool
	textOnly = true
	block := func() bool {
		seenType := false
		if !s.Object(func(key string) bool {
			if jsonscan.FoldsTo(key, "type") {
				return false
			}
			if key != "type" {
				return s.SkipValue(3)
			}
			if seenType {
				return false
			}
			seenType = true
			v, ok := s.PlainString()
			if ok && v != "text" {
				textOnly = false
			}
			return ok
		}, true) {
			return false
		}
		if !seenType {
			textOnly = false
		}
		return true
	}
	member := func(key string) bool {
		if jsonscan.FoldsToAny(key, "content", "isError") {
			return false
		}
		switch key {
		case "content":
			if hasContent {
				return false
			}
			hasContent = true
			return s.Array(block)
		case "isError":
			if seenErr {
				return false
			}
			seenErr = true
			if s.Literal("true") {
				isError = true
				return true
			}
			return s.Literal("false")
		}
		return s.SkipValue(1)
	}
	if !s.Object(member, true) {
		return false, false, false
	}
	s.WS()
	if s.I != len(raw) || !hasContent {
		return false, false, false
	}
	return textOnly, isError, true
}

// scanToolCall reads a downstream tools/call request of the common shape,
// as fastToolCall's encoding/json decoding would: the raw id (a plain
// string or unsigned integer), params.name (plain), and the raw
// params.arguments and params._meta (nil when absent). It declines params
// with inputResponses or requestState, and everything it cannot read
// exactly as encoding/json does.
func scanToolCall(body []byte) (id []byte, p fastToolParams, ok bool) {
	s := &jsonscan.Scanner{B: body}
	var seenJ, seenID, seenM, seenP, jOK, isCall bool
	params := func(key string) bool {
		if jsonscan.FoldsToAny(key, "name", "arguments", "_meta", "inputResponses", "requestState") {
			return false
		}
		switch key {
		case "name":
			if p.Name != "" {
				return false
			}
			v, ok := s.PlainString()
			if !ok || v == "" {
				return false
			}
			p.Name = v
			return true
		case "arguments", "_meta":
			if (key == "arguments" && p.Arguments != nil) || (key == "_meta" && p.Meta != nil) {
				return false
			}
			start := s.I
			if !s.SkipValue(1) {
				return false
			}
			if key == "arguments" {
				p.Arguments = body[start:s.I]
			} else {
				p.Meta = body[start:s.I]
			}
			return true
		case "inputResponses", "requestState":
			return false
		}
		return s.SkipValue(1)
	}
	top := func(key string) bool {
		if jsonscan.RPCKeyVariant(key) {
			return false
		}
		switch key {
		case "jsonrpc":
			if seenJ {
				return false
			}
			seenJ = true
			jOK = s.Version()
			return jOK
		case "id":
			if seenID {
				return false
			}
			seenID = true
			var ok bool
			id, ok = s.ID()
			return ok
		case "method":
			if seenM {
				return false
			}
			seenM = true
			v, ok := s.PlainString()
			isCall = ok && v == "tools/call"
			return isCall
		case "params":
			if seenP {
				return false
			}
			seenP = true
			return s.Object(params, true)
		}
		return false
	}
	if !s.Object(top, true) {
		return nil, fastToolParams{}, false
	}
	s.WS()
	if s.I != len(body) || !jOK || !isCall || !seenID || !seenP || p.Name == "" {
		return nil, fastToolParams{}, false
	}
	return id, p, true
}

package aggregate

import (
	"github.com/Tahul/caddy-zidane-mcp/internal/jsonscan"
)

// The fast path's reading of a tools/call result without encoding/json,
// to tell whether it needs normalizing: the common shape only, anything
// else is declined and read by encoding/json (normalizeFastResult). The
// cost that matters is a cold encoding/json decoder on every call of a
// lightly loaded route. The answer around the result was read by package
// message (fastAnswer), which refused whatever two readers could read
// differently.

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

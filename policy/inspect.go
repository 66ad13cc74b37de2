package policy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
)

// Call is what the edge learns from one JSON-RPC message.
type Call struct {
	// Method is the JSON-RPC method; empty for a response the client sends
	// back to a server request (sampling, elicitation, roots).
	Method string
	// ID is the raw request id, nil for notifications and responses.
	ID json.RawMessage
	// Tool is params.name of a tools/call.
	Tool string
	// Verb is params.arguments.verb of a tools/call, for tools that take one
	// (the sessions and interactions tools).
	Verb string
}

// IsToolCall reports whether c is a tools/call request.
func (c Call) IsToolCall() bool { return c.Method == "tools/call" }

// ErrMalformed wraps every inspection failure.
var ErrMalformed = errors.New("malformed JSON-RPC")

// message is the part of a JSON-RPC message that policy looks at. Params
// arguments other than verb are skipped by the decoder, never kept.
type message struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id"`
	Method  *string         `json:"method"`
	Params  *struct {
		Name      string `json:"name"`
		Arguments *struct {
			Verb any `json:"verb"`
		} `json:"arguments"`
	} `json:"params"`
	Result json.RawMessage `json:"result"`
	Error  json.RawMessage `json:"error"`
}

// Inspect parses a JSON-RPC 2.0 body: one message or a batch. It returns one
// Call per message, in order, and reports whether the body was a batch. The
// body is not modified.
func Inspect(body []byte) ([]Call, bool, error) {
	trimmed := bytes.TrimLeft(body, " \t\r\n")
	if len(trimmed) == 0 {
		return nil, false, fmt.Errorf("%w: empty body; send a JSON-RPC 2.0 request object", ErrMalformed)
	}
	if trimmed[0] == '[' {
		var raws []json.RawMessage
		if err := json.Unmarshal(trimmed, &raws); err != nil {
			return nil, true, fmt.Errorf("%w: %v", ErrMalformed, syntaxOnly(err))
		}
		if len(raws) == 0 {
			return nil, true, fmt.Errorf("%w: empty batch", ErrMalformed)
		}
		calls := make([]Call, 0, len(raws))
		for i, raw := range raws {
			c, err := inspectOne(raw)
			if err != nil {
				return nil, true, fmt.Errorf("batch element %d: %w", i, err)
			}
			calls = append(calls, c)
		}
		return calls, true, nil
	}
	if c, ok := inspectFast(trimmed); ok {
		return []Call{c}, false, nil
	}
	c, err := inspectOne(trimmed)
	if err != nil {
		return nil, false, err
	}
	return []Call{c}, false, nil
}

func inspectOne(raw []byte) (Call, error) {
	var m message
	if err := json.Unmarshal(raw, &m); err != nil {
		return Call{}, fmt.Errorf("%w: %v", ErrMalformed, syntaxOnly(err))
	}
	if m.JSONRPC != "2.0" {
		return Call{}, fmt.Errorf(`%w: "jsonrpc" must be "2.0"`, ErrMalformed)
	}
	if m.Method == nil {
		if m.Result == nil && m.Error == nil {
			return Call{}, fmt.Errorf("%w: a message needs a method, or a result or error", ErrMalformed)
		}
		return Call{ID: m.ID}, nil
	}
	if *m.Method == "" {
		return Call{}, fmt.Errorf("%w: empty method", ErrMalformed)
	}
	c := Call{Method: *m.Method, ID: m.ID}
	if c.IsToolCall() {
		if m.Params == nil || m.Params.Name == "" {
			return Call{}, fmt.Errorf("%w: tools/call needs params.name", ErrMalformed)
		}
		c.Tool = m.Params.Name
		if a := m.Params.Arguments; a != nil && a.Verb != nil {
			v, ok := a.Verb.(string)
			if !ok {
				return Call{}, fmt.Errorf("%w: arguments.verb must be a string", ErrMalformed)
			}
			c.Verb = v
		}
	}
	return c, nil
}

// syntaxOnly keeps a decoder error's description but never echoes the
// body back: a malformed body may hold a credential.
func syntaxOnly(err error) string {
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return fmt.Sprintf("invalid JSON at byte %d", se.Offset)
	}
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		if te.Field != "" {
			return fmt.Sprintf("field %q has the wrong type", te.Field)
		}
		return "a JSON-RPC message must be an object"
	}
	return "invalid JSON"
}

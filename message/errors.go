package message

import (
	"errors"
	"strconv"
)

// The three kinds of refusal. Every error that Read, Validate and ParseID
// return is an *Error whose Kind is one of them; decide on the kind with
// errors.Is, never on the text.
var (
	// ErrSyntax: the body is not JSON at all (JSON-RPC code -32700).
	ErrSyntax = errors.New("invalid JSON")
	// ErrAmbiguous: the body is JSON that two readers could read
	// differently, so no reading of it is safe to decide on (audit reason
	// ambiguous_body).
	ErrAmbiguous = errors.New("ambiguous JSON-RPC body")
	// ErrMalformed: the body is unambiguous JSON but not a JSON-RPC 2.0
	// message the edge accepts (JSON-RPC code -32600).
	ErrMalformed = errors.New("malformed JSON-RPC")
)

// Error is every error Read, Validate and ParseID return. Its message says
// what is wrong and what to send instead. It never quotes the body, which
// may hold a credential: it gives a byte offset, and names a key only when
// that key is one of the protocol's own field names (jsonrpc, id, method,
// params, name, arguments, verb, uri, ref, ...), never a key or a value the
// client chose.
type Error struct {
	// Kind is ErrSyntax, ErrAmbiguous or ErrMalformed.
	Kind error
	// Offset is the byte offset in the body where the problem was found.
	Offset int
	// Msg says what is wrong and what to send instead.
	Msg string
}

func (e *Error) Error() string {
	return e.Kind.Error() + " at byte " + strconv.Itoa(e.Offset) + ": " + e.Msg
}

// Unwrap returns Kind, so that errors.Is(err, ErrAmbiguous) works.
func (e *Error) Unwrap() error { return e.Kind }

package clients

import "errors"

// The OAuth error codes a refusal carries ([Error.Code]): RFC 7591 §3.2.2
// for registration, RFC 6749 for the rest.
const (
	// CodeInvalidRedirectURI: a redirect URI that breaks the rules of
	// [CheckRedirectURI], or one an authorization request names that no
	// registered URI matches ([MatchRedirect]).
	CodeInvalidRedirectURI = "invalid_redirect_uri"
	// CodeInvalidClientMetadata: a registration request or a metadata
	// document that is not acceptable client metadata.
	CodeInvalidClientMetadata = "invalid_client_metadata"
	// CodeInvalidClient: a client_id that names no client this server
	// accepts: unknown, expired, or a metadata document that could not be
	// fetched or was refused.
	CodeInvalidClient = "invalid_client"
	// CodeAccessDenied: registration is off, or the store of registered
	// clients is full.
	CodeAccessDenied = "access_denied"
	// CodeTemporarilyUnavailable: too many requests from one address, or
	// too many documents being fetched at once; try again later.
	CodeTemporarilyUnavailable = "temporarily_unavailable"
)

// Error is a refusal: the OAuth error code to answer with, one word of
// the reason for the audit log, and a description a person can act on.
// A description never quotes a client's input (a URL, a name, a body).
type Error struct {
	Code        string
	Reason      string
	Description string
	// Err is the cause, when there is one (a fetch's network error).
	Err error
}

func (e *Error) Error() string { return e.Description }

func (e *Error) Unwrap() error { return e.Err }

func refuse(code, reason, description string) *Error {
	return &Error{Code: code, Reason: reason, Description: description}
}

// Reason returns the audit word of err when it is an *Error, "" otherwise.
func Reason(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Reason
	}
	return ""
}

package upstreamauth

import (
	"errors"
	"fmt"
	"strings"
)

// ErrAuthRequired is wrapped by the error of a request the gateway did not
// send because the upstream needs an operator to log in (again): there is
// no token, the refresh token was refused, or the upstream asks for scopes
// the token lacks. Test with errors.Is; errors.As with *[AuthRequiredError]
// gives the upstream and the reason.
var ErrAuthRequired = errors.New("upstream OAuth login required")

// ErrLogin is wrapped by the errors of [Client.Callback] that refuse the
// authorization response: an unknown or expired state, an iss that does
// not match the authorization server, or an error the server returned.
var ErrLogin = errors.New("upstream OAuth login refused")

// AuthRequiredError says which upstream needs a login, why, and how.
type AuthRequiredError struct {
	// Upstream is the upstream's name.
	Upstream string
	// Reason says why the current token (if any) cannot be used.
	Reason string
	// Scopes, when the upstream asked for more scopes (step-up), are the
	// scopes the next login requests.
	Scopes []string
}

func (e *AuthRequiredError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "upstream %q needs an OAuth login", e.Upstream)
	if e.Reason != "" {
		fmt.Fprintf(&b, " (%s)", e.Reason)
	}
	if len(e.Scopes) > 0 {
		fmt.Fprintf(&b, " with scopes %q", strings.Join(e.Scopes, " "))
	}
	fmt.Fprintf(&b, ": an operator must run `caddy zidane login %s`", e.Upstream)
	return b.String()
}

func (e *AuthRequiredError) Unwrap() error { return ErrAuthRequired }

// ErrConnectRequired is wrapped by the error of a request the gateway did
// not send because the upstream takes each person's own token (credentials
// per_user) and the calling person has none usable: they must connect
// their account to the upstream. Test with errors.Is; errors.As with
// *[ConnectRequiredError] gives the upstream and the reason.
var ErrConnectRequired = errors.New("upstream account not connected")

// ConnectRequiredError says which upstream the calling person must connect
// their account to, and why. It never names the person: it goes back to
// them alone.
type ConnectRequiredError struct {
	// Upstream is the upstream's name.
	Upstream string
	// Reason says why the person's token (if any) cannot be used.
	Reason string
	// Scopes, when the upstream asked for more scopes (step-up), are the
	// scopes the next connection requests.
	Scopes []string
}

func (e *ConnectRequiredError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "the upstream MCP server %q acts as each person with their own account, and yours is not connected", e.Upstream)
	if e.Reason != "" {
		fmt.Fprintf(&b, " (%s)", e.Reason)
	}
	if len(e.Scopes) > 0 {
		fmt.Fprintf(&b, "; connecting must grant the scopes %q", strings.Join(e.Scopes, " "))
	}
	b.WriteString(": connect your account to it, then call again")
	return b.String()
}

func (e *ConnectRequiredError) Unwrap() error { return ErrConnectRequired }

// ErrSignInRequired is wrapped by the error of a request the gateway did
// not send because the upstream gets each person's token from their
// sign-in through the company IdP (token_exchange, cross_app_access),
// the calling person's could not be had (no sign-in kept, an expired one,
// an exchange refused), and the upstream has no other way to connect
// them (fallback none). Test with errors.Is; errors.As with
// *[SignInRequiredError] gives the upstream and the reason.
var ErrSignInRequired = errors.New("upstream token not had from the sign-in")

// SignInRequiredError says which upstream could not be given the calling
// person's token from their sign-in, and why. It never names the person:
// it goes back to them alone.
type SignInRequiredError struct {
	// Upstream is the upstream's name.
	Upstream string
	// Reason says why, without a secret.
	Reason string
}

func (e *SignInRequiredError) Error() string {
	return fmt.Sprintf("the upstream MCP server %q acts as each person with the token their sign-in to this gateway gives, and yours could not be had (%s): sign in to the gateway again from your MCP client, then call again; if that does not help, ask this gateway's operator", e.Upstream, e.Reason)
}

func (e *SignInRequiredError) Unwrap() error { return ErrSignInRequired }

// UnavailableError is the error of a request the gateway did not send
// because it could not obtain a token for a reason a login does not fix
// (the authorization server is unreachable or refuses the client, the
// upstream keeps asking for scopes it was granted).
type UnavailableError struct {
	Upstream string
	Err      error
}

func (e *UnavailableError) Error() string {
	return fmt.Sprintf("upstream %q: no OAuth token: %v", e.Upstream, e.Err)
}

func (e *UnavailableError) Unwrap() error { return e.Err }

// oauthError is an error response of a token, registration or revocation
// endpoint (RFC 6749 §5.2). Its message holds the error code and a bounded
// description, never the request.
type oauthError struct {
	Endpoint    string
	Status      int
	Code        string
	Description string
}

func (e *oauthError) Error() string {
	msg := fmt.Sprintf("%s answered HTTP %d", e.Endpoint, e.Status)
	if e.Code != "" {
		msg += " " + e.Code
	}
	if e.Description != "" {
		msg += ": " + e.Description
	}
	return msg
}

// isInvalidGrant reports whether err is the authorization server refusing
// the grant for good (an expired, revoked or already used refresh token or
// code).
func isInvalidGrant(err error) bool {
	var oe *oauthError
	return errors.As(err, &oe) && oe.Code == "invalid_grant"
}

// clip bounds a text that came from a server before it goes into an error,
// and keeps only printable ASCII.
func clip(s string, n int) string {
	var b strings.Builder
	for i := 0; i < len(s) && b.Len() < n; i++ {
		c := s[i]
		if c >= 0x20 && c < 0x7f {
			b.WriteByte(c)
		}
	}
	if b.Len() >= n {
		b.WriteString("…")
	}
	return b.String()
}

// LoginRequiredMessage is what a caller is told when upstream waits for an
// operator's OAuth login: how to log in, and the scopes the login must
// grant when err says (a step-up).
func LoginRequiredMessage(upstream string, err error) string {
	var are *AuthRequiredError
	if errors.As(err, &are) && len(are.Scopes) > 0 {
		return fmt.Sprintf("the upstream MCP server %q is not available yet: the gateway needs an operator to log it in with the scopes %q (`caddy zidane login %s`)", upstream, strings.Join(are.Scopes, " "), upstream)
	}
	return fmt.Sprintf("the upstream MCP server %q is not available yet: the gateway needs an operator to log it in (`caddy zidane login %s`)", upstream, upstream)
}

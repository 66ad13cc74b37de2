// Package pinnedfetch is origin-pinned outbound HTTP: an *http.Client whose
// credentials never leave the origin it was configured for.
//
// The broker, the JWKS fetcher and OAuth discovery send their outbound
// requests through it, and an agent can import it on its own, for example as
// the HTTPClient of an MCP client transport.
//
// It owns three rules:
//
//   - The remote-URL rule ([CheckRemoteURL], [IsAllowedRemoteURL]): HTTPS to
//     anywhere, plain HTTP to loopback only, nothing else, with hosts read
//     strictly so that numeric and mapped spellings cannot smuggle an address.
//   - Origin pinning ([New], [Origin], [SameOrigin]): redirects are followed
//     by the client's transport, one judged hop at a time. A hop off the
//     pinned origin carries no Authorization, Proxy-Authorization, Cookie or
//     configured secret header, and skips the layer that adds credentials
//     ([WithCredentials]); once dropped they stay dropped for the chain.
//     HTTPS never downgrades to HTTP, chains are bounded ([MaxRedirects]) and
//     loops are refused. Every decision can be audited ([WithDecisions]).
//   - The dial-time address guard ([DenyPrivateAddresses], [CheckAddress]):
//     the address actually dialed, after DNS resolution, must be globally
//     reachable by the IANA special-purpose address registries, with the
//     IPv4 address inside a NAT64, 6to4 or Teredo address judged too, so
//     DNS rebinding cannot reach a private network or a metadata service.
//
// What it never does: it never puts a header value, userinfo or query value
// in an error or a [Decision]; it never sets http.Client.Timeout (that would
// cut SSE streams; use the request context); it never uses a proxy from the
// environment, never adds a Referer, and keeps no cookie jar. It does not
// obtain or refresh credentials itself: a caller sets them on the request or
// supplies the layer that adds them.
//
// Errors: a refused request URL is a *[URLError], a refused redirect a
// *[RedirectError] wrapping the rule ([ErrDowngrade], [ErrTooManyRedirects],
// [ErrRedirectLoop], [ErrBodyNotReplayable], [ErrBadLocation] or a
// *URLError), and a refused dial a *[DialError]. http.Client wraps them in a
// *url.Error, whose URL field is net/http's and keeps the query.
package pinnedfetch

// Package clients is who may ask the gateway's authorization server for a
// token: the OAuth clients it accepts, and where it may send a person back
// to.
//
// What it owns:
//
//   - The redirect URI rules ([CheckRedirectURI], [MatchRedirect]): an
//     https URI compared exactly, or an http URI on a loopback host
//     (127.0.0.1, [::1], localhost, each its own host) that matches on any
//     port (RFC 8252 §7.3); no fragment, no userinfo, no dot segment, no
//     parameter the authorization response adds, one spelling of each host.
//   - [Registry.Resolve]: a client_id that is an https URL with a path is a
//     Client ID Metadata Document (draft-ietf-oauth-client-id-metadata-
//     document, as MCP 2025-11-25 and 2026-07-28 use it), fetched through
//     pinnedfetch with the dial-time address guard on (no private, loopback
//     or metadata address, judged on the address dialed), no redirect
//     followed, MaxMetadataBytes and FetchTimeout, application/json only,
//     kept for its Cache-Control max-age clamped to [MinDocumentTTL,
//     MaxDocumentTTL] and, when refused, refused again without a fetch for
//     FailureTTL. Its client_id member must equal the URL exactly. A
//     client_id of the form zdc_… is a registered client, read from
//     storage; anything else is invalid_client.
//   - [Registry.Register]: dynamic client registration (RFC 7591), off
//     unless the operator allows it, limited per address
//     (DefaultRegistrationLimit) and in total (DefaultMaxRegistered);
//     registered clients are kept under StoragePrefix and forgotten after
//     DefaultRegisteredTTL unused.
//
// Both kinds of client are public: token endpoint authentication "none",
// no client_secret taken or issued, the authorization code flow with PKCE
// only. Client metadata, fetched or registered, is read once: a member
// twice, or a member this package reads spelled in another case, is
// refused (package message's rule), so that no other reader of the same
// bytes sees another client.
//
// Every refusal is an *[Error] (an OAuth error code, one word of reason,
// a description that says what to do and quotes nothing the client sent)
// and reaches Config.OnRefusal for the audit log, without a body, a
// secret or a URL's query.
//
// What it never does: Caddy, the authorization or token endpoints, the
// consent page, or deciding what a client may be granted; those are the
// authorization server's.
package clients

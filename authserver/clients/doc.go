// Package clients is who may ask the gateway's authorization server for a
// token: the OAuth clients it accepts, and the rules on where it may send a
// person back to.
//
// What it owns:
//
//   - The redirect URI rules ([CheckRedirectURI], [MatchRedirect]): an https
//     URI compared exactly, or an http URI on a loopback host that matches
//     on any port (RFC 8252 §7.3); no fragment, no userinfo, one spelling of
//     each host.
//   - [Client], with what the consent page may truthfully show.
//
// What it never does: Caddy, the authorization or token endpoints, the
// consent page, or deciding what a client may be granted; those are the
// authorization server's.
package clients

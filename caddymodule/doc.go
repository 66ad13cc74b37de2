// Package caddymodule is the only package of caddy-zidane-mcp that imports
// Caddy: the adapter between Caddy and the core packages. It registers the
// zidane app, the http.handlers.zidane_mcp handler and its Caddyfile
// directive, the handler's routes (guest modules in
// http.handlers.zidane_mcp.routes: sessions, guard, broker, aggregate, of
// which a handler loads one and never asks which), the admin.api.zidane
// routes, the
// caddy.logging.writers.zidane_audit log writer and the `caddy zidane`
// command.
//
// It parses and checks config (a literal secret where a placeholder
// belongs is refused at load), keeps durable state in Caddy's usage pools
// across reloads, builds the core objects from the policy, pinnedfetch,
// mcpendpoint, sessions, clustersessions, broker, pins and cluster
// packages, and hands requests to them. The handler's ServeHTTP sequences
// the request path's steps, and serveHop those of a request another
// replica forwarded; each verdict is a core package's: the Host, Origin
// and CORS rules, authentication and the charging of failed guesses, the
// refusal as the client sees it (its WWW-Authenticate, its JSON-RPC code,
// the RFC 9728 document), the rule of a draining replica, the hop between
// replicas and the egress paths are package edge's; scopes, tokens, the
// aggregated route's upstream rule and the verb table are package
// policy's; an orchestrator's child-token scopes are package
// mcpendpoint's; the authorization server of a signin block (its
// metadata, authorization, consent, token and revocation endpoints, served
// on every zidane_mcp site) is package authserver's, on the clients of
// authserver/clients and the sign-in of authserver/idp. This package
// writes the audit lines and metrics of what they decide, and with Caddy's
// tracing on records the steps in the request's span.
//
// It also tells gatewayfiles which files each module reads secrets from or
// writes logs to, and finds those of the config caddy runs, for the
// sessions to keep from agents.
package caddymodule

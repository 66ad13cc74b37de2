// Package caddymodule is the only package of caddy-zidane-mcp that imports
// Caddy. It registers the zidane app, the http.handlers.zidane_mcp handler
// and its Caddyfile directive, the handler's routes (guest modules in
// http.handlers.zidane_mcp.routes: sessions, guard, broker, aggregate, of
// which a handler loads one and never asks which), the admin.api.zidane
// routes, the
// caddy.logging.writers.zidane_audit log writer and the `caddy zidane`
// command; it parses config, builds the core objects from the
// policy, pinnedfetch, mcpendpoint, sessions, broker, pins and cluster
// packages, and hands requests to them; it tells gatewayfiles which files
// each module reads secrets from or writes logs to, and finds those of the
// config caddy runs, for the sessions to keep from agents; with Caddy's
// tracing on it records
// the edge's steps in the request's span. It holds no decision logic of its
// own.
package caddymodule

// Package e2e holds the end-to-end tests: they build cmd/caddy and drive the
// binary over loopback with real peers (the go-sdk and TypeScript SDK clients,
// the MCP conformance suite, the go-sdk conformance everything-server).
//
// It has no code outside its tests. The harness (harness_test.go) builds the
// binaries once per run and starts processes that it always stops: every wait
// has a deadline and every child is killed, with its process group, at
// cleanup. Node tooling comes from e2e/node_modules, which ./test.sh installs
// from e2e/package-lock.json; without it the Node-based tests skip, unless
// ZIDANE_E2E=1, when they fail.
package e2e

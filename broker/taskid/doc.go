// Package taskid seals an upstream's task id (MCP 2026-07-28's Tasks
// extension) and the upstream that gave it into the handle the gateway
// gives the client that created the task, bound to that principal and
// route, and opens it again ([Sealer]); package edge applies it on every
// route.
//
// It never gives a client the upstream's task id, keeps nothing per task,
// and holds no key of its own.
package taskid

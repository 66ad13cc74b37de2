//go:build !unix

package caddymodule

// lockAuditFile takes no lock where flock is missing: one process must
// write each audit log.
func lockAuditFile(string) (func(), error) { return func() {}, nil }

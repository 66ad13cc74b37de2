// Package natstest runs real nats-servers, embedded, on loopback for the
// tests of the packages that share state through NATS.
package natstest

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// Start runs a nats-server with opts (signals and logging off), waits until
// it takes connections, and shuts it down when the test ends.
func Start(t testing.TB, opts *server.Options) *server.Server {
	t.Helper()
	opts.NoSigs, opts.NoLog = true, true
	ns, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go ns.Start()
	t.Cleanup(ns.Shutdown)
	if !ns.ReadyForConnections(30 * time.Second) {
		t.Fatal("nats-server did not become ready")
	}
	return ns
}

// JetStream runs a nats-server with JetStream on a free loopback port.
func JetStream(t testing.TB) *server.Server {
	t.Helper()
	return Start(t, &server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir()})
}

// FromConfig runs a nats-server from the text of a configuration file.
func FromConfig(t testing.TB, conf string) *server.Server {
	t.Helper()
	path := filepath.Join(t.TempDir(), "nats.conf")
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return Start(t, opts)
}

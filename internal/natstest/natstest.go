// Package natstest runs real nats-servers, embedded, on loopback for the
// tests of the packages that share state through NATS.
package natstest

import (
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
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

// Cluster runs n nats-servers with JetStream as one NATS cluster on
// loopback, each with its own store, and returns them once each takes
// connections. It does not wait for JetStream's meta leader: replicas
// started with a fresh cluster meet it leaderless, as in production.
func Cluster(t testing.TB, n int) []*server.Server {
	t.Helper()
	// JetStream in a cluster wants its routes configured on every server,
	// so the route ports are chosen first: each a port the kernel gave and
	// was given back.
	routes := make([]*url.URL, n)
	for i := range routes {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		routes[i] = &url.URL{Scheme: "nats", Host: ln.Addr().String()}
		ln.Close()
	}
	name := "zidane-test-" + filepath.Base(t.TempDir())
	servers := make([]*server.Server, n)
	for i := range servers {
		port := routes[i].Port()
		p, _ := strconv.Atoi(port)
		servers[i] = Start(t, &server.Options{
			ServerName: fmt.Sprintf("n%d", i), Host: "127.0.0.1", Port: -1,
			JetStream: true, StoreDir: t.TempDir(),
			Cluster: server.ClusterOpts{Name: name, Host: "127.0.0.1", Port: p},
			Routes:  routes,
		})
	}
	return servers
}

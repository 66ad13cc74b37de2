package e2e

import (
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"
)

// startFreshNATSCluster runs three nats-servers as one JetStream cluster
// (natsNode) and returns their client URLs as soon as each listens: unlike
// startNATSCluster, it does not wait for the cluster to hold a bucket,
// which is what replicas started together with it meet.
func startFreshNATSCluster(t *testing.T) []string {
	t.Helper()
	buildNATSServer(t)
	nodes := make([]*natsNode, 3)
	for i := range nodes {
		nodes[i] = &natsNode{
			name: fmt.Sprintf("nats-%d", i), dir: t.TempDir(),
			addr: fmt.Sprintf("127.0.0.1:%d", freePort(t)), clusterAddr: fmt.Sprintf("127.0.0.1:%d", freePort(t)),
		}
	}
	var urls []string
	for _, n := range nodes {
		for _, o := range nodes {
			if o != n {
				n.routes = append(n.routes, "nats://"+o.clusterAddr)
			}
		}
		urls = append(urls, "nats://"+n.addr)
	}
	for _, n := range nodes {
		n.start(t)
		t.Cleanup(func() {
			n.p.stop(2 * time.Second)
			n.p.dumpIfFailed(t)
		})
	}
	return urls
}

// Three replicas of the built caddy, started at the same instant with the
// three-server NATS cluster they share (replicas 3, each its own server,
// node and advertised address, as an operator runs them), all come up
// and serve a token made on one of them, ten times in a row.
func TestClusterReplicasStartTogether(t *testing.T) {
	up := startRecordingUpstream(t)
	for run := range 10 {
		t.Run(fmt.Sprint("run ", run+1), func(t *testing.T) {
			nats := startFreshNATSCluster(t)
			clusterKey := "ZIDANE_CLUSTER_KEY=" + base64.StdEncoding.EncodeToString([]byte(randomHex(16)))
			replicas := make([]*Caddy, len(nats))
			sites := make([]string, len(nats))
			for i, url := range nats {
				site := fmt.Sprintf("127.0.0.1:%d", freePort(t))
				sites[i] = "http://" + site + "/mcp"
				replicas[i] = newCaddy(t, fmt.Sprintf(`{
	admin %s
	storage zidane_nats
	zidane {
		cluster {
			url %s
			replicas 3
			node gw-%d
			advertise http://%s
		}
	}
}

http://%s {
	zidane_mcp {
		guard
	}
	reverse_proxy %s
}
`, AdminPlaceholder, url, i+1, site, site, up.addr), clusterKey)
			}
			served := make([]func() error, len(replicas))
			for i, c := range replicas {
				served[i] = c.launch(t)
			}
			errs := make([]error, len(replicas))
			var wg sync.WaitGroup
			for i := range served {
				wg.Go(func() {
					if err := served[i](); err != nil {
						errs[i] = fmt.Errorf("replica gw-%d: %w", i+1, err)
					}
				})
			}
			wg.Wait()
			if err := errors.Join(errs...); err != nil {
				t.Fatal(err)
			}
			token := createToken(t, replicas[0], "start", "--scope", "mcp")
			for _, s := range sites {
				waitStatus(t, s, token, http.StatusOK, 20*time.Second)
			}
		})
	}
}

package e2e

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// natsNode is one nats-server of a JetStream cluster on loopback.
type natsNode struct {
	name, addr, clusterAddr, dir string
	routes                       []string
	p                            *process
}

func (n *natsNode) start(t testing.TB) {
	t.Helper()
	host, port, _ := strings.Cut(n.addr, ":")
	cmd := exec.Command(natsServerBin, "-a", host, "-p", port, "-js", "-sd", filepath.Join(n.dir, "js"),
		"-n", n.name, "--cluster_name", "zidane", "--cluster", "nats://"+n.clusterAddr, "--routes", strings.Join(n.routes, ","))
	cmd.Dir = n.dir
	n.p = startProcess(t, n.name, cmd, filepath.Join(n.dir, n.name+".log"))
	waitListening(t, n.p, n.addr, startTimeout)
}

func (n *natsNode) kill() {
	_ = syscall.Kill(-n.p.cmd.Process.Pid, syscall.SIGKILL)
	<-n.p.done
}

// startNATSCluster runs three nats-servers as one JetStream cluster and
// waits until it can hold a bucket with three replicas.
func startNATSCluster(t *testing.T) (nodes []*natsNode, urls []string) {
	t.Helper()
	buildNATSServer(t)
	for i := range 3 {
		nodes = append(nodes, &natsNode{
			name: fmt.Sprintf("nats-%d", i), dir: t.TempDir(),
			addr: fmt.Sprintf("127.0.0.1:%d", freePort(t)), clusterAddr: fmt.Sprintf("127.0.0.1:%d", freePort(t)),
		})
	}
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
	nc, err := nats.Connect(strings.Join(urls, ","))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	deadline := time.Now().Add(60 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "ready", Replicas: 3})
		if err == nil {
			_, err = kv.Put(ctx, "k", []byte("v"))
		}
		cancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the NATS cluster did not hold a replicated bucket within 60s: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	return nodes, urls
}

// streamLeader names the NATS server that leads stream.
func streamLeader(t *testing.T, urls []string, stream string) string {
	t.Helper()
	nc, err := nats.Connect(strings.Join(urls, ","))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil || info.Cluster == nil {
		t.Fatalf("stream %s: %v", stream, err)
	}
	return info.Cluster.Leader
}

// callLoop makes a tools/call through cs every period until stop, and
// records when each started and whether it failed.
type callRecord struct {
	at  time.Time
	err error
}

func callLoop(cs *mcp.ClientSession, period time.Duration, stop <-chan struct{}) <-chan []callRecord {
	out := make(chan []callRecord, 1)
	go func() {
		var recs []callRecord
		t := time.NewTicker(period)
		defer t.Stop()
		for {
			select {
			case <-stop:
				out <- recs
				return
			case <-t.C:
			}
			start := time.Now()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "test_simple_text"})
			cancel()
			if err == nil && res.IsError {
				err = fmt.Errorf("tool error: %+v", res.Content)
			}
			recs = append(recs, callRecord{start, err})
		}
	}()
	return out
}

// Three replicas on a three-node NATS cluster, behind a Caddy
// reverse_proxy load balancer with health checks on /zidane/healthz, with
// go-sdk clients at both protocol versions: steady load without errors;
// a revocation on one replica in force on every replica (the lags are
// logged); a replica killed mid-load costs at most its in-flight calls,
// and every call succeeds once the load balancer's health check has found
// it gone; the NATS stream leader killed: no call fails and a write (a
// token made) succeeds (its stall is logged); a rolling restart
// of the replicas fails no 2026-07-28 call. Without NATS quorum, writes
// get a clear 503, known tokens keep working, and writes come back with
// quorum.
func TestClusterBehindLoadBalancer(t *testing.T) {
	nodes, natsURLs := startNATSCluster(t)
	upstream := startStatelessEverythingServer(t) // both protocol versions
	upHost := strings.TrimSuffix(strings.TrimPrefix(upstream, "http://"), "/mcp")
	key := "ZIDANE_CLUSTER_KEY=" + base64.StdEncoding.EncodeToString([]byte(randomHex(16)))

	var replicas []*Caddy
	var sites []string
	for range 3 {
		site := fmt.Sprintf("127.0.0.1:%d", freePort(t))
		replicas = append(replicas, startCaddy(t, fmt.Sprintf(`{
	admin %s
	grace_period 10s
	# Stopping, a replica answers its health check 503 (draining) and
	# still serves for this long, so the load balancer (health_interval
	# 250ms) has stopped sending to it before its listener closes.
	shutdown_delay 1s
	storage zidane_nats
	zidane {
		cluster {
			url %s
			replicas 3
		}
	}
}

http://%s {
	zidane_mcp {
		guard
		rate_limit {
			per_token 1000/s 1000
		}
	}
	reverse_proxy %s
}
`, AdminPlaceholder, strings.Join(natsURLs, " "), site, upHost), key))
		sites = append(sites, site)
	}
	lb, lbCaddy := startLoadBalancer(t, sites)

	token := createToken(t, replicas[0], "load", "--scope", "mcp")
	for _, s := range sites {
		waitStatus(t, "http://"+s+"/mcp", token, http.StatusOK, 20*time.Second)
	}
	connect := func(version string) *mcp.ClientSession {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		client := mcp.NewClient(&mcp.Implementation{Name: "e2e-lb-" + version, Version: "1"}, nil)
		cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: lb, HTTPClient: bearerClient(token, nil), MaxRetries: -1},
			&mcp.ClientSessionOptions{ProtocolVersion: version})
		if err != nil {
			t.Fatalf("connect at %s through the load balancer: %v", version, err)
		}
		t.Cleanup(func() { cs.Close() })
		if got := cs.InitializeResult().ProtocolVersion; got != version {
			t.Fatalf("negotiated %s, want %s", got, version)
		}
		return cs
	}

	t.Run("steady load", func(t *testing.T) {
		var wg sync.WaitGroup
		errs := make(chan error, 200)
		for _, v := range []string{"2025-11-25", "2026-07-28"} {
			for range 3 {
				cs := connect(v)
				wg.Go(func() {
					for i := range 20 {
						res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "test_simple_text"})
						if err != nil || res.IsError {
							errs <- fmt.Errorf("%s call %d: %v", v, i, err)
						}
					}
				})
			}
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
	})

	t.Run("revocation on every replica", func(t *testing.T) {
		victim := createToken(t, replicas[1], "victim", "--scope", "mcp")
		for _, s := range sites {
			waitStatus(t, "http://"+s+"/mcp", victim, http.StatusOK, 20*time.Second)
		}
		if _, stderr, err := replicas[1].Run(t, "zidane", "token", "revoke", "victim"); err != nil {
			t.Fatalf("revoke: %v %s", err, stderr)
		}
		revoked := time.Now()
		var wg sync.WaitGroup
		lags := make([]time.Duration, len(sites))
		for i, s := range sites {
			wg.Go(func() {
				for time.Since(revoked) < 10*time.Second {
					if post(t, "http://"+s+"/mcp", victim, initializeBody).status == http.StatusUnauthorized {
						lags[i] = time.Since(revoked)
						return
					}
					time.Sleep(20 * time.Millisecond)
				}
				lags[i] = -1
			})
		}
		wg.Wait()
		// The lags are measured, not asserted: 10 s only bounds the wait.
		t.Logf("revocation lag per replica: %v", lags)
		for i, l := range lags {
			if l < 0 {
				t.Errorf("replica %d still accepts the token revoked on replica 1 10s later", i)
			}
		}
	})

	t.Run("replica killed mid-load", func(t *testing.T) {
		cs := connect("2026-07-28")
		stop := make(chan struct{})
		done := callLoop(cs, 20*time.Millisecond, stop)
		time.Sleep(time.Second) // calls before the kill
		victim := replicas[2]
		logged := len(lbCaddy.Logs())
		_ = syscall.Kill(-victim.proc.cmd.Process.Pid, syscall.SIGKILL)
		<-victim.proc.done
		// The load balancer's health check finds the replica gone (it
		// logs the failed check, then takes the replica out): from then
		// on every call succeeds.
		awaitHealthCheckFailed(t, lbCaddy, logged, sites[2])
		close(stop)
		recs := <-done
		failed := 0
		for _, r := range recs {
			if r.err != nil {
				failed++
			}
		}
		t.Logf("%d calls until the load balancer found the replica gone, %d failed (in flight at the kill)", len(recs), failed)
		const after = 50
		for i := range after {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "test_simple_text"})
			cancel()
			if err != nil || res.IsError {
				t.Errorf("call %d of %d after the load balancer found the replica gone failed: %v", i+1, after, err)
			}
		}
		victim.start(t) // back for the next steps
		waitStatus(t, "http://"+sites[2]+"/mcp", token, http.StatusOK, 20*time.Second)
	})

	t.Run("NATS leader killed", func(t *testing.T) {
		leader := streamLeader(t, natsURLs, "KV_zidane")
		cs := connect("2026-07-28")
		stop := make(chan struct{})
		done := callLoop(cs, 20*time.Millisecond, stop)
		for _, n := range nodes {
			if n.name == leader {
				n.kill()
			}
		}
		start := time.Now()
		if _, stderr, err := replicas[0].Run(t, "zidane", "token", "create", "--name", "after-leader", "--scope", "mcp"); err != nil {
			t.Fatalf("a write after the NATS leader died: %v %s", err, stderr)
		}
		stall := time.Since(start)
		close(stop)
		recs := <-done
		for _, r := range recs {
			if r.err != nil {
				t.Errorf("a call failed after the NATS leader died: %v", r.err)
			}
		}
		// nats-server elects a stream's new leader within its raft
		// election timeout (4 to 9 s), and the storage retries a write for
		// 12 s: the write above succeeding is the proof; its time is
		// measured.
		t.Logf("NATS leader %s killed: a token write took %v; %d calls meanwhile", leader, stall.Round(time.Millisecond), len(recs))
		for _, n := range nodes {
			if n.name == leader {
				n.start(t)
			}
		}
	})

	t.Run("NATS quorum lost", func(t *testing.T) {
		cs := connect("2026-07-28")
		for _, n := range nodes[:2] {
			n.kill()
		}
		// Writes fail, and say why; tokens already known keep working
		// (they live in each replica's memory for as long as it runs).
		start := time.Now()
		_, stderr, err := replicas[0].Run(t, "zidane", "token", "create", "--name", "no-quorum", "--scope", "mcp")
		if err == nil || !strings.Contains(stderr, "NATS did not answer") {
			t.Errorf("a write without quorum: %v %s; want a refusal that says NATS did not answer", err, stderr)
		}
		t.Logf("without quorum a token write failed after %v: %s", time.Since(start).Round(time.Millisecond), lastLine(stderr))
		for i := range 10 {
			if res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "test_simple_text"}); err != nil || res.IsError {
				t.Errorf("call %d without quorum: %v", i, err)
			}
		}
		for _, n := range nodes[:2] {
			n.start(t)
		}
		deadline := time.Now().Add(60 * time.Second)
		for {
			_, stderr, err := replicas[0].Run(t, "zidane", "token", "create", "--name", "quorum-back", "--scope", "mcp")
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("writes did not recover within 60s of quorum's return: %s", stderr)
			}
			time.Sleep(500 * time.Millisecond)
		}
		t.Logf("writes back %v after quorum returned", time.Since(deadline.Add(-60*time.Second)).Round(time.Millisecond))
	})

	t.Run("rolling restart", func(t *testing.T) {
		cs := connect("2026-07-28")
		stop := make(chan struct{})
		done := callLoop(cs, 20*time.Millisecond, stop)
		for i, r := range replicas {
			r.Restart(t)
			waitStatus(t, "http://"+sites[i]+"/mcp", token, http.StatusOK, 20*time.Second)
		}
		close(stop)
		recs := <-done
		for _, r := range recs {
			if r.err != nil {
				t.Errorf("a 2026-07-28 call failed during the rolling restart: %v", r.err)
			}
		}
		t.Logf("rolling restart of 3 replicas: %d calls", len(recs))
	})
}

// startLoadBalancer starts a Caddy reverse_proxy over the replicas at
// hosts (host:port): round robin, retrying for 5 s, with health checks on
// /zidane/healthz every 250 ms, streaming answers as they come. It returns
// its /mcp URL, and the Caddy, whose log tells its health checks.
func startLoadBalancer(t *testing.T, hosts []string) (string, *Caddy) {
	t.Helper()
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	c := startCaddy(t, fmt.Sprintf(`{
	admin %s
}

http://%s {
	reverse_proxy %s {
		lb_policy round_robin
		lb_try_duration 5s
		lb_try_interval 50ms
		fail_duration 5s
		health_uri /zidane/healthz
		health_interval 250ms
		health_timeout 1s
		flush_interval -1
	}
}
`, AdminPlaceholder, addr, strings.Join(hosts, " ")))
	return "http://" + addr + "/mcp", c
}

// awaitHealthCheckFailed waits until the load balancer lb logs, after the
// first from bytes of its log, an active health check of host that failed,
// for at most 20 s.
func awaitHealthCheckFailed(t *testing.T, lb *Caddy, from int, host string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		for _, line := range strings.Split(lb.Logs()[from:], "\n") {
			if strings.Contains(line, "health_checker.active") && strings.Contains(line, `"host":"`+host+`"`) {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the load balancer logged no failed health check of %s within 20s of its death", host)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/internal/sse"
	"github.com/Tahul/caddy-zidane-mcp/message"
)

// The idle-sessions run. For each route, N MCP sessions are opened and
// left open: initialize, then notifications/initialized with the session
// id the server gave, and nothing more (no DELETE, no GET stream). The
// client is a lean raw HTTP one, not go-sdk ClientSessions, so that 10,000
// sessions cost the harness little: idleWorkers workers share one
// keep-alive transport. Memory is measured before the first initialize and
// after the last one: caddy's RSS from /proc and its live heap after a GC
// from the admin API's pprof; for broker pass-through, whose session ids
// are sealed and which keeps no session state itself, also the upstream's
// RSS, since that is where the sessions' state lives. Then a sample of
// the sessions is pinged with their ids, to check they are still alive.
// Last, on the routes that close idle sessions (the sessions endpoint and
// the aggregated route: mcp_session_idle_timeout), the run waits out the
// timeout after the last ping, measures again, and pings the sample once
// more: each must now get 404.
const (
	idleWorkers     = 32
	idlePings       = 20
	idleCallTimeout = 30 * time.Second
	// idleTargetKiB is the target of RSS per idle session.
	idleTargetKiB = 30
	// idleProtocol is the MCP version the harness asks for; it then uses
	// whatever the server answered.
	idleProtocol = "2025-06-18"
)

// idleRoute is what the run measured on one route.
type idleRoute struct {
	name           string
	n              int
	opened         int // initialize and notifications/initialized both succeeded
	failures       int
	firstError     string
	open           time.Duration // first initialize → last notifications/initialized answered
	rssBefore      int64
	rssAfter       int64
	heapBefore     int64 // caddy's live heap after a GC; 0 when unknown
	heapAfter      int64
	gorBefore      int // caddy's goroutines; 0 when unknown
	gorAfter       int
	upstream       bool // the upstream's figures apply
	modern         bool // 2026-07-28 clients: no session; "opened" counts clients that made their calls
	upRSSBefore    int64
	upRSSAfter     int64
	pingsOK        int
	pingsSampled   int
	firstPingError string

	// After the idle timeout, on the routes that close idle sessions.
	expire      time.Duration // 0: not measured
	rssExpired  int64
	heapExpired int64
	gorExpired  int
	closed      int // sampled sessions answered 404
}

// idleResult is what the idle-sessions run measured.
type idleResult struct {
	n      int
	routes []idleRoute
	total  time.Duration
}

// runIdle opens cfg.idle sessions on the sessions endpoint, in a caddy of
// its own, then on broker pass-through, in a gateway and upstream of their
// own, so that neither route's figures hold the other's or the tools/call
// section's sessions.
func runIdle(ctx context.Context, cfg config, work, caddyBin, upstreamBin string) (*idleResult, error) {
	began := time.Now()
	res := &idleResult{n: cfg.idle}

	dir := filepath.Join(work, "idle-sessions")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	zidane := ""
	if cfg.idleTimeout > 0 {
		zidane = "\t\tmcp_session_idle_timeout " + cfg.idleTimeout.String()
	}
	fmt.Fprintf(os.Stderr, "bench: idle MCP sessions, %d on the sessions endpoint…\n", cfg.idle)
	sgw, err := startSessionsGateway(ctx, caddyBin, dir, 1000, 4, 30*time.Second, zidane)
	if err != nil {
		return nil, err
	}
	r, err := measureIdle(ctx, "sessions endpoint", sgw.url, sgw.token, cfg.idle, sgw.pid(), sgw.admin, 0, cfg.idleTimeout)
	sgw.stop()
	if err != nil {
		return nil, fmt.Errorf("idle sessions, sessions endpoint: %w\n%s", err, tail(sgw.p.logs.String(), 20))
	}
	res.routes = append(res.routes, r)

	// 2026-07-28 clients of the sessions endpoint, in a caddy of their own.
	fmt.Fprintf(os.Stderr, "bench: %d idle 2026-07-28 clients on the sessions endpoint…\n", cfg.idle)
	mdir := filepath.Join(work, "idle-modern")
	if err := os.MkdirAll(mdir, 0o700); err != nil {
		return nil, err
	}
	mgw, err := startSessionsGateway(ctx, caddyBin, mdir, 1000, 4, 30*time.Second, zidane)
	if err != nil {
		return nil, err
	}
	r, err = measureIdleModern(ctx, "sessions endpoint, 2026-07-28", mgw.url, mgw.token, cfg.idle, mgw.pid(), mgw.admin)
	mgw.stop()
	if err != nil {
		return nil, fmt.Errorf("idle 2026-07-28 clients, sessions endpoint: %w\n%s", err, tail(mgw.p.logs.String(), 20))
	}
	res.routes = append(res.routes, r)

	fmt.Fprintf(os.Stderr, "bench: idle MCP sessions, %d on broker pass-through, then on the aggregated route…\n", cfg.idle)
	up, upAddr, err := startUpstream(ctx, upstreamBin)
	if err != nil {
		return nil, err
	}
	defer up.stop()
	gdir := filepath.Join(work, "idle-broker")
	if err := os.MkdirAll(gdir, 0o700); err != nil {
		return nil, err
	}
	// The aggregated route, over the same upstream twice; its sessions
	// only initialize, so they reach no upstream.
	gw, err := startGateway(ctx, caddyBin, gdir, upAddr, upAddr, "", "", zidane, false)
	if err != nil {
		return nil, err
	}
	defer gw.stop()
	for _, name := range []string{"broker pass-through", "aggregated (2 upstreams)"} {
		var rt *route
		for i := range gw.routes {
			if gw.routes[i].name == name {
				rt = &gw.routes[i]
			}
		}
		if rt == nil {
			return nil, fmt.Errorf("the gateway has no %s route", name)
		}
		// Pass-through keeps no session state in caddy: the upstream's
		// sessions are its own to time out.
		upPID, expire := up.cmd.Process.Pid, time.Duration(0)
		if name != "broker pass-through" {
			upPID, expire = 0, cfg.idleTimeout
		}
		r, err = measureIdle(ctx, rt.name, rt.url, rt.token, cfg.idle, gw.pid(), gw.admin, upPID, expire)
		if err != nil {
			return nil, fmt.Errorf("idle sessions, %s: %w\n%s", name, err, tail(gw.p.logs.String(), 20))
		}
		res.routes = append(res.routes, r)
	}
	res.total = time.Since(began)
	return res, nil
}

// idleClient is the lean MCP client: bare JSON-RPC over HTTP POST.
type idleClient struct {
	hc    *http.Client
	url   string
	token string
	ids   atomic.Int64 // JSON-RPC request ids
}

// measureIdle opens n sessions on url and measures caddy (caddyPID, admin)
// and, when upPID is not 0, the upstream around it; with expire, once more
// after that idle timeout.
func measureIdle(ctx context.Context, name, url, token string, n, caddyPID int, admin string, upPID int, expire time.Duration) (idleRoute, error) {
	r := idleRoute{name: name, n: n, upstream: upPID != 0, expire: expire}
	tr := &http.Transport{MaxIdleConns: 2 * idleWorkers, MaxIdleConnsPerHost: 2 * idleWorkers, IdleConnTimeout: time.Minute}
	defer tr.CloseIdleConnections()
	c := &idleClient{hc: &http.Client{Transport: tr, Timeout: idleCallTimeout}, url: url, token: token}

	// One session opened and pinged before measuring, so that the
	// first-request costs (connections, lazy initialisation, pools) are in
	// "before" and not spread over the sessions.
	warm, _, err := c.open(ctx)
	if err != nil {
		return r, fmt.Errorf("opening a first session: %w", err)
	}
	if err := c.ping(ctx, warm); err != nil {
		return r, fmt.Errorf("pinging a first session: %w", err)
	}
	r.rssBefore, _ = rss(caddyPID)
	r.heapBefore = liveHeap(ctx, admin)
	r.gorBefore = goroutines(ctx, admin)
	if upPID != 0 {
		r.upRSSBefore, _ = rss(upPID)
	}

	start := time.Now()
	ids := openIdle(ctx, c, n, &r)
	r.open = time.Since(start)
	r.opened = len(ids)
	if err := ctx.Err(); err != nil {
		return r, err
	}

	r.rssAfter, _ = rss(caddyPID)
	r.heapAfter = liveHeap(ctx, admin)
	r.gorAfter = goroutines(ctx, admin)
	if upPID != 0 {
		r.upRSSAfter, _ = rss(upPID)
	}

	sample := pingSample(ctx, c, ids, &r)
	if expire <= 0 || ctx.Err() != nil {
		return r, ctx.Err()
	}

	// The pings were the sessions' last requests: wait the timeout out
	// (and a little more, for the timers), then measure and ping again.
	fmt.Fprintf(os.Stderr, "bench: waiting out the %s idle timeout on %s…\n", expire, name)
	select {
	case <-time.After(expire + 2*time.Second):
	case <-ctx.Done():
		return r, ctx.Err()
	}
	r.rssExpired, _ = rss(caddyPID)
	r.heapExpired = liveHeap(ctx, admin)
	r.gorExpired = goroutines(ctx, admin)
	for i := range sample {
		if err := c.ping(ctx, ids[i]); err != nil && strings.Contains(err.Error(), "HTTP 404") {
			r.closed++
		}
	}
	return r, ctx.Err()
}

// openIdle opens n sessions with c, idleWorkers at a time, and returns
// those that opened; r counts the failures and keeps the first error.
func openIdle(ctx context.Context, c *idleClient, n int, r *idleRoute) []idleSession {
	var (
		next atomic.Int64
		mu   sync.Mutex
		wg   sync.WaitGroup
		ids  = make([]idleSession, 0, n)
	)
	for w := 0; w < min(idleWorkers, n); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil && next.Add(1) <= int64(n) {
				s, _, err := c.open(ctx)
				mu.Lock()
				if err != nil {
					r.failures++
					if r.firstError == "" {
						r.firstError = err.Error()
					}
				} else {
					ids = append(ids, s)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return ids
}

// pingSample pings a sample of ids, the first and the last opened among
// them, to tell whether they are still alive; r counts the answers. It
// returns the sample, as indexes into ids.
func pingSample(ctx context.Context, c *idleClient, ids []idleSession, r *idleRoute) map[int]bool {
	sample := map[int]bool{}
	if len(ids) > 0 {
		sample[0], sample[len(ids)-1] = true, true
	}
	for i := 0; len(sample) < min(idlePings, len(ids)) && i < 10*idlePings; i++ {
		sample[rand.IntN(len(ids))] = true
	}
	for i := range sample {
		r.pingsSampled++
		if err := c.ping(ctx, ids[i]); err != nil {
			if r.firstPingError == "" {
				r.firstPingError = err.Error()
			}
			continue
		}
		r.pingsOK++
	}
	return sample
}

// measureIdleModern is measureIdle for MCP 2026-07-28 clients, which have
// no session: each of n clients sends server/discover and one tools/call
// (sessions list), everything such a client does before it goes idle, and
// then nothing. What caddy holds for them afterwards (the live heap after
// a GC, over the heap before, per client) is the session state an idle
// 2026-07-28 client costs. A sample then calls again, to check that a
// client that went idle needs nothing kept to be served. The harness's
// connections are opened before "before", so their buffers are not counted.
func measureIdleModern(ctx context.Context, name, url, token string, n, caddyPID int, admin string) (idleRoute, error) {
	r := idleRoute{name: name, n: n, modern: true}
	tr := &http.Transport{MaxIdleConns: 2 * idleWorkers, MaxIdleConnsPerHost: 2 * idleWorkers, IdleConnTimeout: time.Minute}
	defer tr.CloseIdleConnections()
	c := &idleClient{hc: &http.Client{Transport: tr, Timeout: idleCallTimeout}, url: url, token: token}
	// As many first clients as workers, at once, so that the harness's
	// keep-alive connections (and caddy's buffers for them) are all open in
	// "before" and not counted as the clients' state.
	var warm sync.WaitGroup
	warmErrs := make(chan error, idleWorkers)
	for range min(idleWorkers, n) {
		warm.Add(1)
		go func() {
			defer warm.Done()
			if err := c.modernClient(ctx); err != nil {
				warmErrs <- err
			}
		}()
	}
	warm.Wait()
	close(warmErrs)
	if err := <-warmErrs; err != nil {
		return r, fmt.Errorf("a first 2026-07-28 client: %w", err)
	}
	r.rssBefore, _ = rss(caddyPID)
	r.heapBefore = liveHeap(ctx, admin)
	r.gorBefore = goroutines(ctx, admin)

	var (
		next  atomic.Int64
		mu    sync.Mutex
		wg    sync.WaitGroup
		start = time.Now()
	)
	for w := 0; w < min(idleWorkers, n); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil && next.Add(1) <= int64(n) {
				err := c.modernClient(ctx)
				mu.Lock()
				if err != nil {
					r.failures++
					if r.firstError == "" {
						r.firstError = err.Error()
					}
				} else {
					r.opened++
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	r.open = time.Since(start)
	if err := ctx.Err(); err != nil {
		return r, err
	}
	r.rssAfter, _ = rss(caddyPID)
	r.heapAfter = liveHeap(ctx, admin)
	r.gorAfter = goroutines(ctx, admin)
	for range min(idlePings, r.opened) {
		r.pingsSampled++
		if _, err := c.modernCall(ctx, "tools/call", "sessions", map[string]any{"name": "sessions", "arguments": map[string]any{"verb": "list", "limit": 1}}); err != nil {
			if r.firstPingError == "" {
				r.firstPingError = err.Error()
			}
			continue
		}
		r.pingsOK++
	}
	return r, ctx.Err()
}

// modernClient is one 2026-07-28 client's life before it goes idle:
// server/discover, then a tools/call.
func (c *idleClient) modernClient(ctx context.Context) error {
	res, err := c.modernCall(ctx, "server/discover", "", map[string]any{})
	if err != nil {
		return err
	}
	var d struct {
		SupportedVersions []string `json:"supportedVersions"`
	}
	if json.Unmarshal(res, &d) != nil || !slices.Contains(d.SupportedVersions, modernProtocol) {
		return fmt.Errorf("server/discover answered %s, without %s", truncate(res, 200), modernProtocol)
	}
	_, err = c.modernCall(ctx, "tools/call", "sessions", map[string]any{"name": "sessions", "arguments": map[string]any{"verb": "list", "limit": 1}})
	return err
}

// modernProtocol is the stateless MCP version.
const modernProtocol = "2026-07-28"

// modernCall sends one 2026-07-28 request: its version, method and name
// in the headers and the version, capabilities and client in _meta.
func (c *idleClient) modernCall(ctx context.Context, method, name string, params map[string]any) (json.RawMessage, error) {
	params["_meta"] = map[string]any{
		"io.modelcontextprotocol/protocolVersion":    modernProtocol,
		"io.modelcontextprotocol/clientCapabilities": map[string]any{},
		"io.modelcontextprotocol/clientInfo":         map[string]any{"name": "zidane-bench-idle", "version": "1"},
	}
	hdr := map[string]string{"Mcp-Protocol-Version": modernProtocol, "Mcp-Method": method}
	if name != "" {
		hdr["Mcp-Name"] = name
	}
	status, _, res, err := c.postHeaders(ctx, idleSession{}, hdr, map[string]any{"jsonrpc": "2.0", "id": c.ids.Add(1), "method": method, "params": params})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", method, err)
	}
	if status != http.StatusOK {
		return nil, fmt.Errorf("%s: HTTP %d", method, status)
	}
	return res, nil
}

// idleSession is an opened session: its id and negotiated version.
type idleSession struct {
	id, version string
}

// open makes the initialize handshake and returns the session.
func (c *idleClient) open(ctx context.Context) (idleSession, json.RawMessage, error) {
	init := map[string]any{
		"jsonrpc": "2.0",
		"id":      c.ids.Add(1),
		"method":  "initialize",
		"params": map[string]any{
			"protocolVersion": idleProtocol,
			"capabilities":    map[string]any{},
			"clientInfo":      map[string]any{"name": "zidane-bench-idle", "version": "1"},
		},
	}
	status, hdr, result, err := c.post(ctx, idleSession{}, init)
	if err != nil {
		return idleSession{}, nil, fmt.Errorf("initialize: %w", err)
	}
	if status != http.StatusOK {
		return idleSession{}, nil, fmt.Errorf("initialize: HTTP %d", status)
	}
	s := idleSession{id: hdr.Get("Mcp-Session-Id"), version: idleProtocol}
	if s.id == "" {
		return idleSession{}, nil, fmt.Errorf("initialize: no Mcp-Session-Id in the answer")
	}
	var v struct {
		ProtocolVersion string `json:"protocolVersion"`
	}
	if json.Unmarshal(result, &v) == nil && v.ProtocolVersion != "" {
		s.version = v.ProtocolVersion
	}
	status, _, _, err = c.post(ctx, s, map[string]any{"jsonrpc": "2.0", "method": "notifications/initialized"})
	if err != nil {
		return idleSession{}, nil, fmt.Errorf("notifications/initialized: %w", err)
	}
	if status != http.StatusAccepted && status != http.StatusOK {
		return idleSession{}, nil, fmt.Errorf("notifications/initialized: HTTP %d", status)
	}
	return s, result, nil
}

// ping sends a ping in session s; a 404 means the session is gone.
func (c *idleClient) ping(ctx context.Context, s idleSession) error {
	status, _, _, err := c.post(ctx, s, map[string]any{"jsonrpc": "2.0", "id": c.ids.Add(1), "method": "ping"})
	if err != nil {
		return fmt.Errorf("ping: %w", err)
	}
	if status != http.StatusOK {
		return fmt.Errorf("ping: HTTP %d", status)
	}
	return nil
}

// post sends one JSON-RPC message and returns the HTTP status, the headers
// and, for a request, the result of the answer, read from a JSON body or an
// event stream. A JSON-RPC error is an error.
func (c *idleClient) post(ctx context.Context, s idleSession, msg map[string]any) (int, http.Header, json.RawMessage, error) {
	return c.postHeaders(ctx, s, nil, msg)
}

// postHeaders is post with more request headers.
func (c *idleClient) postHeaders(ctx context.Context, s idleSession, more map[string]string, msg map[string]any) (int, http.Header, json.RawMessage, error) {
	body, err := json.Marshal(msg)
	if err != nil {
		return 0, nil, nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, idleCallTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(cctx, http.MethodPost, c.url, bytes.NewReader(body))
	if err != nil {
		return 0, nil, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	if s.id != "" {
		req.Header.Set("Mcp-Session-Id", s.id)
		req.Header.Set("Mcp-Protocol-Version", s.version)
	}
	for k, v := range more {
		req.Header.Set(k, v)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return 0, nil, nil, err
	}
	defer resp.Body.Close()
	// Read it all, so that the connection is reused.
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return resp.StatusCode, resp.Header, nil, err
	}
	if resp.StatusCode != http.StatusOK || msg["id"] == nil {
		return resp.StatusCode, resp.Header, nil, nil
	}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		raw = sseData(raw)
	}
	var answer struct {
		Result json.RawMessage `json:"result"`
		Error  *struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal(raw, &answer); err != nil {
		return resp.StatusCode, resp.Header, nil, fmt.Errorf("answer %q: %v", truncate(raw, 200), err)
	}
	if answer.Error != nil {
		return resp.StatusCode, resp.Header, nil, fmt.Errorf("JSON-RPC error %d: %s", answer.Error.Code, answer.Error.Message)
	}
	if answer.Result == nil {
		return resp.StatusCode, resp.Header, nil, fmt.Errorf("answer %q has no result", truncate(raw, 200))
	}
	return resp.StatusCode, resp.Header, answer.Result, nil
}

// sseData is the data of the first event of an event stream that carries
// a JSON-RPC answer (a result or an error), read as a client reads the
// stream.
func sseData(raw []byte) []byte {
	r := sse.NewReader(bytes.NewReader(raw), 0)
	for {
		ev, err := r.Next()
		if err != nil {
			return nil
		}
		data, ok := ev.Message()
		if !ok {
			continue
		}
		if b, err := message.ReadAnswer(data); err == nil && !b.Batch && b.Calls[0].IsResponse() {
			return data
		}
	}
}

// goroutines is the number of caddy's goroutines, from the admin API's
// goroutine profile; 0 when it cannot be had.
func goroutines(ctx context.Context, admin string) int {
	cctx, cancel := context.WithTimeout(ctx, idleCallTimeout)
	defer cancel()
	resp, err := adminGet(cctx, admin, "/debug/pprof/goroutine?debug=1")
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	line, _ := bufio.NewReader(io.LimitReader(resp.Body, 4096)).ReadString('\n')
	var n int
	if _, err := fmt.Sscanf(line, "goroutine profile: total %d", &n); err != nil {
		return 0
	}
	return n
}

func truncate(b []byte, n int) string {
	if len(b) > n {
		return string(b[:n]) + "…"
	}
	return string(b)
}

func printIdle(out io.Writer, r *idleResult) {
	fmt.Fprintf(out, "idle MCP sessions: %d per route, opened by %d workers (initialize + notifications/initialized, then left open: no DELETE, no GET stream); target ≤ %d KiB RSS per session\n\n",
		r.n, idleWorkers, idleTargetKiB)
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "route\topened\tfailures\topening took\tcaddy RSS before → after\tcaddy RSS/session\tcaddy heap/session\tcaddy goroutines/session\tupstream RSS before → after\tupstream RSS/session\tpings ok\t≤ target\t")
	for _, x := range r.routes {
		per := func(before, after int64) string {
			if x.opened == 0 || before == 0 || after == 0 {
				return "-"
			}
			return kib((after - before) / int64(x.opened))
		}
		upRange, upPer := "-", "-"
		if x.upstream {
			upRange = mib(x.upRSSBefore) + " → " + mib(x.upRSSAfter)
			upPer = per(x.upRSSBefore, x.upRSSAfter)
		}
		rate := 0.0
		if x.open > 0 {
			rate = float64(x.opened) / x.open.Seconds()
		}
		target := "-"
		if x.opened > 0 {
			within := func(d int64) bool { return d/int64(x.opened) <= idleTargetKiB<<10 }
			target = "caddy: " + yesNo(within(x.rssAfter-x.rssBefore))
			if x.upstream {
				target += ", caddy+upstream: " + yesNo(within(x.rssAfter-x.rssBefore+x.upRSSAfter-x.upRSSBefore))
			}
		}
		gor := "-"
		if x.opened > 0 && x.gorBefore > 0 && x.gorAfter > 0 {
			gor = fmt.Sprintf("%.2f", float64(x.gorAfter-x.gorBefore)/float64(x.opened))
		}
		fmt.Fprintf(tw, "%s\t%d/%d\t%d\t%s (%.0f/s)\t%s → %s\t%s\t%s\t%s\t%s\t%s\t%d/%d\t%s\t\n", x.name, x.opened, x.n, x.failures,
			x.open.Round(10*time.Millisecond), rate, mib(x.rssBefore), mib(x.rssAfter), per(x.rssBefore, x.rssAfter),
			per(x.heapBefore, x.heapAfter), gor, upRange, upPer, x.pingsOK, x.pingsSampled, target)
	}
	tw.Flush()
	for _, x := range r.routes {
		if x.firstError != "" {
			fmt.Fprintf(out, "%s: first failure: %s\n", x.name, x.firstError)
		}
		if x.firstPingError != "" {
			fmt.Fprintf(out, "%s: first failed ping: %s\n", x.name, x.firstPingError)
		}
	}
	for _, x := range r.routes {
		if x.modern && x.opened > 0 && x.heapBefore > 0 && x.heapAfter > 0 {
			fmt.Fprintf(out, "%s: %d clients each sent server/discover and a tools/call, then nothing; no MCP session: what caddy's live heap (after a GC) holds for them is %s in all, %d B per client, and %+d goroutines\n",
				x.name, x.opened, signedKiB(x.heapAfter-x.heapBefore), (x.heapAfter-x.heapBefore)/int64(x.opened), x.gorAfter-x.gorBefore)
		}
	}
	printExpired(out, r)
	fmt.Fprintf(out, "wall time, whole section: %s\n", r.total.Round(10*time.Millisecond))
}

// printExpired is the table of what the routes that close idle sessions
// hold once the timeout has passed, against what the sessions took: kept
// is (after timeout − before) / (after opening − before).
func printExpired(out io.Writer, r *idleResult) {
	var rows []idleRoute
	for _, x := range r.routes {
		if x.expire > 0 {
			rows = append(rows, x)
		}
	}
	if len(rows) == 0 {
		return
	}
	fmt.Fprintf(out, "\nafter mcp_session_idle_timeout %s (waited out after the last ping): what the sessions took, and what of it is kept\n\n", rows[0].expire)
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "route\tcaddy heap before → opened → after timeout\theap kept\tcaddy RSS before → opened → after timeout\tRSS kept\tgoroutines before → opened → after\tsampled sessions closed (404)\t")
	kept := func(before, opened, after int64) string {
		if before == 0 || opened <= before || after == 0 {
			return "-"
		}
		return fmt.Sprintf("%.2f", float64(after-before)/float64(opened-before))
	}
	for _, x := range rows {
		fmt.Fprintf(tw, "%s\t%s → %s → %s\t%s\t%s → %s → %s\t%s\t%d → %d → %d\t%d/%d\t\n", x.name,
			mib(x.heapBefore), mib(x.heapAfter), mib(x.heapExpired), kept(x.heapBefore, x.heapAfter, x.heapExpired),
			mib(x.rssBefore), mib(x.rssAfter), mib(x.rssExpired), kept(x.rssBefore, x.rssAfter, x.rssExpired),
			x.gorBefore, x.gorAfter, x.gorExpired, x.closed, x.pingsSampled)
	}
	tw.Flush()
	for _, x := range rows {
		if x.open > x.expire {
			fmt.Fprintf(out, "%s: opening took %s, longer than the timeout, so the first sessions had closed before \"opened\" was measured\n", x.name, x.open.Round(time.Second))
		}
	}
	fmt.Fprintln(out, "RSS falls back only as fast as Go's scavenger returns freed pages to the OS; the heap is the live heap after a GC.")
}

// signedKiB is a byte count in KiB, with its sign.
func signedKiB(b int64) string { return fmt.Sprintf("%+.1fKiB", float64(b)/1024) }

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The server timeouts of TestServerTimeouts' Caddyfile, small so that the
// test is quick, and each its own so that the log tells which one cut. The
// streams outlast all three.
const (
	readHeaderBound = 2 * time.Second
	readBodyBound   = 3 * time.Second
	idleBound       = 4 * time.Second
	// closeSafety bounds every wait for the server to close a connection;
	// far above the bounds, it only keeps a failing test from hanging.
	closeSafety = 30 * time.Second
)

// TestServerTimeouts runs the servers timeouts that README and
// Caddyfile.example recommend (read_header, read_body, idle; no write) in
// front of the guard and a real MCP server (the TypeScript
// server-everything), over HTTP/1.1 and over HTTP/2 with TLS. Slow clients
// are cut: headers that never end, a body that never ends from a client
// with a valid token, a TLS handshake that never starts, an idle
// keep-alive connection. Streams are not: an event stream answering a POST
// (whose body net/http has read, after which it reads the connection in the
// background) and a GET stream keep delivering events well past every
// bound.
func TestServerTimeouts(t *testing.T) {
	upstream := startNodeEverythingServer(t)
	up := strings.TrimSuffix(strings.TrimPrefix(upstream, "http://"), "/mcp")
	h1 := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	h2Port := freePort(t)
	c := startCaddy(t, fmt.Sprintf(`{
	admin %s
	skip_install_trust
	http_port %d
	servers {
		timeouts {
			read_header %s
			read_body %s
			idle %s
		}
	}
}

http://%s {
	bind 127.0.0.1
	zidane_mcp {
		guard
	}
	reverse_proxy %s {
		flush_interval -1
	}
}

https://localhost:%d {
	bind 127.0.0.1
	tls internal
	zidane_mcp {
		guard
	}
	reverse_proxy %s {
		flush_interval -1
	}
}
`, AdminPlaceholder, freePort(t), readHeaderBound, readBodyBound, idleBound, h1, up, h2Port, up))
	token := createToken(t, c, "slow", "--scope", "mcp")
	c.WaitForLog(t, "certificate obtained successfully", 30*time.Second)
	root, err := os.ReadFile(filepath.Join(c.DataDir, "pki", "authorities", "local", "root.crt"))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(root) {
		t.Fatal("Caddy's local root is not PEM")
	}
	h2 := fmt.Sprintf("localhost:%d", h2Port)
	h2Client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, ForceAttemptHTTP2: true}}
	h1Client := &http.Client{Transport: &http.Transport{}}

	t.Run("headers that never end are cut", func(t *testing.T) {
		t.Parallel()
		conn, start := dialLoopback(t, h1)
		write(t, conn, "POST /mcp HTTP/1.1\r\nHost: "+h1+"\r\nContent-Type: application/json\r\n")
		trickle(t, conn, "X-Slow: "+strings.Repeat("a", 1000))
		took, got := waitClosed(t, conn)
		t.Logf("read_header %s: a trickle of headers was cut after %s (server wrote %q)", readHeaderBound, took.Sub(start).Round(10*time.Millisecond), firstLine(got))
	})

	t.Run("a body that never ends is cut, with a valid token", func(t *testing.T) {
		t.Parallel()
		conn, start := dialLoopback(t, h1)
		write(t, conn, "POST /mcp HTTP/1.1\r\nHost: "+h1+"\r\nAuthorization: Bearer "+token+
			"\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: 60000\r\n\r\n"+
			`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"message":"`)
		trickle(t, conn, strings.Repeat("a", 60000))
		took, got := waitClosed(t, conn)
		t.Logf("read_body %s: a trickle of body was cut after %s (server wrote %q)", readBodyBound, took.Sub(start).Round(10*time.Millisecond), firstLine(got))
	})

	t.Run("a TLS handshake that never starts is cut", func(t *testing.T) {
		t.Parallel()
		conn, start := dialLoopback(t, h2)
		took, _ := waitClosed(t, conn)
		t.Logf("a silent TLS connection was cut after %s", took.Sub(start).Round(10*time.Millisecond))
	})

	t.Run("an idle keep-alive connection is closed", func(t *testing.T) {
		t.Parallel()
		conn, _ := dialLoopback(t, h1)
		write(t, conn, "POST /mcp HTTP/1.1\r\nHost: "+h1+"\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
		br := bufio.NewReader(conn)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized || resp.Close {
			t.Fatalf("a POST without a token: %d (close %v), want 401 on a connection kept alive", resp.StatusCode, resp.Close)
		}
		answered := time.Now()
		took, _ := waitClosed(t, readerConn{conn, br})
		t.Logf("idle %s: a kept-alive connection was closed %s after its answer", idleBound, took.Sub(answered).Round(10*time.Millisecond))
	})

	for _, site := range []struct {
		name   string
		url    string
		client *http.Client
		proto  int
	}{
		{"HTTP/1.1", "http://" + h1 + "/mcp", h1Client, 1},
		{"HTTP/2", "https://" + h2 + "/mcp", h2Client, 2},
	} {
		t.Run("a POST's event stream outlives the bounds over "+site.name, func(t *testing.T) {
			t.Parallel()
			s := openMCPSession(t, site.client, site.url, token, site.proto)
			// The server sends one progress notification a second for 8
			// seconds on the stream of this POST, then the result.
			const steps = 8
			start := time.Now()
			resp := s.post(t, `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"trigger-long-running-operation","arguments":{"duration":8,"steps":8},"_meta":{"progressToken":"slow"}}}`)
			if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
				t.Fatalf("tools/call answered %d %q, want an event stream", resp.StatusCode, ct)
			}
			progress := 0
			var last time.Time
			for ev := range sseEvents(t, resp.Body) {
				if ev.data == "" {
					continue // the priming event of a resumable stream
				}
				var m struct {
					ID     json.RawMessage `json:"id"`
					Method string          `json:"method"`
					Result json.RawMessage `json:"result"`
					Params struct {
						Progress int `json:"progress"`
					} `json:"params"`
				}
				if err := json.Unmarshal([]byte(ev.data), &m); err != nil {
					t.Fatalf("event %q: %v", ev.data, err)
				}
				switch {
				case m.Method == "notifications/progress":
					progress++
					if m.Params.Progress != progress {
						t.Fatalf("progress %d after %d notifications", m.Params.Progress, progress-1)
					}
					last = ev.at
				case string(m.ID) == "2" && m.Result != nil:
					if progress != steps {
						t.Fatalf("the result came after %d of %d progress notifications", progress, steps)
					}
					t.Logf("the stream delivered %d progress notifications, the last %s after the request (read_body %s), then the result %s after it",
						progress, last.Sub(start).Round(10*time.Millisecond), readBodyBound, ev.at.Sub(start).Round(10*time.Millisecond))
					return
				}
			}
			t.Fatalf("the stream ended after %d of %d progress notifications, without the result", progress, steps)
		})

		t.Run("a GET stream outlives the bounds over "+site.name, func(t *testing.T) {
			t.Parallel()
			s := openMCPSession(t, site.client, site.url, token, site.proto)
			stream := s.get(t)
			// The server logs to the session's GET stream at once, then
			// every 5 seconds.
			toggle := s.post(t, `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"toggle-simulated-logging","arguments":{}}}`)
			_, _ = io.Copy(io.Discard, toggle.Body)
			toggle.Body.Close()
			// Two messages are 5 seconds apart, past every bound.
			var at []string
			for ev := range sseEvents(t, stream.Body) {
				if strings.Contains(ev.data, `"notifications/message"`) {
					at = append(at, ev.at.Sub(stream.opened).Round(10*time.Millisecond).String())
				}
				if len(at) == 2 {
					t.Logf("the GET stream delivered log messages %s after it opened (read_header %s, read_body %s, idle %s)",
						strings.Join(at, " and "), readHeaderBound, readBodyBound, idleBound)
					return
				}
			}
			t.Fatalf("the GET stream ended after %d log messages", len(at))
		})
	}
}

// dialLoopback connects to addr on loopback, and closes the connection at
// cleanup.
func dialLoopback(t *testing.T, addr string) (net.Conn, time.Time) {
	t.Helper()
	start := time.Now()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn, start
}

func write(t *testing.T, conn net.Conn, s string) {
	t.Helper()
	if _, err := io.WriteString(conn, s); err != nil {
		t.Fatal(err)
	}
}

// trickle writes s to conn a byte every 100ms, as a slowloris client does,
// until the server closes the connection or the test ends.
func trickle(t *testing.T, conn net.Conn, s string) {
	done := make(chan struct{})
	stopped := make(chan struct{})
	t.Cleanup(func() { close(done); <-stopped })
	go func() {
		defer close(stopped)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for i := 0; i < len(s); i++ {
			select {
			case <-done:
				return
			case <-tick.C:
			}
			if _, err := conn.Write([]byte{s[i]}); err != nil {
				return
			}
		}
	}()
}

// waitClosed reads from conn until the server closes it (EOF or a reset),
// and returns when that was and what the server wrote before. The test
// fails if the connection is still open after closeSafety.
func waitClosed(t *testing.T, conn net.Conn) (time.Time, []byte) {
	t.Helper()
	if err := conn.SetReadDeadline(time.Now().Add(closeSafety)); err != nil {
		t.Fatal(err)
	}
	var got bytes.Buffer
	buf := make([]byte, 4096)
	for {
		n, err := conn.Read(buf)
		got.Write(buf[:n])
		if err == nil {
			continue
		}
		if ne, ok := errors.AsType[net.Error](err); ok && ne.Timeout() {
			t.Fatalf("the connection is still open after %s (the server wrote %q)", closeSafety, got.Bytes())
		}
		return time.Now(), got.Bytes()
	}
}

// readerConn reads through the buffered reader that already holds what
// the server wrote.
type readerConn struct {
	net.Conn
	r *bufio.Reader
}

func (c readerConn) Read(p []byte) (int, error) { return c.r.Read(p) }

func firstLine(b []byte) string {
	line, _, _ := bytes.Cut(b, []byte("\r\n"))
	return string(line)
}

// sseEvent is one event of a stream, with the time it arrived.
type sseEvent struct {
	data string
	at   time.Time
}

// sseEvents reads the events of an event stream until it ends, and closes
// it. A read error ends the sequence; the caller tells from what it got
// whether the stream ended too early.
func sseEvents(t *testing.T, body io.ReadCloser) func(func(sseEvent) bool) {
	return func(yield func(sseEvent) bool) {
		defer body.Close()
		br := bufio.NewReader(body)
		var data []string
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				if !errors.Is(err, io.EOF) {
					t.Logf("the stream ended with %v", err)
				}
				return
			}
			line = strings.TrimRight(line, "\r\n")
			if v, ok := strings.CutPrefix(line, "data:"); ok {
				data = append(data, strings.TrimPrefix(v, " "))
				continue
			}
			if line == "" && len(data) > 0 {
				if !yield(sseEvent{data: strings.Join(data, "\n"), at: time.Now()}) {
					return
				}
				data = nil
			}
		}
	}
}

// mcpSession is an initialized MCP session spoken in raw HTTP, so that a
// test sees each stream as the one response it is.
type mcpSession struct {
	client *http.Client
	url    string
	token  string
	id     string
	proto  int
}

// openMCPSession initializes a session at url, and deletes it at cleanup.
func openMCPSession(t *testing.T, client *http.Client, url, token string, proto int) *mcpSession {
	t.Helper()
	s := &mcpSession{client: client, url: url, token: token, proto: proto}
	resp := s.post(t, initializeBody)
	s.id = resp.Header.Get("Mcp-Session-Id")
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || s.id == "" {
		t.Fatalf("initialize: %d, session %q", resp.StatusCode, s.id)
	}
	t.Cleanup(func() {
		req, _ := http.NewRequest(http.MethodDelete, url, nil)
		s.headers(req)
		if resp, err := client.Do(req); err == nil {
			resp.Body.Close()
		}
	})
	resp = s.post(t, `{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("notifications/initialized: %d", resp.StatusCode)
	}
	return s
}

func (s *mcpSession) headers(req *http.Request) {
	req.Header.Set("Authorization", "Bearer "+s.token)
	req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
	if s.id != "" {
		req.Header.Set("Mcp-Session-Id", s.id)
	}
}

// post sends body and returns the response, whose body the caller reads.
// Requests are bounded by closeSafety.
func (s *mcpSession) post(t *testing.T, body string) *http.Response {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), closeSafety)
	t.Cleanup(cancel)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	s.headers(req)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	resp, err := s.client.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", s.url, err)
	}
	if resp.ProtoMajor != s.proto {
		t.Fatalf("answered over %s, want HTTP/%d", resp.Proto, s.proto)
	}
	return resp
}

// openStream is a GET stream and when it opened.
type openStream struct {
	*http.Response
	opened time.Time
}

// get opens the session's GET stream.
func (s *mcpSession) get(t *testing.T) openStream {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), closeSafety)
	t.Cleanup(cancel)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.url, nil)
	if err != nil {
		t.Fatal(err)
	}
	s.headers(req)
	req.Header.Set("Accept", "text/event-stream")
	resp, err := s.client.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", s.url, err)
	}
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") || resp.ProtoMajor != s.proto {
		t.Fatalf("GET stream: %d %q over %s", resp.StatusCode, resp.Header.Get("Content-Type"), resp.Proto)
	}
	return openStream{resp, time.Now()}
}

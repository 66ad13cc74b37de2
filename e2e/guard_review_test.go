package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestGuardRefusesUpgrade: a request that asks to switch protocols never
// reaches the guarded server. Once the server answered 101, reverse_proxy
// would join the client's connection to the server's, and every byte after
// it (HTTP/2 over h2c, WebSocket frames, anything) would pass without the
// edge reading, authorizing or filtering it.
func TestGuardRefusesUpgrade(t *testing.T) {
	reached := make(chan string, 4)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") == "" {
			http.Error(w, "no upgrade", http.StatusBadRequest)
			return
		}
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		fmt.Fprintf(brw, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: %s\r\n\r\n", r.Header.Get("Upgrade"))
		brw.Flush()
		line, _ := brw.ReadString('\n')
		reached <- line
		io.WriteString(conn, "tunnel: "+line)
	}))
	t.Cleanup(up.Close)
	port := freePort(t)
	c := startCaddy(t, fmt.Sprintf(`{
	admin %s
}

http://:%d {
	bind 127.0.0.1
	zidane_mcp {
		guard
		scope simple tools nothing_at_all
	}
	reverse_proxy %s
}
`, AdminPlaceholder, port, strings.TrimPrefix(up.URL, "http://")))
	token := createToken(t, c, "upgrader", "--scope", "simple")
	for _, proto := range []string{"websocket", "h2c"} {
		t.Run(proto, func(t *testing.T) {
			conn, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), 5*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			conn.SetDeadline(time.Now().Add(20 * time.Second))
			fmt.Fprintf(conn, "GET /mcp HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nAuthorization: Bearer %s\r\nAccept: text/event-stream\r\nConnection: Upgrade\r\nUpgrade: %s\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n", port, token, proto)
			br := bufio.NewReader(conn)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode == http.StatusSwitchingProtocols {
				// Show what passes now: a tools/call nobody authorized.
				io.WriteString(conn, `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"unauthorized"}}`+"\n")
				echo, _ := br.ReadString('\n')
				t.Fatalf("the guard let a %s upgrade through (101): the client's bytes reach the server unread; the server got %q", proto, strings.TrimSpace(echo))
			}
			if resp.StatusCode != http.StatusBadRequest {
				t.Errorf("an upgrade request got %d; want 400", resp.StatusCode)
			}
		})
	}
}

// TestGuardJSONAnswersReachRealClients: a guarded server that answers in
// JSON (go-sdk's JSONResponse mode), whose status the listing filter now
// sends with the filtered body and its length, serves the TypeScript SDK
// and go-sdk clients: they list tools and call one, through the built
// binary.
func TestGuardJSONAnswersReachRealClients(t *testing.T) {
	s := mcp.NewServer(&mcp.Implementation{Name: "json", Version: "1"}, nil)
	type args struct {
		Text string `json:"text"`
	}
	mcp.AddTool(s, &mcp.Tool{Name: "echo", Description: "echoes"}, func(_ context.Context, _ *mcp.CallToolRequest, a args) (*mcp.CallToolResult, any, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: a.Text}}}, nil, nil
	})
	up := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, &mcp.StreamableHTTPOptions{JSONResponse: true}))
	t.Cleanup(up.Close)
	port := freePort(t)
	c := startCaddy(t, fmt.Sprintf(`{
	admin %s
}

http://:%d {
	bind 127.0.0.1
	zidane_mcp {
		guard
	}
	reverse_proxy %s
}
`, AdminPlaceholder, port, strings.TrimPrefix(up.URL, "http://")))
	token := createToken(t, c, "json", "--scope", "mcp")
	url := fmt.Sprintf("http://127.0.0.1:%d/mcp", port)

	out, err := tsClient(t, url, token, "list-tools")
	if err != nil || !strings.Contains(out, `"echo"`) {
		t.Fatalf("TypeScript SDK list-tools: %v %q", err, out)
	}
	out, err = tsClient(t, url, token, "call", "echo", `{"text":"through the guard"}`)
	if err != nil || !strings.Contains(out, "through the guard") {
		t.Fatalf("TypeScript SDK call: %v %q", err, out)
	}
	cs, err := connectGo(t, url, bearerClient(token, nil))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"text": "go-sdk"}})
	if err != nil || res.IsError || res.Content[0].(*mcp.TextContent).Text != "go-sdk" {
		t.Fatalf("go-sdk call: %v %+v", err, res)
	}
}

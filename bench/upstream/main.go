// Command upstream is the benchmark's upstream MCP server: a go-sdk
// streamable HTTP server with an `echo` tool and a `payload` tool that
// returns 4 KiB of text. It listens on loopback only. With -stateless it
// serves go-sdk's stateless mode, which speaks MCP 2026-07-28 beside
// 2025-11-25; without, it is stateful and speaks 2025-11-25.
package main

import (
	"context"
	"flag"
	"log"
	"net"
	"net/http"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

type echoArgs struct {
	Message string `json:"message"`
}

func main() {
	addr := flag.String("addr", "127.0.0.1:0", "loopback address to listen on")
	stateless := flag.Bool("stateless", false, "serve statelessly: MCP 2026-07-28 and 2025-11-25, no session")
	flag.Parse()
	host, _, err := net.SplitHostPort(*addr)
	if err != nil || (host != "127.0.0.1" && host != "::1" && host != "localhost") {
		log.Fatalf("upstream: -addr %q: listen on a loopback address", *addr)
	}

	payload := strings.Repeat("0123456789abcdef", 256) // 4 KiB
	server := mcp.NewServer(&mcp.Implementation{Name: "bench-upstream", Version: "1"}, nil)
	mcp.AddTool(server, &mcp.Tool{Name: "echo", Description: "Returns its message."},
		func(_ context.Context, _ *mcp.CallToolRequest, in echoArgs) (*mcp.CallToolResult, any, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: in.Message}}}, nil, nil
		})
	mcp.AddTool(server, &mcp.Tool{Name: "payload", Description: "Returns 4 KiB of text."},
		func(context.Context, *mcp.CallToolRequest, any) (*mcp.CallToolResult, any, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: payload}}}, nil, nil
		})
	handler := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server }, &mcp.StreamableHTTPOptions{JSONResponse: true, Stateless: *stateless})

	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Fatal(err)
	}
	// The harness reads the address from the first line.
	log.SetFlags(0)
	log.Printf("listening on %s", ln.Addr())
	log.Fatal(http.Serve(ln, handler))
}

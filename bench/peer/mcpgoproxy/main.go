// Command mcpgoproxy is the benchmark's stand-in for TBXark/mcp-proxy, a
// Go MCP aggregator, which the module proxy here does not serve. It is
// built the way TBXark/mcp-proxy is, on the library it uses
// (github.com/mark3labs/mcp-go): one mcp-go client per upstream,
// initialized once and shared by every downstream session; each upstream
// tool re-registered on an mcp-go MCPServer whose handler calls the
// client's CallTool; the server offered through mcp-go's streamable HTTP
// server in stateless mode; a bearer-token check in front.
//
// Where it differs, so that it runs in the same rounds as the aggregated
// route over the same two upstreams: it offers every upstream's tools on
// one endpoint (/mcp), each prefixed mcp_<name>_ as the aggregated route
// names them (TBXark/mcp-proxy serves each upstream under a path of its
// own, with the tools' own names), and it lists tools only (no prompts or
// resources, which the benchmark does not use). It is not TBXark/mcp-proxy
// and its figures are not that project's.
//
//	mcpgoproxy -addr 127.0.0.1:0 -token T -upstream bench=http://127.0.0.1:1234/mcp -upstream bench2=...
//
// It listens on loopback only and prints "listening on ADDR" first.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"
)

type upstreams []string

func (u *upstreams) String() string     { return strings.Join(*u, ",") }
func (u *upstreams) Set(s string) error { *u = append(*u, s); return nil }

func main() {
	addr := flag.String("addr", "127.0.0.1:0", "loopback address to listen on")
	token := flag.String("token", "", "the bearer token clients must present (required)")
	var ups upstreams
	flag.Var(&ups, "upstream", "name=URL of a streamable-HTTP upstream MCP server (repeatable)")
	flag.Parse()
	log.SetFlags(0)
	host, _, err := net.SplitHostPort(*addr)
	if err != nil || (host != "127.0.0.1" && host != "::1" && host != "localhost") {
		log.Fatalf("mcpgoproxy: -addr %q: listen on a loopback address", *addr)
	}
	if *token == "" || len(ups) == 0 {
		log.Fatal("mcpgoproxy: give -token and at least one -upstream name=URL")
	}

	ctx := context.Background()
	srv := server.NewMCPServer("mcpgoproxy", "1", server.WithToolCapabilities(true), server.WithRecovery())
	var clients []*client.Client
	for _, u := range ups {
		name, url, ok := strings.Cut(u, "=")
		if !ok || name == "" || url == "" {
			log.Fatalf("mcpgoproxy: -upstream %q: write name=URL", u)
		}
		c, err := connect(ctx, url)
		if err != nil {
			log.Fatalf("mcpgoproxy: upstream %s: %v", name, err)
		}
		clients = append(clients, c)
		if err := addTools(ctx, srv, c, "mcp_"+name+"_"); err != nil {
			log.Fatalf("mcpgoproxy: upstream %s: %v", name, err)
		}
	}
	defer func() {
		for _, c := range clients {
			c.Close()
		}
	}()

	mux := http.NewServeMux()
	mux.Handle("/mcp", auth(*token, server.NewStreamableHTTPServer(srv, server.WithStateLess(true))))
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Fprintf(os.Stderr, "listening on %s\n", ln.Addr())
	log.Fatal((&http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}).Serve(ln))
}

// connect starts and initializes one mcp-go streamable-HTTP client, as
// TBXark/mcp-proxy does for a streamable-http upstream. The protocol is
// pinned to 2025-11-25, the newest that a stateful go-sdk upstream serves.
func connect(ctx context.Context, url string) (*client.Client, error) {
	c, err := client.NewStreamableHttpClient(url)
	if err != nil {
		return nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := c.Start(cctx); err != nil {
		return nil, err
	}
	req := mcp.InitializeRequest{}
	req.Params.ProtocolVersion = mcp.ProtocolVersion20251125
	req.Params.ClientInfo = mcp.Implementation{Name: "mcpgoproxy", Version: "1"}
	if _, err := c.Initialize(cctx, req); err != nil {
		return nil, fmt.Errorf("initialize: %w", err)
	}
	return c, nil
}

// addTools re-registers the upstream's tools under prefix, each calling the
// upstream's client with its own name.
func addTools(ctx context.Context, srv *server.MCPServer, c *client.Client, prefix string) error {
	req := mcp.ListToolsRequest{}
	for range 100 { // pages, bounded
		res, err := c.ListTools(ctx, req)
		if err != nil {
			return fmt.Errorf("listing tools: %w", err)
		}
		for _, tool := range res.Tools {
			orig := tool.Name
			tool.Name = prefix + orig
			srv.AddTool(tool, func(ctx context.Context, r mcp.CallToolRequest) (*mcp.CallToolResult, error) {
				r.Params.Name = orig
				return c.CallTool(ctx, r)
			})
		}
		if res.NextCursor == "" {
			return nil
		}
		req.Params.Cursor = res.NextCursor
	}
	return fmt.Errorf("listing tools: more than 100 pages")
}

// auth is TBXark/mcp-proxy's token check: a Bearer token from the
// configured set, else 401.
func auth(token string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got := strings.TrimSpace(strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer "))
		if got == "" || got != token {
			http.Error(w, "Unauthorized", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
}

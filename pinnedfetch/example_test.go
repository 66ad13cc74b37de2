package pinnedfetch_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"

	"github.com/Tahul/caddy-zidane-mcp/pinnedfetch"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// An agent reaches a remote MCP server through a pinned client: the API key
// is added by a credential layer that only ever sees requests to the
// configured origin, and the go-sdk transport uses the client as is.
func Example_mcpClient() {
	// The remote MCP server; it wants an API key. (A local test server on
	// loopback, so plain http is allowed and the address guard is off.)
	server := mcp.NewServer(&mcp.Implementation{Name: "remote", Version: "v1.0.0"}, nil)
	type echoIn struct {
		Text string `json:"text"`
	}
	mcp.AddTool(server, &mcp.Tool{Name: "echo", Description: "Echo the text back."},
		func(_ context.Context, _ *mcp.CallToolRequest, in echoIn) (*mcp.CallToolResult, any, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: in.Text}}}, nil, nil
		})
	mcpHandler := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server }, nil)
	remote := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Api-Key") != "k-123" {
			http.Error(w, "missing API key", http.StatusUnauthorized)
			return
		}
		mcpHandler.ServeHTTP(w, r)
	}))
	defer remote.Close()

	// The agent side.
	endpoint := remote.URL + "/mcp"
	client, err := pinnedfetch.New(endpoint, []string{"X-Api-Key"},
		pinnedfetch.WithCredentials(func(next http.RoundTripper) http.RoundTripper {
			return apiKey{key: "k-123", next: next}
		}))
	if err != nil {
		log.Fatal(err)
	}
	defer client.CloseIdleConnections()

	ctx := context.Background()
	transport := &mcp.StreamableClientTransport{Endpoint: endpoint, HTTPClient: client}
	session, err := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "v1.0.0"}, nil).Connect(ctx, transport, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer session.Close()

	tools, err := session.ListTools(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	for _, t := range tools.Tools {
		fmt.Println("tool:", t.Name)
	}
	res, err := session.CallTool(ctx, &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"text": "hello"}})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("echo:", res.Content[0].(*mcp.TextContent).Text)
	// Output:
	// tool: echo
	// echo: hello
}

// apiKey is a credential layer: it adds the key and calls the transport
// beneath. The pinned client never routes an off-origin hop through it.
type apiKey struct {
	key  string
	next http.RoundTripper
}

func (a apiKey) RoundTrip(req *http.Request) (*http.Response, error) {
	r := req.Clone(req.Context())
	r.Header.Set("X-Api-Key", a.key)
	return a.next.RoundTrip(r)
}

// A redirect off the pinned origin is followed without the credentials, and
// every decision is reported for audit, with header names but no values.
func ExampleNew() {
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Printf("other origin got Authorization=%q X-Request-Id=%q\n", r.Header.Get("Authorization"), r.Header.Get("X-Request-Id"))
	}))
	defer other.Close()
	pinned := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Printf("pinned origin got Authorization=%q\n", r.Header.Get("Authorization"))
		http.Redirect(w, r, other.URL+"/moved", http.StatusFound)
	}))
	defer pinned.Close()

	client, err := pinnedfetch.New(pinned.URL, nil, pinnedfetch.WithDecisions(func(d pinnedfetch.Decision) {
		fmt.Printf("decision: hop %d %s credentials=%v stripped=%v\n", d.Hop, d.Action, d.Credentials, d.StrippedHeaders)
	}))
	if err != nil {
		log.Fatal(err)
	}
	req, _ := http.NewRequest(http.MethodGet, pinned.URL+"/start", nil)
	req.Header.Set("Authorization", "Bearer upstream-secret")
	req.Header.Set("X-Request-Id", "r-1")
	resp, err := client.Do(req)
	if err != nil {
		log.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	fmt.Println("status:", resp.StatusCode)
	// Output:
	// decision: hop 0 send credentials=true stripped=[]
	// pinned origin got Authorization="Bearer upstream-secret"
	// decision: hop 1 follow credentials=false stripped=[Authorization]
	// other origin got Authorization="" X-Request-Id="r-1"
	// status: 200
}

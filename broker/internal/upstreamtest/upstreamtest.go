// Package upstreamtest holds what the tests of the upstream side and of both
// routes share: the test binary as a stdio MCP server, an echo server, a
// log handler that keeps its records, and small readers of results. It is
// imported by tests only.
package upstreamtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// StdioEnv, set to "1" in a test binary's environment, makes [Main] run the
// binary as a stdio MCP server instead of its tests.
const StdioEnv = "BROKER_STDIO_SERVER"

// LongStderrLine is the length of the long line the stdio server writes to
// its stderr, past what the gateway relays of one line.
const LongStderrLine = 10000

// Main is a test binary's TestMain: it lets the binary act as a stdio MCP
// server for the stdio tests, which run it again with [StdioEnv] set.
func Main(m *testing.M) {
	if os.Getenv(StdioEnv) == "1" {
		runStdioServer()
		return
	}
	os.Exit(m.Run())
}

func runStdioServer() {
	fmt.Fprintln(os.Stderr, "hello from stderr")
	fmt.Fprintf(os.Stderr, "pid %d\n", os.Getpid()) // the aggregate tests check that the process ends
	fmt.Fprintln(os.Stderr, strings.Repeat("x", LongStderrLine))
	s := NewEchoServer("stdio")
	mcp.AddTool(s, &mcp.Tool{Name: "exit", Description: "ends the process"},
		func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, any, error) {
			fmt.Fprintln(os.Stderr, "exiting on request")
			os.Exit(3)
			return nil, nil, nil
		})
	if err := s.Run(context.Background(), &mcp.StdioTransport{}); err != nil {
		fmt.Fprintln(os.Stderr, "server ended:", err)
	}
	os.Exit(0)
}

// EchoIn is the input of the echo tool.
type EchoIn struct {
	Text string `json:"text"`
}

// NewEchoServer is an MCP server with one tool, echo, that answers
// "name: text".
func NewEchoServer(name string) *mcp.Server {
	s := mcp.NewServer(&mcp.Implementation{Name: name, Version: "1"}, nil)
	mcp.AddTool(s, &mcp.Tool{Name: "echo", Description: "echoes text"},
		func(_ context.Context, _ *mcp.CallToolRequest, in EchoIn) (*mcp.CallToolResult, any, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: name + ": " + in.Text}}}, nil, nil
		})
	return s
}

// LogCapture is a slog handler that keeps its records, each as a map of
// its attributes, its message ("msg") and its level ("level").
type LogCapture struct {
	mu      sync.Mutex
	records []map[string]string
}

func (l *LogCapture) Enabled(context.Context, slog.Level) bool { return true }
func (l *LogCapture) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *LogCapture) WithGroup(string) slog.Handler            { return l }
func (l *LogCapture) Handle(_ context.Context, r slog.Record) error {
	m := map[string]string{"msg": r.Message, "level": r.Level.String()}
	r.Attrs(func(a slog.Attr) bool {
		m[a.Key] = a.Value.String()
		return true
	})
	l.mu.Lock()
	l.records = append(l.records, m)
	l.mu.Unlock()
	return nil
}

// Find returns the first record that match accepts, or nil.
func (l *LogCapture) Find(match func(map[string]string) bool) map[string]string {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, r := range l.records {
		if match(r) {
			return r
		}
	}
	return nil
}

// Records returns the records kept so far, in order.
func (l *LogCapture) Records() []map[string]string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]map[string]string(nil), l.records...)
}

// Ctx is a context that ends with the test, or after 20 seconds.
func Ctx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// ResultText is the text of a tool result's text blocks, joined.
func ResultText(r *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range r.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

// PNGBytes is a small PNG image.
func PNGBytes(t testing.TB) []byte {
	var buf bytes.Buffer
	img := image.NewRGBA(image.Rect(0, 0, 2, 2))
	img.Set(0, 0, color.RGBA{R: 255, A: 255})
	if err := png.Encode(&buf, img); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// PIDFiles lists the pid files in dir.
func PIDFiles(t *testing.T, dir string) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, "*.pid"))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// Alive reports whether the process pid exists.
func Alive(pid int) bool {
	return !errors.Is(syscall.Kill(pid, 0), syscall.ESRCH)
}

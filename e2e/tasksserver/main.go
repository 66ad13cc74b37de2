// Command tasksserver is an MCP server that speaks the Tasks extension of
// MCP 2026-07-28 (io.modelcontextprotocol/tasks, SEP-2663), built on
// go-sdk, which has no Tasks of its own. It is the upstream the end-to-end
// tests put behind every route of the gateway to show that task handles
// pass, and are bound, as the extension requires; it also serves the
// fixtures the conformance suite's tasks-* scenarios call.
//
// What it adds to go-sdk's stateless streamable HTTP handler:
//
//   - the extension in server/discover's capabilities.extensions;
//   - tools/call answered with a CreateTaskResult (resultType "task", the
//     task flat on the result) for a task-supporting tool when the request
//     declares the extension in its _meta client capabilities (or the
//     session did at initialize), a synchronous CallToolResult otherwise,
//     and -32021 with data.requiredCapabilities for a tool that needs a
//     task;
//   - tasks/get (the DetailedTask, result or error inlined), tasks/update
//     (inputResponses for the task's outstanding inputRequests, partial
//     answers kept) and tasks/cancel (an empty acknowledgement), as custom
//     methods, refused with -32021 to a request that does not declare the
//     extension and with -32602 for a task id the server does not hold;
//     tasks/result and tasks/list, which SEP-2663 removed, are unknown
//     methods (-32601, HTTP 404);
//   - the routing header: tasks/get, tasks/update and tasks/cancel must
//     carry Mcp-Name with params.taskId (HTTP 400, -32020 otherwise).
//
// Tasks are bounded: at most -max-tasks at once, each removed (and its work
// cancelled) when its ttlMs has passed; the task id is 128 random bits.
//
// Usage: tasksserver -http 127.0.0.1:PORT [-max-tasks N] [-ttl D]
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/Tahul/caddy-zidane-mcp/message"
)

// extensionID names the Tasks extension in capabilities.
const extensionID = "io.modelcontextprotocol/tasks"

// maxBody bounds a request body the routing-header check reads.
const maxBody = 1 << 20

func main() {
	addr := flag.String("http", "", "listen address, such as 127.0.0.1:8080 (required)")
	maxTasks := flag.Int("max-tasks", 1000, "the most tasks held at once; a tools/call that would create another is refused")
	ttl := flag.Duration("ttl", 5*time.Minute, "how long a task is kept after it was created (its ttlMs)")
	flag.Parse()
	if *addr == "" {
		log.Fatal("tasksserver: give -http 127.0.0.1:PORT")
	}
	if *maxTasks < 1 || *ttl < time.Second {
		log.Fatal("tasksserver: -max-tasks must be at least 1 and -ttl at least 1s")
	}
	store := newStore(*maxTasks, *ttl)
	server, err := newServer(store)
	if err != nil {
		log.Fatalf("tasksserver: %v", err)
	}
	handler := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server },
		&mcp.StreamableHTTPOptions{Stateless: true, MaxRequestBodyBytes: maxBody})
	log.Printf("tasksserver listening at %s", *addr)
	srv := &http.Server{Addr: *addr, Handler: routingHeader(handler), ReadHeaderTimeout: 10 * time.Second}
	log.Fatal(srv.ListenAndServe())
}

// routingHeader refuses a tasks/get, tasks/update or tasks/cancel whose
// Mcp-Name header is missing or is not its params.taskId (SEP-2663's
// routing header, validated as SEP-2243 has servers validate the standard
// headers). go-sdk checks Mcp-Name only for the methods it knows names of.
func routingHeader(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.Header.Get("Mcp-Protocol-Version") < "2026-07-28" {
			next.ServeHTTP(w, r)
			return
		}
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
		if err != nil {
			http.Error(w, "request body too large or unreadable", http.StatusRequestEntityTooLarge)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		var req struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
			Params struct {
				TaskID *string `json:"taskId"`
			} `json:"params"`
		}
		// A body that is not one object is go-sdk's to refuse.
		if json.Unmarshal(body, &req) != nil || !taskMethod(req.Method) || req.Params.TaskID == nil {
			next.ServeHTTP(w, r)
			return
		}
		names := r.Header.Values("Mcp-Name")
		var msg string
		switch {
		case len(names) == 0:
			msg = fmt.Sprintf("missing required Mcp-Name header for method %q: send Mcp-Name with params.taskId", req.Method)
		case len(names) > 1 || strings.TrimSpace(names[0]) != *req.Params.TaskID:
			msg = "header mismatch: the Mcp-Name header does not match params.taskId"
		default:
			next.ServeHTTP(w, r)
			return
		}
		id := req.ID
		if len(id) == 0 {
			id = json.RawMessage("null")
		}
		out, _ := json.Marshal(struct {
			JSONRPC string          `json:"jsonrpc"`
			ID      json.RawMessage `json:"id"`
			Error   rpcError        `json:"error"`
		}{"2.0", id, rpcError{Code: message.CodeHeaderMismatch, Message: msg}})
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		_, _ = w.Write(out)
	})
}

// taskMethod reports whether method is one of the extension's methods,
// which name a task.
func taskMethod(method string) bool {
	switch method {
	case "tasks/get", "tasks/update", "tasks/cancel":
		return true
	}
	return false
}

type rpcError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
	Data    any    `json:"data,omitempty"`
}

// errNotFound is a task id the server does not hold.
var errNotFound = errors.New("task not found")

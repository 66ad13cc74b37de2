package passthrough

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"

	"github.com/Tahul/caddy-zidane-mcp/broker/upstream"

	"github.com/Tahul/caddy-zidane-mcp/internal/sse"
	"github.com/Tahul/caddy-zidane-mcp/message"
)

// copyRequestHeaders copies the allow-listed headers of in to out, leaving
// out any that the client's Connection header names as hop-by-hop.
func copyRequestHeaders(out, in http.Header) {
	conn := in["Connection"]
	for name, values := range in {
		if !upstream.ForwardRequestHeader(name) || namedIn(conn, name) {
			continue
		}
		out[name] = values
	}
}

// namedIn reports whether a Connection header lists name.
func namedIn(connection []string, name string) bool {
	for _, v := range connection {
		for tok := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(strings.TrimSpace(tok), name) {
				return true
			}
		}
	}
	return false
}

// relayedResponseHeaders is the allow-list of upstream response headers a
// client gets, besides Mcp-Session-Id (translated). Set-Cookie,
// WWW-Authenticate and every other header stay behind: the upstream's
// cookies and auth metadata describe the gateway's relationship with it,
// not the client's, and a client must never be steered to the upstream's
// authorization server.
var relayedResponseHeaders = []string{
	"Content-Type",
	"Content-Encoding", // only when the Go transport did not decode it itself
	"Cache-Control",
	"Retry-After", // 429 and 503
	"Allow",       // 405
}

func copyResponseHeaders(out, in http.Header) {
	for _, name := range relayedResponseHeaders {
		if v, ok := in[name]; ok {
			out[name] = v
		}
	}
}

// writeToolError answers the tools/call of id with a tool result that
// reports msg as an error.
func writeToolError(w http.ResponseWriter, id json.RawMessage, msg string) {
	body, err := toolErrorAnswer(id, msg)
	if err != nil {
		upstream.WriteRPCError(w, http.StatusServiceUnavailable, nil, message.CodeUpstream, msg)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	w.Write(body)
}

// toolErrorAnswer is the JSON-RPC answer to the tools/call of id: a tool
// result that reports message as an error.
func toolErrorAnswer(id json.RawMessage, message string) ([]byte, error) {
	return json.Marshal(map[string]any{
		"jsonrpc": "2.0",
		"id":      id,
		"result": map[string]any{
			"content": []map[string]string{{"type": "text", "text": message}},
			"isError": true,
		},
	})
}

var errBodyTooLarge = errors.New("request body too large")

// readBody reads the whole request body, up to max bytes. Reading it before
// forwarding is deliberate: Go's HTTP/1 server closes the request body once
// the response starts, so a body streamed upstream while an SSE answer
// streams back could be cut mid-way. Having it in memory also lets a
// 307/308 redirect replay it.
func readBody(r *http.Request, max int64) ([]byte, error) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, nil
	}
	if r.ContentLength > max {
		return nil, errBodyTooLarge
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(body)) > max {
		return nil, errBodyTooLarge
	}
	return body, nil
}

// copyBuffers holds the buffers answers are relayed through. 16 KiB: a Read
// returns as soon as some bytes arrived, so the size bounds memory per
// stream, not latency.
var copyBuffers = sync.Pool{New: func() any { b := make([]byte, 16<<10); return &b }}

// relayEvents copies an upstream event stream to the client one whole event
// at a time, flushing after each: an event is held until its blank line,
// so that an answer cut short (by max_response) leaves no half event on
// the client's stream, only the events before it. The body bounds what is
// held. It returns as relay does.
func relayEvents(w http.ResponseWriter, body io.Reader, flush func() error) (readErr error, clientGone bool) {
	if flush() != nil {
		return nil, true
	}
	bp := copyBuffers.Get().(*[]byte)
	defer copyBuffers.Put(bp)
	buf := *bp
	var (
		split   sse.Splitter
		pending []byte // the current event, not yet whole
	)
	for {
		n, err := body.Read(buf)
		chunk := buf[:n]
		for len(chunk) > 0 {
			end := split.End(chunk)
			if end < 0 {
				pending = append(pending, chunk...)
				break
			}
			out := chunk[:end]
			if len(pending) > 0 {
				pending = append(pending, out...)
				out = pending
			}
			if _, werr := w.Write(out); werr != nil {
				return nil, true
			}
			if flush() != nil {
				return nil, true
			}
			pending, chunk = pending[:0], chunk[end:]
			if cap(pending) > 64<<10 {
				pending = nil // a large event's buffer is not kept for the stream's life
			}
		}
		if err == io.EOF {
			if len(pending) > 0 {
				// A last event without its blank line: clients drop it
				// too, but pass it on as the upstream sent it.
				if _, werr := w.Write(pending); werr != nil {
					return nil, true
				}
			}
			return nil, false
		}
		if err != nil {
			return err, false
		}
	}
}

// sseMessage is one event-stream event that carries the JSON-RPC message
// data.
func sseMessage(data []byte) []byte {
	return sse.AppendMessage(make([]byte, 0, len(data)+24), data)
}

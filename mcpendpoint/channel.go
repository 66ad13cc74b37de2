package mcpendpoint

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strconv"

	"github.com/Tahul/caddy-zidane-mcp/internal/sse"
	"github.com/Tahul/caddy-zidane-mcp/sessions"
)

// Claude Code channels: a server that declares the experimental
// "claude/channel" capability may push notifications/claude/channel
// {content, meta}, which Claude Code shows the model as a <channel> event.
//
// go-sdk v1.8.0 sends only the methods it knows, so the endpoint sends a
// logging message under the reserved logger channelLogger, whose data is
// the channel params, and channelStream rewrites that SSE event on its way
// out of the GET stream. go-sdk writes each SSE event with one Write
// (writeEvent), so the rewrite sees whole events; if a later SDK split them,
// the event would pass unchanged and the client would see a plain logging
// message from the "claude/channel" logger, which is harmless.
const (
	channelCapability = "claude/channel"
	channelMethod     = "notifications/claude/channel"
	channelLogger     = "claude/channel"
)

// channelParams are the params of notifications/claude/channel.
type channelParams struct {
	Content string            `json:"content"`
	Meta    map[string]string `json:"meta,omitempty"`
}

// channelMeta are the event's attributes. Claude Code accepts only
// identifier-like keys (letters, digits, underscores) with string values.
func channelMeta(ev sessions.Event) map[string]string {
	m := map[string]string{
		"session_id": ev.SessionID,
		"status":     string(ev.Status),
		"seq":        strconv.FormatInt(ev.Seq, 10),
	}
	if ev.Kind != "" {
		m["kind"] = ev.Kind
	}
	if ev.RequestID != "" {
		m["request_id"] = ev.RequestID
	}
	return m
}

// channelStreams wraps the ResponseWriter of GET requests, the standalone
// SSE streams that pushes travel on, with channelStream.
func channelStreams(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			w = channelStream{w}
		}
		next.ServeHTTP(w, r)
	})
}

// channelStream rewrites channel-logger messages into channel notifications.
// go-sdk serializes writes to a stream, so it needs no lock of its own.
type channelStream struct {
	http.ResponseWriter
}

func (c channelStream) Write(p []byte) (int, error) {
	out, ok := rewriteChannelEvent(p)
	if !ok {
		return c.ResponseWriter.Write(p)
	}
	if _, err := c.ResponseWriter.Write(out); err != nil {
		return 0, err
	}
	return len(p), nil
}

// Unwrap lets http.ResponseController reach Flush on the real writer.
func (c channelStream) Unwrap() http.ResponseWriter { return c.ResponseWriter }

// channelLoggerJSON is in every event that carries a message from
// channelLogger, as go-sdk's encoder writes it (compact): events without it
// are passed on without being decoded.
var channelLoggerJSON = []byte(`"logger":"` + channelLogger + `"`)

// rewriteChannelEvent returns the SSE event p with its data replaced by a
// notifications/claude/channel message, if p is one whole SSE event carrying
// a notifications/message from channelLogger. It reads p as a client reads
// an event stream (see internal/sse).
func rewriteChannelEvent(p []byte) ([]byte, bool) {
	if !bytes.Contains(p, channelLoggerJSON) {
		return nil, false
	}
	var (
		dec    sse.Decoder
		events []sse.Event
	)
	dec.Write(p, func(ev sse.Event) { events = append(events, ev) })
	if len(events) != 1 || dec.Pending() != 0 {
		return nil, false
	}
	data, ok := events[0].Message()
	if !ok {
		return nil, false
	}
	var msg struct {
		ID     json.RawMessage `json:"id"`
		Method string          `json:"method"`
		Params struct {
			Logger string          `json:"logger"`
			Data   json.RawMessage `json:"data"`
		} `json:"params"`
	}
	if json.Unmarshal(data, &msg) != nil || msg.ID != nil ||
		msg.Method != "notifications/message" || msg.Params.Logger != channelLogger || msg.Params.Data == nil {
		return nil, false
	}
	out, err := json.Marshal(struct {
		JSONRPC string          `json:"jsonrpc"`
		Method  string          `json:"method"`
		Params  json.RawMessage `json:"params"`
	}{"2.0", channelMethod, msg.Params.Data})
	if err != nil {
		return nil, false
	}
	var ev []byte
	for line := range events[0].Lines() {
		if name, _, comment := sse.Field(line); !comment && string(name) == "data" {
			continue
		}
		ev = append(append(ev, line...), '\n')
	}
	return append(sse.AppendData(ev, out), '\n'), true
}

package caddymodule

import (
	"io"
	"mime"
	"net/http"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/Tahul/caddy-zidane-mcp/policy"
)

// toolsListWriter filters a tools/list answer down to the tools the caller
// may call, whether the upstream answers with JSON or an SSE stream.
type toolsListWriter struct {
	*caddyhttp.ResponseWriterWrapper
	ids     map[string]bool
	visible func(string) bool
	filter  *policy.ToolsListFilter
	wrote   bool
}

func (w *toolsListWriter) WriteHeader(status int) {
	if w.wrote {
		return
	}
	w.wrote = true
	if status == http.StatusOK {
		mt, _, _ := mime.ParseMediaType(w.Header().Get("Content-Type"))
		if mt == "application/json" || mt == "text/event-stream" {
			under := w.ResponseWriterWrapper.ResponseWriter
			rc := http.NewResponseController(under)
			w.filter = policy.NewToolsListFilter(under, mt == "text/event-stream", w.ids, w.visible, func() { rc.Flush() })
			// The filtered body has another length.
			w.Header().Del("Content-Length")
		}
	}
	w.ResponseWriterWrapper.WriteHeader(status)
}

func (w *toolsListWriter) Write(p []byte) (int, error) {
	if !w.wrote {
		w.WriteHeader(http.StatusOK)
	}
	if w.filter != nil {
		return w.filter.Write(p)
	}
	return w.ResponseWriterWrapper.Write(p)
}

// close writes out what the filter still holds.
func (w *toolsListWriter) close() error {
	if w.filter == nil {
		return nil
	}
	return w.filter.Close()
}

// ReadFrom keeps a copy through the filter: the wrapper's own ReadFrom would
// hand the body straight to the connection.
func (w *toolsListWriter) ReadFrom(r io.Reader) (int64, error) {
	return io.Copy(writerOnly{w}, r)
}

type writerOnly struct{ io.Writer }

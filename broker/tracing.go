package broker

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"sync/atomic"

	"github.com/Tahul/caddy-zidane-mcp/message"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// TracerName names the spans this module makes.
const TracerName = "github.com/Tahul/caddy-zidane-mcp"

// tracerProvider is the provider of the edge's recording spans (Caddy's
// one per process), remembered for the calls whose context lost the span:
// go-sdk runs a 2025-11-25 session's handlers on the session's context,
// not the request's, so the aggregated route finds the route span's trace
// context in the request's headers instead (TraceFromHeader).
var tracerProvider atomic.Pointer[providerBox]

// providerBox holds a provider of any type in tracerProvider.
type providerBox struct{ tp trace.TracerProvider }

// RememberTracerProvider records the provider of a recording span: the
// latest, since Caddy makes a new one after a config without tracing.
func RememberTracerProvider(tp trace.TracerProvider) {
	if tp != nil {
		tracerProvider.Store(&providerBox{tp})
	}
}

// TraceFromHeader returns ctx with the trace context of header as its
// remote parent when ctx carries no recording span and the edge set that
// header (it replaces a client's traceparent with its route span's when
// tracing is on, and only then is a provider remembered).
func TraceFromHeader(ctx context.Context, header http.Header) context.Context {
	if header == nil || trace.SpanFromContext(ctx).IsRecording() || tracerProvider.Load() == nil {
		return ctx
	}
	sc := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(), propagation.HeaderCarrier(header)))
	if !sc.IsValid() {
		return ctx
	}
	return trace.ContextWithRemoteSpanContext(ctx, sc)
}

// tracerFor is the tracer of the span ctx carries: its own provider's when
// it records, the remembered one's for a remote parent, or nil.
func tracerFor(ctx context.Context) trace.Tracer {
	span := trace.SpanFromContext(ctx)
	if span.IsRecording() {
		return span.TracerProvider().Tracer(TracerName)
	}
	if sc := span.SpanContext(); sc.IsValid() && sc.IsRemote() {
		if box := tracerProvider.Load(); box != nil {
			return box.tp.Tracer(TracerName)
		}
	}
	return nil
}

// traceTransport makes each request to an upstream a client span of the
// span its context carries (the edge's route span), when that one records
// (Caddy's tracing directive is on), and carries the span's W3C trace
// context to the upstream: in the traceparent and tracestate headers, and,
// for MCP 2026-07-28 requests, in params._meta (SEP-414). Baggage never
// goes to an upstream: a client's could carry anything it likes to a
// server that trusts its own tracing. Nothing of the request's body or
// credentials becomes an attribute.
type traceTransport struct {
	upstream string
	next     http.RoundTripper
}

func (t *traceTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	tracer := tracerFor(req.Context())
	if tracer == nil {
		if req.Header.Get("Baggage") == "" {
			return t.next.RoundTrip(req)
		}
		req = req.Clone(req.Context())
		req.Header.Del("Baggage")
		return t.next.RoundTrip(req)
	}
	method := req.Header.Get("Mcp-Method")
	attrs := []attribute.KeyValue{
		attribute.String("zidane.upstream", t.upstream),
		attribute.String("http.request.method", req.Method),
		attribute.String("server.address", req.URL.Host),
	}
	if method != "" {
		attrs = append(attrs, attribute.String("mcp.method.name", method))
	}
	ctx, span := tracer.Start(req.Context(), "mcp upstream "+t.upstream,
		trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attrs...))
	defer span.End()
	req = req.Clone(ctx)
	req.Header.Del("Baggage")
	req.Header.Del("Traceparent")
	req.Header.Del("Tracestate")
	propagation.TraceContext{}.Inject(ctx, propagation.HeaderCarrier(req.Header))
	if req.Method == http.MethodPost && req.Body != nil && req.Header.Get("Mcp-Protocol-Version") >= message.ModernVersion {
		if err := traceMeta(req); err != nil {
			span.SetStatus(codes.Error, "the request body could not be read")
			return nil, err
		}
	}
	resp, err := t.next.RoundTrip(req)
	if err != nil {
		span.SetStatus(codes.Error, "the upstream request failed")
		return nil, err
	}
	span.SetAttributes(attribute.Int("http.response.status_code", resp.StatusCode))
	if resp.StatusCode >= 500 {
		span.SetStatus(codes.Error, resp.Status)
	}
	return resp, nil
}

// CloseIdleConnections passes on to the transport beneath, which the
// sessions' connections are closed through.
func (t *traceTransport) CloseIdleConnections() {
	if ci, ok := t.next.(interface{ CloseIdleConnections() }); ok {
		ci.CloseIdleConnections()
	}
}

// traceMeta puts the request's traceparent and tracestate headers in its
// JSON-RPC message's params._meta, and takes any baggage out of it. A body
// that is not one message with params as an object (or none) goes as it
// is: only a request has a _meta to carry them.
func traceMeta(req *http.Request) error {
	body, err := io.ReadAll(req.Body)
	req.Body.Close()
	if err != nil {
		return err
	}
	out := body
	if rewritten, ok := withTraceMeta(body, req.Header.Get("Traceparent"), req.Header.Get("Tracestate")); ok {
		out = rewritten
	}
	req.Body = io.NopCloser(bytes.NewReader(out))
	req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(out)), nil }
	req.ContentLength = int64(len(out))
	return nil
}

// withTraceMeta returns body with params._meta's traceparent and
// tracestate set (tracestate removed when empty) and baggage removed. The
// body was read by package message, or written by go-sdk: its keys are
// unique, so decoding it to maps and writing it back changes no value a
// reader sees.
func withTraceMeta(body []byte, traceparent, tracestate string) ([]byte, bool) {
	var msg map[string]json.RawMessage
	if traceparent == "" || json.Unmarshal(body, &msg) != nil || msg["method"] == nil {
		return nil, false
	}
	params := map[string]json.RawMessage{}
	if raw, ok := msg["params"]; ok && string(raw) != "null" {
		if json.Unmarshal(raw, &params) != nil {
			return nil, false
		}
	}
	meta := map[string]json.RawMessage{}
	if raw, ok := params["_meta"]; ok && string(raw) != "null" {
		if json.Unmarshal(raw, &meta) != nil {
			return nil, false
		}
	}
	meta["traceparent"], _ = json.Marshal(traceparent)
	delete(meta, "tracestate")
	if tracestate != "" {
		meta["tracestate"], _ = json.Marshal(tracestate)
	}
	delete(meta, "baggage")
	var err error
	if params["_meta"], err = marshalPlain(meta); err != nil {
		return nil, false
	}
	if msg["params"], err = marshalPlain(params); err != nil {
		return nil, false
	}
	out, err := marshalPlain(msg)
	return out, err == nil
}

// marshalPlain is json.Marshal without HTML escaping, which would rewrite
// every <, > and & of the values kept.
func marshalPlain(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimRight(b.Bytes(), "\n"), nil
}

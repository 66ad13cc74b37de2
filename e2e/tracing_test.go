package e2e

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// otlpCollector is an OTLP/HTTP trace receiver on loopback, on the
// OpenTelemetry protocol's own types: what caddy's tracing exporter sends
// (http/protobuf) is decoded span by span.
type otlpCollector struct {
	url   string
	mu    sync.Mutex
	spans []*tracepb.Span
	raw   bytes.Buffer // every request body, to look for what must not be there
	got   chan struct{}
}

func startOTLPCollector(t *testing.T) *otlpCollector {
	t.Helper()
	c := &otlpCollector{got: make(chan struct{}, 1)}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/traces" || r.Method != http.MethodPost {
			http.NotFound(w, r)
			return
		}
		body, err := io.ReadAll(io.LimitReader(r.Body, 64<<20))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		var req collectortrace.ExportTraceServiceRequest
		if err := proto.Unmarshal(body, &req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		c.mu.Lock()
		c.raw.Write(body)
		for _, rs := range req.ResourceSpans {
			for _, ss := range rs.ScopeSpans {
				c.spans = append(c.spans, ss.Spans...)
			}
		}
		c.mu.Unlock()
		select {
		case c.got <- struct{}{}:
		default:
		}
		out, _ := proto.Marshal(&collectortrace.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.Write(out)
	}))
	t.Cleanup(srv.Close)
	c.url = srv.URL
	return c
}

// trace returns the spans of trace id, once the ones ready looks for are
// among them (every request of a client's session shares its trace id,
// and they arrive in batches).
func (c *otlpCollector) trace(t *testing.T, traceID string, ready func([]*tracepb.Span) bool) []*tracepb.Span {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		c.mu.Lock()
		var out []*tracepb.Span
		for _, s := range c.spans {
			if hex.EncodeToString(s.TraceId) == traceID {
				out = append(out, s)
			}
		}
		c.mu.Unlock()
		if ready(out) {
			return out
		}
		select {
		case <-c.got:
		case <-deadline:
			t.Fatalf("the spans looked for in trace %s did not reach the collector within 30s (%d spans of it)", traceID, len(out))
		}
	}
}

func attr(s *tracepb.Span, key string) string {
	for _, kv := range s.Attributes {
		if kv.Key == key {
			return kv.Value.GetStringValue()
		}
	}
	return ""
}

// traceRecorder is the upstream's front: it records the trace headers and
// the body of each request before the go-sdk server reads it.
type traceRecorder struct {
	mu   sync.Mutex
	seen []recorded
	next http.Handler
}

type recorded struct {
	traceparent, baggage string
	meta                 map[string]json.RawMessage
	method               string
}

func (h *traceRecorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	r.Body = io.NopCloser(bytes.NewReader(body))
	var msg struct {
		Method string `json:"method"`
		Params struct {
			Meta map[string]json.RawMessage `json:"_meta"`
		} `json:"params"`
	}
	_ = json.Unmarshal(body, &msg)
	h.mu.Lock()
	h.seen = append(h.seen, recorded{r.Header.Get("Traceparent"), r.Header.Get("Baggage"), msg.Params.Meta, msg.Method})
	h.mu.Unlock()
	h.next.ServeHTTP(w, r)
}

// last returns the last tools/call the upstream got.
func (h *traceRecorder) lastCall() (recorded, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for i := len(h.seen) - 1; i >= 0; i-- {
		if h.seen[i].method == "tools/call" {
			return h.seen[i], true
		}
	}
	return recorded{}, false
}

// With Caddy's tracing on, a call through the guard and through the
// aggregated route is one trace: the client's trace id, Caddy's server
// span, the edge's steps as events on it, the route's span, and on the
// aggregated route the broker's upstream call as a child of the route
// span. The upstream gets the trace context of the span that called it in
// its traceparent header and, at 2026-07-28, in params._meta (SEP-414);
// the client's baggage reaches neither the upstream nor the spans; no span
// holds the token or an argument.
func TestTracesAcrossTheHop(t *testing.T) {
	collector := startOTLPCollector(t)
	server := mcp.NewServer(&mcp.Implementation{Name: "traced", Version: "1"}, nil)
	type in struct {
		City string `json:"city"`
	}
	mcp.AddTool(server, &mcp.Tool{Name: "weather", Description: "Tells the weather."},
		func(_ context.Context, _ *mcp.CallToolRequest, a in) (*mcp.CallToolResult, any, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "sunny"}}}, nil, nil
		})
	rec := &traceRecorder{next: mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server }, &mcp.StreamableHTTPOptions{Stateless: true})}
	upstream := httptest.NewServer(rec)
	t.Cleanup(upstream.Close)

	guard, agg, untraced := freePort(t), freePort(t), freePort(t)
	c := startCaddy(t, fmt.Sprintf(`{
	admin %s
	zidane {
		upstream up %s/mcp
	}
}

http://127.0.0.1:%d {
	tracing {
		span mcp
	}
	zidane_mcp {
		guard
	}
	reverse_proxy %s
}

http://127.0.0.1:%d {
	tracing {
		span mcp
	}
	zidane_mcp {
		aggregate up
	}
}

http://127.0.0.1:%d {
	zidane_mcp {
		aggregate up
	}
}
`, AdminPlaceholder, upstream.URL, guard, strings.TrimPrefix(upstream.URL, "http://"), agg, untraced),
		"OTEL_EXPORTER_OTLP_ENDPOINT="+collector.url, "OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf",
		"OTEL_TRACES_EXPORTER=otlp", "OTEL_TRACES_SAMPLER=always_on", "OTEL_BSP_SCHEDULE_DELAY=100")
	token := createToken(t, c, "traced", "--scope", "mcp", "--scope", "upstream:up")
	const secretCity = "CITY-ARGUMENT-7f3a"

	for i, route := range []struct {
		name, tool, routeSpan string
		port                  int
		version               string
	}{
		{"guard", "weather", "zidane_mcp guard", guard, "2025-11-25"},
		{"guard", "weather", "zidane_mcp guard", guard, modernVersion},
		{"aggregated", "mcp_up_weather", "zidane_mcp aggregate", agg, "2025-11-25"},
		{"aggregated", "mcp_up_weather", "zidane_mcp aggregate", agg, modernVersion},
	} {
		t.Run(route.name+" "+route.version, func(t *testing.T) {
			traceID := fmt.Sprintf("%032x", 0xa11ce0000+i)
			clientSpan := "00f067aa0ba902b7"
			headers := func(r *http.Request) {
				r.Header.Set("Traceparent", "00-"+traceID+"-"+clientSpan+"-01")
				r.Header.Set("Baggage", "user.id=admin,tenant=other")
			}
			hc := bearerClient(token, roundTripFunc(func(r *http.Request) (*http.Response, error) {
				r = r.Clone(r.Context())
				headers(r)
				return http.DefaultTransport.RoundTrip(r)
			}))
			cs, err := connectGoAt(t, fmt.Sprintf("http://127.0.0.1:%d/mcp", route.port), hc, route.version)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: route.tool, Arguments: map[string]any{"city": secretCity}})
			if err != nil || res.IsError {
				t.Fatalf("call: %v %+v", err, res)
			}
			// The call's route span, and on the aggregated route the
			// upstream call under it.
			spans := collector.trace(t, traceID, func(spans []*tracepb.Span) bool {
				var rs *tracepb.Span
				for _, s := range spans {
					if s.Name == route.routeSpan && attr(s, "gen_ai.tool.name") == route.tool {
						rs = s
					}
				}
				if rs == nil {
					return false
				}
				server := false // Caddy's span, the route span's parent, ends after it
				for _, s := range spans {
					server = server || bytes.Equal(s.SpanId, rs.ParentSpanId)
				}
				if !server || route.name != "aggregated" {
					return server
				}
				for _, s := range spans {
					if s.Name == "mcp upstream up" && bytes.Equal(s.ParentSpanId, rs.SpanId) && attr(s, "mcp.method.name") == "tools/call" {
						return true
					}
				}
				return false
			})
			var server, routeSpan *tracepb.Span
			for _, s := range spans {
				if s.Name == route.routeSpan && attr(s, "gen_ai.tool.name") == route.tool {
					routeSpan = s
				}
			}
			if routeSpan == nil {
				t.Fatalf("no route span for the call among %d spans", len(spans))
			}
			for _, s := range spans {
				if bytes.Equal(s.SpanId, routeSpan.ParentSpanId) {
					server = s
				}
			}
			if server == nil || hex.EncodeToString(server.ParentSpanId) != clientSpan {
				t.Fatalf("the route span's parent is not Caddy's server span of the client's trace")
			}
			events := map[string]map[string]string{}
			for _, ev := range server.Events {
				a := map[string]string{}
				for _, kv := range ev.Attributes {
					a[kv.Key] = kv.Value.GetStringValue()
				}
				events[ev.Name] = a
			}
			for _, step := range []string{"zidane_mcp.auth", "zidane_mcp.inspect", "zidane_mcp.decide", "zidane_mcp.limit"} {
				a := events[step]
				if a["zidane.decision"] != "allowed" || a["zidane.principal.id"] == "" {
					t.Errorf("the server span's %s event: %v (events %v)", step, a, events)
				}
				if step != "zidane_mcp.auth" && a["gen_ai.tool.name"] != route.tool {
					t.Errorf("the %s event names tool %q, want %q", step, a["gen_ai.tool.name"], route.tool)
				}
			}
			if attr(routeSpan, "zidane.principal.id") == "" {
				t.Error("the route span names no principal")
			}
			// The span that called the upstream: the route span (guard),
			// or the broker's upstream call, its child (aggregated).
			caller := routeSpan
			if route.name == "aggregated" {
				caller = nil
				for _, s := range spans {
					if s.Name == "mcp upstream up" && bytes.Equal(s.ParentSpanId, routeSpan.SpanId) && attr(s, "mcp.method.name") == "tools/call" {
						caller = s
					}
				}
				if caller == nil {
					t.Fatalf("no upstream call span under the route span")
				}
			}
			got, ok := rec.lastCall()
			if !ok {
				t.Fatal("the upstream got no tools/call")
			}
			want := "00-" + traceID + "-" + hex.EncodeToString(caller.SpanId) + "-01"
			if got.traceparent != want {
				t.Fatalf("the upstream's traceparent %q, want %q (the calling span)", got.traceparent, want)
			}
			if got.baggage != "" || got.meta["baggage"] != nil {
				t.Fatalf("the client's baggage reached the upstream: %q %s", got.baggage, got.meta["baggage"])
			}
			if route.name == "aggregated" && route.version == modernVersion && string(got.meta["traceparent"]) != `"`+want+`"` {
				t.Fatalf("the upstream's _meta.traceparent %s, want %q", got.meta["traceparent"], want)
			}
		})
	}
	// On a site without tracing, in the same process, a client's
	// traceparent never becomes the parent of the gateway's upstream call:
	// the upstream gets no trace context of the client's.
	t.Run("aggregated without tracing", func(t *testing.T) {
		const clientTrace = "0123456789abcdef0123456789abcdef"
		hc := bearerClient(token, roundTripFunc(func(r *http.Request) (*http.Response, error) {
			r = r.Clone(r.Context())
			r.Header.Set("Traceparent", "00-"+clientTrace+"-0123456789abcdef-01")
			return http.DefaultTransport.RoundTrip(r)
		}))
		cs, err := connectGoAt(t, fmt.Sprintf("http://127.0.0.1:%d/mcp", untraced), hc, "2025-11-25")
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "mcp_up_weather", Arguments: map[string]any{"city": "x"}}); err != nil || res.IsError {
			t.Fatalf("call: %v %+v", err, res)
		}
		got, ok := rec.lastCall()
		if !ok || strings.Contains(got.traceparent, clientTrace) {
			t.Fatalf("the upstream got the client's trace context on an untraced site: %q", got.traceparent)
		}
	})
	collector.mu.Lock()
	raw := collector.raw.String()
	collector.mu.Unlock()
	for _, secret := range []string{token, secretCity, "tenant=other"} {
		if strings.Contains(raw, secret) {
			t.Errorf("an exported span holds %q", secret)
		}
	}
}

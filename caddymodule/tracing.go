package caddymodule

import (
	"context"
	"net/http"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/Tahul/caddy-zidane-mcp/broker"
	"github.com/Tahul/caddy-zidane-mcp/message"
	"github.com/Tahul/caddy-zidane-mcp/policy"
)

// steps records the edge's steps in the request's span when Caddy's
// tracing directive made one that records: one span event per step (auth,
// inspect, decide, limit) with its decision and reason, and a child span
// for the route (see routeSpan). Attributes name the principal by its id
// and the call by method and tool; never a secret, an argument or a body.
// Without a recording span it does nothing, at the cost of one check.
type steps struct{ span trace.Span }

func traceSteps(r *http.Request) steps {
	if s := trace.SpanFromContext(r.Context()); s.IsRecording() {
		return steps{s}
	}
	return steps{}
}

// on reports whether the request's span records.
func (s steps) on() bool { return s.span != nil }

// event adds the step's event.
func (s steps) event(step, decision, reason string, attrs ...attribute.KeyValue) {
	if s.span == nil {
		return
	}
	attrs = append(attrs, attribute.String("zidane.decision", decision))
	if reason != "" {
		attrs = append(attrs, attribute.String("zidane.reason", reason))
	}
	s.span.AddEvent("zidane_mcp."+step, trace.WithAttributes(attrs...))
}

// principal is what a span may say of p.
func principalAttrs(p policy.Principal) []attribute.KeyValue {
	if p.TokenID == "" {
		return nil
	}
	return []attribute.KeyValue{attribute.String("zidane.principal.id", p.TokenID), attribute.String("zidane.principal.kind", string(p.Kind))}
}

// callAttrs is what a span may say of a body: its first message's method
// and tool, and how many messages it holds.
func callAttrs(b *message.Body) []attribute.KeyValue {
	if b == nil || len(b.Calls) == 0 {
		return nil
	}
	c := b.Calls[0]
	attrs := []attribute.KeyValue{attribute.Int("zidane.messages", len(b.Calls))}
	if c.Method != "" {
		attrs = append(attrs, attribute.String("mcp.method.name", c.Method))
	}
	if c.Tool != "" {
		attrs = append(attrs, attribute.String("gen_ai.tool.name", c.Tool))
	}
	return attrs
}

// refused records the step of a refusal, by its reason, with the
// decision on the request's span.
func (s steps) refused(rf refusal) {
	if s.span == nil {
		return
	}
	step := "decide"
	switch rf.reason {
	case "no_token", "invalid_token", "rate_limited_ip", "jwt_keys_unavailable", "machine_token":
		step = "auth"
	case "ambiguous_body", "malformed", "too_large", "unexpected_body", "unsupported_media_type", "header_mismatch",
		"method_not_allowed", "duplicate_header", "upgrade_refused":
		step = "inspect"
	case "rate_limited":
		step = "limit"
	}
	attrs := principalAttrs(rf.p)
	if rf.call.Method != "" {
		attrs = append(attrs, attribute.String("mcp.method.name", rf.call.Method))
	}
	if rf.call.Tool != "" {
		attrs = append(attrs, attribute.String("gen_ai.tool.name", rf.call.Tool))
	}
	s.event(step, "refused", rf.reason, append(attrs, attribute.Int("http.response.status_code", rf.status))...)
	s.span.SetAttributes(attribute.String("zidane.decision", "refused"), attribute.String("zidane.reason", rf.reason))
}

// routeSpan starts the route's span, a child of the request's, which the
// broker's upstream calls are children of. In guard mode it stands for the
// call to the server behind: its trace context goes in the request's
// headers, which reverse_proxy passes on. The client's baggage is dropped
// from the context and the headers, whatever the tracing: it is the
// client's to say, and a server behind may trust it.
func (s steps) routeSpan(ctx context.Context, r *http.Request, route spanning, p policy.Principal, b *message.Body) (context.Context, trace.Span) {
	delete(r.Header, "Baggage") // its canonical name
	if baggage.FromContext(ctx).Len() > 0 {
		ctx = baggage.ContextWithoutBaggage(ctx)
	}
	if s.span == nil {
		if route.readsTrace {
			// The aggregated route reads a trace context from these
			// headers where go-sdk lost the request's context
			// (broker.TraceFromHeader): with no span of the edge's here,
			// whatever they hold is the client's, which must not become
			// the parent of the gateway's spans on a site that traces
			// nothing.
			r.Header.Del("Traceparent")
			r.Header.Del("Tracestate")
		}
		return ctx, nil
	}
	attrs := append([]attribute.KeyValue{attribute.String("zidane.route", route.name), attribute.String("zidane.decision", "allowed")}, principalAttrs(p)...)
	attrs = append(attrs, callAttrs(b)...)
	kind := trace.SpanKindInternal
	if route.client {
		kind = trace.SpanKindClient
	}
	ctx, span := s.span.TracerProvider().Tracer(broker.TracerName).Start(ctx, "zidane_mcp "+route.name,
		trace.WithSpanKind(kind), trace.WithAttributes(attrs...))
	if route.client || route.readsTrace {
		// The guard's server behind reads it; the aggregated route reads
		// it back where go-sdk's handlers lost the request's context
		// (broker.TraceFromHeader).
		r.Header.Del("Traceparent")
		r.Header.Del("Tracestate")
		propagation.TraceContext{}.Inject(ctx, propagation.HeaderCarrier(r.Header))
		broker.RememberTracerProvider(s.span.TracerProvider())
	}
	return ctx, span
}

// endRoute ends the route's span with the outcome.
func endRoute(span trace.Span, err error) {
	if span == nil {
		return
	}
	if err != nil {
		span.SetStatus(codes.Error, "the route failed")
	}
	span.End()
}

// spanning is how a route's span is made, which its module says.
type spanning struct {
	// name is the route's in spans: its module's name.
	name string
	// client is set where the route stands for the call to a server
	// behind (the guard's): a client span, whose trace context goes on
	// in the request's headers.
	client bool
	// readsTrace is set where the route reads a trace context back from
	// the request's headers (the aggregated route, where go-sdk lost the
	// request's context): it goes there when the edge traces, and a
	// client's is removed when it does not.
	readsTrace bool
}

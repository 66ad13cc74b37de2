package caddymodule

import (
	"testing"

	"github.com/Tahul/caddy-zidane-mcp/broker"
	"github.com/Tahul/caddy-zidane-mcp/policy"
)

// The labels take their values from small fixed sets: a route's mode, not
// its resource URL; an upstream's answer by class, not by status text; a
// credential by kind, not by name.
func TestMetricLabelsAreBounded(t *testing.T) {
	for route, want := range map[string]string{
		"broker:github":                       "broker",
		"egress:github":                       "egress",
		broker.RouteAggregate:                 "aggregate",
		"guard:https://mcp.example.com/mcp":   "guard",
		"aggregate|https://gw/mcp|always|a,b": "aggregate",
	} {
		if got := routeKind(route); got != want {
			t.Errorf("routeKind(%q) = %q, want %q", route, got, want)
		}
	}
	for _, c := range []struct {
		rec  broker.CallRecord
		want string
	}{
		{broker.CallRecord{Outcome: broker.OutcomeOK, Status: 200}, "ok"},
		{broker.CallRecord{Outcome: broker.OutcomeCanceled}, "canceled"},
		{broker.CallRecord{Outcome: broker.OutcomeAuthRequired}, "auth_required"},
		{broker.CallRecord{Outcome: "Not Found", Status: 404}, "http_4xx"},
		{broker.CallRecord{Outcome: "I'm a teapot", Status: 418}, "http_4xx"},
		{broker.CallRecord{Outcome: "Bad Gateway", Status: 502}, "http_5xx"},
		{broker.CallRecord{Outcome: "Found", Status: 302}, "error"},
	} {
		if got := callOutcome(c.rec); got != c.want {
			t.Errorf("callOutcome(%+v) = %q, want %q", c.rec, got, c.want)
		}
	}
	for _, c := range []struct {
		p    policy.Principal
		want string
	}{
		{policy.Principal{TokenID: "tok_1", Name: "laptop", Source: "token"}, "token"},
		{policy.Principal{TokenID: "tok_2", Name: "ses_abc", Source: "token", Parent: "tok_1"}, "child_token"},
		{policy.Principal{TokenID: "jwt:alice", Name: "alice", Source: "jwt"}, "jwt"},
	} {
		if got := credentialKind(c.p); got != c.want {
			t.Errorf("credentialKind(%+v) = %q, want %q", c.p, got, c.want)
		}
	}
}

package e2e

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// spoofedIP is the address a client claims through the header the edge
// uses to hand the broker's routes the client's address.
const spoofedIP = "203.0.113.7"

// spoofingClient is bearerClient that also sends every spelling of the
// edge's client-address header it can.
func spoofingClient(token string) *http.Client {
	return bearerClient(token, roundTripFunc(func(r *http.Request) (*http.Response, error) {
		r = r.Clone(r.Context())
		r.Header.Add("Zidane-Client-Ip", spoofedIP)
		r.Header.Add("Zidane-Client-Ip", spoofedIP)
		r.Header["zidane-client-ip"] = []string{spoofedIP}
		r.Header["Zidane_Client_Ip"] = []string{spoofedIP}
		return http.DefaultTransport.RoundTrip(r)
	}))
}

// TestUpstreamCallAuditNamesTheClient: the upstream_call audit lines of
// the pass-through and aggregated routes name the address the client
// connected from, at both protocol versions, and a client cannot put
// another there; the header that carries it never reaches a server
// behind the gateway.
func TestUpstreamCallAuditNamesTheClient(t *testing.T) {
	upstream := startEverythingServer(t)
	recording := startRecordingUpstream(t)
	brokerPort, aggPort, recPort, guardPort := freePort(t), freePort(t), freePort(t), freePort(t)
	c := startCaddy(t, fmt.Sprintf(`{
	admin %s
	zidane {
		upstream everything %s
		upstream rec %s
	}
}

http://:%d {
	bind 127.0.0.1
	zidane_mcp {
		broker everything
	}
}

http://:%d {
	bind 127.0.0.1
	zidane_mcp {
		aggregate everything
	}
}

http://:%d {
	bind 127.0.0.1
	zidane_mcp {
		broker rec
	}
}

http://:%d {
	bind 127.0.0.1
	zidane_mcp {
		guard
	}
	reverse_proxy %s
}
`, AdminPlaceholder, upstream, recording.url, brokerPort, aggPort, recPort, guardPort, recording.addr))
	token := createToken(t, c, "agent", "--scope", "upstream:everything", "--scope", "upstream:rec")

	call := func(t *testing.T, url, version, tool string) {
		t.Helper()
		cs, err := connectGoAt(t, url, spoofingClient(token), version)
		if err != nil {
			t.Fatal(err)
		}
		res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: tool})
		if err != nil || res.IsError {
			t.Fatalf("call: %+v %v", res, err)
		}
	}
	for _, site := range []struct {
		name, route, tool string
		port              int
	}{{"pass-through", "broker:everything", "test_simple_text", brokerPort}, {"aggregated", "aggregate", "mcp_everything_test_simple_text", aggPort}} {
		for _, version := range []string{"2025-11-25", "2026-07-28"} {
			t.Run(site.name+" "+version, func(t *testing.T) {
				before := len(auditLines(c))
				call(t, fmt.Sprintf("http://127.0.0.1:%d/mcp", site.port), version, site.tool)
				lines := auditLines(c)[before:]
				calls := 0
				for _, l := range lines {
					if l["event"] != "upstream_call" || l["route"] != site.route {
						continue
					}
					calls++
					if l["rpc_method"] == "tools/call" && l["http_method"] != "POST" {
						t.Errorf("a tools/call upstream_call names http_method %v, want POST: %v", l["http_method"], l)
					}
					if l["client_ip"] != "127.0.0.1" {
						t.Errorf("upstream_call names client_ip %v, want 127.0.0.1: %v", l["client_ip"], l)
					}
				}
				if calls == 0 {
					t.Fatalf("no upstream_call audit line for route %s in:\n%v", site.route, lines)
				}
				for _, l := range lines {
					if strings.Contains(fmt.Sprint(l), spoofedIP) {
						t.Errorf("an audit line carries the address the client claimed: %v", l)
					}
				}
			})
		}
	}

	t.Run("the header reaches no server behind the gateway", func(t *testing.T) {
		hc := spoofingClient(token)
		for _, port := range []int{recPort, guardPort} {
			req, err := http.NewRequest(http.MethodPost, fmt.Sprintf("http://127.0.0.1:%d/mcp", port), strings.NewReader(initializeBody))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Accept", "application/json, text/event-stream")
			resp, err := hc.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
		}
		recording.mu.Lock()
		defer recording.mu.Unlock()
		if len(recording.seen) < 2 {
			t.Fatalf("the recording server saw %d requests, want the pass-through's and the guard's", len(recording.seen))
		}
		// The guard passes a client's own headers on, as reverse_proxy
		// does (a spelling with _ among them): the edge's own never.
		for _, h := range recording.seen {
			if v := h.Values("Zidane-Client-Ip"); len(v) > 0 {
				t.Errorf("a server behind the gateway got Zidane-Client-Ip: %q", v)
			}
		}
		// The pass-through route forwards an allow-list: nothing of it
		// (the guard's request was the last).
		for _, h := range recording.seen[:len(recording.seen)-1] {
			for name, values := range h {
				if strings.Contains(strings.Join(values, ","), spoofedIP) {
					t.Errorf("the pass-through route forwarded %s: %q", name, values)
				}
			}
		}
	})
}

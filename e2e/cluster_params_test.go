package e2e

import (
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// byMethod sends a client's tools/list to list and every other request to
// rest, as a load balancer may: the replica that reads the listing is not
// the one that gets the call. tokens holds each replica's bearer token.
func byMethod(list, rest string, tokens map[string]string, lists *atomic.Int64) *http.Client {
	return &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		host := rest
		if r.Header.Get("Mcp-Method") == "tools/list" {
			host = list
			lists.Add(1)
		}
		r = r.Clone(r.Context())
		r.URL.Host, r.Host = host, host
		r.Header.Set("Authorization", "Bearer "+tokens[host])
		return http.DefaultTransport.RoundTrip(r)
	})}
}

// The x-mcp-header bindings a replica learns from a tools/list answer are
// shared through the NATS storage: a 2026-07-28 client whose tools/list
// went to replica A calls a tool with a Mcp-Param- header through replica
// B, which checks the header against the body with A's reading. A replica
// on another bucket (no shared storage) still refuses to pass a header it
// cannot check, and B still refuses a header that disagrees with the body.
func TestClusterParamBindingsReachEveryReplica(t *testing.T) {
	natsURL := startNATSServer(t)
	upstream := startStatelessEverythingServer(t)
	env := "ZIDANE_CLUSTER_KEY=" + base64.StdEncoding.EncodeToString([]byte(randomHex(16)))
	backend := strings.TrimSuffix(strings.TrimPrefix(upstream, "http://"), "/mcp")
	replica := func(bucket string) (*Caddy, string) {
		addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
		c := startCaddy(t, fmt.Sprintf(`{
	admin %s
	storage zidane_nats
	zidane {
		cluster {
			url %s
			bucket %s
		}
	}
}

http://%s {
	zidane_mcp {
		guard
	}
	reverse_proxy %s
}
`, AdminPlaceholder, natsURL, bucket, addr, backend), env)
		return c, addr
	}
	a, addrA := replica("zidane")
	_, addrB := replica("zidane")
	other, addrC := replica("elsewhere")
	token := createToken(t, a, "params", "--scope", "mcp")
	otherToken := createToken(t, other, "params", "--scope", "mcp")
	waitStatus(t, "http://"+addrB+"/mcp", token, http.StatusOK, 20*time.Second) // B has read the token

	tokens := map[string]string{addrA: token, addrB: token, addrC: otherToken}
	connect := func(list, rest string, lists *atomic.Int64) *mcp.ClientSession {
		t.Helper()
		cs, err := connectGoAt(t, "http://"+rest+"/mcp", byMethod(list, rest, tokens, lists), modernVersion)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if _, err := cs.ListTools(ctx, nil); err != nil {
			t.Fatal(err)
		}
		return cs
	}
	call := func(cs *mcp.ClientSession, region string) error {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "test_x_mcp_header", Arguments: map[string]any{"region": region}})
		if err == nil && res.IsError {
			err = fmt.Errorf("tool error: %+v", res.Content)
		}
		return err
	}

	var lists atomic.Int64
	cs := connect(addrA, addrB, &lists)
	if lists.Load() == 0 {
		t.Fatal("the tools/list did not go to replica A")
	}
	// B takes A's reading once A's write reaches it; until then B refuses
	// the header it cannot check, and the client calls again.
	deadline := time.Now().Add(20 * time.Second)
	var err error
	for attempt := 1; ; attempt++ {
		if err = call(cs, "eu-west1"); err == nil {
			t.Logf("the call through B succeeded at attempt %d", attempt)
			break
		}
		if !strings.Contains(err.Error(), "cannot check the Mcp-Param- headers") || time.Now().After(deadline) {
			t.Fatalf("calling through B after listing through A: %v", err)
		}
		// Bounded by the deadline; each attempt is a real call.
		time.Sleep(100 * time.Millisecond)
	}

	// A replica that shares no storage with A has not learned the tool.
	var otherLists atomic.Int64
	oc := connect(addrA, addrC, &otherLists)
	if otherLists.Load() == 0 {
		t.Fatal("the second client's tools/list did not go to replica A")
	}
	if err := call(oc, "eu-west1"); err == nil || !strings.Contains(err.Error(), "cannot check the Mcp-Param- headers") {
		t.Fatalf("a replica on another bucket passed a header it cannot check: %v", err)
	}

	// B checks the header against the body: one that disagrees is refused
	// there with -32020.
	body := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"test_x_mcp_header","arguments":{"region":"eu-west1"},` +
		`"_meta":{"io.modelcontextprotocol/protocolVersion":"` + modernVersion + `","io.modelcontextprotocol/clientCapabilities":{}}}}`
	req, err := http.NewRequest(http.MethodPost, "http://"+addrB+"/mcp", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range map[string]string{"Authorization": "Bearer " + token, "Content-Type": "application/json",
		"Accept": "application/json, text/event-stream", "Mcp-Protocol-Version": modernVersion,
		"Mcp-Method": "tools/call", "Mcp-Name": "test_x_mcp_header", "Mcp-Param-Region": "us-east1"} {
		req.Header.Set(k, v)
	}
	answer, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(answer.Body)
	answer.Body.Close()
	resp := struct {
		status int
		body   string
	}{answer.StatusCode, string(got)}
	if resp.status != http.StatusBadRequest || !strings.Contains(resp.body, "-32020") {
		t.Fatalf("a disagreeing Mcp-Param-Region through B: %d %s", resp.status, resp.body)
	}
}

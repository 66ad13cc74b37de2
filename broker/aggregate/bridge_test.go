package aggregate

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/broker/upstream"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// firstInput calls tool with go-sdk's retry loop off and returns its
// input-required answer.
func firstInput(t *testing.T, ctx context.Context, cs *mcp.ClientSession, tool string) *mcp.CallToolResult {
	t.Helper()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: tool})
	if err != nil {
		t.Fatal(err)
	}
	if !res.NeedsInput() || len(res.InputRequests) != 1 {
		t.Fatalf("%s answered %q (needsInput %v), want one input request", tool, aggText(t, res), res.NeedsInput())
	}
	return res
}

func onlyKey(m mcp.InputRequestMap) string {
	for k := range m {
		return k
	}
	return ""
}

// A sealed requestState that is altered, replayed by another token, sent
// with another tool, or replayed once its call is over is refused; the
// right retry completes the call.
func TestAggregateBridgeRefusesForeignState(t *testing.T) {
	up := newMRTRUp(t, "l", false) // stateful: 2025-11-25 only
	_, url := aggServe(t, []upstream.Config{up.ups}, Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	off := &mcp.ClientOptions{MultiRoundTrip: &mcp.MultiRoundTripOptions{Disabled: true}}
	alice := modernClient(t, url, "tok-1", off)
	mallory := modernClient(t, url, "tok-2", off)

	res := firstInput(t, ctx, alice, "mcp_l_ask_classic")
	state, key := res.RequestState, onlyKey(res.InputRequests)
	if !strings.HasPrefix(state, bridgeSealPrefix) {
		t.Fatalf("requestState %q is not sealed by the gateway", state)
	}
	if ep, ok := res.InputRequests[key].(*mcp.ElicitParams); !ok || ep.Message != "classic?" {
		t.Fatalf("input request %#v, want the upstream's elicitation", res.InputRequests[key])
	}
	answer := mcp.InputResponseMap{key: &mcp.ElicitResult{Action: "accept", Content: map[string]any{"name": "ada"}}}
	refused := func(who *mcp.ClientSession, tool, st, want string) {
		t.Helper()
		_, err := who.CallTool(ctx, &mcp.CallToolParams{Name: tool, RequestState: st, InputResponses: answer})
		var re *jsonrpc.Error
		if !errors.As(err, &re) || re.Code != jsonrpc.CodeInvalidParams || !strings.Contains(re.Message, want) {
			t.Fatalf("retry with state %.40q… as %s: %v; want -32602 saying %q", st, tool, err, want)
		}
	}
	// Altered: one character of the sealed part changed.
	b := []byte(state)
	i := len(bridgeSealPrefix) + 5
	if b[i] == 'A' {
		b[i] = 'B'
	} else {
		b[i] = 'A'
	}
	refused(alice, "mcp_l_ask_classic", string(b), "altered")
	refused(alice, "mcp_l_ask_classic", bridgeSealPrefix+"Zm9yZ2Vk", "not one the gateway sealed")
	refused(mallory, "mcp_l_ask_classic", state, "another token")
	refused(alice, "mcp_l_two_rounds", state, "given for tools/call mcp_l_ask_classic")

	res, err := alice.CallTool(ctx, &mcp.CallToolParams{Name: "mcp_l_ask_classic", RequestState: state, InputResponses: answer})
	if err != nil || aggText(t, res) != "got ada" {
		t.Fatalf("the right retry: %v %v", res, err)
	}
	refused(alice, "mcp_l_ask_classic", state, "over")
	if got := up.saw(); len(got) != 1 {
		t.Fatalf("the upstream saw %q, want the one call", got)
	}
}

// go-sdk's client, left to run its retry loop, completes calls to a
// 2025-11-25 upstream that asks during the call (classic elicitation) or
// through go-sdk's server-side fulfilment of input requests (two rounds).
func TestAggregateBridgeModernClientLegacyUpstream(t *testing.T) {
	up := newMRTRUp(t, "l", false)
	_, url := aggServe(t, []upstream.Config{up.ups}, Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	n := 0
	cs := modernClient(t, url, "tok-1", &mcp.ClientOptions{
		ElicitationHandler: func(ctx context.Context, req *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			n++
			return &mcp.ElicitResult{Action: "accept", Content: map[string]any{"name": "x"}}, nil
		},
	})
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "mcp_l_ask_classic"})
	if err != nil || aggText(t, res) != "got x" {
		t.Fatalf("ask_classic: %v %v", res, err)
	}
	res, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: "mcp_l_two_rounds"})
	if err != nil || aggText(t, res) != "done x+x" {
		t.Fatalf("two_rounds: %v %v", res, err)
	}
	if n != 3 {
		t.Fatalf("the client was asked %d times, want 3", n)
	}
}

// A call whose client does not retry within the round's wait is cancelled
// upstream, and its state opens nothing afterwards; a token has at most
// bridgeMaxPerToken calls waiting.
func TestAggregateBridgeBounds(t *testing.T) {
	up := newMRTRUp(t, "l", false)
	a, url := aggServe(t, []upstream.Config{up.ups}, Options{})
	a.bridge.roundWait = 50 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cs := modernClient(t, url, "tok-1", &mcp.ClientOptions{MultiRoundTrip: &mcp.MultiRoundTripOptions{Disabled: true}})
	res := firstInput(t, ctx, cs, "mcp_l_ask_classic")
	select {
	case <-up.failed: // the upstream's elicitation was cancelled
	case <-ctx.Done():
		t.Fatal("the upstream call was not cancelled after the round's wait")
	}
	_, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "mcp_l_ask_classic", RequestState: res.RequestState,
		InputResponses: mcp.InputResponseMap{onlyKey(res.InputRequests): &mcp.ElicitResult{Action: "accept", Content: map[string]any{"name": "late"}}}})
	if err == nil || !strings.Contains(err.Error(), "over") {
		t.Fatalf("a late retry: %v; want its refusal", err)
	}

	a.bridge.roundWait = time.Minute
	for i := range bridgeMaxPerToken {
		firstInput(t, ctx, cs, "mcp_l_ask_classic")
		_ = i
	}
	res2, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "mcp_l_ask_classic"})
	if err != nil || !res2.IsError || !strings.Contains(aggText(t, res2), "too many calls wait for input") {
		t.Fatalf("call %d of one token: %v %v; want the bound's tool error", bridgeMaxPerToken+1, res2, err)
	}
	// Another token is not held back by this one's.
	other := modernClient(t, url, "tok-2", &mcp.ClientOptions{MultiRoundTrip: &mcp.MultiRoundTripOptions{Disabled: true}})
	firstInput(t, ctx, other, "mcp_l_ask_classic")
}

// A requestState sealed by an earlier release ("zidane-mrtr.1.", the same
// cipher without the purpose bound in) still opens, and names its node;
// one sealed now is "zidane-mrtr.2.", and does not open relabelled. This
// one was sealed by that code under the key 32 bytes of 9.
func TestBridgeStatesOfEarlierReleasesOpen(t *testing.T) {
	b := newBridge(bytes.Repeat([]byte{9}, 32), "node-a")
	const earlier = "zidane-mrtr.1.r9nkEqz1SbiUF6U69etgOevtvZkFeqfsUidk3uJBewGmGig2maowv5ewKmfH7wNSMJnp3R3ICCaVm4Qw8wCBeD1kNVq42k449PB0Fwg_nhQ8"
	s, err := b.open(earlier)
	if err != nil || s != (sealed{Token: "tok_1", Call: "tools/call t", ID: "7", Node: "node-a"}) {
		t.Fatalf("the earlier release's state: %+v, %v", s, err)
	}
	now := b.seal(s)
	if !strings.HasPrefix(now, "zidane-mrtr.2.") {
		t.Fatalf("sealed now: %q", now)
	}
	if again, err := b.open(now); err != nil || again != s {
		t.Fatalf("%+v, %v", again, err)
	}
	if _, err := b.open("zidane-mrtr.1." + strings.TrimPrefix(now, "zidane-mrtr.2.")); err == nil {
		t.Error("a state sealed now opened relabelled as an earlier release's")
	}
	if _, err := newBridge(bytes.Repeat([]byte{8}, 32), "node-a").open(now); err == nil {
		t.Error("a state opened under another key")
	}
}

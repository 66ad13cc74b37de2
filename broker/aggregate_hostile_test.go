package broker

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/Tahul/caddy-zidane-mcp/internal/hostile"
)

// The aggregated route in front of an upstream that tries every hostile
// answer: each call gets a tool error that names the upstream and its
// max_response, the next call on the same downstream session works (on a
// new upstream session), and nothing stays reserved.
func TestAggregateHostileAnswers(t *testing.T) {
	hu := hostile.NewUpstream()
	hu.Max = 8 << 20
	srv := httptest.NewServer(hu)
	t.Cleanup(srv.Close)
	budget := NewAnswerBudget(0)
	_, url := aggServe(t, []Upstream{{Name: "evil", URL: srv.URL, MaxResponse: 1 << 20}}, AggregateOptions{AnswerBudget: budget})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, warm := range []bool{false, true} {
		for _, attack := range hostile.Attacks {
			name := attack + map[bool]string{false: " first call", true: " after a call"}[warm]
			t.Run(name, func(t *testing.T) {
				cs := aggConnect(t, url, nil)
				if warm {
					// The first call opens the upstream session with go-sdk;
					// later ones take the fast path.
					if res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "mcp_evil_ok", Arguments: map[string]any{"text": "warm"}}); err != nil || res.IsError {
						t.Fatalf("ok: %v %+v", err, res)
					}
				}
				res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "mcp_evil_" + attack})
				if err != nil {
					t.Fatalf("%s: %v; want a tool error", attack, err)
				}
				if text := aggText(t, res); !res.IsError || !strings.Contains(text, `"evil"`) || !strings.Contains(text, "1 MiB") || !strings.Contains(text, "max_response") {
					t.Fatalf("%s: isError %v, %q; want a tool error naming the upstream and its max_response", attack, res.IsError, text)
				}
				res, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: "mcp_evil_ok", Arguments: map[string]any{"text": "after"}})
				if err != nil || res.IsError || aggText(t, res) != "after" {
					t.Fatalf("ok after %s: %v %+v", attack, err, res)
				}
			})
		}
	}
	if u := budget.Used(); u != 0 {
		t.Errorf("budget holds %d bytes after every call ended", u)
	}
}

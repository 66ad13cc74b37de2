package e2e

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// restartableUpstream is the go-sdk everything-server on a fixed address,
// which the test can kill and start again.
type restartableUpstream struct {
	t    *testing.T
	addr string
	p    *process
}

func startRestartableUpstream(t *testing.T) *restartableUpstream {
	u := &restartableUpstream{t: t, addr: fmt.Sprintf("127.0.0.1:%d", freePort(t))}
	u.start()
	t.Cleanup(func() { u.p.stop(2 * time.Second) })
	return u
}

func (u *restartableUpstream) start() {
	cmd := exec.Command(everythingServerBin, "-http", u.addr, "-stateless=false")
	cmd.Dir = u.t.TempDir()
	u.p = startProcess(u.t, "everything-server", cmd, filepath.Join(cmd.Dir, "everything-server.log"))
	waitListening(u.t, u.p, u.addr, startTimeout)
}

func (u *restartableUpstream) restart() {
	u.p.stop(2 * time.Second)
	u.start()
}

// An upstream killed and started again mid-session forgets its sessions.
// The aggregated route's own upstream sessions notice, and the client that
// was connected to the gateway the whole time keeps calling.
func TestUpstreamRestartMidSession(t *testing.T) {
	up := startRestartableUpstream(t)
	port := freePort(t)
	c := startCaddy(t, fmt.Sprintf(`{
	admin %s
	zidane {
		upstream remote http://%s/mcp
	}
}

http://:%d {
	bind 127.0.0.1
	zidane_mcp {
		aggregate remote
		rate_limit {
			per_token 1000/s 1000
		}
	}
}
`, AdminPlaceholder, up.addr, port))
	token := createToken(t, c, "agent", "--scope", "mcp")
	cs, err := connectGo(t, fmt.Sprintf("http://127.0.0.1:%d/mcp", port), bearerClient(token, nil))
	if err != nil {
		t.Fatal(err)
	}
	call := func() (*mcp.CallToolResult, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		return cs.CallTool(ctx, &mcp.CallToolParams{Name: "mcp_remote_test_simple_text"})
	}
	if res, err := call(); err != nil || res.IsError {
		t.Fatalf("before the restart: %+v %v", res, err)
	}
	up.restart()

	// The first call after the restart may report the upstream's failure as
	// a tool error; the client's own session to the gateway must survive,
	// and calls must succeed again without the client reconnecting.
	deadline := time.Now().Add(30 * time.Second)
	var last string
	for time.Now().Before(deadline) {
		res, err := call()
		if err != nil {
			t.Fatalf("the client's session to the gateway broke: %v", err)
		}
		if !res.IsError {
			return
		}
		last = fmt.Sprint(res.Content[0].(*mcp.TextContent).Text)
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("calls never recovered after the upstream restarted; last tool error: %s", last)
}

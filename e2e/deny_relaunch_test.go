package e2e

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestRelaunchInADeniedDirectoryIsAudited is a session whose directory
// became the gateway's after it was created: caddy restarts on a config
// whose file log is in that directory. Resuming the session relaunches
// its agent there, which the engine refuses with the denied-path message;
// a refusal, so the audit log says so, as it does for the same directory
// refused at create (tool_refused, reason denied_path), naming the
// session.
func TestRelaunchInADeniedDirectoryIsAudited(t *testing.T) {
	gw := startSessionsGateway(t, "", "")
	token := createToken(t, gw.c, "relaunch", "--scope", "chat")
	g := connectGoSessions(t, gw.url, token, "before")
	dir := t.TempDir()
	id := createSession(t, g, dir, "hello").SessionID
	settleIn(t, g, id, "idle")

	cfg := strings.Replace(sessionsCaddyfile(gw.port, "", ""), "\tzidane {",
		fmt.Sprintf("\tlog extra {\n\t\toutput file %s\n\t}\n\tzidane {", filepath.Join(dir, "caddy.log")), 1)
	gw.c.writeCaddyfile(t, cfg)
	gw.c.Restart(t)
	g = connectGoSessions(t, gw.url, token, "after")

	v := settle(t, g, id)
	if !strings.Contains(v.Error, "keeps from agents") {
		t.Fatalf("the agent was relaunched in %s, which holds a file log of the config: %+v", dir, v)
	}
	t.Logf("the relaunch refused: %s", v.Error)
	deadline := time.Now().Add(auditEventTimeout)
	for {
		for _, line := range strings.Split(gw.c.Logs(), "\n") {
			if strings.Contains(line, `"logger":"http.handlers.zidane_mcp.audit"`) && strings.Contains(line, "denied_path") && strings.Contains(line, id) {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no audit line records the refused relaunch of %s in %s within %s", id, dir, auditEventTimeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

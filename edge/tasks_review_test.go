package edge

import (
	"strings"
	"testing"

	"github.com/Tahul/caddy-zidane-mcp/message"
)

// An upstream's task id never reaches the client unsealed, whatever the
// spelling of its key: encoding/json reads taskId with a long s (U+017F)
// or a Kelvin sign (U+212A) for k as taskId, as it reads "TASKID".
func TestTaskIDKeyFoldedToNonASCII(t *testing.T) {
	var answer string
	up := &taskUpstream{answer: func(message.Call) (string, string) { return "application/json", answer }}
	route, _ := newTaskRoute(t, up)
	for _, key := range []string{"TASKID", "ta\u017fkId", "tas\u212aId"} {
		answer = `{"jsonrpc":"2.0","id":1,"result":{"resultType":"task","` + key + `":"up-raw","status":"working"}}`
		body, h := modernTask("tools/call", `"name":"slow"`, "slow", true)
		a := edgeThrough(t, route, taskAlice, h, body)
		if strings.Contains(a.body, "up-raw") {
			t.Errorf("%s: the client got the upstream's task id: %s", key, a.body)
		}
	}
}

package message

import (
	"errors"
	"testing"
)

// The Tasks extension (MCP 2026-07-28, SEP-2663) names a task by
// params.taskId on tasks/get, tasks/update and tasks/cancel, and by
// params.notifications.taskIds on subscriptions/listen; a route opens the
// gateway's handle there and forwards the upstream's id. The reader gives
// each id with its span, read once, so that the route replaces exactly
// what was decided on; a spelling another reader would take for one of
// them, and an id that is not a string, are refused.
func TestReadTaskIDs(t *testing.T) {
	for _, c := range []struct {
		body, id, raw string
	}{
		{`{"jsonrpc":"2.0","id":1,"method":"tasks/get","params":{"taskId":"h1"}}`, "h1", `"h1"`},
		{`{"jsonrpc":"2.0","id":1,"method":"tasks/update","params":{"inputResponses":{"taskId":"not this"},"taskId":"h\u0032"}}`, "h2", `"h\u0032"`},
		{`{"jsonrpc":"2.0","id":1,"method":"tasks/cancel","params":{"_meta":{},"taskId" : "h3"}}`, "h3", `"h3"`},
		{`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","arguments":{"taskId":"x"}}}`, "", ``},
	} {
		b, err := Read([]byte(c.body))
		if err != nil {
			t.Fatalf("%s: %v", c.body, err)
		}
		got := b.Calls[0]
		if got.TaskID != c.id || string(got.TaskIDRaw) != c.raw {
			t.Errorf("%s: read %q spelled %q, want %q spelled %q", c.body, got.TaskID, got.TaskIDRaw, c.id, c.raw)
		}
		if c.id != "" && got.Name() != c.id {
			t.Errorf("%s: Name() = %q, want the task id (the Mcp-Name routing header)", c.body, got.Name())
		}
	}

	listen := `{"jsonrpc":"2.0","id":1,"method":"subscriptions/listen","params":{"notifications":{"toolsListChanged":true,"taskIds":["a", "b\u0031"]}}}`
	b, err := Read([]byte(listen))
	if err != nil {
		t.Fatal(err)
	}
	if l := b.Calls[0].ListenTasks; len(l) != 2 || l[0].Value != "a" || string(l[0].Raw) != `"a"` || l[1].Value != "b1" || string(l[1].Raw) != `"b\u0031"` {
		t.Errorf("listen task ids = %+v", l)
	}

	for _, body := range []string{
		`{"jsonrpc":"2.0","id":1,"method":"tasks/get","params":{"taskId":"h","TaskId":"raw"}}`,
		`{"jsonrpc":"2.0","id":1,"method":"tasks/get","params":{"taskID":"raw"}}`,
		`{"jsonrpc":"2.0","id":1,"method":"tasks/cancel","params":{"t\u0061skId":"raw"}}`,
		`{"jsonrpc":"2.0","id":1,"method":"subscriptions/listen","params":{"notifications":{"TaskIds":["raw"]}}}`,
		`{"jsonrpc":"2.0","id":1,"method":"subscriptions/listen","params":{"Notifications":{"taskIds":["raw"]}}}`,
	} {
		if _, err := Read([]byte(body)); !errors.Is(err, ErrAmbiguous) {
			t.Errorf("%s: %v, want ErrAmbiguous", body, err)
		}
	}
	for _, body := range []string{
		`{"jsonrpc":"2.0","id":1,"method":"tasks/get","params":{"taskId":7}}`,
		`{"jsonrpc":"2.0","id":1,"method":"tasks/update","params":{"taskId":null}}`,
		`{"jsonrpc":"2.0","id":1,"method":"subscriptions/listen","params":{"notifications":{"taskIds":[7]}}}`,
		`{"jsonrpc":"2.0","id":1,"method":"subscriptions/listen","params":{"notifications":{"taskIds":"a"}}}`,
		`{"jsonrpc":"2.0","id":1,"method":"tasks/get","params":["h"]}`,
	} {
		if _, err := Read([]byte(body)); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: %v, want ErrMalformed", body, err)
		}
	}
}

// A request declares the Tasks extension in its _meta client
// capabilities; the edge refuses a task method of a 2026-07-28 request
// that does not (-32021), before it looks at the id.
func TestReadDeclaresTasks(t *testing.T) {
	for _, c := range []struct {
		body string
		want bool
	}{
		{`{"jsonrpc":"2.0","id":1,"method":"tasks/get","params":{"taskId":"h","_meta":{"io.modelcontextprotocol/clientCapabilities":{"elicitation":{},"extensions":{"io.modelcontextprotocol/tasks":{}}}}}}`, true},
		{`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","_meta":{"io.modelcontextprotocol/clientCapabilities":{"extensions":{"other/ext":{},"io.modelcontextprotocol/tasks":{}}}}}}`, true},
		{`{"jsonrpc":"2.0","id":1,"method":"tasks/get","params":{"taskId":"h","_meta":{"io.modelcontextprotocol/clientCapabilities":{}}}}`, false},
		{`{"jsonrpc":"2.0","id":1,"method":"tasks/get","params":{"taskId":"h","_meta":{"io.modelcontextprotocol/clientCapabilities":{"extensions":{"io.modelcontextprotocol/other":{}}}}}}`, false},
		{`{"jsonrpc":"2.0","id":1,"method":"tasks/get","params":{"taskId":"h","_meta":{"io.modelcontextprotocol/clientCapabilities":null}}}`, false},
		{`{"jsonrpc":"2.0","id":1,"method":"tasks/get","params":{"taskId":"h","extensions":{"io.modelcontextprotocol/tasks":{}}}}`, false},
	} {
		b, err := Read([]byte(c.body))
		if err != nil {
			t.Fatalf("%s: %v", c.body, err)
		}
		if got := b.Calls[0].DeclaresTasks; got != c.want {
			t.Errorf("%s: DeclaresTasks = %v, want %v", c.body, got, c.want)
		}
	}
	for _, body := range []string{
		`{"jsonrpc":"2.0","id":1,"method":"tasks/get","params":{"taskId":"h","_meta":{"io.modelcontextprotocol/ClientCapabilities":{"extensions":{"io.modelcontextprotocol/tasks":{}}}}}}`,
		`{"jsonrpc":"2.0","id":1,"method":"tasks/get","params":{"taskId":"h","_meta":{"io.modelcontextprotocol/clientCapabilities":{"Extensions":{"io.modelcontextprotocol/tasks":{}}}}}}`,
		`{"jsonrpc":"2.0","id":1,"method":"tasks/get","params":{"taskId":"h","_meta":{"io.modelcontextprotocol/clientCapabilities":{"extensions":{"io.modelcontextprotocol/Tasks":{}}}}}}`,
	} {
		if _, err := Read([]byte(body)); !errors.Is(err, ErrAmbiguous) {
			t.Errorf("%s: %v, want ErrAmbiguous", body, err)
		}
	}
}

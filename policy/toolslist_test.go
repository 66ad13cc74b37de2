package policy

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

const toolsAnswer = `{"jsonrpc":"2.0","id":3,"result":{"tools":[{"name":"echo","inputSchema":{"type":"object"}},{"name":"deploy_prod","inputSchema":{"type":"object"}}],"nextCursor":"c"}}`

func visibleEcho(name string) bool { return name == "echo" }

func toolNames(t *testing.T, msg []byte) []string {
	t.Helper()
	var r struct {
		Result struct {
			Tools []struct{ Name string } `json:"tools"`
			Next  string                  `json:"nextCursor"`
		} `json:"result"`
	}
	if err := json.Unmarshal(msg, &r); err != nil {
		t.Fatalf("%v in %s", err, msg)
	}
	if r.Result.Next != "c" {
		t.Fatalf("other result fields lost: %s", msg)
	}
	var names []string
	for _, tool := range r.Result.Tools {
		names = append(names, tool.Name)
	}
	return names
}

func TestFilterToolsListJSON(t *testing.T) {
	out := FilterToolsList([]byte(toolsAnswer), map[string]bool{"3": true}, visibleEcho)
	if got := toolNames(t, out); len(got) != 1 || got[0] != "echo" {
		t.Fatalf("tools = %v, want [echo]", got)
	}
	if string(FilterToolsList([]byte(toolsAnswer), map[string]bool{"4": true}, visibleEcho)) != toolsAnswer {
		t.Fatal("a response with another id was changed")
	}
	none := FilterToolsList([]byte(toolsAnswer), map[string]bool{"3": true}, func(string) bool { return false })
	if !bytes.Contains(none, []byte(`"tools":[]`)) {
		t.Fatalf("all filtered: %s, want an empty array", none)
	}
}

func TestToolsListFilterSSE(t *testing.T) {
	var out bytes.Buffer
	flushes := 0
	f := NewToolsListFilter(&out, true, map[string]bool{"3": true}, visibleEcho, func() { flushes++ })
	stream := "event: message\nid: 1\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\",\"params\":{}}\n\n" +
		"event: message\ndata: " + toolsAnswer + "\n\n"
	// Written in small pieces, as a proxy would.
	for i := 0; i < len(stream); i += 7 {
		end := min(i+7, len(stream))
		if _, err := f.Write([]byte(stream[i:end])); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if flushes != 2 {
		t.Fatalf("flushed %d times, want once per event", flushes)
	}
	events := strings.Split(strings.TrimSuffix(out.String(), "\n\n"), "\n\n")
	if len(events) != 2 || !strings.HasPrefix(events[0], "event: message\nid: 1\ndata: ") {
		t.Fatalf("stream = %q", out.String())
	}
	data := strings.TrimPrefix(strings.Split(events[1], "\n")[1], "data: ")
	if got := toolNames(t, []byte(data)); len(got) != 1 || got[0] != "echo" {
		t.Fatalf("tools = %v", got)
	}
}

func TestToolsListFilterJSONBody(t *testing.T) {
	var out bytes.Buffer
	f := NewToolsListFilter(&out, false, map[string]bool{"3": true}, visibleEcho, nil)
	f.Write([]byte(toolsAnswer[:20]))
	f.Write([]byte(toolsAnswer[20:]))
	if out.Len() != 0 {
		t.Fatal("JSON body passed before it was complete")
	}
	f.Close()
	if got := toolNames(t, out.Bytes()); len(got) != 1 {
		t.Fatalf("tools = %v", got)
	}
}

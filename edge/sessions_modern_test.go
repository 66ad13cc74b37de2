package edge

import (
	"net/http"
	"testing"

	"github.com/Tahul/caddy-zidane-mcp/policy"
)

// The sessions route's 2026-07-28 methods: a session's events resource is
// read as `sessions events` is called, so a token that may not call the
// events verb gets nothing of it, and no new method starts or drives an
// agent.
func TestSessionsRouteModernMethods(t *testing.T) {
	defaults, err := policy.NewScopeMap(nil, true)
	if err != nil {
		t.Fatal(err)
	}
	route := &Sessions{Scopes: defaults}
	user := func(name string, scopes ...string) policy.Principal {
		return policy.Principal{TokenID: "t-" + name, Name: name, Kind: policy.KindUser, Scopes: scopes}
	}
	reader, chatter := user("reader", "read"), user("chatter", "chat")
	creator := user("creator", "sessions:create", "sessions:send")
	nobody := user("nobody", "other")
	anyOwner := user("any-owner", "sessions:any")
	eventsOnly := user("events-only", "sessions:events")
	const uri = "zidane://sessions/ses_abc/events"
	read := `{"jsonrpc":"2.0","id":1,"method":"resources/read","params":{"uri":"` + uri + `","_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}`
	subscribe := `{"jsonrpc":"2.0","id":1,"method":"resources/subscribe","params":{"uri":"` + uri + `"}}`
	unsubscribe := `{"jsonrpc":"2.0","id":1,"method":"resources/unsubscribe","params":{"uri":"` + uri + `"}}`
	other := `{"jsonrpc":"2.0","id":1,"method":"resources/read","params":{"uri":"file:///etc/passwd","_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}`
	templates := `{"jsonrpc":"2.0","id":1,"method":"resources/templates/list","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}`
	listen := `{"jsonrpc":"2.0","id":1,"method":"subscriptions/listen","params":{"notifications":{"resourceSubscriptions":["` + uri + `"]},"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}`
	discover := `{"jsonrpc":"2.0","id":1,"method":"server/discover","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}`
	create := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"sessions","arguments":{"verb":"create","cwd":"/tmp","prompt":"hi"},"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}`
	hdr := func(method, name string) http.Header { return modern(method, name) }
	cases := []struct {
		name   string
		p      policy.Principal
		header http.Header
		body   string
		status int
	}{
		{"a read token reads a session's events", reader, hdr("resources/read", uri), read, 0},
		{"a chat token reads a session's events", chatter, hdr("resources/read", uri), read, 0},
		{"sessions:events alone reads them", eventsOnly, hdr("resources/read", uri), read, 0},
		{"a token without sessions scopes reads nothing", nobody, hdr("resources/read", uri), read, 403},
		{"sessions:any grants no verb, so no read", anyOwner, hdr("resources/read", uri), read, 403},
		{"create and send without events read nothing", creator, hdr("resources/read", uri), read, 403},
		{"any other resource is read as events too", nobody, hdr("resources/read", "file:///etc/passwd"), other, 403},
		{"legacy resources/subscribe needs events", nobody, http.Header{}, subscribe, 403},
		{"legacy resources/unsubscribe needs events", nobody, http.Header{}, unsubscribe, 403},
		{"a read token may subscribe (the endpoint decides the session)", reader, http.Header{}, subscribe, 0},
		{"a read token still may not create", reader, hdr("tools/call", "sessions"), create, 403},
		{"a creator may create", creator, hdr("tools/call", "sessions"), create, 0},
		{"discover needs no scope", nobody, hdr("server/discover", ""), discover, 0},
		{"listen is open; the endpoint authorizes each resource", nobody, hdr("subscriptions/listen", ""), listen, 0},
		{"listing templates is open; the listing is filtered", nobody, hdr("resources/templates/list", ""), templates, 0},
		// The Mcp-Name header must name the uri the body reads.
		{"a header naming another uri is refused", reader, hdr("resources/read", "zidane://sessions/ses_other/events"), read, 400},
	}
	for _, tc := range cases {
		d := Decide(route, tc.p, http.MethodPost, tc.header, []byte(tc.body))
		if d.Status != tc.status {
			t.Errorf("%s: got %d %q (%s), want %d", tc.name, d.Status, d.Reason, d.Message, tc.status)
		}
	}

	// The events template is listed to whoever may call events, and to
	// nobody else.
	tmpl := Item{Kind: KindResourceTemplate, Name: "zidane://sessions/{sessionId}/events"}
	res := Item{Kind: KindResource, Name: uri}
	for _, tc := range []struct {
		p    policy.Principal
		want bool
	}{{reader, true}, {chatter, true}, {eventsOnly, true}, {nobody, false}, {anyOwner, false}, {creator, false}} {
		for _, it := range []Item{tmpl, res} {
			if got := route.Visible(tc.p, it); got != tc.want {
				t.Errorf("%s sees %v: %v, want %v", tc.p.Name, it, got, tc.want)
			}
		}
	}
}

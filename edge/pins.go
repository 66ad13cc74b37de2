package edge

import (
	"encoding/json"
	"net/http"

	"github.com/Tahul/caddy-zidane-mcp/message"
	"github.com/Tahul/caddy-zidane-mcp/pins"
)

// Audit reasons of a use refused because its item's definition changed
// since it was pinned, or is a tool new to its pinned set (package pins).
const (
	ReasonToolChanged     = "tool_changed"
	ReasonPromptChanged   = "prompt_changed"
	ReasonResourceChanged = "resource_changed"
)

// serverInfoMeta is the _meta key that carries a 2026-07-28 server's
// serverInfo (SEP-2575): go-sdk's client takes it from server/discover's.
const serverInfoMeta = "io.modelcontextprotocol/serverInfo"

// pinRoute is a route that pins what its upstream gives a model to read.
// pin gives the store, the namespace and the upstream's own name of an
// item as the route lists it (nil store: not pinned). pinServer gives the
// namespace of the server's instructions and serverInfo as the route's
// answers carry them (nil: the route makes its own, as the aggregated
// route does). pinSets gives the namespaces whose tool set one whole
// tools listing of the route establishes, whatever it holds.
type pinRoute interface {
	pin(kind Kind, name string) (store *pins.Store, ns, upstreamName string)
	pinServer() (store *pins.Store, ns string)
	pinSets() (store *pins.Store, ns []string)
}

// pinKind is a listing kind's kind of pin.
func pinKind(k Kind) pins.Kind {
	switch k {
	case KindPrompt:
		return pins.Prompt
	case KindResource:
		return pins.Resource
	case KindResourceTemplate:
		return pins.ResourceTemplate
	}
	return pins.Tool
}

// pinShown decides a listed item by its pin: false withholds it. asked
// says whether the listing answers a list request of the request for that
// kind: only such a listing pins an item or records a change; one taken for
// a listing by its shape (the answer to another request, which a client
// could have an upstream's tool echo) is checked against the pins and
// records nothing. The namespace decided in is added to seen.
func pinShown(route Route, kind Kind, name string, obj map[string]json.RawMessage, asked bool, seen map[string]*pins.Store) bool {
	pr, ok := route.(pinRoute)
	if !ok {
		return true
	}
	st, ns, upstream := pr.pin(kind, name)
	if st == nil {
		return true
	}
	decide := st.Seen
	if asked {
		decide = st.Listed
		if seen != nil {
			seen[ns] = st
		}
	}
	v, _ := decide(ns, pinKind(kind), upstream, obj)
	return v == pins.Shown
}

// pinToolSets records that route's tools were listed whole: the
// namespaces whose tools the listing held (seen), and those the route
// always lists.
func pinToolSets(route Route, seen map[string]*pins.Store) {
	if pr, ok := route.(pinRoute); ok {
		if st, all := pr.pinSets(); st != nil {
			for _, ns := range all {
				seen[ns] = st
			}
		}
	}
	for ns, st := range seen {
		st.ToolsListed(ns)
	}
}

// pinServerAnswer decides the instructions and serverInfo of an answer to
// initialize (result members) or server/discover (instructions, and the
// serverInfo in _meta) by their pins, and puts the pinned ones in res in
// place of changed ones: a client reads only what was approved. It
// reports whether it changed res.
func pinServerAnswer(route Route, method string, res map[string]json.RawMessage) bool {
	pr, ok := route.(pinRoute)
	if !ok {
		return false
	}
	st, ns := pr.pinServer()
	if st == nil {
		return false
	}
	changed := false
	obj := map[string]json.RawMessage{}
	if v, ok := res["instructions"]; ok {
		obj["instructions"] = v
	}
	if v, _ := st.Listed(ns, pins.Server, pins.ServerInstructions, obj); v != pins.Shown {
		if p, ok := st.Pinned(ns, pins.Server, pins.ServerInstructions)["instructions"]; ok {
			res["instructions"] = p
		} else {
			delete(res, "instructions")
		}
		changed = true
	}
	var meta map[string]json.RawMessage
	info := res["serverInfo"]
	if method == "server/discover" {
		if json.Unmarshal(res["_meta"], &meta) != nil {
			return changed
		}
		info = meta[serverInfoMeta]
	}
	if info == nil {
		return changed
	}
	if v, _ := st.Listed(ns, pins.Server, pins.ServerInfo, map[string]json.RawMessage{"serverInfo": info}); v == pins.Shown {
		return changed
	}
	// A serverInfo is required: with no pin to serve (the pins cannot be
	// read yet), the server's stays.
	p, ok := st.Pinned(ns, pins.Server, pins.ServerInfo)["serverInfo"]
	if !ok {
		return changed
	}
	if meta == nil {
		res["serverInfo"] = p
		return true
	}
	meta[serverInfoMeta] = p
	if b, err := json.Marshal(meta); err == nil {
		res["_meta"] = b
		return true
	}
	return changed
}

// heldServerInfo is the pinned serverInfo of route's server while a change
// of it waits for an operator's approval (pin strict), nil otherwise: the
// one lock of the pins per request, and no answer read, in the usual case.
func heldServerInfo(route Route) json.RawMessage {
	pr, ok := route.(pinRoute)
	if !ok {
		return nil
	}
	st, ns := pr.pinServer()
	if st == nil || st.Blocked(ns, pins.Server, pins.ServerInfo) == "" {
		return nil
	}
	return st.Pinned(ns, pins.Server, pins.ServerInfo)["serverInfo"]
}

// pinnedMetaInfo puts info, the pinned serverInfo, in place of the one a
// result's _meta names the server by (MCP 2026-07-28 puts it in every
// result), and reports whether it changed res. A _meta that is not an
// object, or that names no server, is left as it is.
func pinnedMetaInfo(res map[string]json.RawMessage, info json.RawMessage) bool {
	var meta map[string]json.RawMessage
	if json.Unmarshal(res["_meta"], &meta) != nil || meta == nil {
		return false
	}
	if _, ok := meta[serverInfoMeta]; !ok {
		return false
	}
	meta[serverInfoMeta] = info
	b, err := json.Marshal(meta)
	if err != nil {
		return false
	}
	res["_meta"] = b
	return true
}

// pinVerdict refuses the use of an item whose definition changed and is
// not approved, or that is a tool new to its pinned set: a tools/call, a
// prompts/get, a resources/read. A tools/call on its own gets a tool error
// (a result the model reads, with isError set), which says what changed
// and how an operator approves it; a call in a batch, and the others, get
// 403.
func pinVerdict(route Route, c message.Call, batch bool) Verdict {
	var (
		kind   Kind
		name   string
		reason string
	)
	switch c.Method {
	case "tools/call":
		kind, name, reason = KindTool, c.Tool, ReasonToolChanged
	case "prompts/get":
		kind, name, reason = KindPrompt, c.Prompt, ReasonPromptChanged
	case "resources/read":
		kind, name, reason = KindResource, c.URI, ReasonResourceChanged
	default:
		return Verdict{}
	}
	pr, ok := route.(pinRoute)
	if !ok {
		return Verdict{}
	}
	st, ns, upstream := pr.pin(kind, name)
	if st == nil {
		return Verdict{}
	}
	why := st.Blocked(ns, pinKind(kind), upstream)
	if why == "" {
		return Verdict{}
	}
	if batch || kind != KindTool {
		return Refuse(http.StatusForbidden, reason, why)
	}
	return Verdict{Status: http.StatusOK, Reason: reason, Message: why, ToolError: true}
}

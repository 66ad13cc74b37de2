package edge

import (
	"encoding/json"
	"net/http"

	"github.com/Tahul/caddy-zidane-mcp/pins"
)

// ReasonToolChanged is the audit reason of a call refused because its
// tool's definition changed since it was pinned (package pins).
const ReasonToolChanged = "tool_changed"

// pinRoute is a route that pins its tools' definitions: toolPin gives the
// store, the namespace and the upstream's own name of a tool as the route
// lists it (nil store: not pinned).
type pinRoute interface {
	toolPin(tool string) (store *pins.Store, ns, name string)
}

// pinShown decides a listed tool by its pin: false withholds it. asked
// says whether the listing answers a tools/list of the request: only such
// a listing pins a tool or records a change; one taken for a listing by its
// shape (the answer to another request, which a client could have an
// upstream's tool echo) is checked against the pins and records nothing.
func pinShown(route Route, tool string, obj map[string]json.RawMessage, asked bool) bool {
	pr, ok := route.(pinRoute)
	if !ok {
		return true
	}
	st, ns, name := pr.toolPin(tool)
	if st == nil {
		return true
	}
	decide := st.Seen
	if asked {
		decide = st.Listed
	}
	v, _ := decide(ns, name, obj)
	return v == pins.Shown
}

// pinVerdict refuses a tools/call of a tool whose definition changed and
// is not approved. A call on its own gets a tool error (a result the model
// reads, with isError set), which says what changed and how an operator
// approves it; a call in a batch refuses the batch (403).
func pinVerdict(route Route, tool string, batch bool) Verdict {
	pr, ok := route.(pinRoute)
	if !ok {
		return Verdict{}
	}
	st, ns, name := pr.toolPin(tool)
	if st == nil {
		return Verdict{}
	}
	why := st.Blocked(ns, name)
	if why == "" {
		return Verdict{}
	}
	if batch {
		return Refuse(http.StatusForbidden, ReasonToolChanged, why)
	}
	return Verdict{Status: http.StatusOK, Reason: ReasonToolChanged, Message: why, ToolError: true}
}

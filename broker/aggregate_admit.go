package broker

import "github.com/modelcontextprotocol/go-sdk/mcp"

// fastAdmission is what a tools/call fast path needs of a call it takes:
// the tool's upstream, its name there, and the open upstream session the
// call goes on.
type fastAdmission struct {
	q  qualified
	up *aggUpstream
	c  *aggConn
	ir *mcp.InitializeResult
}

// admitFast is the one rule by which both tools/call fast paths (the
// 2025-11-25 one on a client's session, the 2026-07-28 one on a principal's
// session) take a call for tool on s: the tool is registered and its
// upstream waits for no login; the upstream is streamable HTTP and not a
// shared stdio process; s holds an open upstream session to it whose
// answers broke no limit (the gateway dropped such a session, and go-sdk's
// path tells the caller); and that session speaks the fast path's protocol
// generation (modern: 2026-07-28; otherwise a session id and 2025-11-25 or
// older). Anything else is go-sdk's, which opens, reopens or refuses.
// Both paths once carried their own copy of these checks, and the copies
// drifted.
func (a *Aggregate) admitFast(s *aggSession, tool string, modern bool) (fastAdmission, bool) {
	if s == nil {
		return fastAdmission{}, false
	}
	a.mu.Lock()
	q, ok := a.tools[tool]
	a.mu.Unlock()
	if !ok || a.waitingForLogin(tool) != nil {
		return fastAdmission{}, false
	}
	up := a.byName[q.server]
	if up == nil || up.shared || up.cfg.Transport != TransportHTTP {
		return fastAdmission{}, false
	}
	// The upstream session must already be open: opening one is the go-sdk
	// path's business, and so is a failure to open it.
	s.mu.Lock()
	c := s.conns[up.cfg.Name]
	closed := s.closed
	s.mu.Unlock()
	if c == nil || closed {
		return fastAdmission{}, false
	}
	select {
	case <-c.done:
	default:
		return fastAdmission{}, false
	}
	if c.err != nil || c.cs == nil || c.overLimit.Load() != nil {
		return fastAdmission{}, false
	}
	ir := c.cs.InitializeResult()
	switch {
	case ir == nil:
		return fastAdmission{}, false
	case modern && ir.ProtocolVersion != protocolModern:
		return fastAdmission{}, false
	case !modern && (c.cs.ID() == "" || ir.ProtocolVersion > aggProtocolVersion):
		return fastAdmission{}, false
	}
	return fastAdmission{q: q, up: up, c: c, ir: ir}, true
}

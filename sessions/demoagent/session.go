package demoagent

import (
	"strings"

	acp "github.com/coder/acp-go-sdk"
)

// maxHistory bounds the exchanges a session remembers for session/load.
const maxHistory = 100

// session is what the demo agent remembers of one ACP session. The fields
// after id are guarded by agent.mu.
type session struct {
	id  acp.SessionId
	cwd string
	// mcpServers are recorded as given; the demo agent does not connect to
	// them (see mcp.go).
	mcpServers []acp.McpServer
	titled     bool
	history    []exchange
	// guidance is steering received and not yet acted on; wake tells a
	// sleeping turn that some arrived.
	guidance []string
	wake     chan struct{}
}

// exchange is one finished turn, replayed by session/load.
type exchange struct {
	prompt, answer string
}

func newSession(id acp.SessionId, cwd string, mcpServers []acp.McpServer) *session {
	return &session{id: id, cwd: cwd, mcpServers: mcpServers, wake: make(chan struct{}, 1)}
}

// steer records guidance and wakes a sleeping turn.
func (a *agent) steer(s *session, text string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	s.guidance = append(s.guidance, text)
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

func (a *agent) hasGuidance(s *session) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(s.guidance) > 0
}

// takeGuidance returns the pending guidance, joined, and forgets it.
func (a *agent) takeGuidance(s *session) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	g := strings.Join(s.guidance, "; ")
	s.guidance = nil
	select {
	case <-s.wake:
	default:
	}
	return g
}

func (a *agent) remember(s *session, prompt, answer string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	s.history = append(s.history, exchange{prompt: prompt, answer: answer})
	if len(s.history) > maxHistory {
		s.history = s.history[len(s.history)-maxHistory:]
	}
}

// claimTitle reports whether this is the session's first prompt, which
// names the session.
func (a *agent) claimTitle(s *session) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	first := !s.titled
	s.titled = true
	return first
}

func (a *agent) cwdOf(s *session) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return s.cwd
}

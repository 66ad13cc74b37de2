package demoagent

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	acp "github.com/coder/acp-go-sdk"
)

// Name is the agentInfo name the demo agent reports in initialize.
const Name = "zidane-demo-agent"

// Version is the agentInfo version the demo agent reports in initialize.
const Version = "1"

// agent implements the agent side of ACP for the demo agent.
type agent struct {
	conn *acp.AgentSideConnection
	opts Options
	exit func(e *ExitError, lastLine []byte)

	mu         sync.Mutex
	sessions   map[acp.SessionId]*session
	clientCaps acp.ClientCapabilities
}

var (
	_ acp.Agent                  = (*agent)(nil)
	_ acp.AgentLoader            = (*agent)(nil)
	_ acp.ExtensionMethodHandler = (*agent)(nil)
)

func newAgent(opts Options, exit func(*ExitError, []byte)) *agent {
	return &agent{opts: opts, exit: exit, sessions: make(map[acp.SessionId]*session)}
}

func (a *agent) Initialize(_ context.Context, p acp.InitializeRequest) (acp.InitializeResponse, error) {
	a.mu.Lock()
	a.clientCaps = p.ClientCapabilities
	a.mu.Unlock()
	resp := acp.InitializeResponse{
		ProtocolVersion: acp.ProtocolVersionNumber,
		AgentInfo:       &acp.Implementation{Name: Name, Title: acp.Ptr("Zidane demo agent (no model; for demos and tests)"), Version: Version},
		AgentCapabilities: acp.AgentCapabilities{
			LoadSession: true,
			// The demo agent connects to streamable HTTP MCP servers itself
			// (the "mcp: tools" and "mcp: call" prompts).
			McpCapabilities: acp.McpCapabilities{Http: true},
		},
	}
	if !a.opts.DisableSteering {
		resp.Meta = map[string]any{"steering": map[string]any{"supported": true}}
	}
	return resp, nil
}

func (a *agent) Authenticate(context.Context, acp.AuthenticateRequest) (acp.AuthenticateResponse, error) {
	return acp.AuthenticateResponse{}, nil
}

func (a *agent) NewSession(_ context.Context, p acp.NewSessionRequest) (acp.NewSessionResponse, error) {
	if err := checkCwd(p.Cwd); err != nil {
		return acp.NewSessionResponse{}, err
	}
	id := acp.SessionId("demo-" + rand.Text())
	a.mu.Lock()
	a.sessions[id] = newSession(id, p.Cwd, p.McpServers)
	a.mu.Unlock()
	a.opts.Logger.Info("session/new", "session", id, "cwd", p.Cwd, "mcpServers", len(p.McpServers))
	return acp.NewSessionResponse{SessionId: id}, nil
}

// LoadSession accepts any id: a known session keeps its memory and replays
// it; an unknown one (the agent process was restarted) starts empty.
func (a *agent) LoadSession(ctx context.Context, p acp.LoadSessionRequest) (acp.LoadSessionResponse, error) {
	if err := checkCwd(p.Cwd); err != nil {
		return acp.LoadSessionResponse{}, err
	}
	if p.SessionId == "" {
		return acp.LoadSessionResponse{}, acp.NewInvalidParams(map[string]any{"error": "sessionId is required"})
	}
	a.mu.Lock()
	s, ok := a.sessions[p.SessionId]
	if !ok {
		s = newSession(p.SessionId, p.Cwd, p.McpServers)
		a.sessions[p.SessionId] = s
	}
	s.cwd, s.mcpServers = p.Cwd, p.McpServers
	history := append([]exchange(nil), s.history...)
	a.mu.Unlock()
	a.opts.Logger.Info("session/load", "session", p.SessionId, "known", ok, "replay", len(history))
	for _, x := range history {
		for _, u := range []acp.SessionUpdate{acp.UpdateUserMessageText(x.prompt), acp.UpdateAgentMessageText(x.answer)} {
			if err := a.conn.SessionUpdate(ctx, acp.SessionNotification{SessionId: p.SessionId, Update: u}); err != nil {
				return acp.LoadSessionResponse{}, err
			}
		}
	}
	return acp.LoadSessionResponse{}, nil
}

// Cancel has nothing to do: the SDK cancels the ctx of the session's running
// Prompt before calling it.
func (a *agent) Cancel(_ context.Context, p acp.CancelNotification) error {
	a.opts.Logger.Info("session/cancel", "session", p.SessionId)
	return nil
}

func (a *agent) CloseSession(context.Context, acp.CloseSessionRequest) (acp.CloseSessionResponse, error) {
	return acp.CloseSessionResponse{}, acp.NewMethodNotFound(acp.AgentMethodSessionClose)
}

func (a *agent) ListSessions(context.Context, acp.ListSessionsRequest) (acp.ListSessionsResponse, error) {
	return acp.ListSessionsResponse{}, acp.NewMethodNotFound(acp.AgentMethodSessionList)
}

func (a *agent) ResumeSession(context.Context, acp.ResumeSessionRequest) (acp.ResumeSessionResponse, error) {
	return acp.ResumeSessionResponse{}, acp.NewMethodNotFound(acp.AgentMethodSessionResume)
}

func (a *agent) SetSessionConfigOption(context.Context, acp.SetSessionConfigOptionRequest) (acp.SetSessionConfigOptionResponse, error) {
	return acp.SetSessionConfigOptionResponse{}, acp.NewMethodNotFound(acp.AgentMethodSessionSetConfigOption)
}

func (a *agent) SetSessionMode(context.Context, acp.SetSessionModeRequest) (acp.SetSessionModeResponse, error) {
	return acp.SetSessionModeResponse{}, acp.NewMethodNotFound(acp.AgentMethodSessionSetMode)
}

func (a *agent) session(id acp.SessionId) (*session, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	s, ok := a.sessions[id]
	if !ok {
		return nil, acp.NewInvalidParams(map[string]any{"error": fmt.Sprintf("unknown session %q: call session/new or session/load first", id)})
	}
	return s, nil
}

func (a *agent) canElicit() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	e := a.clientCaps.Elicitation
	return e != nil && e.Form != nil
}

func checkCwd(cwd string) error {
	if !filepath.IsAbs(cwd) {
		return acp.NewInvalidParams(map[string]any{"error": fmt.Sprintf("cwd %q must be an absolute path", cwd)})
	}
	if fi, err := os.Stat(cwd); err != nil || !fi.IsDir() {
		return acp.NewInvalidParams(map[string]any{"error": fmt.Sprintf("cwd %q is not a directory", cwd)})
	}
	return nil
}

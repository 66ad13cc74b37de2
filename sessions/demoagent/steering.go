package demoagent

import (
	"context"
	"encoding/json"
	"strings"

	acp "github.com/coder/acp-go-sdk"
)

// SteeringMethod is the ACP extension method that injects guidance into a
// session's running turn.
const SteeringMethod = "_session/steering"

// SteeringParams are the params of SteeringMethod: the guidance is Text, or
// the text blocks of Prompt when Text is empty.
type SteeringParams struct {
	SessionId acp.SessionId      `json:"sessionId"`
	Text      string             `json:"text,omitempty"`
	Prompt    []acp.ContentBlock `json:"prompt,omitempty"`
}

// SteeringResult answers a SteeringMethod request.
type SteeringResult struct {
	Accepted bool `json:"accepted"`
}

// HandleExtensionMethod serves the extension methods (names starting with
// "_"). The SDK calls it on its own goroutine for a request and on the
// notification goroutine for a notification, so it never blocks.
func (a *agent) HandleExtensionMethod(_ context.Context, method string, params json.RawMessage) (any, error) {
	if method != SteeringMethod || a.opts.DisableSteering {
		return nil, acp.NewMethodNotFound(method)
	}
	var p SteeringParams
	if err := json.Unmarshal(params, &p); err != nil {
		return nil, acp.NewInvalidParams(map[string]any{"error": err.Error()})
	}
	s, err := a.session(p.SessionId)
	if err != nil {
		return nil, err
	}
	text := strings.TrimSpace(p.Text)
	if text == "" {
		text = promptText(p.Prompt)
	}
	if text == "" {
		return nil, acp.NewInvalidParams(map[string]any{"error": "steering needs text or prompt content"})
	}
	a.steer(s, text)
	a.opts.Logger.Info("steering", "session", s.id, "text", text)
	return SteeringResult{Accepted: true}, nil
}

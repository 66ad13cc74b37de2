package demoagent

import (
	"context"
	"fmt"
	"strings"
	"unicode/utf8"

	acp "github.com/coder/acp-go-sdk"

	rpc "github.com/Tahul/caddy-zidane-mcp/message"
)

const helpText = `I am the demo agent: I run no model, only these prompts.
- anything else: I echo it
- ask: <question>: I ask you through elicitation/create
- approve: <command>: I ask permission to run <command> (I never run it)
- plan: <plan>: I ask you to approve a plan (switch_mode)
- sleep: <duration>: I hold the turn; cancel or steer me
- fail: the prompt fails with an internal error
- crash: I exit with status 3 mid-turn
- garbage: I write a line that is not JSON, then exit with status 4
- pwd: I say my working directory
- mcp: I list the MCP servers I was given
- mcp: tools <server>: I connect to that (HTTP) server and list its tools
- mcp: call <server> <tool> [<json arguments>]: I call one of its tools
- mcp: version <YYYY-MM-DD> tools|call ...: the same at that MCP protocol version`

// turn is one session/prompt being served.
type turn struct {
	a *agent
	s *session
	// ctx ends on session/cancel (the SDK cancels it) or disconnect.
	ctx context.Context
	// out outlives session/cancel: updates sent after a cancel, and requests
	// whose answer must be awaited even then (a client answers pending
	// permission requests "cancelled").
	out    context.Context
	answer strings.Builder
}

func (a *agent) Prompt(ctx context.Context, p acp.PromptRequest) (acp.PromptResponse, error) {
	s, err := a.session(p.SessionId)
	if err != nil {
		return acp.PromptResponse{}, err
	}
	text := promptText(p.Prompt)
	t := &turn{a: a, s: s, ctx: ctx, out: context.WithoutCancel(ctx)}
	if a.claimTitle(s) {
		if err := t.update(acp.SessionUpdate{SessionInfoUpdate: &acp.SessionSessionInfoUpdate{Title: acp.Ptr(title(text))}}); err != nil {
			return acp.PromptResponse{}, err
		}
	}
	stop, err := t.run(text)
	if err == nil && stop == acp.StopReasonEndTurn {
		if g := a.takeGuidance(s); g != "" {
			err = t.say("\nSteered: " + g)
		}
	}
	a.remember(s, text, t.answer.String())
	a.opts.Logger.Info("session/prompt", "session", s.id, "stopReason", stop, "err", err)
	if err != nil {
		return acp.PromptResponse{}, err
	}
	return acp.PromptResponse{StopReason: stop}, nil
}

// run plays the script that the prompt names.
func (t *turn) run(text string) (acp.StopReason, error) {
	verb, arg, hasArg := strings.Cut(text, ":")
	verb = strings.ToLower(strings.TrimSpace(verb))
	arg = strings.TrimSpace(arg)
	if hasArg {
		switch verb {
		case "ask":
			return t.ask(arg)
		case "approve":
			return t.approve(arg)
		case "plan":
			return t.plan(arg)
		case "sleep":
			return t.sleep(arg)
		case "mcp":
			return t.mcp(arg)
		}
	} else {
		switch verb {
		case "fail":
			return "", &acp.RequestError{Code: rpc.CodeInternalError, Message: `demo agent: this turn fails on purpose (prompt "fail")`}
		case "crash":
			return t.crash()
		case "garbage":
			t.a.exit(&ExitError{Code: ExitGarbage, Reason: `prompt "garbage"`}, []byte("the demo agent wrote this line, which is not JSON-RPC, on purpose\n"))
			return "", errExited
		case "pwd":
			return acp.StopReasonEndTurn, t.say(t.a.cwdOf(t.s))
		case "mcp":
			return acp.StopReasonEndTurn, t.say(describeMCPServers(t.a.mcpServersOf(t.s)))
		case "help":
			return acp.StopReasonEndTurn, t.say(helpText)
		}
	}
	return t.echo(text)
}

// echo streams "You said: <prompt>" in a few chunks.
func (t *turn) echo(text string) (acp.StopReason, error) {
	if err := t.say("You said: "); err != nil {
		return "", err
	}
	for _, chunk := range chunks(text, 3) {
		if chunk == "" {
			continue
		}
		if err := t.say(chunk); err != nil {
			return "", err
		}
	}
	return acp.StopReasonEndTurn, nil
}

func (t *turn) crash() (acp.StopReason, error) {
	if err := t.say(fmt.Sprintf("Crashing on purpose (exit status %d).", ExitCrash)); err != nil {
		return "", err
	}
	t.a.exit(&ExitError{Code: ExitCrash, Reason: `prompt "crash"`}, nil)
	return "", errExited
}

// say streams one agent_message_chunk and adds it to the turn's answer.
func (t *turn) say(text string) error {
	t.answer.WriteString(text)
	return t.update(acp.UpdateAgentMessageText(text))
}

func (t *turn) update(u acp.SessionUpdate) error {
	return t.a.conn.SessionUpdate(t.out, acp.SessionNotification{SessionId: t.s.id, Update: u})
}

// promptText joins the text blocks of a prompt; other blocks are ignored.
func promptText(blocks []acp.ContentBlock) string {
	var parts []string
	for _, b := range blocks {
		if b.Text != nil {
			parts = append(parts, b.Text.Text)
		}
	}
	return strings.TrimSpace(strings.Join(parts, "\n"))
}

// chunks splits s into at most n pieces at word boundaries; joined, they
// are s.
func chunks(s string, n int) []string {
	words := strings.SplitAfter(s, " ")
	per := (len(words) + n - 1) / n
	var out []string
	for len(words) > 0 {
		k := min(per, len(words))
		out = append(out, strings.Join(words[:k], ""))
		words = words[k:]
	}
	return out
}

// title names a session after the first line of its first prompt.
func title(prompt string) string {
	line, _, _ := strings.Cut(prompt, "\n")
	if line == "" {
		return "Demo session"
	}
	const maxRunes = 60
	if utf8.RuneCountInString(line) <= maxRunes {
		return line
	}
	r := []rune(line)
	return string(r[:maxRunes-1]) + "…"
}

package caddymodule

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/Tahul/caddy-zidane-mcp/sessions/demoagent"
)

func init() {
	zidaneSubcommands = append(zidaneSubcommands, demoAgentCommand)
}

func demoAgentCommand() *cobra.Command {
	return &cobra.Command{
		// The gateway runs it, not a person: left out of the help.
		Hidden: true,
		Use:    "demo-agent",
		Short:  "Serves the built-in demo ACP agent on stdio (demos and tests only)",
		Long: `
Serves the demo agent: an Agent Client Protocol agent, JSON-RPC over stdin and
stdout, that runs no model and needs no API key. It exists so that the quick
start and the tests work on a machine with no LLM. Its prompts script each
turn: "help" lists them (ask:, approve:, plan:, sleep:, fail, crash, ...).

Stdout carries the protocol only; logs go to stderr. Set
ZIDANE_DEMO_AGENT_STEERING=0 to switch off the _session/steering extension.`,
		Args: cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			code := demoagent.Main(ctx)
			stop()
			if code != 0 {
				os.Exit(code)
			}
			return nil
		},
	}
}

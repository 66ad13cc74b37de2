package caddymodule

import (
	"os"

	"github.com/spf13/cobra"

	"github.com/Tahul/caddy-zidane-mcp/sessions/confine"
)

func init() {
	zidaneSubcommands = append(zidaneSubcommands, confineCommand)
}

// confineCommand is `caddy zidane confine`: the sessions engine launches
// every confined agent (and the git that makes its worktree) through it,
// so that the sandbox is in place before the agent's first instruction.
func confineCommand() *cobra.Command {
	return &cobra.Command{
		// The gateway runs it, not a person: left out of the help.
		Hidden: true,
		Use:    "confine [--read PATH]… [--write PATH]… [--deny PATH]… [--connect PORT]… [--connect-any] [--best-effort] -- COMMAND [ARGS…]",
		Short:  "Runs a command in the agents' sandbox (the gateway launches agents with it)",
		Long: `
Confines this process with Landlock (reads and executes only under the
system directories, the command's directories and --read; writes only under
--write; TCP connect only to --connect ports; nothing under --deny), a
seccomp filter (no Multipath TCP, no io_uring) and, as root, no
capabilities, then replaces it with COMMAND. It exits with status 126 and a
message on stderr when the sandbox cannot be applied; COMMAND has not run
then. --best-effort confines as far as the kernel allows instead.`,
		DisableFlagParsing: true,
		RunE: func(_ *cobra.Command, args []string) error {
			os.Exit(confine.Main(args))
			return nil
		},
	}
}

package mcpendpoint

import (
	"testing"

	"github.com/Tahul/caddy-zidane-mcp/policy"
)

// Each verb of policy's table takes its arguments here, and no argument
// list names a verb the table does not have: a verb added to one and not
// the other would be refused by its own tool, or checked by no scope.
func TestEveryVerbHasItsArguments(t *testing.T) {
	for tool, args := range map[string]map[string][]string{"sessions": sessionsArgs, "interactions": interactionsArgs} {
		names := policy.VerbNames(tool)
		if len(names) != len(args) {
			t.Errorf("%s: the table has %v, the arguments name %d verbs", tool, names, len(args))
		}
		for _, name := range names {
			if len(args[name]) == 0 {
				t.Errorf("%s %s takes no arguments here", tool, name)
			}
		}
	}
}

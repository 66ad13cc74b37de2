package caddymodule

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"text/tabwriter"
	"time"

	"github.com/caddyserver/caddy/v2"
	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/spf13/cobra"

	"github.com/Tahul/caddy-zidane-mcp/pins"
)

func init() {
	zidaneSubcommands = append(zidaneSubcommands, toolsCommand)
}

// toolsCommand is `caddy zidane tools list|diff|approve|reject`: the pinned
// tool definitions of a running server (package pins).
func toolsCommand() *cobra.Command {
	c := &cobra.Command{
		Use:   "tools",
		Short: "Shows and decides the pinned tool definitions of upstream MCP servers",
		Long: `
The gateway pins each upstream tool's definition (name, title, description,
schemas, annotations) the first time it lists it. A later listing that
differs is a change: with pin strict the tool is withheld and its calls
refused until an operator approves the change here. UPSTREAM is the
upstream's name, or guard:<resource> for a guarded site (as list shows).`,
	}
	c.AddCommand(toolsListCommand(), toolsDiffCommand(), toolsDecideCommand("approve")(), toolsDecideCommand("reject")())
	return c
}

func toolsPath(parts ...string) string {
	p := "/zidane/tools"
	for _, s := range parts {
		p += "/" + url.PathEscape(s)
	}
	return p
}

func toolsListCommand() *cobra.Command {
	c := &cobra.Command{
		Use:   "list [UPSTREAM] [--json]",
		Short: "Lists the pinned tools, and the changes waiting for a decision",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return caddycmd.WrapCommandFuncForCobra(func(fl caddycmd.Flags) (int, error) {
				admin, err := runningAdmin(fl, "pins are read from a running server")
				if err != nil {
					return caddy.ExitCodeFailedStartup, err
				}
				var list []pins.Namespace
				if err := adminJSON(admin, http.MethodGet, toolsPath(args...), nil, &list); err != nil {
					return caddy.ExitCodeFailedStartup, err
				}
				if fl.Bool("json") {
					return caddy.ExitCodeSuccess, printJSON(list)
				}
				tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "UPSTREAM\tPIN\tTOOL\tSTATE\tDIGEST\tSINCE")
				for _, ns := range list {
					if !ns.Loaded && ns.Mode != "off" {
						fmt.Fprintf(tw, "%s\t%s\t-\tpins not read yet\t-\t-\n", ns.Name, ns.Mode)
					}
					for _, t := range ns.Tools {
						state, digest, since := "pinned", t.Digest, t.PinnedAt
						if t.Approved {
							state = "approved"
						}
						if p := t.Pending; p != nil {
							state, digest, since = "changed: "+fmt.Sprint(p.Fields), p.Digest, p.Seen
							if p.Rejected {
								state = "rejected: " + fmt.Sprint(p.Fields)
							}
						}
						fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", ns.Name, ns.Mode, t.Tool, state, digest, since.Local().Format(time.DateTime))
					}
				}
				return caddy.ExitCodeSuccess, tw.Flush()
			})(cmd, args)
		},
	}
	c.Flags().Bool("json", false, "Print JSON")
	adminFlags(c)
	return c
}

func toolsDiffCommand() *cobra.Command {
	c := &cobra.Command{
		Use:   "diff UPSTREAM TOOL [--json]",
		Short: "Shows a tool's pending change, field by field: the pinned value, then the new one",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return caddycmd.WrapCommandFuncForCobra(func(fl caddycmd.Flags) (int, error) {
				admin, err := runningAdmin(fl, "pins are read from a running server")
				if err != nil {
					return caddy.ExitCodeFailedStartup, err
				}
				var d pins.ToolDiff
				if err := adminJSON(admin, http.MethodGet, toolsPath(args[0], args[1]), nil, &d); err != nil {
					return caddy.ExitCodeFailedStartup, err
				}
				if fl.Bool("json") {
					return caddy.ExitCodeSuccess, printJSON(d)
				}
				fmt.Printf("tool %q of %s\npinned  %s\npending %s", d.Tool, d.Namespace, d.Pinned, d.Pending)
				if d.Rejected {
					fmt.Print(" (rejected)")
				}
				fmt.Println()
				for _, f := range d.Fields {
					fmt.Printf("\n%s\n- %s\n+ %s\n", f.Field, orAbsent(f.Old), orAbsent(f.New))
				}
				fmt.Printf("\nTo accept it: caddy zidane tools approve %s %s --digest %s\n", d.Namespace, d.Tool, d.Pending)
				return caddy.ExitCodeSuccess, nil
			})(cmd, args)
		},
	}
	c.Flags().Bool("json", false, "Print JSON")
	adminFlags(c)
	return c
}

func orAbsent(b json.RawMessage) string {
	if b == nil {
		return "(absent)"
	}
	return string(b)
}

func toolsDecideCommand(action string) func() *cobra.Command {
	return func() *cobra.Command {
		short := "Approves a tool's pending change: the new definition becomes the pin"
		if action == "reject" {
			short = "Rejects a tool's pending change: the tool stays withheld (pin strict) while the upstream lists it"
		}
		c := &cobra.Command{
			Use:   action + " UPSTREAM TOOL --digest sha256:…",
			Short: short,
			Args:  cobra.ExactArgs(2),
			RunE: func(cmd *cobra.Command, args []string) error {
				return caddycmd.WrapCommandFuncForCobra(func(fl caddycmd.Flags) (int, error) {
					admin, err := runningAdmin(fl, "pins are decided on a running server")
					if err != nil {
						return caddy.ExitCodeFailedStartup, err
					}
					digest := fl.String("digest")
					if action == "approve" && digest == "" {
						// Whatever is pending when the command runs may be a
						// change that came after the diff the operator read.
						return caddy.ExitCodeFailedStartup, fmt.Errorf("approve needs --digest: the pending digest that `caddy zidane tools diff %s %s` shows, so that only the change you read is approved", args[0], args[1])
					}
					body, _ := json.Marshal(map[string]string{"digest": digest})
					var res struct {
						Outcome string   `json:"outcome"`
						New     string   `json:"new_digest"`
						Fields  []string `json:"changed_fields"`
					}
					if err := adminJSON(admin, http.MethodPost, toolsPath(args[0], args[1], action), body, &res); err != nil {
						return caddy.ExitCodeFailedStartup, err
					}
					fmt.Printf("Tool %q of %s: %s %s.\n", args[1], args[0], res.Outcome, res.New)
					return caddy.ExitCodeSuccess, nil
				})(cmd, args)
			},
		}
		usage := "The pending digest to decide on, as diff shows it"
		if action == "reject" {
			usage += " (default: whichever is pending)"
		}
		c.Flags().String("digest", "", usage)
		adminFlags(c)
		return c
	}
}

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
// definitions of a running server (package pins).
func toolsCommand() *cobra.Command {
	c := &cobra.Command{
		Use:   "tools",
		Short: "Shows and decides the pinned definitions of upstream MCP servers",
		Long: `
The gateway pins every member of each upstream item a model reads (tools,
prompts, resources, resource templates, and the server's instructions and
serverInfo) the first time it lists it. A later listing that differs is a
change, and a tool listed after the upstream's tools were listed whole is
new (new_tools hold): with pin strict either is withheld and its use
refused until an operator approves it here. UPSTREAM is the upstream's
name, aggregate:<upstream> on the aggregated route, or guard:<resource>
for a guarded site (as list shows). NAME is a tool's name unless --kind
says otherwise: a prompt's name, a resource's URI, a resource template's
URI template, or instructions or serverInfo (--kind server).`,
	}
	c.AddCommand(toolsListCommand(), toolsDiffCommand(), toolsDecideCommand("approve")(), toolsDecideCommand("reject")())
	return c
}

// toolsPath is the admin path of parts, with the item's kind.
func toolsPath(kind string, parts ...string) string {
	p := "/zidane/tools"
	for _, s := range parts {
		p += "/" + url.PathEscape(s)
	}
	if kind != "" && kind != "tool" {
		p += "?kind=" + url.QueryEscape(kind)
	}
	return p
}

// kindFlag adds --kind to c.
func kindFlag(c *cobra.Command) {
	c.Flags().String("kind", "tool", "The kind of item: tool, prompt, resource, resource_template or server")
}

// readKind is the --kind flag, checked.
func readKind(fl caddycmd.Flags) (string, error) {
	k, err := pins.ParseKind(fl.String("kind"))
	if err != nil {
		return "", err
	}
	return k.String(), nil
}

func toolsListCommand() *cobra.Command {
	c := &cobra.Command{
		Use:   "list [UPSTREAM] [--json]",
		Short: "Lists the pinned items, and the changes waiting for a decision",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return plainCommand(func(fl caddycmd.Flags) (int, error) {
				admin, err := runningAdmin(fl, "pins are read from a running server")
				if err != nil {
					return caddy.ExitCodeFailedStartup, err
				}
				var list []pins.Namespace
				if err := adminJSON(admin, http.MethodGet, toolsPath("", args...), nil, &list); err != nil {
					return caddy.ExitCodeFailedStartup, err
				}
				if fl.Bool("json") {
					return caddy.ExitCodeSuccess, printJSON(list)
				}
				tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "UPSTREAM\tPIN\tKIND\tNAME\tSTATE\tDIGEST\tSINCE")
				for _, ns := range list {
					if !ns.Loaded && ns.Mode != "off" {
						fmt.Fprintf(tw, "%s\t%s\t-\t-\tpins not read yet\t-\t-\n", ns.Name, ns.Mode)
					}
					for _, t := range ns.Items {
						state, digest, since := "pinned", t.Digest, t.PinnedAt
						if t.Approved {
							state = "approved"
						}
						if p := t.Pending; p != nil {
							state, digest, since = "changed: "+fmt.Sprint(p.Fields), p.Digest, p.Seen
							if p.New {
								state = "new"
							}
							if p.Rejected {
								state = "rejected: " + state
							}
						}
						fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", ns.Name, ns.Mode, t.Kind, t.Name, state, digest, since.Local().Format(time.DateTime))
					}
				}
				return caddy.ExitCodeSuccess, tw.Flush()
			})(cmd, args)
		},
	}
	c.Flags().Bool("json", false, "Print the pins as a JSON array of upstreams, as the admin API answers (for scripts)")
	adminFlags(c)
	return c
}

func toolsDiffCommand() *cobra.Command {
	c := &cobra.Command{
		Use:   "diff UPSTREAM NAME [--kind KIND] [--json]",
		Short: "Shows an item's pending change, member by member: the pinned value, then the new one",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return plainCommand(func(fl caddycmd.Flags) (int, error) {
				kind, err := readKind(fl)
				if err != nil {
					return caddy.ExitCodeFailedStartup, err
				}
				admin, err := runningAdmin(fl, "pins are read from a running server")
				if err != nil {
					return caddy.ExitCodeFailedStartup, err
				}
				var d pins.ItemDiff
				if err := adminJSON(admin, http.MethodGet, toolsPath(kind, args[0], args[1]), nil, &d); err != nil {
					return caddy.ExitCodeFailedStartup, err
				}
				if fl.Bool("json") {
					return caddy.ExitCodeSuccess, printJSON(d)
				}
				fmt.Printf("%s %q of %s\npinned  %s\npending %s", d.Kind, d.Name, d.Namespace, pinnedOrNew(d.Pinned), d.Pending)
				if d.Rejected {
					fmt.Print(" (rejected)")
				}
				fmt.Println()
				for _, f := range d.Fields {
					fmt.Printf("\n%s\n- %s\n+ %s\n", f.Field, orAbsent(f.Old), orAbsent(f.New))
				}
				flag := ""
				if kind != "tool" {
					flag = " --kind " + kind
				}
				fmt.Printf("\nTo accept it: caddy zidane tools approve %s %s%s --digest %s\n", d.Namespace, d.Name, flag, d.Pending)
				return caddy.ExitCodeSuccess, nil
			})(cmd, args)
		},
	}
	c.Flags().Bool("json", false, "Print the change as one JSON object, as the admin API answers: kind, name, pinned and pending digests, each member's old and new value (for scripts)")
	kindFlag(c)
	adminFlags(c)
	return c
}

func orAbsent(b json.RawMessage) string {
	if b == nil {
		return "(absent)"
	}
	return string(b)
}

func pinnedOrNew(digest string) string {
	if digest == "" {
		return "(none: new since the upstream's tools were pinned)"
	}
	return digest
}

func toolsDecideCommand(action string) func() *cobra.Command {
	return func() *cobra.Command {
		short := "Approves an item's pending change: the new definition becomes the pin"
		if action == "reject" {
			short = "Rejects an item's pending change: the item stays withheld (pin strict) while the upstream lists it"
		}
		c := &cobra.Command{
			Use:   action + " UPSTREAM NAME [--kind KIND] --digest sha256:…",
			Short: short,
			Args:  cobra.ExactArgs(2),
			RunE: func(cmd *cobra.Command, args []string) error {
				return plainCommand(func(fl caddycmd.Flags) (int, error) {
					kind, err := readKind(fl)
					if err != nil {
						return caddy.ExitCodeFailedStartup, err
					}
					admin, err := runningAdmin(fl, "pins are decided on a running server")
					if err != nil {
						return caddy.ExitCodeFailedStartup, err
					}
					digest := fl.String("digest")
					if action == "approve" && digest == "" {
						// Whatever is pending when the command runs may be a
						// change that came after the diff the operator read.
						flag := ""
						if kind != "tool" {
							flag = " --kind " + kind
						}
						return caddy.ExitCodeFailedStartup, fmt.Errorf("approve needs --digest: the pending digest that `caddy zidane tools diff %s %s%s` shows, so that only the change you read is approved", args[0], args[1], flag)
					}
					body, _ := json.Marshal(map[string]string{"digest": digest})
					var res struct {
						Outcome string   `json:"outcome"`
						New     string   `json:"new_digest"`
						Fields  []string `json:"changed_fields"`
					}
					if err := adminJSON(admin, http.MethodPost, toolsPath(kind, args[0], args[1], action), body, &res); err != nil {
						return caddy.ExitCodeFailedStartup, err
					}
					fmt.Printf("%s %q of %s: %s %s.\n", kind, args[1], args[0], res.Outcome, res.New)
					return caddy.ExitCodeSuccess, nil
				})(cmd, args)
			},
		}
		usage := "The pending digest to decide on, as diff shows it"
		if action == "reject" {
			usage += " (default: whichever is pending)"
		}
		c.Flags().String("digest", "", usage)
		kindFlag(c)
		adminFlags(c)
		return c
	}
}

package caddymodule

import (
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/caddyserver/caddy/v2"
	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/spf13/cobra"

	"github.com/Tahul/caddy-zidane-mcp/approvals"
)

func init() {
	zidaneSubcommands = append(zidaneSubcommands, approvalsCommand)
}

// operatorAnswerer is who answers through the admin API: the operator,
// whose name no owner id can take (owners are token owners, jwt:<sub>
// and signed-in people, none with parentheses), so that the rule against
// answering one's own call never matches it.
var operatorAnswerer = approvals.Answerer{Owner: "(operator)", Credential: "(admin key)"}

// handleApprovals answers the calls that approve rules hold:
//
//	GET  /zidane/approvals -> {"approvals": […]}: the pending ones, every site
//	POST /zidane/approvals/<id>/approve, /deny -> the approval as answered
//
// The operator may answer any approval; the first answer wins.
func (a *adminAPI) handleApprovals(w http.ResponseWriter, r *http.Request) error {
	app := liveApp()
	if app == nil || app.approvals == nil {
		return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: errors.New("no zidane app is running")}
	}
	rest := strings.Trim(strings.TrimPrefix(r.URL.Path, "/zidane/approvals"), "/")
	if rest == "" && r.Method == http.MethodGet {
		list, err := app.approvals.List(r.Context(), func(approvals.Approval) bool { return true })
		if err != nil {
			return caddy.APIError{HTTPStatus: http.StatusServiceUnavailable, Err: err}
		}
		if list == nil {
			list = []approvals.Approval{}
		}
		return writeJSON(w, http.StatusOK, map[string]any{"approvals": list})
	}
	id, action, ok := strings.Cut(rest, "/")
	if !ok || r.Method != http.MethodPost || (action != "approve" && action != "deny") || strings.Contains(action, "/") {
		return caddy.APIError{HTTPStatus: http.StatusMethodNotAllowed,
			Err: errors.New("use GET /zidane/approvals, or POST /zidane/approvals/<id>/approve or /deny")}
	}
	got, err := app.approvals.Answer(r.Context(), id, operatorAnswerer, action == "approve", func(approvals.Approval) bool { return true })
	switch {
	case errors.Is(err, approvals.ErrUnknown):
		return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: err}
	case errors.Is(err, approvals.ErrAnswered), errors.Is(err, approvals.ErrExpired):
		return caddy.APIError{HTTPStatus: http.StatusConflict, Err: fmt.Errorf("%s: %w (%s)", id, err, got.State)}
	case err != nil:
		return caddy.APIError{HTTPStatus: http.StatusServiceUnavailable, Err: err}
	}
	return writeJSON(w, http.StatusOK, got)
}

// approvalsCommand is `caddy zidane approvals list|approve|deny`.
func approvalsCommand() *cobra.Command {
	c := &cobra.Command{
		Use:   "approvals list|approve|deny",
		Short: "Lists, approves or denies the calls that approve rules hold",
	}
	list := &cobra.Command{
		Use:   "list [--json]",
		Short: "Lists the calls awaiting approval: id, site, rule, caller, tool and arguments",
		Args:  cobra.NoArgs,
		RunE: plainCommand(func(fl caddycmd.Flags) (int, error) {
			admin, err := runningAdmin(fl, "approvals are read through the running server")
			if err != nil {
				return caddy.ExitCodeFailedStartup, err
			}
			var res struct {
				Approvals []approvals.Approval `json:"approvals"`
			}
			if err := adminJSON(admin, http.MethodGet, "/zidane/approvals", nil, &res); err != nil {
				return caddy.ExitCodeFailedStartup, err
			}
			if fl.Bool("json") {
				return caddy.ExitCodeSuccess, printJSON(res.Approvals)
			}
			if len(res.Approvals) == 0 {
				fmt.Println("No call awaits approval.")
				return caddy.ExitCodeSuccess, nil
			}
			tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tSITE\tCALLER\tCALL\tARGUMENTS\tEXPIRES\tRULE")
			for _, a := range res.Approvals {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", a.ID, a.Site, a.Owner, callName(a), clipArgs(string(a.Arguments)),
					a.Expires.UTC().Format(time.RFC3339), a.Rule)
			}
			tw.Flush()
			return caddy.ExitCodeSuccess, nil
		}),
	}
	list.Flags().Bool("json", false, "Print the approvals as JSON, arguments whole")
	c.AddCommand(list)
	adminFlags(list)
	for _, action := range []string{"approve", "deny"} {
		sub := &cobra.Command{
			Use:   action + " ID",
			Short: strings.ToUpper(action[:1]) + action[1:] + "s the held call ID, as the operator; the first answer stands",
			Args:  cobra.ExactArgs(1),
			RunE: func(cmd *cobra.Command, args []string) error {
				return plainCommand(func(fl caddycmd.Flags) (int, error) {
					admin, err := runningAdmin(fl, "approvals are answered on a running server")
					if err != nil {
						return caddy.ExitCodeFailedStartup, err
					}
					var got approvals.Approval
					if err := adminJSON(admin, http.MethodPost, "/zidane/approvals/"+args[0]+"/"+action, []byte("{}"), &got); err != nil {
						return caddy.ExitCodeFailedStartup, err
					}
					fmt.Printf("%s %s: %s by %s's %s on %s.\n", got.ID, got.State, callName(got), got.Owner, got.Credential, got.Site)
					return caddy.ExitCodeSuccess, nil
				})(cmd, args)
			},
		}
		adminFlags(sub)
		c.AddCommand(sub)
	}
	return c
}

// callName is what a held call calls: its method and tool, prompt or URI.
func callName(a approvals.Approval) string {
	for _, n := range []string{a.Tool, a.Prompt, a.URI} {
		if n != "" {
			return a.Method + " " + n
		}
	}
	return a.Method
}

// clipArgs keeps a listing's rows short; --json shows them whole.
func clipArgs(s string) string {
	if len(s) > 80 {
		return s[:77] + "..."
	}
	return s
}

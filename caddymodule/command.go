package caddymodule

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/caddyserver/caddy/v2"
	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/spf13/cobra"

	"github.com/Tahul/caddy-zidane-mcp/broker"
	"github.com/Tahul/caddy-zidane-mcp/broker/upstreamauth"
	"github.com/Tahul/caddy-zidane-mcp/policy"
)

func init() {
	caddycmd.RegisterCommand(caddycmd.Command{
		Name:  "zidane",
		Usage: "token create|list|revoke …",
		Short: "Manages caddy-zidane-mcp tokens",
		Long: `
Manages the bearer tokens that zidane_mcp accepts.

With a server running, each command goes through the admin API (found from
--address, or the admin address of --config), so a change is live at once.
With no server answering, it reads and writes Caddy's storage directly; a
server started later, or one whose admin API is elsewhere, sees the change
within two seconds.`,
		CobraFunc: func(cmd *cobra.Command) {
			token := &cobra.Command{
				Use:   "token",
				Short: "Creates, lists and revokes tokens",
			}
			token.AddCommand(tokenCreateCommand(), tokenListCommand(), tokenRevokeCommand())
			cmd.AddCommand(token)
			upstream := &cobra.Command{
				Use:   "upstream",
				Short: "Shows the upstream MCP servers of a running server",
			}
			upstream.AddCommand(upstreamListCommand(), upstreamRestartCommand("restart"), upstreamRestartCommand("retire"))
			cmd.AddCommand(upstream)
			for _, sub := range zidaneSubcommands {
				cmd.AddCommand(sub())
			}
		},
	})
}

// zidaneSubcommands are the other `caddy zidane` commands, each added by
// the file that implements it.
var zidaneSubcommands []func() *cobra.Command

func adminFlags(c *cobra.Command) {
	c.Flags().String("address", "", "Address of the admin API of a running server (default: from --config, else "+caddy.DefaultAdminListen+")")
	c.Flags().StringP("config", "c", "", "Configuration file to read the admin address from")
	c.Flags().StringP("adapter", "a", "", "Adapter of --config")
}

func tokenCreateCommand() *cobra.Command {
	c := &cobra.Command{
		Use:   "create --name NAME --scope SCOPE [--scope SCOPE…] [--machine] [--expires DURATION] [--root PATH…]",
		Short: "Creates a token and prints it once",
		Example: `  caddy zidane token create --name laptop --scope chat
  caddy zidane token create --name intern --scope chat --root /srv/projects/sandbox
  caddy zidane token create --name ci --scope deploy --machine --expires 30d`,
		Args: cobra.NoArgs,
		RunE: caddycmd.WrapCommandFuncForCobra(func(fl caddycmd.Flags) (int, error) {
			scopes, err := fl.GetStringArray("scope")
			if err != nil {
				return caddy.ExitCodeFailedStartup, err
			}
			roots, err := fl.GetStringArray("root")
			if err != nil {
				return caddy.ExitCodeFailedStartup, err
			}
			req := createTokenRequest{Name: fl.String("name"), Scopes: scopes, Kind: string(policy.KindUser), Expires: fl.String("expires"), Roots: roots}
			if fl.Bool("machine") {
				req.Kind = string(policy.KindMachine)
			}
			spec, err := req.spec()
			if err == nil {
				err = policy.ValidateSpec(spec)
			}
			if err != nil {
				return caddy.ExitCodeFailedStartup, err
			}
			var res createTokenResponse
			err = withTokens(fl, func(admin string) error {
				body, _ := json.Marshal(req)
				return adminJSON(admin, http.MethodPost, "/zidane/tokens", body, &res)
			}, func(store *policy.TokenStore) error {
				secret, tok, err := store.Create(context.Background(), spec)
				res = createTokenResponse{Token: secret, Record: tok}
				return err
			})
			if err != nil {
				return caddy.ExitCodeFailedStartup, err
			}
			fmt.Println(res.Token)
			confined := "the gateway's"
			if len(res.Record.Roots) > 0 {
				confined = strings.Join(res.Record.Roots, ",")
			}
			fmt.Fprintf(os.Stderr, "Created token %q (id %s, kind %s, scopes %s, roots %s, expires %s).\nThis is the only time the token is shown: store it now.\n",
				res.Record.Name, res.Record.ID, res.Record.Kind, strings.Join(res.Record.Scopes, ","), confined, when(res.Record.Expires, "never"))
			return caddy.ExitCodeSuccess, nil
		}),
	}
	c.Flags().String("name", "", "Name of the token, unique among live tokens (required)")
	c.Flags().StringArray("scope", nil, "Scope to grant; repeat for several (required)")
	c.Flags().Bool("machine", false, "Issue a machine token (refused by the sessions endpoint)")
	c.Flags().String("expires", "", "Lifetime, such as 12h or 30d (default: no expiry)")
	c.Flags().StringArray("root", nil, "Confine the token's sessions to this directory tree, inside the gateway's roots; repeat for several (default: the gateway's roots)")
	adminFlags(c)
	return c
}

func tokenListCommand() *cobra.Command {
	c := &cobra.Command{
		Use:   "list [--json]",
		Short: "Lists tokens; never prints a secret",
		Args:  cobra.NoArgs,
		RunE: caddycmd.WrapCommandFuncForCobra(func(fl caddycmd.Flags) (int, error) {
			var list []policy.Token
			err := withTokens(fl, func(admin string) error {
				return adminJSON(admin, http.MethodGet, "/zidane/tokens", nil, &list)
			}, func(store *policy.TokenStore) error {
				list = redact(store.List())
				return nil
			})
			if err != nil {
				return caddy.ExitCodeFailedStartup, err
			}
			if fl.Bool("json") {
				enc := json.NewEncoder(os.Stdout)
				enc.SetIndent("", "  ")
				return caddy.ExitCodeSuccess, enc.Encode(list)
			}
			tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tNAME\tKIND\tSCOPES\tROOTS\tCREATED\tEXPIRES\tLAST USED\tSTATE")
			now := time.Now()
			for _, t := range list {
				state := "active"
				switch {
				case t.Revoked != nil:
					state = "revoked"
				case !t.Active(now):
					state = "expired"
				}
				roots := "-"
				if len(t.Roots) > 0 {
					roots = strings.Join(t.Roots, ",")
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", t.ID, t.Name, t.Kind, strings.Join(t.Scopes, ","), roots,
					t.Created.Local().Format(time.DateTime), when(t.Expires, "never"), when(t.LastUsed, "-"), state)
			}
			return caddy.ExitCodeSuccess, tw.Flush()
		}),
	}
	c.Flags().Bool("json", false, "Print JSON")
	adminFlags(c)
	return c
}

func tokenRevokeCommand() *cobra.Command {
	c := &cobra.Command{
		Use:   "revoke NAME_OR_ID",
		Short: "Revokes a token at once, and every token derived from it",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			target := args[0]
			return caddycmd.WrapCommandFuncForCobra(func(fl caddycmd.Flags) (int, error) {
				var tok policy.Token
				err := withTokens(fl, func(admin string) error {
					return adminJSON(admin, http.MethodDelete, "/zidane/tokens/"+target, nil, &tok)
				}, func(store *policy.TokenStore) error {
					var err error
					tok, err = store.Revoke(context.Background(), target)
					return err
				})
				if err != nil {
					return caddy.ExitCodeFailedStartup, err
				}
				fmt.Printf("Revoked token %q (id %s).\n", tok.Name, tok.ID)
				return caddy.ExitCodeSuccess, nil
			})(cmd, args)
		},
	}
	adminFlags(c)
	return c
}

func upstreamListCommand() *cobra.Command {
	c := &cobra.Command{
		Use:   "list [--json]",
		Short: "Lists the configured upstreams; secrets are shown as <redacted>",
		Args:  cobra.NoArgs,
		RunE: caddycmd.WrapCommandFuncForCobra(func(fl caddycmd.Flags) (int, error) {
			admin, err := runningAdmin(fl, "upstreams are listed from a running server")
			if err != nil {
				return caddy.ExitCodeFailedStartup, err
			}
			var raw json.RawMessage
			if err := adminJSON(admin, http.MethodGet, "/zidane/upstreams", nil, &raw); err != nil {
				return caddy.ExitCodeFailedStartup, err
			}
			if fl.Bool("json") {
				enc := json.NewEncoder(os.Stdout)
				enc.SetIndent("", "  ")
				return caddy.ExitCodeSuccess, enc.Encode(raw)
			}
			// Each entry is an upstream with, for one with an oauth block,
			// an "auth" object beside its fields.
			var list []broker.Upstream
			var auth []struct {
				Auth *upstreamauth.Status `json:"auth"`
			}
			if err := json.Unmarshal(raw, &list); err != nil {
				return caddy.ExitCodeFailedStartup, err
			}
			if err := json.Unmarshal(raw, &auth); err != nil {
				return caddy.ExitCodeFailedStartup, err
			}
			tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tTRANSPORT\tTARGET\tSCOPE\tAUTH\tSOURCE")
			for i, u := range list {
				target := u.URL
				if u.Transport == broker.TransportStdio {
					target = strings.TrimSpace(u.Command + " " + strings.Join(u.Args, " "))
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", u.Name, u.Transport, target, u.Scope, authColumn(auth[i].Auth), u.Source)
			}
			return caddy.ExitCodeSuccess, tw.Flush()
		}),
	}
	c.Flags().Bool("json", false, "Print JSON")
	adminFlags(c)
	return c
}

// upstreamRestartCommand is `caddy zidane upstream restart NAME` or, with
// action "retire", `… retire NAME`.
func upstreamRestartCommand(action string) *cobra.Command {
	short := "Restarts an upstream's connections on a running server (a stdio upstream gets a new process)"
	done := "Restarted"
	if action == "retire" {
		short = "Ends an upstream's connections on a running server; a shared stdio upstream's process stays stopped until a call needs it"
		done = "Retired"
	}
	c := &cobra.Command{
		Use:   action + " NAME",
		Short: short,
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			name := args[0]
			return caddycmd.WrapCommandFuncForCobra(func(fl caddycmd.Flags) (int, error) {
				admin, err := runningAdmin(fl, action+" needs a running server")
				if err != nil {
					return caddy.ExitCodeFailedStartup, err
				}
				var res struct {
					Routes int `json:"routes"`
				}
				if err := adminJSON(admin, http.MethodPost, "/zidane/upstreams/"+url.PathEscape(name)+"/"+action, []byte("{}"), &res); err != nil {
					return caddy.ExitCodeFailedStartup, err
				}
				fmt.Printf("%s upstream %q on %d aggregated route(s).\n", done, name, res.Routes)
				return caddy.ExitCodeSuccess, nil
			})(cmd, args)
		},
	}
	adminFlags(c)
	return c
}

// runningAdmin finds the admin API of a running server, or says why none
// answers; why names what needs one.
func runningAdmin(fl caddycmd.Flags, why string) (string, error) {
	admin, err := caddycmd.DetermineAdminAPIAddress(fl.String("address"), nil, fl.String("config"), fl.String("adapter"))
	if err != nil {
		return "", fmt.Errorf("finding the admin API address: %v", err)
	}
	if !adminAnswers(admin) {
		return "", fmt.Errorf("no server answers at %s: %s (give --address or --config)", admin, why)
	}
	return admin, nil
}

// withTokens runs online through a running server's admin API, or offline
// on Caddy's default storage when no server answers.
func withTokens(fl caddycmd.Flags, online func(admin string) error, offline func(*policy.TokenStore) error) error {
	admin, err := caddycmd.DetermineAdminAPIAddress(fl.String("address"), nil, fl.String("config"), fl.String("adapter"))
	if err != nil {
		return fmt.Errorf("finding the admin API address: %v", err)
	}
	if adminAnswers(admin) {
		return online(admin)
	}
	st := caddy.DefaultStorage
	fmt.Fprintf(os.Stderr, "No server answers at %s: using storage %s directly; a running server sees the change within 2s.\n", admin, st.Path)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	store, err := policy.OpenTokenStore(ctx, st)
	if err != nil {
		return err
	}
	return offline(store)
}

func adminAnswers(admin string) bool {
	addr, err := caddy.ParseNetworkAddress(admin)
	if err != nil {
		return false
	}
	conn, err := net.DialTimeout(addr.Network, addr.JoinHostPort(0), 2*time.Second)
	if err != nil {
		return false
	}
	conn.Close()
	return true
}

func adminJSON(admin, method, uri string, body []byte, out any) error {
	var r io.Reader
	if body != nil {
		r = bytes.NewReader(body)
	}
	resp, err := caddycmd.AdminAPIRequest(admin, method, uri, cliAdminHeaders(), r)
	if err != nil {
		if strings.Contains(err.Error(), "HTTP 404") && strings.Contains(err.Error(), "not found") && !strings.Contains(uri, "/zidane/tokens/") {
			return fmt.Errorf("the server at %s has no zidane admin routes: is it this build of caddy? (%v)", admin, err)
		}
		return adminError(err)
	}
	defer resp.Body.Close()
	return json.NewDecoder(resp.Body).Decode(out)
}

func when(t *time.Time, none string) string {
	if t == nil {
		return none
	}
	return t.Local().Format(time.DateTime)
}

// authColumn is the AUTH column of `upstream list`: "-" without an oauth
// block, else the token's state and the scopes granted.
func authColumn(st *upstreamauth.Status) string {
	if st == nil {
		return "-"
	}
	if len(st.Scopes) == 0 {
		return st.State
	}
	return st.State + " (" + strings.Join(st.Scopes, " ") + ")"
}

// adminError turns the admin API's refusal, which caddy reports as
// "caddy responded with error: HTTP 400: {"error":"…"}", into its message.
func adminError(err error) error {
	msg := err.Error()
	i := strings.Index(msg, "HTTP ")
	j := strings.Index(msg, "{")
	if i < 0 || j < i {
		return err
	}
	var body struct {
		Error string `json:"error"`
	}
	if json.Unmarshal([]byte(strings.TrimSpace(msg[j:])), &body) != nil || body.Error == "" {
		return err
	}
	return errors.New(body.Error)
}

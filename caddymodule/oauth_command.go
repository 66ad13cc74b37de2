package caddymodule

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/spf13/cobra"

	"github.com/Tahul/caddy-zidane-mcp/broker/upstreamauth"
)

func init() {
	zidaneSubcommands = append(zidaneSubcommands, loginCommand, logoutCommand)
}

// loginCommand is `caddy zidane login UPSTREAM`: it asks the running
// server to start an authorization-code login, prints the URL to open, and
// waits (--wait) until the callback has reached the gateway.
func loginCommand() *cobra.Command {
	c := &cobra.Command{
		Use:   "login UPSTREAM [--wait 10m]",
		Short: "Logs the gateway in to an upstream that uses OAuth: prints the URL to open in a browser",
		Long: `
Starts an OAuth authorization-code login of the running server to UPSTREAM
(an upstream with an oauth block) and prints the authorization URL. Open it
in a browser and approve; the authorization server then sends the browser
to the upstream's redirect_url, where the gateway stores the tokens,
encrypted. The command waits until then (or --wait 0 to return at once).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			name := args[0]
			return plainCommand(func(fl caddycmd.Flags) (int, error) {
				admin, err := runningAdmin(fl, "the login's callback lands on the running server")
				if err != nil {
					return caddy.ExitCodeFailedStartup, err
				}
				base := "/zidane/upstreams/" + url.PathEscape(name)
				before := readAuth(admin, base)
				var res struct {
					URL string `json:"authorization_url"`
				}
				if err := adminJSON(admin, http.MethodPost, base+"/login", []byte("{}"), &res); err != nil {
					return caddy.ExitCodeFailedStartup, err
				}
				fmt.Printf("Open this URL in a browser to log the gateway in to upstream %q:\n\n  %s\n\n", name, res.URL)
				wait, err := time.ParseDuration(fl.String("wait"))
				if err != nil || wait < 0 {
					return caddy.ExitCodeFailedStartup, fmt.Errorf("--wait %q: give a duration such as 10m, or 0", fl.String("wait"))
				}
				if wait == 0 {
					return caddy.ExitCodeSuccess, nil
				}
				fmt.Println("Waiting for the login to complete…")
				deadline := time.Now().Add(wait)
				for time.Now().Before(deadline) {
					time.Sleep(time.Second)
					st := readAuth(admin, base)
					if st != nil && st.State == "ready" && (before == nil || before.State != "ready" || !st.Expiry.Equal(before.Expiry)) {
						fmt.Printf("Logged in to upstream %q; scopes granted: %s.\n", name, orNone(st.Scopes))
						return caddy.ExitCodeSuccess, nil
					}
				}
				return caddy.ExitCodeFailedStartup, fmt.Errorf("no login completed within %s; run `caddy zidane login %s` again", wait, name)
			})(cmd, args)
		},
	}
	c.Flags().String("wait", "10m", "How long to wait for the login to complete (0: do not wait)")
	adminFlags(c)
	return c
}

func readAuth(admin, base string) *upstreamauth.Status {
	var st upstreamauth.Status
	if err := adminJSON(admin, http.MethodGet, base+"/auth", nil, &st); err != nil {
		return nil
	}
	return &st
}

func orNone(scopes []string) string {
	if len(scopes) == 0 {
		return "(none listed)"
	}
	return strings.Join(scopes, " ")
}

// logoutCommand is `caddy zidane logout UPSTREAM`.
func logoutCommand() *cobra.Command {
	c := &cobra.Command{
		Use:   "logout UPSTREAM",
		Short: "Revokes the gateway's OAuth token for an upstream (where the server supports it) and deletes it",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			name := args[0]
			return plainCommand(func(fl caddycmd.Flags) (int, error) {
				admin, err := runningAdmin(fl, "logout needs a running server")
				if err != nil {
					return caddy.ExitCodeFailedStartup, err
				}
				var st upstreamauth.Status
				if err := adminJSON(admin, http.MethodPost, "/zidane/upstreams/"+url.PathEscape(name)+"/logout", []byte("{}"), &st); err != nil {
					return caddy.ExitCodeFailedStartup, err
				}
				fmt.Printf("Logged out of upstream %q; its state is now %s.\n", name, st.State)
				return caddy.ExitCodeSuccess, nil
			})(cmd, args)
		},
	}
	adminFlags(c)
	return c
}

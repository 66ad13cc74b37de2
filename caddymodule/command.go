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

	"github.com/Tahul/caddy-zidane-mcp/broker/upstream"

	"github.com/caddyserver/caddy/v2"
	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/spf13/cobra"

	"github.com/Tahul/caddy-zidane-mcp/broker/upstreamauth"
	"github.com/Tahul/caddy-zidane-mcp/policy"
)

func init() {
	caddycmd.RegisterCommand(caddycmd.Command{
		Name:  "zidane",
		Usage: "token|upstream|tools|login|logout|audit …",
		Short: "Manages a zidane_mcp gateway: tokens, upstreams, pinned tools, upstream logins, the audit log",
		Long: `
Manages what a zidane_mcp gateway keeps outside its config:

  token     creates, lists and revokes the bearer tokens it accepts
  upstream  lists the upstream MCP servers of a running server, restarts or retires one
  tools     lists the pinned definitions of upstream servers, shows a change, approves or rejects it
  login     logs the gateway in to an upstream that uses OAuth
  logout    revokes and deletes the gateway's OAuth token for an upstream
  audit     verifies the audit log, prints the public key that verifies it
  signin-link  prints a one-time link that signs a browser in, on a gateway without an IdP

With a server running, each command goes through the admin API (found from
--address, or the admin address of --config), so a change is live at once.
With no server answering, token, audit and signin-link read and write Caddy's storage
directly; a server started later, or one whose admin API is elsewhere, sees
the change within two seconds.

Output is plain text for people; list and diff commands take --json for
scripts. A command exits 0 when it did what was asked, and 1 with a message
on stderr when it did not.`,
		CobraFunc: func(cmd *cobra.Command) {
			token := &cobra.Command{
				Use:   "token",
				Short: "Creates, lists and revokes tokens",
			}
			token.AddCommand(tokenCreateCommand(), tokenListCommand(), tokenRevokeCommand())
			cmd.AddCommand(token)
			upstream := &cobra.Command{
				Use:   "upstream",
				Short: "Lists, restarts and retires the upstream MCP servers of a running server",
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

// plainCommand runs f as caddycmd.WrapCommandFuncForCobra does, but writes
// its error as one plain line on stderr, "caddy zidane token revoke: …",
// where Caddy's wrapper logs it as a JSON log line: these commands are run
// by people. A status other than 0 with no error (a verdict f has printed
// itself) exits with it and adds nothing.
func plainCommand(f caddycmd.CommandFunc) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, _ []string) error {
		status, err := f(caddycmd.Flags{FlagSet: cmd.Flags()})
		if err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", cmd.CommandPath(), err)
			if status == caddy.ExitCodeSuccess {
				status = caddy.ExitCodeFailedStartup
			}
		}
		if status != caddy.ExitCodeSuccess {
			os.Exit(status)
		}
		return nil
	}
}

// printJSON writes v to stdout as indented JSON: the --json output of the
// commands that list.
func printJSON(v any) error {
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func adminFlags(c *cobra.Command) {
	c.Flags().String("address", "", "Address of the admin API of a running server (default: from --config, else "+caddy.DefaultAdminListen+")")
	c.Flags().StringP("config", "c", "", "Configuration file to read the admin address from")
	c.Flags().StringP("adapter", "a", "", "Adapter of --config")
}

func tokenCreateCommand() *cobra.Command {
	c := &cobra.Command{
		Use:   "create --name NAME --scope SCOPE [--scope SCOPE…] [--owner OWNER] [--machine] [--expires DURATION] [--root PATH…]",
		Short: "Creates a token and prints it once",
		Example: `  caddy zidane token create --name laptop --scope chat --owner alice
  caddy zidane token create --name phone --scope chat --owner alice
  caddy zidane token create --name intern --scope chat --root /srv/projects/sandbox
  caddy zidane token create --name ci --scope deploy --machine --expires 30d`,
		Args: cobra.NoArgs,
		RunE: plainCommand(func(fl caddycmd.Flags) (int, error) {
			scopes, err := fl.GetStringArray("scope")
			if err != nil {
				return caddy.ExitCodeFailedStartup, err
			}
			roots, err := fl.GetStringArray("root")
			if err != nil {
				return caddy.ExitCodeFailedStartup, err
			}
			req := createTokenRequest{Name: fl.String("name"), Scopes: scopes, Kind: string(policy.KindUser), Expires: fl.String("expires"), Roots: roots, Owner: fl.String("owner")}
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
			fmt.Fprintf(os.Stderr, "Created token %q (id %s, owner %s, kind %s, scopes %s, roots %s, expires %s).\nThis is the only time the token is shown: store it now.\n",
				res.Record.Name, res.Record.ID, res.Record.OwnerID(), res.Record.Kind, strings.Join(res.Record.Scopes, ","), confined, when(res.Record.Expires, "never"))
			return caddy.ExitCodeSuccess, nil
		}),
	}
	c.Flags().String("name", "", "Name of the token, unique among live tokens (required)")
	c.Flags().StringArray("scope", nil, "Scope to grant; repeat for several (required)")
	c.Flags().String("owner", "", "Who the token acts for: tokens of one owner share their sessions (default: the token is its own owner)")
	c.Flags().Bool("machine", false, "Issue a machine token (refused by the sessions endpoint)")
	c.Flags().String("expires", "", "Lifetime, such as 12h or 30d (default: no expiry)")
	c.Flags().StringArray("root", nil, "Confine the token's sessions to this directory tree, inside the gateway's roots; repeat for several (default: the gateway's roots)")
	adminFlags(c)
	return c
}

func tokenListCommand() *cobra.Command {
	c := &cobra.Command{
		Use:   "list [--owner NAME] [--client ID] [--json]",
		Short: "Lists tokens and grants; never prints a secret",
		Long: `
Lists the tokens the gateway accepts: the operator's, those derived for
sessions' agents (under their parent), and the grants people gave OAuth
clients when they signed them in, with the client in the CLIENT column.
A grant is revoked like a token, by its id (grt_…).`,
		Example: `  caddy zidane token list
  caddy zidane token list --owner alice
  caddy zidane token list --client https://claude.ai/oauth/claude-code-client-metadata`,
		Args: cobra.NoArgs,
		RunE: plainCommand(func(fl caddycmd.Flags) (int, error) {
			var list []policy.Token
			owner, client := fl.String("owner"), fl.String("client")
			err := withTokens(fl, func(admin string) error {
				q := url.Values{}
				if owner != "" {
					q.Set("owner", owner)
				}
				if client != "" {
					q.Set("client", client)
				}
				uri := "/zidane/tokens"
				if len(q) > 0 {
					uri += "?" + q.Encode()
				}
				return adminJSON(admin, http.MethodGet, uri, nil, &list)
			}, func(store *policy.TokenStore) error {
				list = redact(policy.FilterTokens(store.List(), owner, client))
				return nil
			})
			if err != nil {
				return caddy.ExitCodeFailedStartup, err
			}
			if fl.Bool("json") {
				return caddy.ExitCodeSuccess, printJSON(list)
			}
			tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tNAME\tOWNER\tCLIENT\tKIND\tSCOPES\tROOTS\tCREATED\tEXPIRES\tLAST USED\tSTATE")
			now := time.Now()
			for _, row := range tokenTree(list) {
				t := row.token
				if t.ID == "" {
					// A JWT subject, which tokens derive from but the store
					// does not hold.
					fmt.Fprintf(tw, "%s\t(JWT subject)\t%s\t-\tuser\t-\t-\t-\t-\t-\t-\n", row.subject, row.subject)
					continue
				}
				state := "active"
				switch {
				case t.Revoked != nil:
					state = "revoked"
				case !t.Active(now):
					state = "expired"
				case t.Refresh != nil && !now.Before(t.Refresh.Expires):
					// A grant whose refresh token lapsed unused: its client
					// signs in again once its access token expires.
					state = "lapsed"
				}
				roots := "-"
				if len(t.Roots) > 0 {
					roots = strings.Join(t.Roots, ",")
				}
				fmt.Fprintf(tw, "%s\t%s%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", t.ID, strings.Repeat("  ", row.depth), t.Name, t.OwnerID(), clientColumn(t), t.Kind, strings.Join(t.Scopes, ","), roots,
					t.Created.Local().Format(time.DateTime), when(t.Expires, "never"), when(t.LastUsed, "-"), state)
			}
			return caddy.ExitCodeSuccess, tw.Flush()
		}),
	}
	c.Flags().String("owner", "", "List only the tokens and grants acting for this owner")
	c.Flags().String("client", "", "List only the grants to this OAuth client (its client_id) and the tokens derived from them")
	c.Flags().Bool("json", false, "Print the tokens as a JSON array, as GET /zidane/tokens answers (for scripts)")
	adminFlags(c)
	return c
}

func tokenRevokeCommand() *cobra.Command {
	c := &cobra.Command{
		Use:   "revoke NAME_OR_ID | GRANT_ID | jwt:SUB | --session SESSION_ID",
		Short: "Revokes a token or grant at once, and every token derived from it",
		Long: `
Revokes a token at once, and every token derived from it; what they started is
cancelled.

A grant (grt_…, see token list) is revoked by its id: its client's access and
refresh tokens are refused at once, its open streams close and the sessions
it started are cancelled. The person signs the client in again to get a new
one.

jwt:SUB revokes a JWT subject: its access tokens issued until now are refused,
its running sessions are cancelled, and the tokens derived from it are deleted.
An access token the identity provider issues later is accepted: disable the
subject there to lock it out.

--session revokes the tokens the gateway minted for one session's agent (and
those derived from them); the agent runs without them, and a relaunch of it
does not renew them.`,
		Example: `  caddy zidane token revoke laptop
  caddy zidane token revoke grt_3f9c0a1b2c4d5e6f
  caddy zidane token revoke jwt:alice
  caddy zidane token revoke --session ses_4kq2v7x9m1abcdef`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return plainCommand(func(fl caddycmd.Flags) (int, error) {
				session := fl.String("session")
				if (session == "") == (len(args) == 0) {
					return caddy.ExitCodeFailedStartup, fmt.Errorf("give a token name or id, jwt:<sub>, or --session <session id> (one of them)")
				}
				if session != "" {
					return revokeDerived(fl, "/zidane/tokens?session="+url.QueryEscape(session), func(store *policy.TokenStore) (policy.Revocation, error) {
						return store.RevokeSession(context.Background(), session)
					})
				}
				target := args[0]
				if policy.IsJWTID(target) {
					return revokeDerived(fl, "/zidane/tokens/"+url.PathEscape(target), func(store *policy.TokenStore) (policy.Revocation, error) {
						return store.RevokeSubject(context.Background(), target)
					})
				}
				var tok policy.Token
				err := withTokens(fl, func(admin string) error {
					return adminJSON(admin, http.MethodDelete, "/zidane/tokens/"+url.PathEscape(target), nil, &tok)
				}, func(store *policy.TokenStore) error {
					var err error
					tok, err = store.Revoke(context.Background(), target)
					return err
				})
				if err != nil {
					return caddy.ExitCodeFailedStartup, err
				}
				if tok.IsGrant() {
					fmt.Printf("Revoked grant %s of %s to client %s: its access and refresh tokens are refused, and what they started is cancelled.\n", tok.ID, tok.OwnerID(), tok.Client)
					return caddy.ExitCodeSuccess, nil
				}
				fmt.Printf("Revoked token %q (id %s).\n", tok.Name, tok.ID)
				return caddy.ExitCodeSuccess, nil
			})(cmd, args)
		},
	}
	c.Flags().String("session", "", "Revoke the tokens minted for this session's agent")
	adminFlags(c)
	return c
}

// revokeDerived runs a session's or a JWT subject's revocation, online at
// uri or offline, and says what it did.
func revokeDerived(fl caddycmd.Flags, uri string, offline func(*policy.TokenStore) (policy.Revocation, error)) (int, error) {
	var rev policy.Revocation
	err := withTokens(fl, func(admin string) error {
		return adminJSON(admin, http.MethodDelete, uri, nil, &rev)
	}, func(store *policy.TokenStore) error {
		var err error
		rev, err = offline(store)
		return err
	})
	if err != nil {
		return caddy.ExitCodeFailedStartup, err
	}
	names := make([]string, len(rev.Tokens))
	for i, t := range rev.Tokens {
		names[i] = fmt.Sprintf("%q", t.Name)
	}
	list := ""
	if len(names) > 0 {
		list = ": " + strings.Join(names, ", ")
	}
	if rev.Subject != "" {
		fmt.Printf("Revoked JWT subject %q: its access tokens issued until now are refused and its running sessions cancelled; "+
			"%d token(s) derived from it were deleted%s.\nA fresh access token from the identity provider is accepted: disable the subject there to lock it out.\n",
			strings.TrimPrefix(rev.Subject, policy.JWTPrefix), len(rev.Tokens), list)
		return caddy.ExitCodeSuccess, nil
	}
	fmt.Printf("Revoked %d token(s) of session %s%s.\nIts agent runs without them, and a relaunch does not renew them.\n", len(rev.Tokens), rev.Session, list)
	return caddy.ExitCodeSuccess, nil
}

// clientColumn is the CLIENT column of `token list`: a grant's client
// (its name, when it gave one, then its client_id), else "-".
func clientColumn(t policy.Token) string {
	switch {
	case !t.IsGrant():
		return "-"
	case t.ClientName != "":
		return fmt.Sprintf("%q %s", t.ClientName, t.Client)
	}
	return t.Client
}

// tokenRow is one line of `token list`: a token at its depth under its
// parent, or a JWT subject heading the tokens derived from it.
type tokenRow struct {
	token   policy.Token
	subject string
	depth   int
}

// tokenTree orders list (newest first) so that each token follows its
// parent, one level deeper; tokens derived from a JWT follow a line for
// the subject.
func tokenTree(list []policy.Token) []tokenRow {
	byID := map[string]bool{}
	children := map[string][]policy.Token{}
	for _, t := range list {
		byID[t.ID] = true
	}
	var roots []policy.Token
	var subjects []string
	for _, t := range list {
		switch {
		case t.Parent != "" && (byID[t.Parent] || policy.IsJWTID(t.Parent)):
			if policy.IsJWTID(t.Parent) && len(children[t.Parent]) == 0 {
				subjects = append(subjects, t.Parent)
			}
			children[t.Parent] = append(children[t.Parent], t)
		default:
			roots = append(roots, t)
		}
	}
	var rows []tokenRow
	var walk func(t policy.Token, depth int)
	walk = func(t policy.Token, depth int) {
		rows = append(rows, tokenRow{token: t, depth: depth})
		if depth > 16 {
			return // a chain this long is refused anyway; keep the listing finite
		}
		for _, c := range children[t.ID] {
			walk(c, depth+1)
		}
	}
	for _, t := range roots {
		walk(t, 0)
	}
	for _, s := range subjects {
		rows = append(rows, tokenRow{subject: s})
		for _, c := range children[s] {
			walk(c, 1)
		}
	}
	return rows
}

func upstreamListCommand() *cobra.Command {
	c := &cobra.Command{
		Use:   "list [--json]",
		Short: "Lists the configured upstreams; secrets are shown as <redacted>",
		Args:  cobra.NoArgs,
		RunE: plainCommand(func(fl caddycmd.Flags) (int, error) {
			admin, err := runningAdmin(fl, "upstreams are listed from a running server")
			if err != nil {
				return caddy.ExitCodeFailedStartup, err
			}
			var raw json.RawMessage
			if err := adminJSON(admin, http.MethodGet, "/zidane/upstreams", nil, &raw); err != nil {
				return caddy.ExitCodeFailedStartup, err
			}
			if fl.Bool("json") {
				return caddy.ExitCodeSuccess, printJSON(raw)
			}
			// Each entry is an upstream with, for one with an oauth block,
			// an "auth" object beside its fields.
			var list []upstream.Config
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
				if u.Transport == upstream.TransportStdio {
					target = strings.TrimSpace(u.Command + " " + strings.Join(u.Args, " "))
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", u.Name, u.Transport, target, u.Scope, authColumn(auth[i].Auth), u.Source)
			}
			return caddy.ExitCodeSuccess, tw.Flush()
		}),
	}
	c.Flags().Bool("json", false, "Print the upstreams as a JSON array, as GET /zidane/upstreams answers, with each OAuth upstream's state under \"auth\" (for scripts)")
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
			return plainCommand(func(fl caddycmd.Flags) (int, error) {
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
	if err := refuseClusterOffline(fl.String("config"), fl.String("adapter")); err != nil {
		return fmt.Errorf("no server answers at %s, and %w", admin, err)
	}
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
		if strings.Contains(err.Error(), "HTTP 404") && strings.Contains(err.Error(), "not found") && !strings.Contains(uri, "/zidane/tokens/") && !strings.Contains(uri, "?session=") {
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

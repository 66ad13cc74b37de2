package caddymodule

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/spf13/cobra"
	"go.uber.org/zap"

	"github.com/Tahul/caddy-zidane-mcp/authserver/idp"
	"github.com/Tahul/caddy-zidane-mcp/policy"
	"github.com/Tahul/caddy-zidane-mcp/storage"
)

func init() {
	zidaneSubcommands = append(zidaneSubcommands, signinLinkCommand)
}

// signinLinkRequest is the body of POST /zidane/signin/links.
type signinLinkRequest struct {
	Owner   string   `json:"owner"`
	Name    string   `json:"name,omitempty"`
	Scopes  []string `json:"scopes"`
	Expires string   `json:"expires,omitempty"`
}

// signinLinkResponse carries the link's secret, once.
type signinLinkResponse struct {
	Secret  string    `json:"secret"`
	Expires time.Time `json:"expires"`
}

func (req signinLinkRequest) spec() (idp.LinkSpec, error) {
	exp, err := policy.ParseExpiry(req.Expires)
	if err != nil {
		return idp.LinkSpec{}, err
	}
	return idp.LinkSpec{Owner: req.Owner, Name: req.Name, Scopes: req.Scopes, Expires: exp}, nil
}

func signinLinkCommand() *cobra.Command {
	c := &cobra.Command{
		Use:   "signin-link --owner NAME --scope SCOPE [--scope SCOPE…] [--name TEXT] [--expires 10m] [--base URL]",
		Short: "Prints a one-time link that signs one browser in, for a gateway without an IdP",
		Long: `
Prints a link that signs the browser it is opened in to the gateway as
--owner, who may then grant OAuth clients the --scope scopes. It works
once, and for --expires (default 10m, at most 24h). Opening the link
shows a page with a button: the sign-in happens when the person presses
it, so a mail or chat scanner that fetches the link does not use it up.

Only a hash of the link's secret is kept, in the gateway's storage. The
link starts with --base, or with the issuer of the signin block of
--config. Hand it to the person over a channel you trust: whoever opens
it first is signed in as --owner.`,
		Example: `  caddy zidane signin-link --owner alice --scope chat --scope upstream:github --base https://mcp.example.com
  caddy zidane signin-link --owner bob --scope chat --expires 1h --config /etc/caddy/Caddyfile`,
		Args: cobra.NoArgs,
		RunE: plainCommand(func(fl caddycmd.Flags) (int, error) {
			scopes, err := fl.GetStringArray("scope")
			if err != nil {
				return caddy.ExitCodeFailedStartup, err
			}
			req := signinLinkRequest{Owner: fl.String("owner"), Name: fl.String("name"), Scopes: scopes, Expires: fl.String("expires")}
			spec, err := req.spec()
			if err == nil {
				err = spec.Check()
			}
			if err != nil {
				return caddy.ExitCodeFailedStartup, err
			}
			base, err := signinBase(fl.String("base"), fl.String("config"), fl.String("adapter"))
			if err != nil {
				return caddy.ExitCodeFailedStartup, err
			}
			var res signinLinkResponse
			err = withStorage(fl, func(admin string) error {
				body, _ := json.Marshal(req)
				return adminJSON(admin, http.MethodPost, "/zidane/signin/links", body, &res)
			}, func(st storage.Storage) error {
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				res.Secret, res.Expires, err = idp.NewLinks(st, nil).Create(ctx, spec)
				return err
			})
			if err != nil {
				return caddy.ExitCodeFailedStartup, err
			}
			fmt.Println(idp.LinkURL(base, res.Secret))
			fmt.Fprintf(os.Stderr, "Sign-in link for %s (scopes %s), good once until %s.\nThis is the only time the link is shown.\n",
				req.Owner, strings.Join(scopes, ","), res.Expires.Local().Format(time.DateTime))
			return caddy.ExitCodeSuccess, nil
		}),
	}
	c.Flags().String("owner", "", "Who the browser signs in as (required)")
	c.Flags().StringArray("scope", nil, "A scope the person may grant their clients; repeat for several (required)")
	c.Flags().String("name", "", "The name pages show for the person (default: the owner)")
	c.Flags().String("expires", "", "How long the link is good, such as 30m (default 10m, at most 24h)")
	c.Flags().String("base", "", "The origin people reach the gateway at, such as https://mcp.example.com (default: the issuer of the config's signin block)")
	adminFlags(c)
	return c
}

// signinBase is the origin a link starts with: base, or the issuer of the
// signin block of the config file.
func signinBase(base, configFile, adapter string) (string, error) {
	if base == "" && configFile != "" {
		raw, _, _, err := caddycmd.LoadConfig(configFile, adapter)
		if err != nil {
			return "", fmt.Errorf("reading %s for the signin issuer: %v", configFile, err)
		}
		var cfg struct {
			Apps struct {
				Zidane struct {
					Signin struct {
						Issuer string `json:"issuer"`
					} `json:"signin"`
				} `json:"zidane"`
			} `json:"apps"`
		}
		if err := json.Unmarshal(raw, &cfg); err == nil {
			base = cfg.Apps.Zidane.Signin.Issuer
		}
	}
	if base == "" {
		return "", errors.New("give --base, the origin people reach the gateway at (such as https://mcp.example.com), or --config of a config whose signin block names its issuer")
	}
	if _, err := idp.SiteOrigin(base); err != nil {
		return "", fmt.Errorf("--base: %w", err)
	}
	return strings.TrimSuffix(base, "/"), nil
}

// withStorage runs online against a running server's admin API, or, when
// none answers, offline against Caddy's storage, as the token commands do
// (never behind a cluster's back).
func withStorage(fl caddycmd.Flags, online func(admin string) error, offline func(storage.Storage) error) error {
	admin, err := caddycmd.DetermineAdminAPIAddress(fl.String("address"), nil, fl.String("config"), fl.String("adapter"))
	if err != nil {
		return fmt.Errorf("finding the admin API address: %v", err)
	}
	if adminAnswers(admin) {
		return online(admin)
	}
	if err := refuseClusterOffline(fl.String("config"), fl.String("adapter")); err != nil {
		return fmt.Errorf("no server answers at %s, and %w", admin, err)
	}
	fmt.Fprintf(os.Stderr, "No server answers at %s: using storage %s directly.\n", admin, caddy.DefaultStorage.Path)
	return offline(caddy.DefaultStorage)
}

// handleSigninLinks serves POST /zidane/signin/links: a new sign-in link's
// secret, once. The admin key guards it (it signs a browser in as anyone).
func (a *adminAPI) handleSigninLinks(w http.ResponseWriter, r *http.Request) error {
	if r.Method != http.MethodPost {
		return caddy.APIError{HTTPStatus: http.StatusMethodNotAllowed, Err: errors.New("POST a link request")}
	}
	var req signinLinkRequest
	refuse := func(status int, err error) error {
		auditLogger().Warn("signin link refused", zap.String("event", "signin_link_refused"), zap.String("owner", req.Owner), zap.Error(err))
		return caddy.APIError{HTTPStatus: status, Err: err}
	}
	dec := json.NewDecoder(io.LimitReader(r.Body, 64<<10))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return refuse(http.StatusBadRequest, fmt.Errorf("decoding the link request: %v", err))
	}
	spec, err := req.spec()
	if err != nil {
		return refuse(http.StatusBadRequest, err)
	}
	secret, expires, err := idp.NewLinks(a.store(), nil).Create(r.Context(), spec)
	if err != nil {
		return refuse(storeStatus(err, http.StatusBadRequest), err)
	}
	auditLogger().Info("signin link created", zap.String("event", "signin_link_created"), zap.String("owner", spec.Owner),
		zap.Strings("scopes", spec.Scopes), zap.Time("expires", expires))
	return writeJSON(w, http.StatusCreated, signinLinkResponse{Secret: secret, Expires: expires})
}

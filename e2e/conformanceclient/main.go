// Command conformanceclient is the client side of the MCP conformance
// suite (`conformance client --command …`) built from the gateway's own
// parts: it reaches the server under test through the broker's upstream
// client (broker.Dial, the origin-pinned egress) with the upstream OAuth
// client of package upstreamauth as its credential layer, and nothing
// else.
//
// The suite appends the server URL as the last argument and sets
// MCP_CONFORMANCE_SCENARIO and, for some scenarios, MCP_CONFORMANCE_CONTEXT
// (JSON: client ids, secrets, keys, a workload's JWT). The scenario only
// picks the oauth block an operator would write (a JWT or ID token goes to
// a file, where its platform would keep it); every OAuth decision,
// DPoP included, is upstreamauth's.
// For the authorization-code scenarios the program plays the operator's
// browser in `caddy zidane login`: BeginLogin, a GET of the authorization
// URL that does not follow its redirect, and Callback with the query of
// the redirect, the path a real login takes.
package main

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/caddyserver/certmagic"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/Tahul/caddy-zidane-mcp/broker"
	"github.com/Tahul/caddy-zidane-mcp/broker/upstreamauth"
)

// upstream is the name the server under test has in this program.
const upstream = "conformance"

// redirectURL is the gateway callback the logins register; the program
// reads the redirect's query instead of serving it.
const redirectURL = "http://localhost:3000/callback"

// clientMetadataURL is the Client ID Metadata Document the suite expects
// (auth/basic-cimd).
const clientMetadataURL = "https://conformance-test.local/client-metadata.json"

// maxLogins bounds the logins of one run (the first and the step-ups);
// upstreamauth bounds the step-ups itself, below this.
const maxLogins = 5

func main() {
	log.SetFlags(0)
	log.SetPrefix("conformanceclient: ")
	if len(os.Args) < 2 {
		log.Fatal("usage: conformanceclient <server-url> (with MCP_CONFORMANCE_SCENARIO set)")
	}
	serverURL := os.Args[len(os.Args)-1]
	scenario := os.Getenv("MCP_CONFORMANCE_SCENARIO")
	if scenario == "" {
		log.Fatal("MCP_CONFORMANCE_SCENARIO is not set")
	}
	var conf map[string]any
	if s := os.Getenv("MCP_CONFORMANCE_CONTEXT"); s != "" {
		if err := json.Unmarshal([]byte(s), &conf); err != nil {
			log.Fatalf("MCP_CONFORMANCE_CONTEXT is not JSON: %v", err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Second)
	defer cancel()
	if err := run(ctx, scenario, serverURL, conf); err != nil {
		log.Fatalf("scenario %s: %v", scenario, err)
	}
}

// steps are what a scenario does on the session.
type steps func(ctx context.Context, cs *mcp.ClientSession) error

func run(ctx context.Context, scenario, serverURL string, conf map[string]any) error {
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	if strings.HasPrefix(scenario, "auth/") {
		return runAuth(ctx, scenario, serverURL, conf, logger)
	}
	return runScenario(ctx, scenario, serverURL, conf, logger)
}

// runScenario runs a scenario that needs no authorization.
func runScenario(ctx context.Context, scenario, serverURL string, conf map[string]any, logger *slog.Logger) error {
	switch scenario {
	case "initialize":
		return session(ctx, serverURL, nil, nil, logger, listTools)
	case "tools_call":
		return session(ctx, serverURL, nil, nil, logger, callTool("add_numbers", map[string]any{"a": 5, "b": 3}))
	case "elicitation-sep1034-client-defaults":
		opts := &mcp.ClientOptions{
			ElicitationHandler: func(context.Context, *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
				// Accept without content: the SDK fills in the schema's
				// defaults (SEP-1034).
				return &mcp.ElicitResult{Action: "accept", Content: map[string]any{}}, nil
			},
		}
		return session(ctx, serverURL, opts, nil, logger, callTool("test_client_elicitation_defaults", map[string]any{}))
	case "sse-retry":
		return session(ctx, serverURL, nil, nil, logger, callTool("test_reconnection", map[string]any{}))
	case "request-metadata":
		// SEP-2575: the per-request _meta, the MCP-Protocol-Version header
		// and the retry after -32022 are the connection's own work.
		return session(ctx, serverURL, nil, nil, logger, listTools)
	case "json-schema-ref-no-deref":
		// SEP-2106: listing a tool whose schema has a network $ref must
		// not fetch it.
		return session(ctx, serverURL, nil, nil, logger, listTools)
	case "json-schema-2020-12-preservation":
		return session(ctx, serverURL, nil, nil, logger, echoSchema)
	case "sep-2322-client-request-state":
		opts := &mcp.ClientOptions{
			Capabilities: &mcp.ClientCapabilities{Elicitation: &mcp.ElicitationCapabilities{}},
			ElicitationHandler: func(context.Context, *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
				return &mcp.ElicitResult{Action: "accept", Content: map[string]any{"confirmed": true}}, nil
			},
		}
		return session(ctx, serverURL, opts, nil, logger, callEach("test_mrtr_echo_state", "test_mrtr_no_state", "test_mrtr_unrelated", "test_mrtr_no_result_type"))
	case "http-standard-headers":
		return session(ctx, serverURL, nil, nil, logger, touchEveryVerb)
	case "http-custom-headers":
		return session(ctx, serverURL, nil, nil, logger, contextToolCalls(conf))
	case "http-invalid-tool-headers":
		return session(ctx, serverURL, nil, nil, logger, callListed(map[string]any{"region": "us-west1"}))
	case "sep-2640-client-no-prefetch", "sep-2640-client-verify-digest", "sep-2640-client-verify-size", "sep-2640-client-verify-frontmatter":
		// The skills extension (SEP-2640) judges a host that loads skills;
		// the broker loads none. It connects and lists tools, as it does
		// for any upstream, and reads no skill.
		return session(ctx, serverURL, nil, nil, logger, listTools)
	}
	return fmt.Errorf("unknown scenario")
}

// runAuth runs an auth/ scenario: the gateway's upstream OAuth client,
// configured as an operator would for it, logs in and calls a tool.
func runAuth(ctx context.Context, scenario, serverURL string, conf map[string]any, logger *slog.Logger) error {
	cfg := oauthConfig(scenario, conf)
	dir, err := os.MkdirTemp("", "conformanceclient-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if s, ok := conf["idp_id_token"].(string); ok {
		// The ID token the IdP issued to the gateway, where a workload
		// identity would be kept fresh.
		cfg.IDTokenFile = filepath.Join(dir, "id_token")
		if err := os.WriteFile(cfg.IDTokenFile, []byte(s), 0o600); err != nil {
			return err
		}
	}
	if s, ok := conf["valid_jwt"].(string); ok {
		// The workload's JWT, where its platform would keep it fresh.
		cfg.AssertionFile = filepath.Join(dir, "workload.jwt")
		if err := os.WriteFile(cfg.AssertionFile, []byte(s), 0o600); err != nil {
			return err
		}
	}
	key := make([]byte, 32)
	rand.Read(key)
	client, err := upstreamauth.New(ctx, upstream, serverURL, cfg, upstreamauth.Options{
		Storage: &certmagic.FileStorage{Path: filepath.Join(dir, "storage")},
		Key:     key,
		Logger:  logger,
	})
	if err != nil {
		return err
	}
	defer client.Close()

	do := func(ctx context.Context, cs *mcp.ClientSession) error {
		if err := listTools(ctx, cs); err != nil {
			return err
		}
		return callTool("test-tool", map[string]any{})(ctx, cs)
	}
	for logins := 0; ; {
		if client.State().State == upstreamauth.StateAuthRequired {
			if logins == maxLogins {
				return fmt.Errorf("still not authorized after %d logins", logins)
			}
			logins++
			if err := login(ctx, client); err != nil {
				return err
			}
		}
		err := session(ctx, serverURL, nil, client.Transport, logger, do)
		if err == nil {
			return nil
		}
		if !errors.Is(err, upstreamauth.ErrAuthRequired) || client.State().State != upstreamauth.StateAuthRequired {
			return err
		}
		log.Printf("%v; logging in again", err)
	}
}

// oauthConfig is the oauth block an operator would write for the scenario.
func oauthConfig(scenario string, conf map[string]any) upstreamauth.Config {
	str := func(k string) string { s, _ := conf[k].(string); return s }
	switch {
	case conf["private_key_pem"] != nil:
		return upstreamauth.Config{
			Grant:            upstreamauth.GrantClientCredentials,
			ClientID:         str("client_id"),
			PrivateKey:       str("private_key_pem"),
			SigningAlgorithm: str("signing_algorithm"),
		}
	case conf["valid_jwt"] != nil:
		return upstreamauth.Config{
			Grant:    upstreamauth.GrantJWTBearer,
			ClientID: str("client_id"),
		}
	case conf["idp_id_token"] != nil:
		return upstreamauth.Config{
			Grant:           upstreamauth.GrantCrossAppAccess,
			ClientID:        str("client_id"),
			ClientSecret:    str("client_secret"),
			IDPIssuer:       str("idp_issuer"),
			IDPTokenURL:     str("idp_token_endpoint"),
			IDPClientID:     str("idp_client_id"),
			IDPClientSecret: str("idp_client_secret"),
		}
	case scenario == "auth/client-credentials-basic":
		return upstreamauth.Config{
			Grant:        upstreamauth.GrantClientCredentials,
			ClientID:     str("client_id"),
			ClientSecret: str("client_secret"),
		}
	}
	return upstreamauth.Config{
		Grant:             upstreamauth.GrantAuthorizationCode,
		ClientID:          str("client_id"),
		ClientSecret:      str("client_secret"),
		RedirectURL:       redirectURL,
		ClientMetadataURL: clientMetadataURL,
	}
}

// login is `caddy zidane login` with the program as the browser.
func login(ctx context.Context, client *upstreamauth.Client) error {
	authURL, err := client.BeginLogin(ctx)
	if err != nil {
		return err
	}
	browser := &http.Client{
		Timeout:       10 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, authURL, nil)
	if err != nil {
		return err
	}
	resp, err := browser.Do(req)
	if err != nil {
		return fmt.Errorf("opening the authorization URL: %v", err)
	}
	resp.Body.Close()
	loc, err := url.Parse(resp.Header.Get("Location"))
	if err != nil || resp.Header.Get("Location") == "" {
		return fmt.Errorf("the authorization server answered HTTP %d without a usable redirect", resp.StatusCode)
	}
	if got := loc.Scheme + "://" + loc.Host + loc.Path; got != redirectURL {
		return fmt.Errorf("the authorization server redirected to %s, not the callback", got)
	}
	return client.Callback(ctx, loc.Query())
}

// session connects to serverURL through the broker's upstream client,
// runs do on the session and closes it.
func session(ctx context.Context, serverURL string, opts *mcp.ClientOptions, creds func(http.RoundTripper) http.RoundTripper, logger *slog.Logger, do steps) error {
	conn, err := broker.Dial(ctx, broker.Upstream{Name: upstream, Transport: broker.TransportHTTP, URL: serverURL}, broker.ConnOptions{
		ClientInfo:    &mcp.Implementation{Name: "test-client", Version: "1.0.0"},
		ClientOptions: opts,
		Credentials:   creds,
		Logger:        logger,
	})
	if err != nil {
		return err
	}
	defer conn.Close()
	cs, err := conn.Session(ctx)
	if err != nil {
		return err
	}
	return do(ctx, cs)
}

func listTools(ctx context.Context, cs *mcp.ClientSession) error {
	_, err := cs.ListTools(ctx, nil)
	return err
}

// callTool lists the tools, checks that name is one, and calls it.
func callTool(name string, args map[string]any) steps {
	return func(ctx context.Context, cs *mcp.ClientSession) error {
		res, err := cs.ListTools(ctx, nil)
		if err != nil {
			return err
		}
		if !slices.ContainsFunc(res.Tools, func(t *mcp.Tool) bool { return t.Name == name }) {
			return fmt.Errorf("the server has no tool %q", name)
		}
		if _, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args}); err != nil {
			return fmt.Errorf("calling %s: %w", name, err)
		}
		return nil
	}
}

// callEach calls each named tool once, in order. A call the server
// answers with an error is logged, not fatal: the scenarios judge what was
// sent.
func callEach(names ...string) steps {
	return func(ctx context.Context, cs *mcp.ClientSession) error {
		for _, name := range names {
			if _, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: map[string]any{}}); err != nil {
				log.Printf("calling %s: %v", name, err)
			}
		}
		return nil
	}
}

// callListed lists the tools and calls every one the client kept with
// args (SEP-2243: a tool whose x-mcp-header annotations are invalid is
// left out of the listing).
func callListed(args map[string]any) steps {
	return func(ctx context.Context, cs *mcp.ClientSession) error {
		res, err := cs.ListTools(ctx, nil)
		if err != nil {
			return err
		}
		for _, t := range res.Tools {
			if _, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: t.Name, Arguments: args}); err != nil {
				log.Printf("calling %s: %v", t.Name, err)
			}
		}
		return nil
	}
}

// touchEveryVerb lists and uses the first tool, resource and prompt, so
// that each request carries its Mcp-Method and Mcp-Name headers.
func touchEveryVerb(ctx context.Context, cs *mcp.ClientSession) error {
	if res, err := cs.ListTools(ctx, nil); err == nil && len(res.Tools) > 0 {
		if _, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: res.Tools[0].Name, Arguments: map[string]any{}}); err != nil {
			log.Printf("calling %s: %v", res.Tools[0].Name, err)
		}
	}
	if res, err := cs.ListResources(ctx, nil); err == nil && len(res.Resources) > 0 {
		if _, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: res.Resources[0].URI}); err != nil {
			log.Printf("reading %s: %v", res.Resources[0].URI, err)
		}
	}
	if res, err := cs.ListPrompts(ctx, nil); err == nil && len(res.Prompts) > 0 {
		if _, err := cs.GetPrompt(ctx, &mcp.GetPromptParams{Name: res.Prompts[0].Name, Arguments: map[string]string{}}); err != nil {
			log.Printf("getting %s: %v", res.Prompts[0].Name, err)
		}
	}
	return nil
}

// contextToolCalls lists the tools (which records their x-mcp-header
// annotations) and makes the calls the suite gives in its context
// ({"toolCalls": [{"name", "arguments"}]}).
func contextToolCalls(conf map[string]any) steps {
	return func(ctx context.Context, cs *mcp.ClientSession) error {
		if _, err := cs.ListTools(ctx, nil); err != nil {
			return err
		}
		calls, _ := conf["toolCalls"].([]any)
		for _, c := range calls {
			call, _ := c.(map[string]any)
			name, _ := call["name"].(string)
			args, _ := call["arguments"].(map[string]any)
			if name == "" {
				continue
			}
			if _, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args}); err != nil {
				log.Printf("calling %s: %v", name, err)
			}
		}
		return nil
	}
}

// echoSchema hands the focal tool's inputSchema, as the client read it,
// back through the server's echo tool, so the suite can see which JSON
// Schema 2020-12 keywords survived.
func echoSchema(ctx context.Context, cs *mcp.ClientSession) error {
	res, err := cs.ListTools(ctx, nil)
	if err != nil {
		return err
	}
	i := slices.IndexFunc(res.Tools, func(t *mcp.Tool) bool { return t.Name == "json_schema_2020_12_tool" })
	if i < 0 {
		return fmt.Errorf("the server has no tool json_schema_2020_12_tool")
	}
	_, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: "json_schema_echo", Arguments: map[string]any{"schema": res.Tools[i].InputSchema}})
	return err
}

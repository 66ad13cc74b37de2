package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Bounds of the bad-config tests.
const (
	// badConfigTimeout bounds one `caddy validate` or `caddy run` of a bad
	// config, which refuses it in well under a second: a run that reaches
	// it hangs.
	badConfigTimeout = time.Minute
	// badConfigParallel is how many caddy processes the walk runs at once.
	badConfigParallel = 2
	// keyFileLimit is the size the Caddyfile reference gives for the files a config
	// names (key files, upstreams_file).
	keyFileLimit = 1 << 20
)

// badConfigSite is the site every bad config serves. `caddy validate`
// never listens on it, and a `caddy run` stops before it would.
const badConfigSite = "http://127.0.0.1:9"

// referencePage is the Caddyfile reference, whose blocks list every option.
const referencePage = "docs/caddyfile.md"

// referenceOption is one option of a reference block: its path of
// block names ("zidane_mcp jwt leeway") and the value it documents
// ("<duration>").
type referenceOption struct {
	path  string
	value string
}

// referenceOptions reads the options of the caddyfile blocks of the
// Caddyfile reference (docs/caddyfile.md) under "Directive `zidane_mcp`",
// "Global option `zidane`", "Cluster: `storage zidane_nats`" (the storage
// block) and "Log writer `zidane_audit`":
// every line's first word, named by the blocks it sits in. The block names
// are options too ("zidane_mcp jwt"), and so are the directive and the
// global option themselves. A first word such as a|b names two options.
func referenceOptions(t *testing.T) []referenceOption {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(repoRoot, referencePage))
	if err != nil {
		t.Fatal(err)
	}
	var opts []referenceOption
	seen := map[string]bool{}
	for _, heading := range []string{"## Directive `zidane_mcp`", "## Global option `zidane`", "## Cluster: `storage zidane_nats`",
		"## Log writer `zidane_audit`"} {
		_, after, ok := strings.Cut(string(raw), "\n"+heading+"\n")
		if !ok {
			t.Fatalf("%s has no heading %q", referencePage, heading)
		}
		_, after, ok = strings.Cut(after, "```caddyfile\n")
		if !ok {
			t.Fatalf("%s: no caddyfile block under %q", referencePage, heading)
		}
		block, _, ok := strings.Cut(after, "\n```")
		if !ok {
			t.Fatalf("%s: the caddyfile block under %q does not end", referencePage, heading)
		}
		var stack []string
		for line := range strings.Lines(block) {
			line, _, _ = strings.Cut(line, "#")
			words := strings.Fields(line)
			if len(words) > 2 && words[0] == "output" {
				words = words[1:] // `output zidane_audit {`: the writer's options are "zidane_audit …"
			}
			switch {
			case len(words) == 0:
				continue
			case words[0] == "}":
				if len(stack) == 0 {
					t.Fatalf("%s: unbalanced } under %q", referencePage, heading)
				}
				stack = stack[:len(stack)-1]
				continue
			case len(words) == 1 && words[0] == "{":
				stack = append(stack, "") // the global options block
				continue
			}
			value := ""
			if len(words) > 1 && words[1] != "{" {
				value = words[1]
			}
			for name := range strings.SplitSeq(words[0], "|") {
				path := strings.Join(slices.DeleteFunc(append(slices.Clone(stack), name), func(s string) bool { return s == "" }), " ")
				if !seen[path] {
					seen[path] = true
					opts = append(opts, referenceOption{path: path, value: value})
				}
			}
			if words[len(words)-1] == "{" {
				stack = append(stack, words[0])
			}
		}
		if len(stack) != 0 {
			t.Fatalf("%s: unclosed block %v under %q", referencePage, stack, heading)
		}
	}
	return opts
}

// configFixtures are the files the bad configs name.
type configFixtures struct {
	dir        string // a directory
	pub        string // an EC P-256 public key in PEM
	priv       string // its private key (PKCS #8 PEM)
	privBody   string // a line of the private key's base64, which no output may show
	bigPub     string // pub, padded past the size limit with blank lines
	bigPriv    string // priv, padded likewise
	bigJSON    string // a valid mcp.json, padded likewise
	bigIDToken string // an ID token file, padded likewise
	mcpJSON    string // a valid mcp.json
	idToken    string // a file holding an ID token
	notPEM     string // a JWK in JSON: a key, but not PEM
	empty      string // an empty file
	fifo       string // a named pipe nothing writes to
	missing    string // a path where nothing is
}

func writeConfigFixtures(t *testing.T) configFixtures {
	t.Helper()
	dir := t.TempDir()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	pubDER, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	privDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	pubPEM := pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER})
	privPEM := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: privDER})
	mcpJSON := []byte(`{"mcpServers": {"files": {"command": "/bin/true"}}}` + "\n")
	idToken := []byte("eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJnYXRld2F5In0.c2ln\n")
	padded := func(b []byte) []byte { return append(slices.Clone(b), bytes.Repeat([]byte("\n"), keyFileLimit)...) }
	fx := configFixtures{
		dir:        dir,
		pub:        filepath.Join(dir, "public.pem"),
		priv:       filepath.Join(dir, "private.pem"),
		privBody:   strings.Split(string(privPEM), "\n")[1],
		bigPub:     filepath.Join(dir, "big-public.pem"),
		bigPriv:    filepath.Join(dir, "big-private.pem"),
		bigJSON:    filepath.Join(dir, "big-mcp.json"),
		bigIDToken: filepath.Join(dir, "big-id-token"),
		mcpJSON:    filepath.Join(dir, "mcp.json"),
		idToken:    filepath.Join(dir, "id-token"),
		notPEM:     filepath.Join(dir, "key.jwk"),
		empty:      filepath.Join(dir, "empty.pem"),
		fifo:       filepath.Join(dir, "pipe.pem"),
		missing:    filepath.Join(dir, "missing.pem"),
	}
	for path, data := range map[string][]byte{
		fx.pub:        pubPEM,
		fx.priv:       privPEM,
		fx.bigPub:     padded(pubPEM),
		fx.bigPriv:    padded(privPEM),
		fx.bigJSON:    padded(mcpJSON),
		fx.mcpJSON:    mcpJSON,
		fx.idToken:    idToken,
		fx.bigIDToken: padded(idToken),
		fx.notPEM:     []byte(`{"kty":"EC","crv":"P-256","x":"` + base64.RawURLEncoding.EncodeToString(key.X.Bytes()) + `","y":"` + base64.RawURLEncoding.EncodeToString(key.Y.Bytes()) + `"}`),
		fx.empty:      nil,
	} {
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := syscall.Mkfifo(fx.fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	return fx
}

// badConfig is a Caddyfile with one wrong value, and what caddy must say
// about it: the option's name (the last word of option) and each of want.
type badConfig struct {
	option    string // the option's path in the Caddyfile reference
	label     string // what is wrong with the value
	caddyfile string
	want      []string
	env       []string // KEY=VALUE for this run
}

// The Caddyfiles of the cases. Each wraps its lines in a config that is
// valid without them (TestBadConfigValuesAreRefused checks that first), so
// that the refusal is the value's.
func caddyfileOf(global, handler string) string {
	return "{\n\tadmin off\n" + global + "\n}\n\n" + badConfigSite + " {\n\troute {\n" + handler + "\n\t\trespond 404\n\t}\n}\n"
}

func mcpBlock(lines ...string) string {
	return caddyfileOf("", "zidane_mcp {\n"+strings.Join(lines, "\n")+"\n}")
}

func guarded(lines ...string) string { return mcpBlock(append([]string{"guard"}, lines...)...) }

// jwtBlock is a guard with a jwt block of issuer and lines; the resource
// is absolute, so the audience defaults to it.
func jwtBlock(lines ...string) string {
	return guarded("resource "+badConfigSite+"/mcp", "jwt {\nissuer https://idp.test\n"+strings.Join(lines, "\n")+"\n}")
}

func zidaneBlock(lines ...string) string {
	return caddyfileOf("zidane {\n"+strings.Join(lines, "\n")+"\n}", "zidane_mcp {\nguard\n}")
}

func upstreamBlock(lines ...string) string {
	return zidaneBlock("upstream up {\nurl " + badConfigSite + "/mcp\n" + strings.Join(lines, "\n") + "\n}")
}

func stdioBlock(lines ...string) string {
	return zidaneBlock("upstream up {\ncommand /bin/true\n" + strings.Join(lines, "\n") + "\n}")
}

func oauthBlock(base []string, lines ...string) string {
	kept := slices.DeleteFunc(slices.Clone(base), func(b string) bool {
		return slices.ContainsFunc(lines, func(l string) bool { return optionOf(l) == optionOf(b) && optionOf(l) != "scopes" })
	})
	return upstreamBlock("oauth {\n" + strings.Join(append(kept, lines...), "\n") + "\n}")
}

// optionOf is the option a config line sets: its first word.
func optionOf(line string) string {
	opt, _, _ := strings.Cut(strings.TrimSpace(line), " ")
	return opt
}

// The oauth blocks the cases change: one line of a case replaces the
// base's line of the same option.
var (
	oauthSecret = []string{"grant client_credentials", "client_id gateway", "client_secret ${UP_SECRET}", "token_url " + badConfigSite + "/token"}
	oauthLogin  = []string{"grant authorization_code", "redirect_url " + badConfigSite + "/zidane/oauth/callback/up"}
	// oauthExchange is a person's token by RFC 8693 exchange; its first
	// three lines leave the client secret out.
	oauthExchange = []string{"grant token_exchange", "credentials per_user", "client_id gateway", "client_secret ${UP_SECRET}", "token_url " + badConfigSite + "/token"}
)

func oauthKey(fx configFixtures) []string {
	return []string{"grant client_credentials", "client_id gateway", "private_key_file " + fx.priv, "token_url " + badConfigSite + "/token"}
}

func oauthXAA(fx configFixtures) []string {
	return []string{"grant cross_app_access", "client_id gateway", "token_url " + badConfigSite + "/token",
		"idp_token_url " + badConfigSite + "/idp/token", "idp_client_id gateway", "idp_client_secret ${UP_SECRET}", "id_token_file " + fx.idToken}
}

// oauthWorkload is a jwt_bearer block whose assertion_file holds a JWT;
// its first two lines leave assertion_file out.
func oauthWorkload(fx configFixtures) []string {
	return []string{"grant jwt_bearer", "token_url " + badConfigSite + "/token", "assertion_file " + fx.idToken, "dpop required"}
}

// exchangeBlock is a broker site of an upstream that gets each person's
// token by exchange (oauthExchange, with lines), on a gateway that signs
// people in through an IdP: the valid config the exchange cases change.
func exchangeBlock(lines ...string) string {
	kept := slices.DeleteFunc(slices.Clone(oauthExchange), func(b string) bool {
		return slices.ContainsFunc(lines, func(l string) bool { return optionOf(l) == optionOf(b) })
	})
	signin := "signin {\nissuer " + badConfigSite + "\noidc {\nissuer https://idp.test\nclient_id gw\nclient_secret {env.UP_SECRET}\n}\n}"
	up := "upstream up {\nurl " + badConfigSite + "/mcp\noauth {\n" + strings.Join(append(kept, lines...), "\n") + "\n}\n}"
	return caddyfileOf("zidane {\n"+signin+"\n"+up+"\n}", "zidane_mcp {\nbroker up\nresource "+badConfigSite+"/mcp\n}")
}

func agentBlock(lines ...string) string {
	return zidaneBlock("agent coder {\ncommand /bin/true\n" + strings.Join(lines, "\n") + "\n}")
}

// auditWriterBlock is a log of the audit logger to the zidane_audit writer
// with lines; the default signing key is in the environment.
func auditWriterBlock(_ configFixtures, lines ...string) string {
	return caddyfileOf("log audit {\ninclude http.handlers.zidane_mcp.audit\noutput zidane_audit {\n"+strings.Join(lines, "\n")+"\n}\nformat json\n}", "zidane_mcp {\nguard\n}")
}

func sandboxBlock(lines ...string) string {
	return agentBlock("sandbox {\n" + strings.Join(lines, "\n") + "\n}")
}

// baselines are the configs the cases change, each valid as it is.
func baselines(fx configFixtures) map[string]string {
	return map[string]string{
		"guard":          guarded(),
		"jwt key":        jwtBlock("public_key_file " + fx.pub),
		"jwt jwks":       jwtBlock("jwks_url " + badConfigSite + "/jwks"),
		"upstream":       upstreamBlock(),
		"stdio":          stdioBlock(),
		"oauth secret":   oauthBlock(oauthSecret),
		"oauth key":      oauthBlock(oauthKey(fx)),
		"oauth login":    oauthBlock(oauthLogin),
		"oauth xaa":      oauthBlock(oauthXAA(fx)),
		"oauth workload": oauthBlock(oauthWorkload(fx)),
		"oauth exchange": exchangeBlock(),
		"agent":          agentBlock(),
		"sandbox":        sandboxBlock("read /opt"),
		"upstreams":      zidaneBlock("upstreams_file " + fx.mcpJSON),
		"broker":         caddyfileOf("zidane {\nupstream up "+badConfigSite+"/mcp\n}", "zidane_mcp {\nbroker up\n}"),
		"default agent":  zidaneBlock("agent coder {\ncommand /bin/true\n}", "default_agent coder", "session_upstreams up", "upstream up "+badConfigSite+"/mcp"),
		"audit writer":   auditWriterBlock(fx, "file "+filepath.Join(fx.dir, "audit.log"), "checkpoint_every 1m", "signing_key {env.AUDIT_KEY}"),
		"policy": caddyfileOf("zidane {\npolicy {\ndeny \"tool.name == 'drop_table'\" \"dropping tables is not allowed here\"\n}\n}",
			"zidane_mcp {\nguard\npolicy {\nallow `'db' in principal.scopes && !args.query.matches('(?i)\\\\b(drop|truncate)\\\\b')`\n}\n}"),
	}
}

// Labels of the standard bad values, which every option of a kind must be
// given (see requiredLabels).
const (
	labelNegative  = "negative"
	labelZero      = "zero"
	labelNotNumber = "not a number"
	labelHuge      = "huge"
	labelEmpty     = "no value"
	labelDir       = "a directory"
	labelDevZero   = "/dev/zero"
	labelFIFO      = "a named pipe"
	labelTooBig    = "over 1 MiB"
	labelMissing   = "missing"
)

// durationCases are the bad values of an option that takes a positive
// duration; wrap puts `<option> <value>` in a config.
func durationCases(option string, wrap func(line string) string, want ...string) []badConfig {
	name := lastWord(option)
	var out []badConfig
	for _, v := range []struct{ label, value string }{
		{labelNegative, "-1s"}, {labelZero, "0s"}, {labelNotNumber, "soon"}, {labelHuge, "9999999999999h"}, {labelEmpty, ""},
	} {
		out = append(out, badConfig{option: option, label: v.label, caddyfile: wrap(strings.TrimSpace(name + " " + v.value)), want: want})
	}
	return out
}

// countCases are the bad values of an option that takes a positive whole
// number.
func countCases(option string, wrap func(line string) string, want ...string) []badConfig {
	name := lastWord(option)
	var out []badConfig
	for _, v := range []struct{ label, value string }{
		{labelNegative, "-1"}, {labelZero, "0"}, {labelNotNumber, "many"}, {labelHuge, "99999999999999999999"}, {"a fraction", "1.5"}, {labelEmpty, ""},
	} {
		out = append(out, badConfig{option: option, label: v.label, caddyfile: wrap(strings.TrimSpace(name + " " + v.value)), want: want})
	}
	return out
}

// fileCases are the paths that no option naming a file may accept: a
// directory, /dev/zero, a named pipe (reading either never ends), a file
// over the size limit (else valid), and no path.
func fileCases(option string, fx configFixtures, tooBig string, wrap func(line string) string) []badConfig {
	name := lastWord(option)
	c := func(label, value string, want ...string) badConfig {
		return badConfig{option: option, label: label, caddyfile: wrap(strings.TrimSpace(name + " " + value)), want: want}
	}
	return []badConfig{
		c(labelDir, fx.dir, "is a directory"),
		c(labelDevZero, "/dev/zero", "not a regular file"),
		c(labelFIFO, fx.fifo, "named pipe", "not a regular file"),
		c(labelTooBig, tooBig, "1 MiB"),
		c(labelEmpty, "", name+" takes one"),
	}
}

func lastWord(path string) string { return path[strings.LastIndexByte(path, ' ')+1:] }

// requiredLabels are the bad values an option must be tried with, by the
// value the Caddyfile reference documents for it.
func requiredLabels(o referenceOption) []string {
	switch {
	case o.value == "<duration>" || o.value == "<dur>":
		return []string{labelNegative, labelNotNumber, labelHuge, labelEmpty}
	case o.value == "<n>":
		return []string{labelNegative, labelNotNumber, labelHuge, labelEmpty}
	case o.value == "<path>" && strings.HasSuffix(o.path, "_file"):
		return []string{labelDir, labelDevZero, labelFIFO, labelTooBig, labelEmpty}
	}
	return nil
}

func badConfigs(fx configFixtures) []badConfig {
	c := func(option, label, caddyfile string, want ...string) badConfig {
		return badConfig{option: option, label: label, caddyfile: caddyfile, want: want}
	}
	key := "public_key_file " + fx.pub
	site := func(lines ...string) string { return caddyfileOf("", strings.Join(lines, "\n")) }
	scopes65 := strings.TrimSpace(strings.Repeat("s ", 65))
	cases := []badConfig{
		c("zidane_mcp", "an argument", site("zidane_mcp on {\nguard\n}"), "zidane_mcp takes no argument"),
		c("zidane_mcp", "no mode", mcpBlock(), "choose one mode"),
		c("zidane_mcp sessions", "a value", mcpBlock("sessions on"), "sessions takes no value"),
		c("zidane_mcp sessions", "with another mode", mcpBlock("sessions", "guard"), "choose one mode"),
		c("zidane_mcp broker", labelEmpty, mcpBlock("broker"), "broker takes the name of an upstream"),
		c("zidane_mcp broker", "two names", mcpBlock("broker a b"), "broker takes the name of an upstream"),
		c("zidane_mcp broker", "unknown", mcpBlock("broker nosuch"), `no such upstream`),
		c("zidane_mcp aggregate", labelEmpty, mcpBlock("aggregate"), "aggregate takes the names of upstreams"),
		c("zidane_mcp aggregate", "unknown", mcpBlock("aggregate nosuch"), `no upstream "nosuch"`),
		c("zidane_mcp prefix", "unknown word", guarded("prefix sometimes"), "prefix takes always or conditional"),
		c("zidane_mcp prefix", labelEmpty, guarded("prefix"), "prefix takes always or conditional"),
		c("zidane_mcp guard", "a value", mcpBlock("guard on"), "guard takes no value"),
		c("zidane_mcp guard", "twice", mcpBlock("guard", "guard"), "guard given twice"),
		c("zidane_mcp guard upstream", labelEmpty, mcpBlock("guard {\nupstream\n}"), "guard upstream takes the MCP server's URL"),
		c("zidane_mcp guard upstream", "twice", mcpBlock("guard {\nupstream http://127.0.0.1:9/mcp\nupstream http://127.0.0.1:8/mcp\n}"), "guard upstream given twice"),
		c("zidane_mcp guard upstream", "a path", mcpBlock("guard {\nupstream /mcp\n}"), "absolute URL"),
		c("zidane_mcp guard upstream", "plain http off loopback", mcpBlock("guard {\nupstream http://10.0.0.5/mcp\n}"), "plain http is allowed only to localhost"),
		c("zidane_mcp guard upstream", "user info", mcpBlock("guard {\nupstream https://user:pa55word@mcp.example/mcp\n}"), "userinfo", "configured header"),
		c("zidane_mcp guard upstream", "a secret in its query", mcpBlock("guard {\nupstream https://mcp.example/mcp?api_key=abc123\n}"), "query parameter api_key looks like a secret", "upstream_header"),
		c("zidane_mcp guard upstream", "a request placeholder in upstream_header", mcpBlock("guard {\nupstream http://127.0.0.1:9/mcp\nupstream_header X-Api-Key {http.request.header.X-Key}\n}"), "read once, when Caddy starts", "{env.VAR}"),
		c("zidane_mcp guard upstream", "a placeholder", mcpBlock("guard {\nupstream http://127.0.0.1:9/${MCP_PATH}\n}"), "the URL takes no placeholder"),
		c("zidane_mcp guard upstream", "an upstream_header that resolves empty", mcpBlock("guard {\nupstream http://127.0.0.1:9/mcp\nupstream_header Authorization \"Bearer {env.ZIDANE_TEST_UNSET_VAR}\"\n}"), "not empty"),
		c("zidane_mcp guard upstream_header", "twice in two cases", mcpBlock("guard {\nupstream_header X-Api-Key {env.A}\nupstream_header x-api-key {env.B}\n}"), "given twice"),
		c("zidane_mcp guard upstream", "an upstream_header the pass-through sets", mcpBlock("guard {\nupstream http://127.0.0.1:9/mcp\nupstream_header Mcp-Session-Id {env.HOME}\n}"), "sets or passes this header itself", "remove the upstream_header"),
		c("zidane_mcp guard upstream_header", "a literal credential", mcpBlock("guard {\nupstream_header Authorization \"Bearer abc\"\n}"), "holds a literal value", "{env.VAR}"),
		c("zidane_mcp guard upstream_header", "one value", mcpBlock("guard {\nupstream_header X-Api-Key\n}"), "upstream_header takes a header name and a value"),
		c("zidane_mcp guard upstream_header", "a bad header name", mcpBlock("guard {\nupstream_header \"X Api Key\" {env.KEY}\n}"), "not a valid HTTP header name"),
		c("zidane_mcp resource", "ftp", guarded("resource ftp://127.0.0.1/mcp"), "give an http(s) URL"),
		c("zidane_mcp resource", "no leading slash", guarded("resource mcp"), "give an http(s) URL"),
		c("zidane_mcp resource", "a query", guarded("resource "+badConfigSite+"/mcp?x=1"), "no query"),
		c("zidane_mcp resource", labelEmpty, guarded("resource"), "resource takes one URL or path"),
		c("zidane_mcp max_body", labelNegative, guarded("max_body -1"), "give a size such as 1MiB"),
		c("zidane_mcp max_body", labelZero, guarded("max_body 0"), "give a size such as 1MiB"),
		c("zidane_mcp max_body", labelNotNumber, guarded("max_body lots"), "give a size such as 1MiB"),
		c("zidane_mcp max_body", labelHuge, guarded("max_body 2TiB"), "at most 1TiB"),
		c("zidane_mcp max_body", labelEmpty, guarded("max_body"), "max_body takes one size"),
		c("zidane_mcp allowed_origins", labelEmpty, guarded("allowed_origins"), "allowed_origins takes one or more origins"),
		c("zidane_mcp allowed_origins", "a path", guarded("allowed_origins https://app.test/page"), "write scheme://host[:port]"),
		c("zidane_mcp allowed_origins", "no scheme", guarded("allowed_origins app.test"), "write scheme://host[:port]"),
		c("zidane_mcp scope", "no name", guarded("scope"), "scope needs a name"),
		c("zidane_mcp scope", "a bad name", guarded("scope \"de ploy\" tools deploy"), "use letters, digits"),
		c("zidane_mcp scope", "grants nothing", guarded("scope deploy"), "grants nothing"),
		c("zidane_mcp scope", "an unknown list", guarded("scope deploy files x"), "use tools, verbs or methods"),
		c("zidane_mcp scope tools", "empty on the line", guarded("scope deploy tools"), "tools needs at least one value"),
		c("zidane_mcp scope tools", labelEmpty, guarded("scope deploy {\ntools\n}"), "tools needs at least one value"),
		c("zidane_mcp scope verbs", labelEmpty, guarded("scope deploy {\ntools sessions\nverbs\n}"), "verbs needs at least one value"),
		c("zidane_mcp scope verbs", "without tools", guarded("scope deploy {\nverbs read\n}"), "lists verbs but no tool"),
		c("zidane_mcp scope methods", labelEmpty, guarded("scope deploy {\nmethods\n}"), "methods needs at least one value"),
		c("zidane_mcp no_default_scopes", "a value", guarded("no_default_scopes yes"), "no_default_scopes takes no value"),
		c("zidane_mcp disable_localhost_protection", "a value", guarded("disable_localhost_protection yes"), "disable_localhost_protection takes no value"),
		c("zidane_mcp rate_limit", "a value", guarded("rate_limit 20/s 40"), "rate_limit takes a block"),
		c("zidane_mcp rate_limit", "an unknown limit", guarded("rate_limit {\nper_user 1/s 1\n}"), "use per_token, per_ip or ipv6_prefix"),
	}
	sizeCases := func(opt string, wrap func(string) string, word, example string) []badConfig {
		return []badConfig{
			c(opt, labelNegative, wrap(word+" -1"), "give a size such as "+example),
			c(opt, labelZero, wrap(word+" 0"), "give a size such as "+example),
			c(opt, labelNotNumber, wrap(word+" lots"), "give a size such as "+example),
			c(opt, labelHuge, wrap(word+" 2TiB"), "at most 1TiB"),
			c(opt, labelEmpty, wrap(word), word+" takes one size"),
		}
	}
	cases = append(cases, sizeCases("zidane_mcp guard max_response", func(l string) string { return mcpBlock("guard {\n" + l + "\n}") }, "max_response", "16MiB")...)
	cases = append(cases, sizeCases("zidane upstream max_response", func(l string) string { return upstreamBlock(l) }, "max_response", "16MiB")...)
	cases = append(cases, sizeCases("zidane max_inflight_response", func(l string) string { return zidaneBlock(l) }, "max_inflight_response", "256MiB")...)
	cases = append(cases,
		c("zidane_mcp guard pin", "an unknown mode", mcpBlock("guard {\npin loose\n}"), "use strict, warn or off"),
		c("zidane_mcp guard pin", labelEmpty, mcpBlock("guard {\npin\n}"), "pin takes one value"),
		c("zidane upstream pin", "an unknown mode", upstreamBlock("pin loose"), "use strict, warn or off"),
		c("zidane upstream pin", labelEmpty, upstreamBlock("pin"), "pin takes one value"),
		c("zidane_mcp guard new_tools", "an unknown policy", mcpBlock("guard {\nnew_tools maybe\n}"), "use allow or hold"),
		c("zidane_mcp guard new_tools", labelEmpty, mcpBlock("guard {\nnew_tools\n}"), "new_tools takes one value"),
		c("zidane upstream new_tools", "an unknown policy", upstreamBlock("new_tools maybe"), "use allow or hold"),
	)
	ipv6 := func(v string) string { return guarded("rate_limit {\nipv6_prefix " + v + "\n}") }
	cases = append(cases,
		c("zidane_mcp rate_limit ipv6_prefix", labelZero, ipv6("0"), "1 to 128"),
		c("zidane_mcp rate_limit ipv6_prefix", labelNegative, ipv6("-1"), "1 to 128"),
		c("zidane_mcp rate_limit ipv6_prefix", labelHuge, ipv6("129"), "1 to 128"),
		c("zidane_mcp rate_limit ipv6_prefix", labelNotNumber, ipv6("many"), "1 to 128"),
	)
	for _, kind := range []string{"per_token", "per_ip"} {
		rl := func(v string) string { return guarded("rate_limit {\n" + kind + " " + v + "\n}") }
		opt := "zidane_mcp rate_limit " + kind
		cases = append(cases,
			c(opt, "no burst", rl("20/s"), "takes a rate such as 20/s and a burst such as 40"),
			c(opt, "no rate", rl(""), "takes a rate such as 20/s and a burst such as 40"),
			c(opt, "no unit", rl("20 40"), "write events per unit, such as 20/s"),
			c(opt, "an unknown unit", rl("20/d 40"), "the unit is s, m or h"),
			c(opt, "a zero rate", rl("0/s 40"), "give a positive number"),
			c(opt, "a negative rate", rl("-5/s 40"), "give a positive number"),
			c(opt, "a rate that is not a number", rl("many/s 40"), "is not a number"),
			c(opt, "a huge rate", rl("1e999/s 40"), "out of range"),
			c(opt, "a rate of NaN", rl("NaN/s 40"), "give a positive number"),
			c(opt, "a zero burst", rl("20/s 0"), "give at least 1"),
			c(opt, "a negative burst", rl("20/s -1"), "give at least 1"),
			c(opt, "a fractional burst", rl("20/s 1.5"), "is not a whole number"),
			c(opt, "a huge burst", rl("20/s 99999999999999999999"), "is not a whole number"),
		)
	}
	cases = append(cases,
		c("zidane_mcp jwt", "an argument", guarded("resource "+badConfigSite+"/mcp", "jwt on {\nissuer https://idp.test\n"+key+"\n}"), "jwt takes no argument"),
		c("zidane_mcp jwt", "no issuer", guarded("resource "+badConfigSite+"/mcp", "jwt {\n"+key+"\n}"), "jwt needs an issuer"),
		c("zidane_mcp jwt", "no key", jwtBlock(), "no signing keys configured"),
		c("zidane_mcp jwt", "no audience for a relative resource", guarded("jwt {\nissuer https://idp.test\n"+key+"\n}"), "set `audience` in the jwt block"),
		c("zidane_mcp jwt issuer", labelEmpty, jwtBlock(key, "issuer"), "issuer takes one value"),
		c("zidane_mcp jwt issuer", "two values", jwtBlock(key, "issuer a b"), "issuer takes one value"),
		c("zidane_mcp jwt audience", labelEmpty, jwtBlock(key, "audience"), "audience takes one or more"),
		c("zidane_mcp jwt audience", "an empty string", jwtBlock(key, `audience ""`), "audiences contains an empty value"),
		c("zidane_mcp jwt algorithms", "none", jwtBlock(key, "algorithms none"), "never accepted"),
		c("zidane_mcp jwt algorithms", "HMAC", jwtBlock(key, "algorithms HS256"), "is symmetric"),
		c("zidane_mcp jwt algorithms", "unknown", jwtBlock(key, "algorithms RS1"), "unsupported algorithm"),
		c("zidane_mcp jwt algorithms", labelEmpty, jwtBlock(key, "algorithms"), "algorithms takes one or more"),
		c("zidane_mcp jwt algorithms", "none that fits the key", jwtBlock(key, "algorithms RS256"), "cannot verify any of the allowed algorithms"),
		c("zidane_mcp jwt jwks_url", "plain http off loopback", jwtBlock("jwks_url http://192.0.2.1/jwks"), "use https://"),
		c("zidane_mcp jwt jwks_url", "not a URL", jwtBlock("jwks_url jwks"), "jwks_url"),
		c("zidane_mcp jwt jwks_url", "with a key file", jwtBlock(key, "jwks_url "+badConfigSite+"/jwks"), "keep only one"),
		c("zidane_mcp jwt jwks_url", labelEmpty, jwtBlock("jwks_url"), "jwks_url takes one value: the provider's JWKS URL"),
		c("zidane_mcp jwt public_key_file", "a private key", jwtBlock("public_key_file "+fx.priv), "private key", "give the public key"),
		c("zidane_mcp jwt public_key_file", "not PEM", jwtBlock("public_key_file "+fx.notPEM), "no PEM block"),
		c("zidane_mcp jwt public_key_file", "an empty file", jwtBlock("public_key_file "+fx.empty), "is empty"),
		c("zidane_mcp jwt leeway", "over 5m", jwtBlock(key, "leeway 10h"), "between 0 and 5m"),
		c("zidane_mcp jwt leeway", labelNegative, jwtBlock(key, "leeway -1s"), "between 0 and 5m"),
		c("zidane_mcp jwt leeway", labelNotNumber, jwtBlock(key, "leeway soon"), "give a duration such as 30s"),
		c("zidane_mcp jwt leeway", labelHuge, jwtBlock(key, "leeway 9999999999999h"), "give a duration such as 30s"),
		c("zidane_mcp jwt leeway", labelEmpty, jwtBlock(key, "leeway"), "leeway takes one value: a duration such as 30s"),
		c("zidane_mcp jwt machine_scope", labelEmpty, jwtBlock(key, "machine_scope"), "machine_scope takes one value"),
		c("zidane_mcp jwt machine_scope", "two words", jwtBlock(key, `machine_scope "agent machine"`), "without spaces"),
	)
	cases = append(cases, fileCases("zidane_mcp jwt public_key_file", fx, fx.bigPub, func(l string) string { return jwtBlock(l) })...)

	cases = append(cases,
		c("zidane", "an argument", caddyfileOf("zidane on {\n}", "zidane_mcp {\nguard\n}"), "zidane takes no argument"),
		c("zidane", "twice", caddyfileOf("zidane {\n}\nzidane {\n}", "zidane_mcp {\nguard\n}"), "given twice"),
	)
	for _, opt := range []string{"token_sync", "last_used_flush", "link_ttl", "agent_idle_timeout", "mcp_session_idle_timeout", "approval_pending", "approval_approved"} {
		cases = append(cases, durationCases("zidane "+opt, func(l string) string { return zidaneBlock(l) }, "give a positive duration such as 1s")...)
	}
	for _, opt := range []string{"max_agents", "max_sessions", "max_sessions_per_token", "max_agents_per_token"} {
		cases = append(cases, countCases("zidane "+opt, func(l string) string { return zidaneBlock(l) }, "give a positive whole number")...)
	}
	cases = append(cases,
		c("zidane approval_pending", "under a second", zidaneBlock("approval_pending 500ms"), "approval_pending, approval_approved", "outside 1s to 24h0m0s"),
		c("zidane approval_approved", "over a day", zidaneBlock("approval_approved 25h"), "approval_pending, approval_approved", "outside 1s to 24h0m0s"),
	)
	cases = append(cases,
		c("zidane agent", "no name", zidaneBlock("agent {\ncommand /bin/true\n}"), "agent takes a name and a block"),
		c("zidane agent", "two names", zidaneBlock("agent a b {\ncommand /bin/true\n}"), "agent takes a name and a block"),
		c("zidane agent", "no command", zidaneBlock("agent coder {\n}"), "give its command"),
		c("zidane agent", "twice", zidaneBlock("agent coder {\ncommand /bin/true\n}", "agent coder {\ncommand /bin/true\n}"), "configured twice"),
		c("zidane agent", "an unknown option", agentBlock("model opus"), "use command, env, user or sandbox"),
		c("zidane agent command", labelEmpty, agentBlock("command"), "command needs the program to run"),
		c("zidane agent env", "one value", agentBlock("env FOO"), "env takes a name and a value"),
		c("zidane agent env", "a literal secret", agentBlock("env ANTHROPIC_API_KEY sk-ant-123"), "holds a literal value", "${VAR}"),
		c("zidane agent user", "unknown", agentBlock("user zidane-no-such-user"), "give an account of this host"),
		c("zidane agent user", labelEmpty, agentBlock("user"), "user takes the name of an account"),
		c("zidane agent sandbox", "an unknown word", agentBlock("sandbox maybe"), "write sandbox off, or a sandbox block"),
		c("zidane agent sandbox", "twice", agentBlock("sandbox off", "sandbox off"), "sandbox is given twice"),
		c("zidane agent sandbox", "off with a block", agentBlock("sandbox off {\nread /opt\n}"), "sandbox off takes no block"),
		c("zidane agent sandbox", "an unknown option", sandboxBlock("network none"), "use read, write, connect, best_effort or off"),
		c("zidane agent sandbox connect", labelZero, sandboxBlock("connect 0"), "give a TCP port (1 to 65535) or any"),
		c("zidane agent sandbox connect", labelHuge, sandboxBlock("connect 70000"), "give a TCP port (1 to 65535) or any"),
		c("zidane agent sandbox connect", labelNegative, sandboxBlock("connect -1"), "give a TCP port (1 to 65535) or any"),
		c("zidane agent sandbox connect", labelNotNumber, sandboxBlock("connect https"), "give a TCP port (1 to 65535) or any"),
		c("zidane agent sandbox connect", labelEmpty, sandboxBlock("connect"), "connect takes TCP ports, or any"),
		c("zidane agent sandbox best_effort", "a value", sandboxBlock("best_effort yes"), "best_effort takes no value"),
		c("zidane default_agent", "unknown", zidaneBlock("default_agent nosuch"), `default_agent "nosuch" is not configured`, "demo"),
		c("zidane default_agent", labelEmpty, zidaneBlock("default_agent"), "default_agent takes the name of an agent"),
		c("zidane default_agent", "two names", zidaneBlock("default_agent a b"), "default_agent takes the name of an agent"),
		c("zidane worktree_root", "relative", zidaneBlock("worktree_root worktrees"), "give an absolute path"),
		c("zidane worktree_root", "a file", zidaneBlock("worktree_root "+fx.pub), "is not a directory"),
		c("zidane worktree_root", "/dev/zero", zidaneBlock("worktree_root /dev/zero"), "is not a directory"),
		c("zidane worktree_root", labelEmpty, zidaneBlock("worktree_root"), "worktree_root takes one absolute path"),
		// Rules over calls: each is compiled when the Caddyfile is read,
		// and an error names its line and says what CEL found.
		c("zidane_mcp policy", "a value", guarded("policy on {\nallow \"true\"\n}"), "policy takes no value"),
		c("zidane_mcp policy", "no rules", guarded("policy {\n}"), "policy has no rules"),
		c("zidane_mcp policy", "twice", guarded("policy {\nallow \"true\"\n}", "policy {\nallow \"true\"\n}"), "policy given twice"),
		c("zidane_mcp policy", "an unknown effect", guarded("policy {\npermit \"true\"\n}"), `unknown policy rule "permit"`, "use deny, approve or allow"),
		c("zidane_mcp policy deny", "no message", guarded("policy {\ndeny \"tool.name == 'x'\"\n}"), "takes an expression and a message"),
		c("zidane_mcp policy deny", "an unknown variable", guarded("policy {\ndeny \"request.path == '/x'\" \"no\"\n}"), "undeclared reference to 'request'", "Caddyfile:"),
		c("zidane_mcp policy deny", "an unknown field", guarded("policy {\ndeny \"principal.email == 'x'\" \"no\"\n}"), "undeclared reference to 'principal.email'", "Caddyfile:"),
		c("zidane_mcp policy deny", "not a bool", guarded("policy {\ndeny \"tool.name\" \"no\"\n}"), "not a bool"),
		c("zidane_mcp policy deny", "a bad regular expression", guarded("policy {\ndeny \"args.q.matches('(')\" \"no\"\n}"), "error parsing regexp"),
		c("zidane_mcp policy deny", "a syntax error", guarded("policy {\ndeny \"tool.name ==\" \"no\"\n}"), "does not compile"),
		c("zidane_mcp policy approve", "no message", guarded("policy {\napprove \"tool.name == 'deploy'\"\n}"), "approve takes an expression, a message"),
		c("zidane_mcp policy approve", "self without a message", guarded("policy {\napprove \"tool.name == 'deploy'\" self\n}"), "needs a message before self"),
		c("zidane_mcp policy approve", "a word after the message that is not self", guarded("policy {\napprove \"tool.name == 'deploy'\" \"ask\" selfish\n}"), "approve takes an expression, a message"),
		c("zidane_mcp policy approve", "self twice", guarded("policy {\napprove \"tool.name == 'deploy'\" \"ask\" self self\n}"), "approve takes an expression, a message"),
		c("zidane_mcp policy approve", "an unknown variable", guarded("policy {\napprove \"request.path == '/x'\" \"ask\"\n}"), "undeclared reference to 'request'", "Caddyfile:"),
		c("zidane_mcp policy deny", "self", guarded("policy {\ndeny \"tool.name == 'x'\" \"no\" self\n}"), "deny takes an expression and a message"),
		c("zidane_mcp policy allow", labelEmpty, guarded("policy {\nallow\n}"), "allow takes an expression"),
		c("zidane_mcp policy allow", "three values", guarded("policy {\nallow \"true\" \"m\" self\n}"), "allow takes an expression"),
		c("zidane_mcp policy allow", "an unknown variable", guarded("policy {\nallow \"'db' in scopes\"\n}"), "undeclared reference to 'scopes'"),
		c("zidane policy", "a value", zidaneBlock("policy on {\nallow \"true\"\n}"), "policy takes no value"),
		c("zidane policy", "twice", zidaneBlock("policy {\nallow \"true\"\n}", "policy {\nallow \"true\"\n}"), "policy given twice"),
		c("zidane policy deny", "an unknown field", zidaneBlock("policy {\ndeny \"tool.nam == 'x'\" \"no\"\n}"), "undeclared reference to 'tool.nam' (did you mean 'tool.name'?)", "Caddyfile:"),
		c("zidane policy deny", "no message", zidaneBlock("policy {\ndeny \"true\"\n}"), "takes an expression and a message"),
		c("zidane policy approve", "self without a message", zidaneBlock("policy {\napprove \"true\" self\n}"), "needs a message before self"),
		c("zidane policy approve", "a word after the message that is not self", zidaneBlock("policy {\napprove \"true\" \"ask\" selfish\n}"), "approve takes an expression, a message"),
		c("zidane policy allow", "not a bool", zidaneBlock("policy {\nallow \"args\"\n}"), "not a bool"),
		c("zidane roots", labelEmpty, zidaneBlock("roots"), "roots takes one or more absolute paths"),
		c("zidane roots", "relative", zidaneBlock("roots projects"), "is not an absolute path"),
		c("zidane share_sessions", "maybe", zidaneBlock("share_sessions maybe"), "share_sessions takes no value, or true or false"),
		c("zidane share_sessions", "two values", zidaneBlock("share_sessions true false"), "share_sessions takes no value, or true or false"),
	)
	for _, opt := range []string{"read", "write"} {
		cases = append(cases,
			c("zidane agent sandbox "+opt, "relative", sandboxBlock(opt+" lib"), "give an absolute path"),
			c("zidane agent sandbox "+opt, labelEmpty, sandboxBlock(opt), opt+" takes one or more absolute paths"),
		)
	}

	cases = append(cases,
		c("zidane upstream", "no name", zidaneBlock("upstream"), "upstream takes a name, then a URL or a block"),
		c("zidane upstream", "three words", zidaneBlock("upstream up "+badConfigSite+"/mcp extra"), "upstream takes a name, then a URL or a block"),
		c("zidane upstream", "a bad name", zidaneBlock(`upstream "u p" `+badConfigSite+"/mcp"), "letters, digits"),
		c("zidane upstream", "neither url nor command", zidaneBlock("upstream up {\n}"), "set url (an https:// MCP endpoint) or command"),
		c("zidane upstream", "plain http off loopback", zidaneBlock("upstream up http://192.0.2.1/mcp"), "use https://"),
		c("zidane upstream", "twice", zidaneBlock("upstream up "+badConfigSite+"/mcp", "upstream up "+badConfigSite+"/other"), "defined twice"),
		c("zidane upstream", "an unknown option", upstreamBlock("retries 3"), `unknown option "retries"`),
		c("zidane upstream url", "ftp", upstreamBlock("url ftp://127.0.0.1/mcp"), `scheme "ftp" is not allowed`),
		c("zidane upstream url", labelEmpty, upstreamBlock("url"), "url takes one value"),
		c("zidane upstream url", "a literal password", upstreamBlock("url https://me:pw@127.0.0.1/mcp"), "holds a literal value"),
		c("zidane upstream transport", "unknown", upstreamBlock("transport pigeon"), `use "http" (streamable HTTP), "sse" or "stdio"`),
		c("zidane upstream transport", "stdio with a url", upstreamBlock("transport stdio"), `needs command`),
		c("zidane upstream transport", labelEmpty, upstreamBlock("transport"), "transport takes one value"),
		c("zidane upstream header", "a literal credential", upstreamBlock(`header Authorization "Bearer abc"`), "holds a literal value", "${VAR}"),
		c("zidane upstream header", "one value", upstreamBlock("header X-Api-Key"), "header takes a name and a value"),
		c("zidane upstream header", "a bad name", upstreamBlock(`header "X Api Key" ${KEY}`), "not a valid HTTP header name"),
		c("zidane upstream bearer", "a literal token", upstreamBlock("bearer abc"), "holds a literal value"),
		c("zidane upstream bearer", labelEmpty, upstreamBlock("bearer"), "bearer takes one value"),
		c("zidane upstream bearer", "with an Authorization header", upstreamBlock("header Authorization ${A}", "bearer ${B}"), "given twice"),
		c("zidane upstream command", labelEmpty, stdioBlock("command"), "command needs the program to run"),
		c("zidane upstream command", "with a url", upstreamBlock("command /bin/true"), "has both url and command"),
		c("zidane upstream env", "one value", stdioBlock("env FOO"), "env takes a name and a value"),
		c("zidane upstream env", "a literal secret", stdioBlock("env GITHUB_TOKEN ghp_123"), "holds a literal value"),
		c("zidane upstream env", "on an http upstream", upstreamBlock("env FOO bar"), "applies to stdio servers"),
		c("zidane upstream tools", "an unknown word", upstreamBlock("tools maybe x"), "write tools allow <pattern...> or tools deny <pattern...>"),
		c("zidane upstream tools", "no pattern", upstreamBlock("tools allow"), "write tools allow <pattern...> or tools deny <pattern...>"),
		c("zidane upstream scope", "two words", upstreamBlock(`scope "a b"`), "use letters, digits"),
		c("zidane upstream scope", labelEmpty, upstreamBlock("scope"), "scope takes one value"),
		c("zidane upstream shared", "maybe", upstreamBlock("shared maybe"), "shared takes true or false"),
		c("zidane upstream shared", labelEmpty, upstreamBlock("shared"), "shared takes one value"),
		c("zidane upstream oauth", "an argument", upstreamBlock("oauth on"), "oauth takes a block"),
		c("zidane upstream oauth", "twice", upstreamBlock("oauth {\n"+strings.Join(oauthSecret, "\n")+"\n}", "oauth {\n}"), "oauth is given twice"),
		c("zidane upstream oauth", "an empty block", upstreamBlock("oauth {\n}"), "authorization_code needs redirect_url"),
		c("zidane upstream oauth", "on a stdio upstream", stdioBlock("oauth {\n"+strings.Join(oauthSecret, "\n")+"\n}"), "oauth applies to http and sse servers"),
		c("zidane upstream oauth", "an unknown option", oauthBlock(oauthSecret, "client_secrt x"), `unknown oauth option "client_secrt"`),
		c("zidane upstream oauth grant", "unknown", oauthBlock(oauthSecret, "grant implicit"), "use authorization_code, client_credentials, cross_app_access, jwt_bearer or token_exchange"),
		c("zidane upstream oauth grant", "token_exchange shared", oauthBlock(oauthExchange, "credentials shared"), "token_exchange", "needs credentials per_user"),
		c("zidane upstream oauth grant", "token_exchange without a client secret", oauthBlock(oauthExchange[:3], "authorization_server "+badConfigSite), "client credential"),
		c("zidane upstream oauth grant", "token_exchange to the server the upstream names", oauthBlock(oauthExchange[:4]), "set authorization_server"),
		c("zidane upstream oauth grant", "token_exchange without a signin IdP", oauthBlock(oauthExchange), "signs no one in through one", "signin { oidc"),
		c("zidane upstream oauth grant", "token_exchange with fallback connect without a signin IdP", oauthBlock(oauthExchange, "fallback connect", "redirect_url "+badConfigSite+"/zidane/oauth/callback/up"), "signs no one in through one"),
		c("zidane upstream oauth id_token_file", "with cross_app_access per_user", oauthBlock(oauthXAA(fx), "credentials per_user"), "remove id_token_file"),
		c("zidane upstream oauth grant", "cross_app_access per_user to the server the upstream names", oauthBlock(slices.DeleteFunc(oauthXAA(fx), func(l string) bool { return optionOf(l) == "token_url" || optionOf(l) == "id_token_file" }), "credentials per_user"), "set authorization_server"),
		c("zidane upstream oauth fallback", "unknown", exchangeBlock("fallback browser"), "use none (the default"),
		c("zidane upstream oauth redirect_url", "fallback connect off the signin site", exchangeBlock("fallback connect", "redirect_url https://elsewhere.example.com/zidane/oauth/callback/up"), "not on the signin issuer's site"),
		c("zidane upstream oauth fallback", labelEmpty, oauthBlock(oauthExchange, "fallback"), "fallback takes one value"),
		c("zidane upstream oauth fallback", "connect without redirect_url", oauthBlock(oauthExchange, "fallback connect"), "needs redirect_url"),
		c("zidane upstream oauth fallback", "connect with authorization_code", oauthBlock(oauthLogin, "credentials per_user", "fallback connect"), "fallback connect applies"),
		c("zidane upstream oauth fallback", "redirect_url without fallback connect", oauthBlock(oauthExchange, "redirect_url "+badConfigSite+"/zidane/oauth/callback/up"), "fallback connect"),
		c("zidane upstream oauth audience", labelEmpty, oauthBlock(oauthExchange, "audience"), "audience takes one value"),
		c("zidane upstream oauth actor_token_file", "with client_credentials", oauthBlock(oauthSecret, "actor_token_file "+fx.idToken), "actor_token_file applies to grant token_exchange"),
		c("zidane upstream oauth audience", "with client_credentials", oauthBlock(oauthSecret, "audience urn:up"), "audience applies to grant token_exchange"),
		c("zidane upstream oauth grant", labelEmpty, oauthBlock(oauthSecret, "grant"), "grant takes one value"),
		c("zidane upstream oauth client_id", labelEmpty, oauthBlock(oauthSecret, "client_id"), "client_id takes one value"),
		c("zidane upstream oauth client_id", "missing for client_credentials", oauthBlock([]string{"grant client_credentials", "token_url " + badConfigSite + "/token"}), "needs client_id"),
		c("zidane upstream oauth client_secret", "a literal secret", oauthBlock(oauthSecret, "client_secret s3cret"), "holds a literal value"),
		c("zidane upstream oauth client_secret", "with a private key", oauthBlock(oauthKey(fx), "client_secret ${UP_SECRET}"), "either client_secret or a private key"),
		c("zidane upstream oauth token_endpoint_auth_method", "unknown", oauthBlock(oauthSecret, "token_endpoint_auth_method magic"), "use client_secret_basic, client_secret_post, private_key_jwt or none"),
		c("zidane upstream oauth token_endpoint_auth_method", "none with a secret", oauthBlock(oauthSecret, "token_endpoint_auth_method none"), "sends no credential"),
		c("zidane upstream oauth private_key_file", "a public key", oauthBlock(oauthKey(fx), "private_key_file "+fx.pub), "give a PRIVATE KEY"),
		c("zidane upstream oauth private_key_file", "not PEM", oauthBlock(oauthKey(fx), "private_key_file "+fx.notPEM), "holds no PEM block"),
		c("zidane upstream oauth private_key", "a literal key", oauthBlock(oauthSecret[:2], "token_url "+badConfigSite+"/token", `private_key "-----BEGIN PRIVATE KEY-----"`), "holds a literal value", "private_key_file"),
		c("zidane upstream oauth signing_algorithm", "HMAC", oauthBlock(oauthKey(fx), "signing_algorithm HS256"), "use RS256 or ES256"),
		c("zidane upstream oauth signing_algorithm", "not the key's", oauthBlock(oauthKey(fx), "signing_algorithm RS256"), "does not fit the key"),
		c("zidane upstream oauth signing_algorithm", "without a key", oauthBlock(oauthSecret, "signing_algorithm ES256"), "apply to private_key_jwt"),
		c("zidane upstream oauth key_id", "without a key", oauthBlock(oauthSecret, "key_id k1"), "apply to private_key_jwt"),
		c("zidane upstream oauth key_id", labelEmpty, oauthBlock(oauthKey(fx), "key_id"), "key_id takes one value"),
		c("zidane upstream oauth scopes", labelEmpty, oauthBlock(oauthSecret, "scopes"), "scopes takes one or more scopes"),
		c("zidane upstream oauth scopes", "too many", oauthBlock(oauthSecret, "scopes "+scopes65), "give at most 64"),
		c("zidane upstream oauth scopes", "a quote", oauthBlock(oauthSecret, `scopes "a\"b"`), "is not a valid OAuth scope"),
		c("zidane upstream oauth redirect_url", "twice", upstreamBlock("oauth {\n"+strings.Join(append(slices.Clone(oauthLogin), "redirect_url "+badConfigSite+"/other"), "\n")+"\n}"), "given twice", "give it once"),
		c("zidane upstream oauth redirect_url", "plain http off loopback", oauthBlock(oauthLogin, "redirect_url http://192.0.2.1/cb"), "use https://"),
		c("zidane upstream oauth redirect_url", "not a URL", oauthBlock(oauthLogin, "redirect_url callback"), "redirect_url"),
		c("zidane upstream oauth redirect_url", "with client_credentials", oauthBlock(oauthSecret, "redirect_url "+badConfigSite+"/cb"), "apply to authorization_code"),
		c("zidane upstream oauth client_metadata_url", "plain http", oauthBlock(oauthLogin, "client_metadata_url "+badConfigSite+"/client.json"), "must be an https URL with a path"),
		c("zidane upstream oauth client_metadata_url", "no path", oauthBlock(oauthLogin, "client_metadata_url https://127.0.0.1:9"), "must be an https URL with a path"),
		c("zidane upstream oauth client_name", labelEmpty, oauthBlock(oauthLogin, "client_name"), "client_name takes one value"),
		c("zidane upstream oauth authorization_server", "ftp", oauthBlock(oauthLogin, "authorization_server ftp://127.0.0.1/"), `scheme "ftp" is not allowed`),
		c("zidane upstream oauth token_url", "plain http off loopback", oauthBlock(oauthSecret, "token_url http://192.0.2.1/token"), "use https://"),
		c("zidane upstream oauth token_url", "with authorization_code", oauthBlock(oauthLogin, "token_url "+badConfigSite+"/token"), "applies to client_credentials, cross_app_access and jwt_bearer"),
		c("zidane upstream oauth max_step_up", labelNegative, oauthBlock(oauthSecret, "max_step_up -1"), "give 1 to 10"),
		c("zidane upstream oauth max_step_up", labelHuge, oauthBlock(oauthSecret, "max_step_up 100"), "give 1 to 10"),
		c("zidane upstream oauth max_step_up", labelNotNumber, oauthBlock(oauthSecret, "max_step_up twice"), "takes a whole number"),
		c("zidane upstream oauth max_step_up", labelEmpty, oauthBlock(oauthSecret, "max_step_up"), "takes a whole number"),
		c("zidane upstream oauth idp_issuer", "plain http off loopback", oauthBlock(oauthXAA(fx), "idp_issuer http://192.0.2.1/"), "use https://"),
		c("zidane upstream oauth idp_issuer", "with client_credentials", oauthBlock(oauthSecret, "idp_issuer "+badConfigSite+"/idp"), "applies to cross_app_access, not client_credentials"),
		c("zidane upstream oauth idp_token_url", "plain http off loopback", oauthBlock(oauthXAA(fx), "idp_token_url http://192.0.2.1/token"), "use https://"),
		c("zidane upstream oauth idp_client_id", labelEmpty, oauthBlock(oauthXAA(fx), "idp_client_id"), "idp_client_id takes one value"),
		c("zidane upstream oauth idp_client_secret", "a literal secret", oauthBlock(oauthXAA(fx), "idp_client_secret s3cret"), "holds a literal value"),
		c("zidane upstream oauth assertion_file", "with client_credentials", oauthBlock(oauthSecret, "assertion_file "+fx.idToken), "applies to jwt_bearer, not client_credentials"),
		c("zidane upstream oauth assertion_file", "missing for jwt_bearer", oauthBlock(oauthWorkload(fx)[:2]), "jwt_bearer needs assertion_file"),
		c("zidane upstream oauth dpop", "unknown", oauthBlock(oauthSecret, "dpop sometimes"), "use auto (the default), off or required"),
		c("zidane upstream oauth dpop", labelEmpty, oauthBlock(oauthSecret, "dpop"), "dpop takes one value"),
		c("zidane upstream oauth credentials", "unknown", oauthBlock(oauthLogin, "credentials mine"), "use shared (the default"),
		c("zidane upstream oauth credentials", labelEmpty, oauthBlock(oauthLogin, "credentials"), "credentials takes one value"),
		c("zidane upstream oauth credentials", "per_user with a machine grant", oauthBlock(oauthSecret, "credentials per_user"), "needs grant authorization_code"),
		c("zidane upstream_token_key", "a literal key", zidaneBlock("upstream_token_key c2VjcmV0"), "holds a literal value"),
		c("zidane upstream_token_key", labelEmpty, zidaneBlock("upstream_token_key"), "upstream_token_key takes one value"),
		c("zidane upstream_token_key", "an unset variable", oauthBlockWithKey(oauthSecret, "{env.ZIDANE_E2E_UNSET}"), "is empty"),
		withEnv(c("zidane upstream_token_key", "a short key", oauthBlockWithKey(oauthSecret, "{env.SHORT_KEY}"), "must be 32 bytes in base64"), "SHORT_KEY=c2hvcnQ="),
		c("zidane upstreams_file", "not JSON", zidaneBlock("upstreams_file "+fx.priv), "upstreams_file"),
		c("zidane session_upstreams", "unknown", zidaneBlock("session_upstreams nosuch"), `no upstream "nosuch" is configured`),
		c("zidane session_upstreams", labelEmpty, zidaneBlock("session_upstreams"), "session_upstreams takes the names of configured upstreams"),
	)
	cases = append(cases, durationCases("zidane upstream timeout", func(l string) string { return upstreamBlock(l) }, "give a positive duration such as 30s")...)
	cases = append(cases, fileCases("zidane upstream oauth private_key_file", fx, fx.bigPriv, func(l string) string { return oauthBlock(oauthKey(fx), l) })...)
	cases = append(cases, fileCases("zidane upstreams_file", fx, fx.bigJSON, func(l string) string { return zidaneBlock(l) })...)
	// The ID token file is read at each exchange, and may be written only
	// after caddy starts; what is there must be a file all the same.
	cases = append(cases, fileCases("zidane upstream oauth id_token_file", fx, fx.bigIDToken, func(l string) string { return oauthBlock(oauthXAA(fx), l) })...)
	// The gateway's own JWT, the actor of a token exchange, likewise.
	cases = append(cases, fileCases("zidane upstream oauth actor_token_file", fx, fx.bigIDToken, func(l string) string { return oauthBlock(oauthExchange, l) })...)
	// The workload's JWT likewise: the platform may write it later.
	cases = append(cases, fileCases("zidane upstream oauth assertion_file", fx, fx.bigIDToken, func(l string) string { return oauthBlock(oauthWorkload(fx)[:2], l) })...)
	cases = append(cases, auditWriterCases(fx)...)
	for _, m := range []struct{ option, caddyfile string }{
		{"zidane_mcp jwt public_key_file", jwtBlock("public_key_file " + fx.missing)},
		{"zidane upstream oauth private_key_file", oauthBlock(oauthKey(fx), "private_key_file "+fx.missing)},
		{"zidane upstreams_file", zidaneBlock("upstreams_file " + fx.missing)},
	} {
		cases = append(cases, c(m.option, labelMissing, m.caddyfile, "no such file"))
	}
	// The cluster's settings, in storage zidane_nats's block: refused before
	// caddy dials NATS (nats://127.0.0.1:1 would refuse the connection).
	nats := func(option, label string, lines ...string) func(want ...string) badConfig {
		return func(want ...string) badConfig {
			return withEnv(c(option, label, natsBlock(lines...), want...), clusterKeyEnv)
		}
	}
	cases = append(cases,
		c("storage", "an argument", "{\n\tadmin off\n\tstorage zidane_nats extra\n}\n\n"+badConfigSite+" {\n\trespond 404\n}\n", "extra"),
		c("storage", "a block without the cluster key", "{\n\tadmin off\n\tstorage zidane_nats {\n\t\turl nats://127.0.0.1:1\n\t}\n}\n\n"+badConfigSite+" {\n\trespond 404\n}\n", "no cluster key", "ZIDANE_CLUSTER_KEY"),
		c("storage", "without settings", caddyfileOf("storage zidane_nats", "zidane_mcp {\nguard\n}"), "storage zidane_nats has no settings", "storage zidane_nats { url"),
		withEnv(c("zidane cluster", "an argument", caddyfileOf("storage zidane_nats\nzidane {\ncluster nats {\nurl nats://127.0.0.1:1\n}\n}", "zidane_mcp {\nguard\n}"), "takes no argument"), clusterKeyEnv),
		withEnv(c("zidane cluster", "no url", legacyNatsBlock("node gw-1"), "no url"), clusterKeyEnv),
		withEnv(c("zidane cluster", "on the file storage", caddyfileOf("zidane {\ncluster {\nurl nats://127.0.0.1:1\n}\n}", "zidane_mcp {\nguard\n}"), "add `storage zidane_nats`"), clusterKeyEnv),
		withEnv(c("zidane cluster", "twice", caddyfileOf("storage zidane_nats\nzidane {\ncluster {\nurl nats://127.0.0.1:1\n}\ncluster {\nurl nats://127.0.0.1:1\n}\n}", "zidane_mcp {\nguard\n}"), "given twice"), clusterKeyEnv),
		nats("storage url", labelEmpty, "url")("url needs one or more NATS URLs"),
		nats("storage url", "plain to a remote host", "url nats://10.0.0.9:4222")("not loopback", "use tls://"),
		nats("storage url", "a password", "url nats://user:pw@127.0.0.1:4222")("creds file"),
		nats("storage creds", labelEmpty, "url nats://127.0.0.1:1", "creds")(),
		nats("storage tls_ca", labelEmpty, "url nats://127.0.0.1:1", "tls_ca")(),
		nats("storage tls_cert", "without tls_key", "url tls://127.0.0.1:1", "tls_cert /c.pem")("tls_key go together"),
		nats("storage tls_key", labelEmpty, "url nats://127.0.0.1:1", "tls_key")(),
		nats("storage bucket", labelEmpty, "url nats://127.0.0.1:1", "bucket")(),
		nats("storage replicas", labelHuge, "url nats://127.0.0.1:1", "replicas 7")("give 1 to 5"),
		nats("storage replicas", labelNotNumber, "url nats://127.0.0.1:1", "replicas three")("give 1 to 5"),
		nats("storage lock_ttl", "under 1s", "url nats://127.0.0.1:1", "lock_ttl 10ms")("1s or more"),
		nats("storage lock_ttl", labelNotNumber, "url nats://127.0.0.1:1", "lock_ttl soon")("1s or more"),
		nats("storage key", "a literal key", "url nats://127.0.0.1:1", "key c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0MTI=")("literal", "{env.VAR}"),
		c("storage key", "an unset variable", natsBlock("url nats://127.0.0.1:1", "key {env.ZIDANE_E2E_UNSET}"), "no cluster key"),
		nats("storage node", labelEmpty, "url nats://127.0.0.1:1", "node")(),
		nats("storage node", "a slash", "url nats://127.0.0.1:1", "node a/b")("1 to 64", "such as gw-1"),
		nats("storage node", "too long", "url nats://127.0.0.1:1", "node "+strings.Repeat("n", 65))("1 to 64"),
		nats("storage advertise", labelEmpty, "url nats://127.0.0.1:1", "advertise")(),
		nats("storage advertise", "plain http to a remote host", "url nats://127.0.0.1:1", "advertise http://10.0.0.2:8080")("in the clear", "https://"),
		nats("storage advertise", "no scheme", "url nats://127.0.0.1:1", "advertise gw-1:8443")("such as https://gw-1.internal:8443"),
		nats("storage advertise", "a path", "url nats://127.0.0.1:1", "advertise https://gw-1/mcp")("no user, path or query"),
		nats("storage advertise", "the unspecified address", "url nats://127.0.0.1:1", "advertise https://0.0.0.0:8443")("no address another replica can reach"),
	)
	return append(cases, signinConfigs()...)
}

// signinBlock is a zidane option with a signin block of lines, and a
// guard site whose resource is absolute, as signin needs.
func signinBlock(lines ...string) string {
	return caddyfileOf("zidane {\nsignin {\n"+strings.Join(lines, "\n")+"\n}\n}",
		"zidane_mcp {\nguard\nresource "+badConfigSite+"/mcp\n}")
}

// signinConfigs are the bad values of the signin block, and of the
// per-site DPoP options.
func signinConfigs() []badConfig {
	c := func(option, label, caddyfile string, want ...string) badConfig {
		return badConfig{option: option, label: label, caddyfile: caddyfile, want: want}
	}
	issuer := "issuer " + badConfigSite
	oidc := func(lines ...string) string {
		return signinBlock(issuer, "oidc {\n"+strings.Join(lines, "\n")+"\n}")
	}
	cases := []badConfig{
		c("zidane_mcp dpop", "unknown", guarded("resource "+badConfigSite+"/mcp", "dpop sometimes"), "`dpop optional`", "`dpop required`"),
		c("zidane_mcp dpop", labelEmpty, guarded("resource "+badConfigSite+"/mcp", "dpop"), "optional or required"),
		c("zidane_mcp dpop", "required on a path resource", guarded("dpop required"), "absolute"),
		c("zidane_mcp dpop_nonce", "a value", guarded("resource "+badConfigSite+"/mcp", "dpop_nonce on"), "no value"),
		c("zidane_mcp dpop_nonce", "on a path resource", guarded("dpop_nonce"), "absolute"),
		c("zidane signin", "an argument", caddyfileOf("zidane {\nsignin on {\n"+issuer+"\n}\n}", "zidane_mcp {\nguard\n}"), "no argument"),
		c("zidane signin", "a site whose resource is a path", caddyfileOf("zidane {\nsignin {\n"+issuer+"\n}\n}", "zidane_mcp {\nguard\n}"), "absolute"),
		c("zidane signin issuer", labelMissing, signinBlock("registration off"), "issuer"),
		c("zidane signin issuer", labelEmpty, signinBlock("issuer"), "issuer"),
		c("zidane signin issuer", "a path", signinBlock(issuer+"/as"), "path"),
		c("zidane signin issuer", "plain http off loopback", signinBlock("issuer http://10.0.0.5"), "https"),
		c("zidane signin registration", "unknown", signinBlock(issuer, "registration sometimes"), "takes one value: dynamic", "or off"),
		c("zidane signin registration", labelEmpty, signinBlock(issuer, "registration"), "takes one value: dynamic", "or off"),
		c("zidane signin oidc", "no issuer", oidc("client_id gw", "client_secret {env.OIDC_SECRET}"), "issuer"),
		c("zidane signin oidc", "a literal secret", oidc("issuer https://idp.test", "client_id gw", "client_secret hunter2"), "{env.VAR}"),
		c("zidane signin oidc", "an unknown option", oidc("issuer https://idp.test", "client_id gw", "client_secret {env.OIDC_SECRET}", "colour blue"), "unknown option"),
	}
	for _, opt := range []string{"access_lifetime", "refresh_lifetime", "session_lifetime"} {
		cases = append(cases, durationCases("zidane signin "+opt, func(l string) string { return signinBlock(issuer, l) }, "duration")...)
	}
	return cases
}

// clusterKeyEnv gives the storage cases a cluster key, so that only the
// wrong value is wrong.
var clusterKeyEnv = "ZIDANE_CLUSTER_KEY=" + base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{9}, 32))

// natsBlock is a config in cluster mode with lines in storage
// zidane_nats's block.
func natsBlock(lines ...string) string {
	return caddyfileOf("storage zidane_nats {\n"+strings.Join(lines, "\n")+"\n}", "zidane_mcp {\nguard\n}")
}

// legacyNatsBlock is a config in cluster mode with lines in the zidane
// global option's cluster block, the former place of the settings.
func legacyNatsBlock(lines ...string) string {
	return caddyfileOf("storage zidane_nats\nzidane {\ncluster {\n"+strings.Join(lines, "\n")+"\n}\n}", "zidane_mcp {\nguard\n}")
}

// auditWriterCases are the bad values of the zidane_audit log writer's
// options.
func auditWriterCases(fx configFixtures) []badConfig {
	c := func(option, label, caddyfile string, want ...string) badConfig {
		return badConfig{option: option, label: label, caddyfile: caddyfile, want: want}
	}
	file := "file " + filepath.Join(fx.dir, "audit.log")
	w := func(lines ...string) string { return auditWriterBlock(fx, append([]string{file}, lines...)...) }
	cases := []badConfig{
		c("zidane_audit", "an argument", caddyfileOf("log audit {\noutput zidane_audit /var/log/audit.log {\n}\n}", "zidane_mcp {\nguard\n}"), "zidane_audit takes no argument", "file <path>"),
		c("zidane_audit", "no file", auditWriterBlock(fx, "checkpoint_every 1m"), "file is missing"),
		c("zidane_audit", "an unknown option", w("sign_with ed25519"), "unknown option", "checkpoint_every"),
		c("zidane_audit file", labelEmpty, auditWriterBlock(fx, "file"), "file takes one value"),
		c("zidane_audit file", "two paths", auditWriterBlock(fx, "file /a /b"), "file takes one value"),
		c("zidane_audit file", labelDir, auditWriterBlock(fx, "file "+fx.dir), "is not a regular file"),
		c("zidane_audit file", labelDevZero, auditWriterBlock(fx, "file /dev/zero"), "is not a regular file"),
		c("zidane_audit file", labelFIFO, auditWriterBlock(fx, "file "+fx.fifo), "is not a regular file"),
		c("zidane_audit checkpoint_every", labelEmpty, w("checkpoint_every"), "checkpoint_every takes one value"),
		c("zidane_audit signing_key", "a literal key", w("signing_key "+base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{5}, 32))), "holds a literal value", "{env.VAR}"),
		c("zidane_audit signing_key", labelEmpty, w("signing_key"), "signing_key takes one value"),
		c("zidane_audit signing_key", "an unset variable", w("signing_key {env.ZIDANE_E2E_UNSET}"), "is empty", "openssl rand -base64 32"),
		withEnv(c("zidane_audit signing_key", "the default variable unset", w(), "ZIDANE_AUDIT_SIGNING_KEY is empty"), "ZIDANE_AUDIT_SIGNING_KEY="),
		withEnv(c("zidane_audit signing_key", "a short key", w("signing_key {env.SHORT_AUDIT_KEY}"), "must be an Ed25519 seed of 32 bytes"), "SHORT_AUDIT_KEY=c2hvcnQ="),
		c("zidane_audit roll_disabled", "a value", w("roll_disabled yes"), "roll_disabled takes no value"),
		c("zidane_audit roll_size", labelNegative, w("roll_size -1"), "give a size such as 100MiB"),
		c("zidane_audit roll_size", labelZero, w("roll_size 0"), "give a size such as 100MiB"),
		c("zidane_audit roll_size", labelNotNumber, w("roll_size lots"), "give a size such as 100MiB"),
		c("zidane_audit roll_size", labelHuge, w("roll_size 2TiB"), "at most 1TiB"),
		c("zidane_audit roll_size", labelEmpty, w("roll_size"), "roll_size takes one value"),
		c("zidane_audit roll_keep", labelEmpty, w("roll_keep"), "roll_keep takes one value"),
		c("zidane_audit roll_keep_for", labelEmpty, w("roll_keep_for"), "roll_keep_for takes one value"),
		c("zidane_audit roll_compression", "unknown", w("roll_compression brotli"), "give none, gzip or zstd"),
		c("zidane_audit roll_compression", labelEmpty, w("roll_compression"), "roll_compression takes one value"),
		c("zidane_audit checkpoint_copy", labelEmpty, w("checkpoint_copy"), "checkpoint_copy takes one value"),
		c("zidane_audit checkpoint_copy", "beside the log", w("checkpoint_copy "+filepath.Join(fx.dir, "audit.checkpoint")), "in the audit log's directory", "another directory"),
		c("zidane_audit checkpoint_copy", labelDir, w("checkpoint_copy "+fx.dir), "is not a regular file"),
		c("zidane_audit checkpoint_copy", labelDevZero, w("checkpoint_copy /dev/zero"), "is not a regular file"),
	}
	for _, v := range []struct{ label, value string }{
		{labelNegative, "-1s"}, {labelZero, "0s"}, {labelNotNumber, "soon"}, {labelHuge, "9999999999999h"}, {"under 1s", "500ms"}, {"over 24h", "25h"},
	} {
		cases = append(cases, c("zidane_audit checkpoint_every", v.label, w("checkpoint_every "+v.value), "give a duration from 1s to 24h"))
	}
	for _, v := range []struct{ label, value string }{
		{labelNegative, "-1"}, {labelZero, "0"}, {labelNotNumber, "many"}, {labelHuge, "99999999999999999999"}, {"a fraction", "1.5"},
	} {
		cases = append(cases, c("zidane_audit roll_keep", v.label, w("roll_keep "+v.value), "give a positive whole number"))
	}
	for _, v := range []struct{ label, value string }{
		{labelNegative, "-1s"}, {labelZero, "0s"}, {labelNotNumber, "soon"}, {labelHuge, "9999999999999h"}, {"over 10 years", "3651d"},
	} {
		cases = append(cases, c("zidane_audit roll_keep_for", v.label, w("roll_keep_for "+v.value), "give a positive duration such as 90d"))
	}
	return cases
}

// oauthBlockWithKey is oauthBlock with upstream_token_key set.
func oauthBlockWithKey(base []string, key string) string {
	return zidaneBlock("upstream_token_key "+key, "upstream up {\nurl "+badConfigSite+"/mcp\noauth {\n"+strings.Join(base, "\n")+"\n}\n}")
}

func withEnv(c badConfig, env ...string) badConfig {
	c.env = append(c.env, env...)
	return c
}

// caddyOutcome is how one caddy command ended.
type caddyOutcome struct {
	output   string // stdout and stderr
	errors   string // the error lines of the output: caddy's `Error:` and error-level log messages
	err      error  // nil when it exited 0
	timedOut bool
}

// runBadConfig runs caddy with args on caddyfile (its path replaces {{FILE}}
// in args) in a home of its own, bounded by badConfigTimeout.
func runBadConfig(t *testing.T, caddyfile string, env []string, args ...string) caddyOutcome {
	t.Helper()
	dir := t.TempDir()
	path := filepath.Join(dir, "Caddyfile")
	if err := os.WriteFile(path, []byte(caddyfile), 0o600); err != nil {
		t.Fatal(err)
	}
	for i, a := range args {
		if a == "{{FILE}}" {
			args[i] = path
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), badConfigTimeout)
	defer cancel()
	cmd := boundedCommand(ctx, caddyBin, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(),
		"HOME="+filepath.Join(dir, "home"),
		"XDG_DATA_HOME="+filepath.Join(dir, "data"),
		"XDG_CONFIG_HOME="+filepath.Join(dir, "config"),
		"XDG_CACHE_HOME="+filepath.Join(dir, "cache"),
		"XDG_STATE_HOME="+filepath.Join(dir, "state"),
		"TMPDIR="+dir,
		"ZIDANE_UPSTREAM_TOKEN_KEY="+base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{7}, 32)),
		"UP_SECRET=e2e-upstream-secret",
		"ZIDANE_AUDIT_SIGNING_KEY="+base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{9}, 32)),
		"AUDIT_KEY="+base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{8}, 32)),
	)
	cmd.Env = append(cmd.Env, env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return caddyOutcome{output: out.String(), errors: errorLines(out.String()), err: err, timedOut: ctx.Err() != nil}
}

// errorLines picks caddy's error messages out of its output.
func errorLines(output string) string {
	var msgs []string
	sc := bufio.NewScanner(strings.NewReader(output))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, "Error: "); ok {
			msgs = append(msgs, rest)
			continue
		}
		var rec struct {
			Level string `json:"level"`
			Msg   string `json:"msg"`
			Error string `json:"error"`
		}
		if json.Unmarshal([]byte(line), &rec) == nil && (rec.Level == "error" || rec.Level == "fatal") {
			msgs = append(msgs, strings.TrimSpace(rec.Msg+" "+rec.Error))
		}
	}
	return strings.Join(msgs, "\n")
}

// checkRefused fails t unless caddy refused the config within its bound,
// with a message naming option and holding want, and without crashing.
func checkRefused(t *testing.T, res caddyOutcome, option string, want []string, secret string) {
	t.Helper()
	if res.timedOut {
		t.Fatalf("caddy did not exit within %s: it hangs on this config\n%s", badConfigTimeout, tail(res.output, 4096))
	}
	for _, crash := range []string{"panic:", "goroutine ", "SIGSEGV", "runtime error"} {
		if strings.Contains(res.output, crash) {
			t.Fatalf("caddy crashed (%q in its output):\n%s", crash, tail(res.output, 8192))
		}
	}
	var exit *exec.ExitError
	switch {
	case res.err == nil:
		t.Fatalf("caddy accepted the config:\n%s", tail(res.output, 4096))
	case !errors.As(res.err, &exit):
		t.Fatalf("running caddy: %v", res.err)
	case exit.ProcessState.Sys().(syscall.WaitStatus).Signaled():
		t.Fatalf("caddy was killed by a signal (%v):\n%s", res.err, tail(res.output, 4096))
	}
	if res.errors == "" {
		t.Fatalf("caddy exited with %v but printed no error message:\n%s", res.err, tail(res.output, 4096))
	}
	for _, w := range append([]string{lastWord(option)}, want...) {
		if !strings.Contains(res.errors, w) {
			t.Errorf("the error does not say %q:\n%s", w, res.errors)
		}
	}
	if secret != "" && strings.Contains(res.output, secret) {
		t.Errorf("the output shows the private key:\n%s", res.output)
	}
}

// TestBadConfigValuesAreRefused walks the Caddyfile reference (docs/caddyfile.md) of the
// zidane_mcp directive and the zidane global option: every option listed
// there is given wrong values (of the wrong kind, negative, huge, empty;
// for a path, a directory, /dev/zero, a named pipe, a file too big or
// holding the wrong key), and `caddy validate` must refuse each with a
// message that names the option and says what to give, within a bound,
// without a crash. An option added to the reference without cases here
// fails the walk.
func TestBadConfigValuesAreRefused(t *testing.T) {
	fx := writeConfigFixtures(t)
	cases := badConfigs(fx)
	options := referenceOptions(t)

	byOption := map[string][]string{}
	for _, c := range cases {
		byOption[c.option] = append(byOption[c.option], c.label)
	}
	known := map[string]bool{}
	for _, o := range options {
		known[o.path] = true
		labels, ok := byOption[o.path]
		if !ok {
			t.Errorf("Caddyfile reference option %q has no bad-value case here: add one to badConfigs", o.path)
			continue
		}
		for _, l := range requiredLabels(o) {
			if !slices.Contains(labels, l) {
				t.Errorf("Caddyfile reference option %q (%s) is not tried with %s", o.path, o.value, l)
			}
		}
	}
	for opt := range byOption {
		if !known[opt] {
			t.Errorf("cases for %q, which the Caddyfile reference does not list", opt)
		}
	}
	if t.Failed() {
		t.FailNow()
	}

	slots := make(chan struct{}, badConfigParallel)
	validate := func(t *testing.T, caddyfile string, env []string) caddyOutcome {
		slots <- struct{}{}
		defer func() { <-slots }()
		return runBadConfig(t, caddyfile, env, "validate", "--config", "{{FILE}}", "--adapter", "caddyfile")
	}
	baseline := t.Run("baseline", func(t *testing.T) {
		for name, cf := range baselines(fx) {
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				res := validate(t, cf, nil)
				if res.err != nil || res.timedOut {
					t.Fatalf("the valid config that cases change is refused (%v):\n%s\n%s", res.err, cf, tail(res.output, 4096))
				}
			})
		}
	})
	if !baseline {
		t.FailNow()
	}
	t.Logf("%d options, %d bad values", len(options), len(cases))
	for _, c := range cases {
		t.Run(strings.ReplaceAll(c.option, " ", ".")+"/"+c.label, func(t *testing.T) {
			t.Parallel()
			res := validate(t, c.caddyfile, c.env)
			checkRefused(t, res, c.option, c.want, fx.privBody)
			if t.Failed() {
				t.Logf("Caddyfile:\n%s", c.caddyfile)
			}
		})
	}
}

// The configs that crashed caddy (a verifier that was never built, closed
// at cleanup) or hung it (/dev/zero read to the end) are refused by
// `caddy run` too, and by `caddy reload`, which must say why rather than
// lose its connection to a server that died; the running config goes on.
func TestBadConfigRunAndReload(t *testing.T) {
	fx := writeConfigFixtures(t)
	bad := []badConfig{
		{option: "leeway", label: "leeway over 5m", want: []string{"between 0 and 5m"},
			caddyfile: "jwt {\nissuer https://idp.test\npublic_key_file " + fx.pub + "\nleeway 10h\n}"},
		{option: "public_key_file", label: "a private key", want: []string{"private key", "give the public key"},
			caddyfile: "jwt {\nissuer https://idp.test\npublic_key_file " + fx.priv + "\n}"},
		{option: "public_key_file", label: "/dev/zero", want: []string{"not a regular file"},
			caddyfile: "jwt {\nissuer https://idp.test\npublic_key_file /dev/zero\n}"},
	}
	site := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	config := func(jwt string) string {
		return fmt.Sprintf("{\n\tadmin %s\n}\n\nhttp://%s {\n\tbind 127.0.0.1\n\troute {\n\t\tzidane_mcp {\n\t\t\tguard\n\t\t\tresource http://%s/mcp\n%s\n\t\t}\n\t\trespond 204\n\t}\n}\n",
			AdminPlaceholder, site, site, jwt)
	}
	t.Run("run", func(t *testing.T) {
		for _, c := range bad {
			t.Run(c.label, func(t *testing.T) {
				cf := strings.ReplaceAll(config(c.caddyfile), AdminPlaceholder, "off")
				res := runBadConfig(t, cf, nil, "run", "--config", "{{FILE}}", "--adapter", "caddyfile")
				checkRefused(t, res, c.option, c.want, fx.privBody)
			})
		}
	})
	t.Run("reload", func(t *testing.T) {
		caddy := startCaddy(t, config("jwt {\nissuer https://idp.test\npublic_key_file "+fx.pub+"\n}"))
		for _, c := range bad {
			out, err := caddy.TryReload(t, config(c.caddyfile))
			if err == nil {
				t.Fatalf("%s: caddy reload accepted the config:\n%s", c.label, out)
			}
			if strings.Contains(out, "EOF") {
				t.Fatalf("%s: caddy reload lost the server (EOF) instead of saying why:\n%s\ncaddy's log:\n%s", c.label, out, tail(caddy.Logs(), 8192))
			}
			for _, w := range append([]string{c.option}, c.want...) {
				if !strings.Contains(out, w) {
					t.Errorf("%s: caddy reload does not say %q:\n%s", c.label, w, out)
				}
			}
			if strings.Contains(out, fx.privBody) {
				t.Errorf("%s: caddy reload shows the private key:\n%s", c.label, out)
			}
		}
		for _, crash := range []string{"panic", "goroutine ", "SIGSEGV"} {
			if strings.Contains(caddy.Logs(), crash) {
				t.Fatalf("caddy logged %q during the refused reloads:\n%s", crash, tail(caddy.Logs(), 8192))
			}
		}
		// The running config still serves: no credential is a 401 from it.
		resp, err := shortClient.Post("http://"+site+"/mcp", "application/json", strings.NewReader(initializeBody))
		if err != nil {
			t.Fatalf("after the refused reloads the site does not answer: %v\n%s", err, tail(caddy.Logs(), 8192))
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("after the refused reloads, a request without a token got %s, want 401 from the running config", resp.Status)
		}
	})
}

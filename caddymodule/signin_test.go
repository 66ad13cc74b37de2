package caddymodule

import (
	"strings"
	"testing"
)

// TestSigninProvision: a signin block is checked when the config loads,
// and so by `caddy validate`: its issuer, and the resource of every
// zidane_mcp site, which tokens are issued for and must be absolute.
func TestSigninProvision(t *testing.T) {
	global := func(issuer string) string {
		return "\tzidane {\n\t\tsignin {\n\t\t\tissuer " + issuer + "\n\t\t}\n\t}"
	}
	site := func(resource string) string {
		return "http://127.0.0.1:9 {\n\tzidane_mcp {\n\t\tguard\n\t\tresource " + resource + "\n\t}\n}\n"
	}
	if err := validate(t, global("http://127.0.0.1:9"), site("http://127.0.0.1:9/mcp")); err != nil {
		t.Fatalf("the valid config the cases change is refused: %v", err)
	}
	for _, c := range []struct{ name, issuer, resource, want string }{
		{"a resource that is a path alone", "http://127.0.0.1:9", "/mcp", "give the resource as an absolute URL"},
		{"an issuer in plain http off loopback", "http://mcp.example.com", "http://127.0.0.1:9/mcp", "plain http is allowed on a loopback address only"},
		{"an issuer with a path", "https://mcp.example.com/tenant", "http://127.0.0.1:9/mcp", "must have no path"},
		{"an access lifetime over a day", "http://127.0.0.1:9\n\t\t\taccess_lifetime 48h", "http://127.0.0.1:9/mcp", "an access token lives 1s to 24h0m0s"},
		// Resources a grant cannot name: taken before, each site's every
		// code redemption failed with server_error.
		{"a resource with user information", "http://127.0.0.1:9", "http://user@127.0.0.1:9/mcp", "grant resource"},
		{"a resource with an escaped slash", "http://127.0.0.1:9", "http://127.0.0.1:9/a%2Fb", "grant resource"},
		{"a resource with an empty query", "http://127.0.0.1:9", "http://127.0.0.1:9/mcp?", "grant resource"},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := validate(t, global(c.issuer), site(c.resource))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("validate = %v; want an error saying %q", err, c.want)
			}
		})
	}
}

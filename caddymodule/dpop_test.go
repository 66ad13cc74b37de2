package caddymodule

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
)

// A JSON config gets the checks the Caddyfile gets at adapt, when it
// provisions: a DPoP mode that is not one, and DPoP required or nonces on
// a resource that is a path alone, are refused saying what to write.
func TestDPoPJSONConfigsThatFailProvision(t *testing.T) {
	for _, tc := range []struct{ handler, says string }{
		{`"dpop": "always", "resource": "https://mcp.example.com/mcp"`, "write `dpop optional`"},
		{`"dpop": "required"`, "give `resource` as an absolute URL"},
		{`"dpop_nonce": true, "resource": "/mcp"`, "dpop_nonce: give `resource` as an absolute URL"},
	} {
		raw := fmt.Sprintf(`{"admin": {"disabled": true}, "storage": {"module": "file_system", "root": %q},
			"apps": {"http": {"servers": {"s": {"listen": ["127.0.0.1:0"], "routes": [{"handle": [
			{"handler": "zidane_mcp", "route": {"mode": "guard"}, %s}]}]}}}}}`, t.TempDir(), tc.handler)
		var cfg caddy.Config
		if err := json.Unmarshal([]byte(raw), &cfg); err != nil {
			t.Fatal(err)
		}
		err := caddy.Validate(&cfg)
		if err == nil || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%s: %v, want an error saying %q", tc.handler, err, tc.says)
		}
	}
}

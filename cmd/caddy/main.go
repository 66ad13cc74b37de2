// Command caddy is the Caddy web server built with the standard modules and
// caddy-zidane-mcp, as xcaddy would generate it.
package main

import (
	caddycmd "github.com/caddyserver/caddy/v2/cmd"

	_ "github.com/caddyserver/caddy/v2/modules/standard"

	_ "github.com/Tahul/caddy-zidane-mcp/caddymodule"
)

func main() {
	caddycmd.Main()
}

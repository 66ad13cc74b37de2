// Package caddyzidanemcp is the import path that xcaddy builds with
// (`xcaddy build --with github.com/Tahul/caddy-zidane-mcp`): importing it
// registers the zidane app, the zidane_mcp handler and directive, the
// admin.api.zidane routes and the `caddy zidane` command with Caddy.
package caddyzidanemcp

import _ "github.com/Tahul/caddy-zidane-mcp/caddymodule"

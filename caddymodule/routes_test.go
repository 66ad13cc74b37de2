package caddymodule

import (
	"encoding/json"

	"github.com/caddyserver/caddy/v2/caddyconfig"
)

// routeJSON is a handler's "route" holding route module m, as a config
// gives it.
func routeJSON(m routeModule) json.RawMessage {
	return caddyconfig.JSONModuleObject(m, "mode", m.CaddyModule().ID.Name(), nil)
}

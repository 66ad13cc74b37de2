#!/usr/bin/env bash
# xcaddy.sh: builds a caddy binary with this module through xcaddy, the way
# a Caddy user adds any plugin. The result equals `go build ./cmd/caddy`.
#
#   ./xcaddy.sh              writes ./caddy
#   OUTPUT=/usr/local/bin/caddy ./xcaddy.sh
#
# It uses this checkout (--with …=.), so local changes are included. The
# version v0.0.0 only names the replaced module: without one, `go get` would
# ask the module proxy for the newest release first.
set -euo pipefail
cd "$(dirname "$0")"

XCADDY_VERSION=v0.4.5
CADDY_VERSION=v2.11.9
OUTPUT=${OUTPUT:-./caddy}

go run "github.com/caddyserver/xcaddy/cmd/xcaddy@${XCADDY_VERSION}" build "${CADDY_VERSION}" \
	--with "github.com/Tahul/caddy-zidane-mcp@v0.0.0=." \
	--output "${OUTPUT}"

"${OUTPUT}" list-modules | grep -E '^(zidane|http\.handlers\.zidane_mcp|admin\.api\.zidane)$' >/dev/null ||
	{ echo "xcaddy.sh: ${OUTPUT} lacks the zidane modules" >&2; exit 1; }
echo "built ${OUTPUT} with caddy ${CADDY_VERSION} and caddy-zidane-mcp"

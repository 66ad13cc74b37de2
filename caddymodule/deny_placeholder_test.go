package caddymodule

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"

	"github.com/Tahul/caddy-zidane-mcp/gatewayfiles"
)

// Every file that Caddy's replacer reads for a {file.…} placeholder in a
// config value is one the deny list names, whatever braces and escapes the
// value holds: a file it missed would be a secret agents may read. The
// replacer is Caddy's own, reading real files.
func TestDeniedPlaceholderFilesAreTheReplacersFiles(t *testing.T) {
	dir := t.TempDir()
	names := []string{"plain.token", `esc\}aped.token`, `two\}\}.token`}
	paths := map[string]string{} // content -> path
	for i, n := range names {
		p := filepath.Join(dir, n)
		content := "secret-" + string(rune('a'+i))
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		paths[content] = p
	}
	values := []string{
		"{file." + filepath.Join(dir, names[0]) + "}",
		"Bearer {file." + filepath.Join(dir, names[1]) + "}",
		"{file." + filepath.Join(dir, names[2]) + "} and {env.HOME}",
		`\{file.` + filepath.Join(dir, names[0]) + "}",
	}
	for _, v := range values {
		out := caddy.NewReplacer().ReplaceAll(v, "")
		denied := gatewayfiles.Placeholders(v)
		for content, p := range paths {
			if strings.Contains(out, content) && !slices.Contains(denied, p) {
				t.Errorf("Caddy's replacer reads %s for %q, and the deny list names only %q", p, v, denied)
			}
		}
	}
}

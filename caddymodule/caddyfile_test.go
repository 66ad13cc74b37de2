package caddymodule

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddytest"
)

// TestCaddyfileAdapt pins the directive's syntax: each file under
// testdata/adapt holds a Caddyfile, a line of dashes, and either the JSON it
// adapts to or a part of the error it must give.
func TestCaddyfileAdapt(t *testing.T) {
	files, err := filepath.Glob("testdata/adapt/*.caddyfiletest")
	if err != nil || len(files) == 0 {
		t.Fatalf("no adapt tests found (%v)", err)
	}
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			data, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			caddyfile, expected, ok := strings.Cut(string(data), "----------")
			if !ok {
				t.Fatal("no ---------- separator")
			}
			caddyfile, expected = strings.TrimSpace(caddyfile)+"\n", strings.TrimSpace(expected)
			if strings.HasPrefix(expected, "{") {
				if !caddytest.CompareAdapt(t, file, caddyfile, "caddyfile", expected) {
					t.Errorf("%s adapts to other JSON", file)
				}
				return
			}
			_, _, err = caddyconfig.GetAdapter("caddyfile").Adapt([]byte(caddyfile), nil)
			if err == nil || !strings.Contains(err.Error(), expected) {
				t.Errorf("adapt error = %v, want it to contain %q", err, expected)
			}
		})
	}
}

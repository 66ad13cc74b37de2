package pathtree

import (
	"os"
	"path/filepath"
	"testing"
)

func TestWithin(t *testing.T) {
	for _, c := range []struct {
		path, dir string
		want      bool
	}{
		{"/srv/app", "/srv/app", true},
		{"/srv/app/src", "/srv/app", true},
		{"/srv/app/", "/srv/app", true},
		{"/srv/app/..x", "/srv/app", true}, // a directory named "..x" is inside
		{"/srv/app2", "/srv/app", false},   // a sibling that shares a prefix is not
		{"/srv", "/srv/app", false},
		{"/srv/app/../etc", "/srv/app", false},
		{"/srv/./app/x", "/srv/app/", true},
		{"/etc/shadow", "/", true},
		{"/", "/", true},
		{"relative", "/", false},
	} {
		if got := Within(c.path, c.dir); got != c.want {
			t.Errorf("Within(%q, %q) = %v, want %v", c.path, c.dir, got, c.want)
		}
	}
}

func TestResolve(t *testing.T) {
	root := t.TempDir()
	real := filepath.Join(root, "real")
	if err := os.Mkdir(real, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(real, filepath.Join(root, "link")); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ in, want string }{
		{filepath.Join(root, "link"), real},
		{filepath.Join(root, "link", "not", "yet"), filepath.Join(real, "not", "yet")},
		{filepath.Join(root, "link", "..", "real", "x"), filepath.Join(real, "x")},
	} {
		if got, err := Resolve(c.in); err != nil || got != c.want {
			t.Errorf("Resolve(%s) = %q, %v; want %q", c.in, got, err, c.want)
		}
	}
}

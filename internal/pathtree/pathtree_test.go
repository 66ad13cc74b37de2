package pathtree

import "testing"

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

package policy

import "testing"

func TestOrigins(t *testing.T) {
	o, err := NewOrigins([]string{"https://App.Example.com", "http://localhost:6274"})
	if err != nil {
		t.Fatal(err)
	}
	for origin, want := range map[string]bool{
		"":                             true,
		"https://app.example.com":      true,
		"https://app.example.com:443":  true,
		"HTTPS://APP.EXAMPLE.COM":      true,
		"http://localhost:6274":        true,
		"http://app.example.com":       false,
		"https://app.example.com:8443": false,
		"https://evil.com":             false,
		"https://app.example.com.evil": false,
		"null":                         false,
		"http://localhost:6275":        false,
		"https://app.example.com/path": false,
		"https://user@app.example.com": false,
		"javascript:alert(1)":          false,
	} {
		if got := o.Allowed(origin, "mcp.example.com"); got != want {
			t.Errorf("Allowed(%q) = %v, want %v", origin, got, want)
		}
	}
	for _, bad := range []string{"*", "null", "https://*.example.com", "example.com", "https://a.com/x"} {
		if _, err := NewOrigins([]string{bad}); err == nil {
			t.Errorf("NewOrigins(%q) accepted", bad)
		}
	}
}

func TestLoopbackOriginOnLoopbackHost(t *testing.T) {
	o, _ := NewOrigins(nil)
	for _, c := range []struct {
		origin, host string
		want         bool
	}{
		{"http://127.0.0.1:9000", "127.0.0.1:8080", true},
		{"http://localhost:3000", "localhost:8080", true},
		{"http://[::1]:3000", "[::1]:8080", true},
		{"http://evil.example.com", "evil.example.com", false},
		{"http://evil.example.com", "127.0.0.1:8080", false},
		{"http://127.0.0.1:9000", "evil.example.com", false},
		{"http://localhost.evil.com", "localhost:8080", false},
		{"http://127.0.0.1.nip.io", "127.0.0.1", false},
	} {
		if got := o.Allowed(c.origin, c.host); got != c.want {
			t.Errorf("Allowed(%q, host %q) = %v, want %v", c.origin, c.host, got, c.want)
		}
	}
	for host, want := range map[string]bool{"localhost": true, "localhost:80": true, "LOCALHOST.:1": true, "127.9.9.9:1": true, "[::1]:8": true,
		"::1": true, "example.com": false, "127.0.0.1.nip.io": false, "": false, "0x7f.0.0.1": false} {
		if got := HostIsLoopback(host); got != want {
			t.Errorf("HostIsLoopback(%q) = %v", host, got)
		}
	}
}

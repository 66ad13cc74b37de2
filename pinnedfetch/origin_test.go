package pinnedfetch

import (
	"net/url"
	"testing"
)

func mustParse(t testing.TB, s string) *url.URL {
	t.Helper()
	u, err := url.Parse(s)
	if err != nil {
		t.Fatalf("parse %q: %v", s, err)
	}
	return u
}

func TestOrigin(t *testing.T) {
	tests := map[string]string{
		"https://example.com/x":              "https://example.com:443",
		"HTTPS://EXAMPLE.com:443/y":          "https://example.com:443",
		"https://example.com./":              "https://example.com:443",
		"https://example.com:0443/":          "https://example.com:443",
		"http://localhost":                   "http://localhost:80",
		"http://127.0.0.1:8080/a?b#c":        "http://127.0.0.1:8080",
		"https://[::1]/":                     "https://[::1]:443",
		"https://[0:0:0:0:0:0:0:1]:8443/":    "https://[::1]:8443",
		"https://[2001:DB8::A]/":             "https://[2001:db8::a]:443",
		"https://[::ffff:127.0.0.1]/":        "https://[::ffff:127.0.0.1]:443",
		"https://user:pw@example.com/":       "https://example.com:443",
		"wss://example.com/":                 "wss://example.com",
		"/relative":                          "",
		"//example.com/no-scheme":            "",
		"https:///no-host":                   "",
		"mailto:someone@example.com":         "",
		"https://example.com:8443/with/port": "https://example.com:8443",
	}
	for in, want := range tests {
		if got := Origin(mustParse(t, in)); got != want {
			t.Errorf("Origin(%q) = %q, want %q", in, got, want)
		}
	}
	if Origin(nil) != "" {
		t.Error("Origin(nil) is not empty")
	}
}

func TestSameOrigin(t *testing.T) {
	tests := []struct {
		a, b string
		same bool
	}{
		{"https://example.com/a", "https://example.com/b?q", true},
		{"https://example.com", "https://example.com:443", true},
		{"https://example.com", "https://EXAMPLE.COM.", true},
		{"http://localhost", "http://localhost:80", true},
		{"https://[::1]:8443", "https://[0::1]:8443", true},
		{"https://example.com", "http://example.com", false},
		{"https://example.com", "https://example.com:8443", false},
		{"https://example.com", "https://api.example.com", false},
		{"https://api.example.com", "https://example.com", false},
		{"https://example.com", "https://example.com.evil.com", false},
		{"http://localhost:8080", "http://127.0.0.1:8080", false},
		{"http://127.0.0.1:8080", "http://[::1]:8080", false},
		{"https://[::ffff:127.0.0.1]", "https://127.0.0.1", false},
		{"https://example.com:80", "http://example.com:80", false},
		{"/relative", "/relative", false},
	}
	for _, tt := range tests {
		a, b := mustParse(t, tt.a), mustParse(t, tt.b)
		if got := SameOrigin(a, b); got != tt.same {
			t.Errorf("SameOrigin(%q, %q) = %v, want %v", tt.a, tt.b, got, tt.same)
		}
		if got := SameOrigin(b, a); got != tt.same {
			t.Errorf("SameOrigin(%q, %q) = %v, want %v (not symmetric)", tt.b, tt.a, got, tt.same)
		}
	}
	if SameOrigin(nil, nil) {
		t.Error("SameOrigin(nil, nil) is true")
	}
}

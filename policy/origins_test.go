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
		if got := o.Allowed(origin); got != want {
			t.Errorf("Allowed(%q) = %v, want %v", origin, got, want)
		}
	}
	for _, bad := range []string{"*", "null", "https://*.example.com", "example.com", "https://a.com/x"} {
		if _, err := NewOrigins([]string{bad}); err == nil {
			t.Errorf("NewOrigins(%q) accepted", bad)
		}
	}
}

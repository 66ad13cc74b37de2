package clients

import (
	"errors"
	"strings"
	"testing"
)

// TestRedirectURIRegistration is what a client may register as a redirect
// URI, and what it may not, with a word of each refusal's reason.
func TestRedirectURIRegistration(t *testing.T) {
	tests := []struct {
		uri    string
		reason string // "" when accepted
	}{
		{"https://app.example.com/oauth/callback", ""},
		{"https://app.example.com:8443/cb?tenant=a", ""},
		{"https://app.example.com", ""},
		{"http://127.0.0.1/callback", ""},
		{"http://127.0.0.1:33418/callback", ""},
		{"http://[::1]:8080/cb", ""},
		{"http://localhost:6274/oauth/callback", ""},
		{"https://localhost:8443/cb", ""},

		{"http://app.example.com/cb", "http_off_loopback"},
		{"http://127.0.0.2/cb", "http_off_loopback"},
		{"http://127.1/cb", "host"},
		{"http://0x7f.0.0.1/cb", "host"},
		{"http://[::ffff:127.0.0.1]/cb", "http_off_loopback"},
		{"http://LOCALHOST/cb", "host"},
		{"http://localhost./cb", "host"},
		{"http://[0:0:0:0:0:0:0:1]/cb", "host"},
		{"https://app.example.com/cb#frag", "fragment"},
		{"https://app.example.com/cb#", "fragment"},
		{"https://user:s3cret@app.example.com/cb", "userinfo"},
		{"https://user@app.example.com/cb", "userinfo"},
		{"cursor://anysphere.cursor-retrieval/oauth/callback", "scheme"},
		{"javascript:alert(1)", "scheme"},
		{"HTTPS://app.example.com/cb", "scheme"},
		{"https:app.example.com/cb", "scheme"},
		{"/relative/cb", "scheme"},
		{"", "empty"},
		{"https://app.example.com/c b", "characters"},
		{"https://app.example.com\\@evil.example/cb", "characters"},
		{"https://app.example.com/cb\x00", "characters"},
		{"https://app.exämple.com/cb", "characters"},
		{"https:///cb", "host"},
		{"https://app.example.com:/cb", "port"},
		{"https://app.example.com:0/cb", "port"},
		{"https://app.example.com:080/cb", "port"},
		{"https://app.example.com:65536/cb", "port"},
		{"https://app.example.com/a/../cb", "path"},
		{"https://app.example.com/a/%2e%2E/cb", "path"},
		{"https://app.example.com/./cb", "path"},
		{"https://app.example.com/cb?code=x", "query"},
		{"https://app.example.com/cb?state=x", "query"},
		{"https://app.example.com/cb?iss=x", "query"},
		{"https://app.example.com/cb?a=1;b=2", "query"},
		{"https://app.example.com/" + strings.Repeat("a", MaxRedirectURILength), "length"},
	}
	for _, tt := range tests {
		t.Run(tt.uri, func(t *testing.T) {
			err := CheckRedirectURI(tt.uri)
			if tt.reason == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("got %v, want a refusal for %s", err, tt.reason)
			}
			if e.Code != CodeInvalidRedirectURI || e.Reason != tt.reason {
				t.Errorf("got %s/%s (%v), want %s/%s", e.Code, e.Reason, e, CodeInvalidRedirectURI, tt.reason)
			}
			if strings.Contains(e.Error(), "s3cret") || strings.Contains(e.Error(), "evil") {
				t.Errorf("the message quotes the URI: %q", e.Error())
			}
		})
	}
}

// TestRedirectMatch is the rule at the authorization request: the exact
// registered URI, except that a loopback http URI takes any port (RFC 8252
// §7.3) and nothing else varies.
func TestRedirectMatch(t *testing.T) {
	tests := []struct {
		registered, requested string
		reason                string // "" when allowed
	}{
		{"https://app.example.com/cb", "https://app.example.com/cb", ""},
		{"https://app.example.com/cb?x=1", "https://app.example.com/cb?x=1", ""},
		{"http://127.0.0.1/callback", "http://127.0.0.1:53122/callback", ""},
		{"http://127.0.0.1:33418/callback", "http://127.0.0.1:1/callback", ""},
		{"http://127.0.0.1:33418/callback", "http://127.0.0.1/callback", ""},
		{"http://[::1]/cb", "http://[::1]:9000/cb", ""},
		{"http://localhost/cb", "http://localhost:6274/cb", ""},

		{"https://app.example.com/cb", "https://app.example.com:443/cb", "mismatch"},
		{"https://app.example.com:8443/cb", "https://app.example.com:8444/cb", "mismatch"},
		{"https://app.example.com/cb", "https://app.example.com/cb/", "mismatch"},
		{"https://app.example.com/cb", "https://app.example.com/CB", "mismatch"},
		{"https://app.example.com/cb", "https://app.example.com/cb?x=1", "mismatch"},
		{"https://app.example.com/cb", "https://app.example.com/%63b", "mismatch"},
		{"https://app.example.com/cb", "https://evil.example.com/cb", "mismatch"},
		{"https://app.example.com/cb", "https://app.example.com/cb#x", "fragment"},
		{"https://app.example.com/cb", "https://x@app.example.com/cb", "userinfo"},
		{"http://localhost/cb", "http://127.0.0.1:6274/cb", "mismatch"},
		{"http://127.0.0.1/cb", "http://localhost:6274/cb", "mismatch"},
		{"http://127.0.0.1/cb", "http://[::1]:6274/cb", "mismatch"},
		{"http://127.0.0.1/cb", "http://127.0.0.1:6274/cb2", "mismatch"},
		{"http://127.0.0.1/cb?a=1", "http://127.0.0.1:6274/cb?a=2", "mismatch"},
		{"http://127.0.0.1/cb", "https://127.0.0.1:6274/cb", "mismatch"},
		{"https://localhost/cb", "https://localhost:6274/cb", "mismatch"},
		{"http://127.0.0.1/cb", "http://127.0.0.1:0/cb", "port"},
		{"http://127.0.0.1/cb", "http://127.0.0.1:99999/cb", "port"},
		{"http://127.0.0.1/cb", "http://127.0.0.1:/cb", "port"},
		{"http://app.example.com/cb", "http://app.example.com/cb", "http_off_loopback"},
		{"https://app.example.com/cb", "http://app.example.com/cb", "http_off_loopback"},
		{"http://127.0.0.1/cb", "http://127.1:5000/cb", "host"},
	}
	for _, tt := range tests {
		t.Run(tt.registered+" "+tt.requested, func(t *testing.T) {
			err := MatchRedirect(tt.registered, tt.requested)
			c := Client{ID: "https://app.example.com/client.json", RedirectURIs: []string{"https://other.example.com/cb", tt.registered}}
			if got := c.AllowsRedirect(tt.requested); got != (tt.reason == "") {
				t.Errorf("AllowsRedirect = %v, want %v", got, tt.reason == "")
			}
			if tt.reason == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("got %v, want a refusal for %s", err, tt.reason)
			}
			if e.Code != CodeInvalidRedirectURI || e.Reason != tt.reason {
				t.Errorf("got %s/%s (%v), want %s/%s", e.Code, e.Reason, e, CodeInvalidRedirectURI, tt.reason)
			}
		})
	}
}

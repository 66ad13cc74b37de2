package caddymodule

import (
	"strings"
	"testing"
)

// A per_user upstream's redirect_url must be on the signin issuer's site:
// the person's browser reaches the upstream's callback there with its
// sign-in cookie, which the connect flow checks before it redeems a code.
// Elsewhere every person's connection would fail at the callback, after
// they had signed in at the upstream; the config is refused at load
// instead, saying which URL to give.
func TestPerUserRedirectOnTheIssuersSite(t *testing.T) {
	t.Setenv("ZIDANE_UPSTREAM_TOKEN_KEY", "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=")
	global := func(redirect string) string {
		return "\tzidane {\n\t\tsignin {\n\t\t\tissuer http://127.0.0.1:9\n\t\t}\n" +
			"\t\tupstream remote {\n\t\t\turl http://127.0.0.1:8/mcp\n\t\t\toauth {\n\t\t\t\tgrant authorization_code\n" +
			"\t\t\t\tredirect_url " + redirect + "\n\t\t\t\tcredentials per_user\n\t\t\t}\n\t\t}\n\t}"
	}
	site := "http://127.0.0.1:9 {\n\tzidane_mcp {\n\t\tbroker remote\n\t\tresource http://127.0.0.1:9/mcp\n\t}\n}\n"
	if err := validate(t, global("http://127.0.0.1:9/zidane/oauth/callback/remote"), site); err != nil {
		t.Fatalf("a redirect_url on the issuer's site is refused: %v", err)
	}
	for _, redirect := range []string{"http://127.0.0.1:7/zidane/oauth/callback/remote", "http://localhost:9/zidane/oauth/callback/remote"} {
		err := validate(t, global(redirect), site)
		if err == nil || !strings.Contains(err.Error(), "http://127.0.0.1:9/zidane/oauth/callback/remote") || !strings.Contains(err.Error(), "redirect_url") {
			t.Errorf("redirect_url %s: validate = %v; want it refused, naming the URL to give", redirect, err)
		}
	}
}

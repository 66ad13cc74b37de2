package upstreamauth

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/Tahul/caddy-zidane-mcp/internal/oauthtest"
)

// Dynamic registration says what kind of client the gateway is (SEP-837,
// OpenID Connect Registration): native for a loopback callback, web for
// an https one; the Client ID Metadata Document says the same.
func TestRegistrationNamesApplicationType(t *testing.T) {
	for _, tc := range []struct{ redirect, want string }{
		{redirect, "native"},
		{"https://gw.example.com/zidane/oauth/callback/up", "web"},
	} {
		e := newEnv(t, oauthtest.AuthServerOptions{}, nil, "")
		c := e.client(Config{RedirectURL: tc.redirect})
		if _, err := c.BeginLogin(context.Background()); err != nil {
			t.Fatalf("BeginLogin: %v", err)
		}
		regs := e.as.RegistrationRequests()
		if len(regs) != 1 || regs[0].ApplicationType != tc.want {
			t.Errorf("redirect %s: registrations %+v; want one with application_type %q", tc.redirect, regs, tc.want)
		}
		doc, ok := e.client(Config{RedirectURL: tc.redirect, ClientMetadataURL: "https://gw.example.com/oauth/client.json"}).ClientMetadataDocument()
		var got struct {
			ApplicationType string `json:"application_type"`
		}
		if !ok || json.Unmarshal(doc, &got) != nil || got.ApplicationType != tc.want {
			t.Errorf("redirect %s: client metadata document %s; want application_type %q", tc.redirect, doc, tc.want)
		}
	}
}

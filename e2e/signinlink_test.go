package e2e

import (
	"bytes"
	"context"
	"errors"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/caddyserver/certmagic"

	signin "github.com/Tahul/caddy-zidane-mcp/authserver/idp"
)

// linkSecret is the secret of a link `signin-link` printed for base.
func linkSecret(t *testing.T, stdout, base string) string {
	t.Helper()
	link := strings.TrimSpace(stdout)
	secret, ok := strings.CutPrefix(link, base+signin.LinkPath+"#zsl_")
	if !ok || strings.ContainsAny(secret, "\n ") {
		t.Fatalf("signin-link printed %q, want one link %s%s#zsl_…", stdout, base, signin.LinkPath)
	}
	return "zsl_" + secret
}

// noFileHolds fails when a file under dir holds secret.
func noFileHolds(t *testing.T, dir, secret string) {
	t.Helper()
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return nil
		}
		if b, err := os.ReadFile(p); err == nil && bytes.Contains(b, []byte(secret[4:])) {
			t.Errorf("%s holds the link's secret", p)
		}
		return nil
	})
}

// TestSigninLinkCLI: `caddy zidane signin-link` prints a one-time link with
// no server running (into Caddy's storage) and through a running server's
// admin API; storage keeps only the secret's hash; the link signs in once;
// a link for an owner that would act for a token or a JWT subject, with no
// scope, too long a life or a base off https is refused with a message.
func TestSigninLinkCLI(t *testing.T) {
	c := newCaddy(t, "{\n\tadmin {{ADMIN}}\n}\n")
	links := signin.NewLinks(&certmagic.FileStorage{Path: c.DataDir}, nil)
	const base = "https://mcp.example.com"

	for _, tc := range []struct {
		name string
		args []string
		word string
	}{
		{"no base", []string{"--owner", "alice", "--scope", "chat"}, "--base"},
		{"plain http base", []string{"--owner", "alice", "--scope", "chat", "--base", "http://mcp.example.com"}, "https"},
		{"base with a path", []string{"--owner", "alice", "--scope", "chat", "--base", base + "/x"}, "origin"},
		{"owner of a token", []string{"--owner", "tok_0123456789abcdef", "--scope", "chat", "--base", base}, "tok_"},
		{"owner of a JWT subject", []string{"--owner", "jwt:alice", "--scope", "chat", "--base", base}, "jwt:"},
		{"no owner", []string{"--scope", "chat", "--base", base}, "empty"},
		{"no scope", []string{"--owner", "alice", "--base", base}, "no scope"},
		{"a bad scope", []string{"--owner", "alice", "--scope", "a b", "--base", base}, "scope"},
		{"two days", []string{"--owner", "alice", "--scope", "chat", "--expires", "2d", "--base", base}, "24h"},
		{"a bad lifetime", []string{"--owner", "alice", "--scope", "chat", "--expires", "soon", "--base", base}, "duration"},
	} {
		out, stderr, err := c.Run(t, append([]string{"zidane", "signin-link"}, tc.args...)...)
		if last := lastLine(stderr); exitCode(err) != 1 || out != "" || !strings.HasPrefix(last, "caddy zidane signin-link: ") || !strings.Contains(last, tc.word) || strings.Contains(stderr, "No server answers") {
			t.Errorf("%s: exit %d, stdout %q, stderr %q; want exit 1 and a line naming %q", tc.name, exitCode(err), out, stderr, tc.word)
		}
	}

	out, stderr, err := c.Run(t, "zidane", "signin-link", "--owner", "alice", "--scope", "chat", "--scope", "upstream:github", "--base", base+"/")
	if err != nil {
		t.Fatalf("signin-link offline: %v\n%s", err, stderr)
	}
	if !strings.Contains(stderr, "No server answers") || !strings.Contains(stderr, "alice") {
		t.Errorf("offline stderr: %q", stderr)
	}
	secret := linkSecret(t, out, base)
	noFileHolds(t, c.Dir, secret)
	p, err := links.Redeem(context.Background(), secret)
	if err != nil || p.Owner != "alice" || strings.Join(p.Scopes, " ") != "chat upstream:github" {
		t.Fatalf("redeeming the offline link: %+v, %v", p, err)
	}
	if _, err := links.Redeem(context.Background(), secret); !errors.Is(err, signin.ErrLinkUnknown) {
		t.Fatalf("second redemption: %v", err)
	}

	c.start(t)
	out, stderr, err = c.Run(t, "zidane", "signin-link", "--owner", "bob", "--name", "Bob B", "--scope", "chat", "--expires", "30m", "--base", base)
	if err != nil {
		t.Fatalf("signin-link online: %v\n%s", err, stderr)
	}
	if strings.Contains(stderr, "No server answers") {
		t.Errorf("went offline with a server running: %q", stderr)
	}
	secret = linkSecret(t, out, base)
	c.WaitForLog(t, "signin_link_created", startTimeout)
	if strings.Contains(c.Logs(), secret[4:]) {
		t.Error("the server's log holds the link's secret")
	}
	noFileHolds(t, c.Dir, secret)
	p, err = links.Redeem(context.Background(), secret)
	if err != nil || p.Owner != "bob" || p.Name != "Bob B" {
		t.Fatalf("redeeming the online link: %+v, %v", p, err)
	}
	// The admin route itself, as a script would call it: the admin key is
	// required (a link signs a browser in as anyone), and a request the
	// CLI would have refused is refused and audited.
	key, err := os.ReadFile(filepath.Join(c.DataDir, "zidane", "admin.key"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, key, body string
		status          int
		word            string
	}{
		{"no admin key", "", `{"owner":"mallory","scopes":["chat"]}`, http.StatusForbidden, "CLI"},
		{"a wrong admin key", "wrong", `{"owner":"mallory","scopes":["chat"]}`, http.StatusForbidden, ""},
		{"an owner of a JWT subject", string(key), `{"owner":"jwt:bob","scopes":["chat"]}`, http.StatusBadRequest, "jwt:"},
		{"an unknown field", string(key), `{"owner":"bob","scopes":["chat"],"admin":true}`, http.StatusBadRequest, "unknown field"},
		{"a lifetime of a week", string(key), `{"owner":"bob","scopes":["chat"],"expires":"7d"}`, http.StatusBadRequest, "24h"},
	} {
		req, _ := http.NewRequest(http.MethodPost, c.AdminURL("/zidane/signin/links"), strings.NewReader(tc.body))
		req.Header.Set("Content-Type", "application/json")
		if tc.key != "" {
			req.Header.Set("Authorization", "Zidane-Admin-Key "+tc.key)
		}
		resp, err := shortClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
		resp.Body.Close()
		if resp.StatusCode != tc.status || !strings.Contains(string(b), tc.word) || strings.Contains(string(b), "zsl_") {
			t.Errorf("%s: %d %s", tc.name, resp.StatusCode, b)
		}
	}
	c.WaitForLog(t, "signin_link_refused", startTimeout)
	if n := strings.Count(c.Logs(), "signin_link_created"); n != 1 {
		t.Errorf("%d links made through the admin API; only the CLI's one should have been", n)
	}
}

package connect

import (
	"crypto/sha256"
	"encoding/base64"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
)

// TestPageHeadersExact pins every header of the connect pages: a link's
// page with its button, a refusal and the answer to a wrong method, as
// they were before the pages shared internal/htmlpage. The CSP has no
// form-action: the redirect after the button goes to the upstream.
func TestPageHeadersExact(t *testing.T) {
	f := newFixture(t)
	a, b := browser{}, browser{}
	f.signIn(a, "alice")
	f.signIn(b, "bob")
	_, path := f.link("alice", "github")
	sum := sha256.Sum256([]byte(style))
	csp := "default-src 'none'; style-src 'sha256-" + base64.StdEncoding.EncodeToString(sum[:]) + "'; frame-ancestors 'none'; base-uri 'none'"
	for _, tc := range []struct {
		name   string
		resp   *http.Response
		status int
	}{
		{"link page", f.get(a, path), http.StatusOK},
		{"refusal", f.get(b, path), http.StatusForbidden},
		{"wrong method", b.do(t, f.svc, httptest.NewRequest(http.MethodPut, site+path, nil)), http.StatusMethodNotAllowed},
	} {
		body := readBody(tc.resp)
		if tc.resp.StatusCode != tc.status {
			t.Fatalf("%s: status %d, want %d: %s", tc.name, tc.resp.StatusCode, tc.status, body)
		}
		want := map[string]string{
			"Content-Type":            "text/html; charset=utf-8",
			"Content-Security-Policy": csp,
			"X-Frame-Options":         "DENY",
			"X-Content-Type-Options":  "nosniff",
			"Cache-Control":           "no-store",
			"Referrer-Policy":         "same-origin",
			"Content-Length":          strconv.Itoa(len(body)),
		}
		if tc.status == http.StatusMethodNotAllowed {
			want["Allow"] = "GET, POST"
		}
		for k, v := range tc.resp.Header {
			if w, ok := want[k]; !ok || len(v) != 1 || v[0] != w {
				t.Errorf("%s: %s: %q, want %q", tc.name, k, v, w)
			}
		}
		for k, w := range want {
			if _, ok := tc.resp.Header[k]; !ok {
				t.Errorf("%s: no %s, want %q", tc.name, k, w)
			}
		}
	}
}

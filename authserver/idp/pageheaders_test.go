package idp

import (
	"crypto/sha256"
	"encoding/base64"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
)

// TestPageHeadersExact pins every header of the sign-in pages: the link
// page (its one script allowed by hash), a refusal and the answer to a
// wrong method, as they were before the pages shared internal/htmlpage.
func TestPageHeadersExact(t *testing.T) {
	s := newService(t, Config{Links: fileStorage(t)})
	sha := func(s string) string {
		sum := sha256.Sum256([]byte(s))
		return "'sha256-" + base64.StdEncoding.EncodeToString(sum[:]) + "'"
	}
	pageCSP := "default-src 'none'; style-src " + sha(style) + "; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
	for _, tc := range []struct {
		name   string
		r      *http.Request
		status int
		csp    string
	}{
		{"link page", httptest.NewRequest(http.MethodGet, "https://gw.example.com"+LinkPath, nil), http.StatusOK, pageCSP + "; script-src " + sha(linkScript)},
		{"refusal", linkPost("secret=zsl_" + strings.Repeat("A", 43)), http.StatusForbidden, pageCSP},
		{"wrong method", httptest.NewRequest(http.MethodPut, "https://gw.example.com"+LinkPath, nil), http.StatusMethodNotAllowed, pageCSP},
	} {
		resp := serve(s.ServeHTTP, tc.r)
		b := body(t, resp)
		if resp.StatusCode != tc.status {
			t.Fatalf("%s: status %d, want %d: %s", tc.name, resp.StatusCode, tc.status, b)
		}
		want := map[string]string{
			"Content-Type":            "text/html; charset=utf-8",
			"Content-Security-Policy": tc.csp,
			"X-Frame-Options":         "DENY",
			"X-Content-Type-Options":  "nosniff",
			"Cache-Control":           "no-store",
			"Referrer-Policy":         "same-origin",
			"Content-Length":          strconv.Itoa(len(b)),
		}
		if tc.status == http.StatusMethodNotAllowed {
			want["Allow"] = "GET, POST"
		}
		for k, v := range resp.Header {
			if w, ok := want[k]; !ok || len(v) != 1 || v[0] != w {
				t.Errorf("%s: %s: %q, want %q", tc.name, k, v, w)
			}
		}
		for k, w := range want {
			if _, ok := resp.Header[k]; !ok {
				t.Errorf("%s: no %s, want %q", tc.name, k, w)
			}
		}
	}
}

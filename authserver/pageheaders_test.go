package authserver

import (
	"net/http"
	"strconv"
	"testing"
)

// TestPageHeadersExact pins every header of the consent page and of a
// refusal page: the security headers as they were before the pages shared
// internal/htmlpage, and nothing more. The consent page sends its referrer
// to its own origin alone (its form's POST must carry a real Origin); the
// refusal page sends none.
func TestPageHeadersExact(t *testing.T) {
	f := newFixture(t)
	common := map[string]string{
		"Content-Type":            "text/html; charset=utf-8",
		"Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; base-uri 'none'; frame-ancestors 'none'",
		"X-Frame-Options":         "DENY",
		"Cache-Control":           "no-store",
		"Pragma":                  "no-cache",
		"X-Content-Type-Options":  "nosniff",
	}
	with := func(k, v string) map[string]string {
		m := map[string]string{k: v}
		for k, v := range common {
			m[k] = v
		}
		return m
	}
	consent := f.authorize(f.authzQuery(newPKCE(f)).Encode(), "alice")
	q := f.authzQuery(newPKCE(f))
	q.Set("client_id", "https://unknown.example/client.json")
	refusal := f.authorize(q.Encode(), "alice")
	for _, tc := range []struct {
		name   string
		resp   *http.Response
		status int
		want   map[string]string
	}{
		{"consent page", consent, http.StatusOK, with("Referrer-Policy", "same-origin")},
		{"refusal page", refusal, http.StatusBadRequest, with("Referrer-Policy", "no-referrer")},
	} {
		body := readBody(tc.resp)
		if tc.resp.StatusCode != tc.status {
			t.Fatalf("%s: status %d, want %d: %s", tc.name, tc.resp.StatusCode, tc.status, body)
		}
		want := with("Content-Length", strconv.Itoa(len(body)))
		for k, v := range tc.want {
			want[k] = v
		}
		exactHeaders(t, tc.name, tc.resp.Header, want)
	}
}

// exactHeaders fails unless h holds the headers of want, once each, and
// no other; Set-Cookie, the sign-in's flow rather than the page's, is
// left out.
func exactHeaders(t *testing.T, name string, h http.Header, want map[string]string) {
	t.Helper()
	for k, v := range h {
		if k == "Set-Cookie" {
			continue
		}
		if w, ok := want[k]; !ok || len(v) != 1 || v[0] != w {
			t.Errorf("%s: %s: %q, want %q", name, k, v, w)
		}
	}
	for k, w := range want {
		if _, ok := h[k]; !ok {
			t.Errorf("%s: no %s, want %q", name, k, w)
		}
	}
}

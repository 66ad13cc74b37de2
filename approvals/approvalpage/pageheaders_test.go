package approvalpage

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
)

// TestPageHeadersExact pins every header of the status page: with the
// buttons, for an unknown approval, for a refused answer and for a wrong
// method, as they were before the pages shared internal/htmlpage.
func TestPageHeadersExact(t *testing.T) {
	p, _, a, _ := fixture(t)
	serve := func(r *http.Request) *httptest.ResponseRecorder {
		w := httptest.NewRecorder()
		p.ServeHTTP(w, r)
		return w
	}
	show := httptest.NewRequest(http.MethodGet, origin+PathPrefix+a.ID, nil)
	show.Header.Set("X-Test-Person", "bob")
	cross := httptest.NewRequest(http.MethodPost, origin+PathPrefix+a.ID, nil)
	cross.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	cross.Header.Set("Origin", "https://evil.example")
	for _, tc := range []struct {
		name   string
		w      *httptest.ResponseRecorder
		status int
	}{
		{"page with buttons", serve(show), http.StatusOK},
		{"unknown approval", serve(httptest.NewRequest(http.MethodGet, origin+PathPrefix+"apv_AAAAAAAAAAAAAAAAAAAAAA", nil)), http.StatusNotFound},
		{"refused answer", serve(cross), http.StatusForbidden},
		{"wrong method", serve(httptest.NewRequest(http.MethodPut, origin+PathPrefix+a.ID, nil)), http.StatusMethodNotAllowed},
	} {
		if tc.w.Code != tc.status {
			t.Fatalf("%s: status %d, want %d: %s", tc.name, tc.w.Code, tc.status, tc.w.Body)
		}
		want := map[string]string{
			"Content-Type":            "text/html; charset=utf-8",
			"Content-Security-Policy": "default-src 'none'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
			"X-Frame-Options":         "DENY",
			"X-Content-Type-Options":  "nosniff",
			"Cache-Control":           "no-store",
			"Referrer-Policy":         "same-origin",
			"Content-Length":          strconv.Itoa(tc.w.Body.Len()),
		}
		if tc.status == http.StatusMethodNotAllowed {
			want["Allow"] = "GET, POST"
		}
		h := tc.w.Result().Header
		for k, v := range h {
			if w, ok := want[k]; !ok || len(v) != 1 || v[0] != w {
				t.Errorf("%s: %s: %q, want %q", tc.name, k, v, w)
			}
		}
		for k, w := range want {
			if _, ok := h[k]; !ok {
				t.Errorf("%s: no %s, want %q", tc.name, k, w)
			}
		}
	}
}

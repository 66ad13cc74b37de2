package accounts

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/Tahul/caddy-zidane-mcp/broker/upstreamauth"
)

const origin = "https://signin.example.com"

// page is the accounts page of a gateway with no per_user upstream, the
// browser's person read from its X-Test-Person header (the sign-in's
// cookie, in the gateway).
func page(t *testing.T) *Page {
	t.Helper()
	p, err := New(Options{Origin: origin, Key: make([]byte, 32),
		Current: func(r *http.Request) (Person, bool) {
			who := r.Header.Get("X-Test-Person")
			return Person{Owner: who, Name: strings.ToUpper(who)}, who != ""
		},
		SignIn: func(w http.ResponseWriter, r *http.Request, returnTo string) {
			http.Redirect(w, r, "/signin?return="+returnTo, http.StatusSeeOther)
		},
		Upstreams: func() map[string]*upstreamauth.Client { return nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestPageHeadersExact pins every header of the connected accounts page:
// the list, a refused disconnection and a wrong method, as they were
// before the pages shared internal/htmlpage.
func TestPageHeadersExact(t *testing.T) {
	p := page(t)
	serve := func(r *http.Request) *httptest.ResponseRecorder {
		w := httptest.NewRecorder()
		p.ServeHTTP(w, r)
		return w
	}
	show := httptest.NewRequest(http.MethodGet, origin+Path, nil)
	show.Header.Set("X-Test-Person", "alice")
	cross := httptest.NewRequest(http.MethodPost, origin+Path, strings.NewReader("upstream=github&token=x"))
	cross.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	cross.Header.Set("Origin", "https://evil.example")
	cross.Header.Set("X-Test-Person", "alice")
	for _, tc := range []struct {
		name   string
		w      *httptest.ResponseRecorder
		status int
		word   string
	}{
		{"the list", serve(show), http.StatusOK, "You have connected no upstream account"},
		{"refused disconnection", serve(cross), http.StatusForbidden, "own page"},
		{"wrong method", serve(httptest.NewRequest(http.MethodPut, origin+Path, nil)), http.StatusMethodNotAllowed, "Open this page with GET"},
	} {
		if tc.w.Code != tc.status || !strings.Contains(tc.w.Body.String(), tc.word) {
			t.Fatalf("%s: status %d, want %d with %q: %s", tc.name, tc.w.Code, tc.status, tc.word, tc.w.Body)
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

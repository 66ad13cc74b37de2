package connect

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// FuzzServeHTTP: whatever path, query, method and form a browser signed
// in as alice sends, with no link made, nothing starts an authorization
// or finishes one: every answer is a refusal page or a sign-in.
func FuzzServeHTTP(f *testing.F) {
	for _, s := range [][3]string{
		{"GET", "/zidane/connect/zcl_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA", ""},
		{"POST", "/zidane/connect/zcl_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA", "connect=1"},
		{"GET", "/zidane/connect/callback?state=x&code=y", ""},
		{"GET", "/zidane/connect/callback?state=x;code=y", ""},
		{"POST", "/zidane/connect/%2e%2e/callback", "connect=1&connect=2"},
	} {
		f.Add(s[0], s[1], s[2])
	}
	fx := newFixture(f)
	n := 0
	a := browser{}
	fx.signIn(a, "alice")
	f.Fuzz(func(t *testing.T, method, target, form string) {
		if !strings.HasPrefix(target, "/") || strings.ContainsAny(method, " \t\r\n") || method == "" {
			return
		}
		r, err := http.NewRequest(method, "https://gw.example.com"+target, strings.NewReader(form))
		if err != nil {
			return
		}
		r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		r.Header.Set("Origin", site)
		// An address per request: the per-address limit is not what
		// this tests.
		n++
		r.RemoteAddr = fmt.Sprintf("10.%d.%d.%d:1234", n>>16&0xff, n>>8&0xff, n&0xff)
		for n, v := range a {
			r.AddCookie(&http.Cookie{Name: n, Value: v})
		}
		rec := httptest.NewRecorder()
		fx.svc.ServeHTTP(rec, r)
		if rec.Code < 400 && rec.Code != http.StatusTooManyRequests {
			t.Fatalf("%s %s %q answered %d", method, target, form, rec.Code)
		}
		if len(fx.auth.started) != 0 || len(fx.auth.finishedFor()) != 0 {
			t.Fatalf("%s %s %q reached the authorizer", method, target, form)
		}
	})
}

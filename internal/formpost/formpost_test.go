package formpost

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

const site = "https://gw.example.test"

func post(target, body string, h map[string][]string) *http.Request {
	r := httptest.NewRequest(http.MethodPost, target, strings.NewReader(body))
	for k, v := range h {
		for _, x := range v {
			r.Header.Add(k, x)
		}
	}
	return r
}

// TestReadAttacks: each way a post from elsewhere, or a form read two ways,
// is refused with its reason; the good posts are read.
func TestReadAttacks(t *testing.T) {
	form := map[string][]string{"Content-Type": {"application/x-www-form-urlencoded"}}
	with := func(extra map[string][]string) map[string][]string {
		h := map[string][]string{}
		for k, v := range form {
			h[k] = v
		}
		for k, v := range extra {
			h[k] = v
		}
		return h
	}
	cases := []struct {
		name   string
		target string
		body   string
		h      map[string][]string
		want   *Refusal
	}{
		{"origin of this site", "/x", "a=1", with(map[string][]string{"Origin": {site}}), nil},
		{"origin with the default port", "/x", "a=1", with(map[string][]string{"Origin": {"https://gw.example.test:443"}}), nil},
		{"sec-fetch-site same-origin alone", "/x", "a=1", with(map[string][]string{"Sec-Fetch-Site": {"same-origin"}}), nil},
		{"both, agreeing", "/x", "a=1", with(map[string][]string{"Sec-Fetch-Site": {"same-origin"}, "Origin": {site}}), nil},
		{"neither header: no browser's form", "/x", "a=1", form, CrossOrigin},
		{"another site", "/x", "a=1", with(map[string][]string{"Origin": {"https://evil.example.test"}}), CrossOrigin},
		{"same host, http", "/x", "a=1", with(map[string][]string{"Origin": {"http://gw.example.test"}}), CrossOrigin},
		{"same host, other port", "/x", "a=1", with(map[string][]string{"Origin": {"https://gw.example.test:8443"}}), CrossOrigin},
		{"null origin", "/x", "a=1", with(map[string][]string{"Origin": {"null"}}), CrossOrigin},
		{"origin with a path", "/x", "a=1", with(map[string][]string{"Origin": {site + "/page"}}), CrossOrigin},
		{"origin with user info", "/x", "a=1", with(map[string][]string{"Origin": {"https://gw.example.test@evil.example.test"}}), CrossOrigin},
		{"origin twice", "/x", "a=1", with(map[string][]string{"Origin": {site, site}}), CrossOrigin},
		{"cross-site fetch", "/x", "a=1", with(map[string][]string{"Sec-Fetch-Site": {"cross-site"}}), CrossOrigin},
		{"same-site is not same-origin", "/x", "a=1", with(map[string][]string{"Sec-Fetch-Site": {"same-site"}, "Origin": {site}}), CrossOrigin},
		{"sec-fetch-site twice", "/x", "a=1", with(map[string][]string{"Sec-Fetch-Site": {"same-origin", "cross-site"}}), CrossOrigin},
		{"a field in the address", "/x?a=2", "a=1", with(map[string][]string{"Origin": {site}}), Query},
		{"json body", "/x", `{"a":1}`, map[string][]string{"Origin": {site}, "Content-Type": {"application/json"}}, ContentType},
		{"multipart", "/x", "a=1", map[string][]string{"Origin": {site}, "Content-Type": {"multipart/form-data; boundary=x"}}, ContentType},
		{"no content type", "/x", "a=1", map[string][]string{"Origin": {site}}, ContentType},
		{"body over the bound", "/x", "a=" + strings.Repeat("x", 200), with(map[string][]string{"Origin": {site}}), Unreadable},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w := httptest.NewRecorder()
			f, got := Read(w, post(c.target, c.body, c.h), site, 64)
			if got != c.want {
				t.Fatalf("refusal %+v, want %+v", got, c.want)
			}
			if c.want == nil && f.Get("a") != "1" {
				t.Fatalf("form %v, want a=1", f)
			}
		})
	}
}

// TestOriginIsAConfiguredOriginWithAPort: an issuer written with :443 in
// the config is matched by the browser's spelling without it.
func TestOriginIsAConfiguredOriginWithAPort(t *testing.T) {
	if !OriginIs("https://gw.example.test", site) || !OriginIs("HTTPS://GW.example.test", site) {
		t.Fatal("the browser's spelling of this site's origin is not taken")
	}
	if OriginIs("", site) || OriginIs("gw.example.test", site) {
		t.Fatal("an origin without a scheme is taken")
	}
}

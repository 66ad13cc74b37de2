package pinnedfetch

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
)

// opaqueReader hides its type so http.NewRequest cannot set GetBody.
type opaqueReader struct{ io.Reader }

func TestRedirects(t *testing.T) {
	type tcase struct {
		name   string
		routes map[string]string
		pinned string // also the request URL unless url is set
		url    string
		method string
		body   string
		opaque bool // body without GetBody
		ipv6   bool
		opts   []Option
		want   []string // hits, in order; see hit.line
		err    error    // errors.Is target; nil means success
		urlErr bool     // the refusal is a remote-URL rule *URLError
		status int      // final status when err is nil; 200 if zero
	}
	chain := func(n int) map[string]string {
		r := map[string]string{}
		for i := 0; i <= n; i++ {
			r[fmt.Sprintf("/h%d", i)] = fmt.Sprintf("302 /h%d", i+1)
		}
		return r
	}
	hops := func(from, to int) []string {
		var w []string
		for i := from; i <= to; i++ {
			w = append(w, fmt.Sprintf("S GET example.com/h%d %s", i, creds))
		}
		return w
	}
	tests := []tcase{
		{
			name:   "same origin keeps credentials",
			routes: map[string]string{"/start": "302 https://example.com/final"},
			pinned: "https://example.com/start",
			want:   []string{"S GET example.com/start " + creds, "S GET example.com/final " + creds},
		},
		{
			name:   "relative Location stays on origin",
			routes: map[string]string{"/start": "302 ../final"},
			pinned: "https://example.com/start",
			want:   []string{"S GET example.com/start " + creds, "S GET example.com/final " + creds},
		},
		{
			name:   "scheme-relative Location to another host drops",
			routes: map[string]string{"/start": "302 //evil.example.com/final"},
			pinned: "https://example.com/start",
			want:   []string{"S GET example.com/start " + creds, "S GET evil.example.com/final " + bare},
		},
		{
			name:   "subdomain drops (net/http would keep Authorization)",
			routes: map[string]string{"/start": "302 https://evil.example.com/final"},
			pinned: "https://example.com/start",
			want:   []string{"S GET example.com/start " + creds, "S GET evil.example.com/final " + bare},
		},
		{
			name:   "sub-subdomain drops",
			routes: map[string]string{"/start": "302 https://evil.api.example.com/final"},
			pinned: "https://api.example.com/start",
			want:   []string{"S GET api.example.com/start " + creds, "S GET evil.api.example.com/final " + bare},
		},
		{
			name:   "parent domain drops",
			routes: map[string]string{"/start": "301 https://example.com/final"},
			pinned: "https://api.example.com/start",
			want:   []string{"S GET api.example.com/start " + creds, "S GET example.com/final " + bare},
		},
		{
			name:   "cross origin by port drops",
			routes: map[string]string{"/start": "302 https://example.com:8443/final"},
			pinned: "https://example.com/start",
			want:   []string{"S GET example.com/start " + creds, "T GET example.com:8443/final " + bare},
		},
		{
			name:   "cross origin by scheme (http to https upgrade) drops",
			routes: map[string]string{"/start": "302 https://localhost/final"},
			pinned: "http://localhost/start",
			want:   []string{"H GET localhost/start " + creds, "S GET localhost/final " + bare},
		},
		{
			name:   "uppercase host is the same origin",
			routes: map[string]string{"/start": "302 https://EXAMPLE.COM/final"},
			pinned: "https://example.com/start",
			want:   []string{"S GET example.com/start " + creds, "S GET EXAMPLE.COM/final " + creds},
		},
		{
			name:   "trailing dot is the same origin",
			routes: map[string]string{"/start": "302 https://example.com./final"},
			pinned: "https://example.com/start",
			want:   []string{"S GET example.com/start " + creds, "S GET example.com./final " + creds},
		},
		{
			name:   "explicit default port is the same origin",
			routes: map[string]string{"/start": "307 https://example.com:443/final"},
			pinned: "https://example.com/start",
			want:   []string{"S GET example.com/start " + creds, "S GET example.com:443/final " + creds},
		},
		{
			name:   "IP literal is not the name that resolves to it",
			routes: map[string]string{"/start": "302 https://127.0.0.1:{sport}/final"},
			pinned: "https://example.com/start",
			want:   []string{"S GET example.com/start " + creds, "S GET 127.0.0.1:{sport}/final " + bare},
		},
		{
			name:   "localhost is not 127.0.0.1",
			routes: map[string]string{"/start": "302 http://127.0.0.1:{hport}/final"},
			pinned: "http://localhost:{hport}/start",
			want:   []string{"H GET localhost:{hport}/start " + creds, "H GET 127.0.0.1:{hport}/final " + bare},
		},
		{
			name:   "IPv6 loopback, same origin in another spelling",
			routes: map[string]string{"/start": "302 https://[0:0:0:0:0:0:0:1]:{s6port}/final"},
			pinned: "https://[::1]:{s6port}/start",
			ipv6:   true,
			want:   []string{"S6 GET [::1]:{s6port}/start " + creds, "S6 GET [0:0:0:0:0:0:0:1]:{s6port}/final " + creds},
		},
		{
			name:   "IPv6 loopback to IPv4 loopback drops",
			routes: map[string]string{"/start": "302 https://127.0.0.1:{sport}/final"},
			pinned: "https://[::1]:{s6port}/start",
			ipv6:   true,
			want:   []string{"S6 GET [::1]:{s6port}/start " + creds, "S GET 127.0.0.1:{sport}/final " + bare},
		},
		{
			name: "A to B to A: credentials stay dropped",
			routes: map[string]string{
				"/start": "302 https://evil.example.com/hop",
				"/hop":   "302 https://example.com/end",
			},
			pinned: "https://example.com/start",
			want: []string{
				"S GET example.com/start " + creds,
				"S GET evil.example.com/hop " + bare,
				"S GET example.com/end " + bare,
			},
		},
		{
			name:   "request to another origin goes without credentials",
			routes: map[string]string{"/start": "302 https://example.com/final"},
			pinned: "https://example.com/",
			url:    "https://other.example.com/start",
			want:   []string{"S GET other.example.com/start " + bare, "S GET example.com/final " + bare},
		},
		{
			name:   "303 after POST becomes GET without body",
			routes: map[string]string{"/start": "303 /final"},
			pinned: "https://example.com/start",
			method: http.MethodPost, body: "payload",
			want: []string{"S POST example.com/start " + creds + " body=payload", "S GET example.com/final " + creds},
		},
		{
			name:   "302 after PUT becomes GET without body",
			routes: map[string]string{"/start": "302 /final"},
			pinned: "https://example.com/start",
			method: http.MethodPut, body: "payload",
			want: []string{"S PUT example.com/start " + creds + " body=payload", "S GET example.com/final " + creds},
		},
		{
			name:   "HEAD stays HEAD on 301",
			routes: map[string]string{"/start": "301 /final"},
			pinned: "https://example.com/start",
			method: http.MethodHead,
			want:   []string{"S HEAD example.com/start " + creds, "S HEAD example.com/final " + creds},
		},
		{
			name:   "307 replays the body",
			routes: map[string]string{"/start": "307 /final"},
			pinned: "https://example.com/start",
			method: http.MethodPost, body: "payload",
			want: []string{"S POST example.com/start " + creds + " body=payload", "S POST example.com/final " + creds + " body=payload"},
		},
		{
			name:   "308 off origin replays the body without credentials",
			routes: map[string]string{"/start": "308 https://example.com:8443/final"},
			pinned: "https://example.com/start",
			method: http.MethodPost, body: "payload",
			want: []string{"S POST example.com/start " + creds + " body=payload", "T POST example.com:8443/final " + bare + " body=payload"},
		},
		{
			name:   "303 then 307 keeps the body dropped",
			routes: map[string]string{"/start": "303 /mid", "/mid": "307 /final"},
			pinned: "https://example.com/start",
			method: http.MethodPost, body: "payload", opaque: true,
			want: []string{"S POST example.com/start " + creds + " body=payload", "S GET example.com/mid " + creds, "S GET example.com/final " + creds},
		},
		{
			name:   "307 with a body that cannot be replayed is refused",
			routes: map[string]string{"/start": "307 /final"},
			pinned: "https://example.com/start",
			method: http.MethodPost, body: "payload", opaque: true,
			want: []string{"S POST example.com/start " + creds + " body=payload"},
			err:  ErrBodyNotReplayable,
		},
		{
			name:   "redirect loop is refused",
			routes: map[string]string{"/a": "302 /b", "/b": "302 /a"},
			pinned: "https://example.com/a",
			want:   []string{"S GET example.com/a " + creds, "S GET example.com/b " + creds},
			err:    ErrRedirectLoop,
		},
		{
			name:   "Location with userinfo is refused",
			routes: map[string]string{"/start": "302 https://user:secret-pass@evil.example.com/final"},
			pinned: "https://example.com/start",
			want:   []string{"S GET example.com/start " + creds},
			urlErr: true,
		},
		{
			name:   "redirect to file: is refused",
			routes: map[string]string{"/start": "302 file:///etc/passwd"},
			pinned: "https://example.com/start",
			want:   []string{"S GET example.com/start " + creds},
			urlErr: true,
		},
		{
			name:   "redirect to the metadata service over http is refused",
			routes: map[string]string{"/start": "302 http://169.254.169.254/latest/meta-data/"},
			pinned: "http://localhost/start",
			want:   []string{"H GET localhost/start " + creds},
			urlErr: true,
		},
		{
			name:   "redirect to an integer IP spelling is refused",
			routes: map[string]string{"/start": "302 http://2130706433:{hport}/"},
			pinned: "http://localhost/start",
			want:   []string{"H GET localhost/start " + creds},
			urlErr: true,
		},
		{
			name:   "https to http on the same host is refused",
			routes: map[string]string{"/start": "302 http://localhost/final"},
			pinned: "https://localhost/start",
			want:   []string{"S GET localhost/start " + creds},
			err:    ErrDowngrade,
		},
		{
			name:   "unparseable Location is refused",
			routes: map[string]string{"/start": "302 https://exa mple.com/%zz"},
			pinned: "https://example.com/start",
			want:   []string{"S GET example.com/start " + creds},
			err:    ErrBadLocation,
		},
		{
			name:   "3xx without Location is returned as is",
			routes: map[string]string{"/start": "302 "},
			pinned: "https://example.com/start",
			want:   []string{"S GET example.com/start " + creds},
			status: http.StatusFound,
		},
		{
			name:   "300 is not followed",
			routes: map[string]string{"/start": "300 /final"},
			pinned: "https://example.com/start",
			want:   []string{"S GET example.com/start " + creds},
			status: http.StatusMultipleChoices,
		},
		{
			name:   "ten redirects are followed",
			routes: chain(10),
			pinned: "https://example.com/h1",
			want:   hops(1, 11),
		},
		{
			name:   "an eleventh redirect is refused",
			routes: chain(11),
			pinned: "https://example.com/h0",
			want:   hops(0, 10),
			err:    ErrTooManyRedirects,
		},
		{
			name:   "WithMaxRedirects lowers the bound",
			routes: chain(5),
			pinned: "https://example.com/h0",
			opts:   []Option{WithMaxRedirects(2)},
			want:   hops(0, 2),
			err:    ErrTooManyRedirects,
		},
		{
			name:   "WithMaxRedirects(0) refuses every redirect",
			routes: chain(1),
			pinned: "https://example.com/h0",
			opts:   []Option{WithMaxRedirects(0)},
			want:   hops(0, 0),
			err:    ErrTooManyRedirects,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, tt.routes)
			if tt.ipv6 && e.S6 == nil {
				t.Skip("no IPv6 loopback on this machine")
			}
			c := e.client(tt.pinned, tt.opts...)
			target := tt.pinned
			if tt.url != "" {
				target = tt.url
			}
			var body io.Reader
			if tt.body != "" {
				body = strings.NewReader(tt.body)
				if tt.opaque {
					body = opaqueReader{body}
				}
			}
			method := tt.method
			if method == "" {
				method = http.MethodGet
			}
			req, err := http.NewRequest(method, e.expand(target), body)
			if err != nil {
				t.Fatal(err)
			}
			setProbe(req.Header)
			if body != nil {
				req.Header.Set("Content-Type", "text/plain")
			}
			resp, err := c.Do(req)
			if resp != nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			switch {
			case tt.err != nil || tt.urlErr:
				var re *RedirectError
				if !errors.As(err, &re) {
					t.Fatalf("got %v, want a *RedirectError", err)
				}
				var ue *URLError
				if tt.urlErr && !errors.As(err, &ue) {
					t.Errorf("got %v, want a remote-URL rule refusal", err)
				}
				if tt.err != nil && !errors.Is(err, tt.err) {
					t.Errorf("got %v, want %v", err, tt.err)
				}
				if strings.Contains(err.Error(), "secret") {
					t.Errorf("error leaks a secret: %v", err)
				}
			case err != nil:
				t.Fatalf("Do: %v", err)
			default:
				want := tt.status
				if want == 0 {
					want = http.StatusOK
				}
				if resp.StatusCode != want {
					t.Errorf("status %d, want %d", resp.StatusCode, want)
				}
			}
			e.checkHits(tt.want)
		})
	}
}

func TestBodyHeadersGoWithTheBody(t *testing.T) {
	e := newEnv(t, map[string]string{"/start": "303 /final"})
	c := e.client("https://example.com/")
	req, _ := http.NewRequest(http.MethodPost, "https://example.com/start", strings.NewReader("payload"))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Content-Language", "en")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	e.mu.Lock()
	defer e.mu.Unlock()
	final := e.hits[len(e.hits)-1].header
	for _, h := range []string{"Content-Type", "Content-Language", "Content-Length"} {
		if final.Get(h) != "" {
			t.Errorf("%s survived a redirect that dropped the body", h)
		}
	}
}

func TestNonCanonicalHeaderKeysAreStripped(t *testing.T) {
	e := newEnv(t, map[string]string{"/start": "302 https://evil.example.com/final"})
	c := e.client("https://example.com/")
	req, _ := http.NewRequest(http.MethodGet, "https://example.com/start", nil)
	req.Header["authorization"] = []string{"Bearer secret-token"}
	req.Header["x-api-key"] = []string{"secret-key"}
	req.Header["X-Trace"] = []string{"trace-1"}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	e.mu.Lock()
	defer e.mu.Unlock()
	for k := range e.hits[1].header {
		if strings.EqualFold(k, "authorization") || strings.EqualFold(k, "x-api-key") {
			t.Errorf("%s reached the other origin", k)
		}
	}
}

func TestUnconfiguredHeaderFollows(t *testing.T) {
	// Only the listed names are secrets: this pins down that the list is
	// what decides, so callers know to list every secret header.
	e := newEnv(t, map[string]string{"/start": "302 https://evil.example.com/final"})
	c, err := New("https://example.com/", nil, WithTLSConfig(&tls.Config{RootCAs: e.pool}), withLookup(e.lookup), DenyPrivateAddresses(false), loopbackOnly)
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest(http.MethodGet, "https://example.com/start", nil)
	setProbe(req.Header)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	e.checkHits([]string{"S GET example.com/start " + creds, "S GET evil.example.com/final X-Api-Key,X-Trace"})
}

// injector adds Authorization to every request it sees, as an OAuth
// transport does.
type injector struct {
	next http.RoundTripper
	seen []string
}

func (i *injector) RoundTrip(req *http.Request) (*http.Response, error) {
	i.seen = append(i.seen, req.URL.Host+req.URL.Path)
	r := req.Clone(req.Context())
	r.Header.Set("Authorization", "Bearer injected")
	return i.next.RoundTrip(r)
}

func TestInjectedAuthorizationStaysOnOrigin(t *testing.T) {
	e := newEnv(t, map[string]string{
		"/start": "302 /same",
		"/same":  "302 https://evil.example.com/hop",
		"/hop":   "302 https://example.com/end",
	})
	inj := &injector{}
	c := e.client("https://example.com/", WithCredentials(func(next http.RoundTripper) http.RoundTripper {
		inj.next = next
		return inj
	}))
	req, _ := http.NewRequest(http.MethodGet, "https://example.com/start", nil)
	req.Header.Set("X-Trace", "trace-1")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()

	e.mu.Lock()
	defer e.mu.Unlock()
	want := []string{"Bearer injected", "Bearer injected", "", ""}
	if len(e.hits) != len(want) {
		t.Fatalf("got %d hits, want %d", len(e.hits), len(want))
	}
	for i, h := range e.hits {
		if got := h.header.Get("Authorization"); got != want[i] {
			t.Errorf("%s %s: Authorization %q, want %q", h.host, h.path, got, want[i])
		}
	}
	if got := strings.Join(inj.seen, " "); got != "example.com/start example.com/same" {
		t.Errorf("credential layer saw %q; it must see only pinned-origin hops", got)
	}
}

func TestCredentialLayerCannotLeaveOrigin(t *testing.T) {
	e := newEnv(t, nil)
	c := e.client("https://example.com/", WithCredentials(func(next http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(req *http.Request) (*http.Response, error) {
			r := req.Clone(req.Context())
			r.URL.Host = "evil.example.com"
			r.Host = ""
			r.Header.Set("Authorization", "Bearer injected")
			return next.RoundTrip(r)
		})
	}))
	_, err := c.Get("https://example.com/start")
	if !errors.Is(err, errOffOriginInjection) {
		t.Fatalf("got %v, want the origin gate to refuse", err)
	}
	e.checkHits(nil)
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func TestDecisions(t *testing.T) {
	e := newEnv(t, map[string]string{
		"/start": "302 https://evil.example.com/hop?token=secret-q",
		"/hop":   "307 https://example.com/end",
		"/end":   "302 http://example.com/downgrade",
	})
	var got []Decision
	c := e.client("https://example.com/", WithDecisions(func(d Decision) { got = append(got, d) }))
	req, _ := http.NewRequest(http.MethodGet, "https://example.com/start", nil)
	setProbe(req.Header)
	_, err := c.Do(req)
	if !errors.Is(err, ErrDowngrade) {
		t.Fatalf("got %v, want ErrDowngrade", err)
	}
	type short struct {
		Hop         int
		Action      Action
		To          string
		Status      int
		Credentials bool
		Stripped    string
	}
	want := []short{
		{0, ActionSend, "https://example.com/start", 0, true, ""},
		{1, ActionFollow, "https://evil.example.com/hop?…", 302, false, "Authorization,Cookie,Proxy-Authorization,X-Api-Key"},
		{2, ActionFollow, "https://example.com/end", 307, false, "Authorization,Cookie,Proxy-Authorization,X-Api-Key"},
		{3, ActionRefuse, "http://example.com/downgrade", 302, false, ""},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d decisions: %+v", len(got), got)
	}
	for i, d := range got {
		s := short{d.Hop, d.Action, d.To, d.Status, d.Credentials, strings.Join(d.StrippedHeaders, ",")}
		if s != want[i] {
			t.Errorf("decision %d = %+v, want %+v", i, s, want[i])
		}
		if d.Reason == "" {
			t.Errorf("decision %d has no reason", i)
		}
	}
	if !strings.Contains(got[2].Reason, "stay dropped") {
		t.Errorf("back-on-origin reason %q does not say credentials stay dropped", got[2].Reason)
	}
	if all := fmt.Sprintf("%+v", got); strings.Contains(all, "secret") {
		t.Errorf("decisions leak a header value or query: %s", all)
	}
}

func TestRefusedRequestURL(t *testing.T) {
	e := newEnv(t, nil)
	var got []Decision
	c := e.client("https://example.com/", WithDecisions(func(d Decision) { got = append(got, d) }))
	for _, u := range []string{"http://example.com/", "https://2130706433/", "http://[::ffff:10.0.0.1]/"} {
		_, err := c.Get(u)
		var ue *URLError
		if !errors.As(err, &ue) {
			t.Errorf("GET %s: got %v, want a *URLError", u, err)
		}
	}
	if len(got) != 3 || got[0].Action != ActionRefuse {
		t.Errorf("decisions %+v, want three refusals", got)
	}
	e.checkHits(nil)
}

func TestNew(t *testing.T) {
	tests := []struct {
		name   string
		url    string
		names  []string
		opts   []Option
		errHas string
	}{
		{"http to a public host", "http://api.example.com/", nil, nil, "plain http"},
		{"userinfo", "https://u:p@api.example.com/", nil, nil, "userinfo"},
		{"no parse", "https://exa mple.com/", nil, nil, "does not parse"},
		{"relative", "/mcp", nil, nil, "scheme"},
		{"bad header name", "https://api.example.com/", []string{"X Api Key"}, nil, "not a valid HTTP field name"},
		{"empty header name", "https://api.example.com/", []string{""}, nil, "not a valid HTTP field name"},
		{"too many redirects", "https://api.example.com/", nil, []Option{WithMaxRedirects(11)}, "out of range"},
		{"negative redirects", "https://api.example.com/", nil, []Option{WithMaxRedirects(-1)}, "out of range"},
		{"ok", "https://api.example.com/", []string{"X-Api-Key", "x-goog-api-key"}, nil, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := New(tt.url, tt.names, tt.opts...)
			if tt.errHas == "" {
				if err != nil {
					t.Fatal(err)
				}
				if c.Timeout != 0 {
					t.Error("client has a Timeout, which would cut SSE streams")
				}
				if c.CheckRedirect(nil, nil) != http.ErrUseLastResponse {
					t.Error("CheckRedirect does not hand redirects back to the pinned transport")
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.errHas) {
				t.Fatalf("got %v, want an error containing %q", err, tt.errHas)
			}
			if strings.Contains(err.Error(), "u:p@") {
				t.Errorf("error leaks userinfo: %v", err)
			}
		})
	}
}

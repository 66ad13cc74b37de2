package pinnedfetch

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
)

// The two benchmarks make the same GET to the same loopback server, so the
// difference between them is the pinned transport's overhead per request:
// the URL rule, the origin check, the guarded dialer (only on new
// connections) and, here, the Authorization header it has to consider.

func benchServer(b *testing.B) *httptest.Server {
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "ok")
	}))
	b.Cleanup(s.Close)
	return s
}

func benchGet(b *testing.B, c *http.Client, url string) {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		b.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer bench")
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		resp, err := c.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
}

func BenchmarkDefaultTransport(b *testing.B) {
	s := benchServer(b)
	benchGet(b, &http.Client{Transport: http.DefaultTransport}, s.URL+"/mcp")
}

func BenchmarkPinnedClient(b *testing.B) {
	s := benchServer(b)
	c, err := New(s.URL, []string{"X-Api-Key"})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(c.CloseIdleConnections)
	benchGet(b, c, s.URL+"/mcp")
}

// BenchmarkPinnedClientRedirect measures a same-origin redirect, where the
// pinned transport builds the second hop itself.
func BenchmarkPinnedClientRedirect(b *testing.B) {
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/old" {
			http.Redirect(w, r, "/mcp", http.StatusTemporaryRedirect)
			return
		}
		io.WriteString(w, "ok")
	}))
	b.Cleanup(s.Close)
	c, err := New(s.URL, []string{"X-Api-Key"})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(c.CloseIdleConnections)
	benchGet(b, c, s.URL+"/old")
}

package pinnedfetch

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// An answer's headers are bounded by MaxResponseHeaderBytes, not net/http's
// default of 10 MiB: the gateway keeps them for as long as a stream stays
// open, outside every answer bound.
func TestResponseHeadersBounded(t *testing.T) {
	big := strings.Repeat("h", 8<<10)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for i := range (MaxResponseHeaderBytes + 64<<10) / len(big) {
			w.Header().Add("X-Pad", big+string(rune('a'+i%26)))
		}
		w.WriteHeader(http.StatusOK)
	}))
	defer srv.Close()
	c, err := New(srv.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.Get(srv.URL)
	if err == nil {
		n := 0
		for _, v := range resp.Header.Values("X-Pad") {
			n += len(v)
		}
		resp.Body.Close()
		t.Fatalf("an answer with %d KiB of headers was read; want headers over %d KiB refused", n>>10, MaxResponseHeaderBytes>>10)
	}
}

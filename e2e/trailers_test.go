package e2e

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// TestGuardDropsTrailers: a client declares its bearer token, an Mcp-Name
// and another client's raw Mcp-Session-Id (which would pass unopened) as
// trailers of a chunked POST. reverse_proxy passes request
// trailers on, and the edge checks only the headers, so without the edge
// dropping them the upstream got the client's token, the passthrough the
// spec forbids. The upstream here records what arrives; it stands for any
// server that reads trailers.
func TestGuardDropsTrailers(t *testing.T) {
	type arrival struct {
		body    string
		trailer http.Header
		auth    string
	}
	arrived := make(chan arrival, 1)
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		arrived <- arrival{string(b), r.Trailer, r.Header.Get("Authorization")}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"jsonrpc":"2.0","id":1,"result":{}}`)
	})) // binds 127.0.0.1
	t.Cleanup(upstream.Close)
	site := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	c := startCaddy(t, fmt.Sprintf(`{
	admin %s
}

http://%s {
	zidane_mcp {
		guard
	}
	reverse_proxy %s
}
`, AdminPlaceholder, site, upstream.Listener.Addr()))
	token := createToken(t, c, "trailers", "--scope", "mcp")

	const ping = `{"jsonrpc":"2.0","id":1,"method":"ping"}`
	conn, err := net.DialTimeout("tcp", site, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	fmt.Fprintf(conn, "POST /mcp HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\n"+
		"Transfer-Encoding: chunked\r\nTrailer: Authorization, Mcp-Name, Mcp-Session-Id\r\n\r\n%x\r\n%s\r\n0\r\nAuthorization: Bearer %s\r\nMcp-Name: b\r\nMcp-Session-Id: raw-session-of-someone-else\r\n\r\n",
		site, token, len(ping), ping, token)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("the ping was answered %d", resp.StatusCode)
	}
	select {
	case a := <-arrived:
		if a.body != ping || a.auth != "" || len(a.trailer) != 0 {
			t.Fatalf("the upstream got body %q, Authorization %q and trailers %q; want the ping alone", a.body, a.auth, a.trailer)
		}
	default:
		t.Fatal("the ping was answered without reaching the upstream")
	}
}

package clients

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"

	"github.com/Tahul/caddy-zidane-mcp/pinnedfetch"
)

// clock is a settable clock for Config.Now.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// docHost is the name the tests' metadata documents are served under;
// the test certificate of httptest covers it.
const docHost = "client.example.com"

// docServer serves metadata documents over TLS on loopback, and counts
// the requests each path received.
type docServer struct {
	srv  *httptest.Server
	port uint16
	mu   sync.Mutex
	hits map[string]int
	mux  *http.ServeMux
}

func newDocServer(t *testing.T) *docServer {
	t.Helper()
	d := &docServer{hits: map[string]int{}, mux: http.NewServeMux()}
	d.srv = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		d.mu.Lock()
		d.hits[r.URL.Path]++
		d.mu.Unlock()
		d.mux.ServeHTTP(w, r)
	}))
	t.Cleanup(d.srv.Close)
	ap := netip.MustParseAddrPort(d.srv.Listener.Addr().String())
	d.port = ap.Port()
	return d
}

// url is the client_id URL of path on the document server.
func (d *docServer) url(path string) string {
	return "https://" + docHost + ":" + strconv.Itoa(int(d.port)) + path
}

func (d *docServer) hitsOf(path string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.hits[path]
}

// serveJSON serves body at path as application/json.
func (d *docServer) serveJSON(path, body string) {
	d.mux.HandleFunc(path, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(body))
	})
}

// loopbackOnly refuses any dial off loopback: no test sends a packet out,
// even if the address guard under test is broken.
func loopbackOnly(address string) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil || !ap.Addr().Unmap().IsLoopback() {
		return errors.New("test safety net: refusing to connect off loopback")
	}
	return nil
}

// reach lets r fetch from d: docHost resolves to d's loopback listener,
// d's certificate is trusted, and the address guard is off for loopback
// (the test's safety net still refuses anything else).
func reach(r *Registry, d *docServer) {
	pool := x509.NewCertPool()
	pool.AddCert(d.srv.Certificate())
	r.docs.fetchOptions = []pinnedfetch.Option{
		pinnedfetch.WithTLSConfig(&tls.Config{RootCAs: pool}),
		pinnedfetch.WithResolver(func(_ context.Context, host, _ string) ([]netip.AddrPort, error) {
			if host != docHost {
				return nil, errors.New("test resolver: unknown host")
			}
			return []netip.AddrPort{netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), d.port)}, nil
		}),
		pinnedfetch.DenyPrivateAddresses(false),
		pinnedfetch.WithDialCheck(loopbackOnly),
	}
}

// testRegistry returns a registry on a file storage in a temporary
// directory, with a settable clock, recording its refusals.
func testRegistry(t *testing.T, cfg Config) (*Registry, *clock, *refusals) {
	t.Helper()
	clk := &clock{t: time.Date(2026, 12, 6, 9, 0, 0, 0, time.UTC)}
	rec := &refusals{}
	if cfg.Storage == nil {
		cfg.Storage = &certmagic.FileStorage{Path: t.TempDir()}
	}
	cfg.Now = clk.now
	cfg.OnRefusal = rec.add
	r, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return r, clk, rec
}

type refusals struct {
	mu   sync.Mutex
	list []Refusal
}

func (r *refusals) add(ev Refusal) {
	r.mu.Lock()
	r.list = append(r.list, ev)
	r.mu.Unlock()
}

func (r *refusals) all() []Refusal {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Refusal(nil), r.list...)
}

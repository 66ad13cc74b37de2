package pinnedfetch

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// withLookup is the test-only resolver hook: it maps names onto loopback
// listeners. The address guard still judges what it returns.
func withLookup(fn lookupFunc) Option {
	return func(o *options) { o.lookup = fn }
}

// loopbackOnly is the tests' safety net under the guard: no test may
// connect off loopback, even if the guard under test is broken.
func loopbackOnly(o *options) {
	o.safetyNet = func(address string) error {
		ap, err := netip.ParseAddrPort(address)
		if err != nil || !ap.Addr().Unmap().IsLoopback() {
			return errSafetyNet
		}
		return nil
	}
}

var errSafetyNet = errors.New("test safety net: refusing to connect off loopback (the address guard let this through)")

// testCert is a self-signed certificate for every name the tests use.
// httptest's own certificate does not cover localhost, which the scheme
// tests need.
var testCert = sync.OnceValues(func() (tls.Certificate, *x509.CertPool) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		panic(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{Organization: []string{"pinnedfetch test"}},
		NotBefore:             time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC),
		NotAfter:              time.Date(2100, 1, 1, 0, 0, 0, 0, time.UTC),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
		DNSNames:              []string{"localhost", "example.com", "*.example.com", "*.api.example.com"},
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		panic(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		panic(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(leaf)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, pool
})

// The probe headers every test request carries. All but X-Trace are secrets.
var probe = [][2]string{
	{"Authorization", "Bearer secret-token"},
	{"Cookie", "session=secret-cookie"},
	{"Proxy-Authorization", "Basic secret-proxy"},
	{"X-Api-Key", "secret-key"},
	{"X-Trace", "trace-1"},
}

// configured is the header list given to New in tests.
var configured = []string{"x-api-key"}

const (
	creds = "Authorization,Cookie,Proxy-Authorization,X-Api-Key,X-Trace"
	bare  = "X-Trace"
)

func setProbe(h http.Header) {
	for _, p := range probe {
		h.Set(p[0], p[1])
	}
}

// hit is one request as a server saw it.
type hit struct {
	server, method, host, path, body string
	header                           http.Header
}

// line renders a hit as "S GET example.com/final Authorization,X-Trace",
// followed by " body=…" when there was a body.
func (h hit) line() string {
	var names []string
	for _, p := range probe {
		if h.header.Get(p[0]) != "" {
			names = append(names, p[0])
		}
	}
	present := strings.Join(names, ",")
	if present == "" {
		present = "-"
	}
	s := fmt.Sprintf("%s %s %s%s %s", h.server, h.method, h.host, h.path, present)
	if h.body != "" {
		s += " body=" + h.body
	}
	return s
}

// env is a set of loopback servers sharing one route table and one log:
// S and T are TLS servers, H is plain HTTP, S6 is TLS on [::1] (nil when the
// machine has no IPv6 loopback). Names resolve (through withLookup) to
// 127.0.0.1; ports 443, 8443 and 80 stand for S, T and H, so URLs in tests
// can be written with default ports.
type env struct {
	t      *testing.T
	routes map[string]string
	pool   *x509.CertPool

	S, T, H, S6 *httptest.Server

	mu   sync.Mutex
	hits []hit
}

// newEnv starts the servers. routes maps a path to "CODE LOCATION"; LOCATION
// may use {sport}, {tport}, {hport} and {s6port}. Other paths answer 200.
func newEnv(t *testing.T, routes map[string]string) *env {
	t.Helper()
	cert, pool := testCert()
	e := &env{t: t, routes: routes, pool: pool}
	start := func(name string, useTLS bool, network, addr string) *httptest.Server {
		l, err := net.Listen(network, addr)
		if err != nil {
			return nil
		}
		s := httptest.NewUnstartedServer(e.handler(name))
		s.Listener.Close()
		s.Listener = l
		if useTLS {
			s.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
			s.StartTLS()
		} else {
			s.Start()
		}
		t.Cleanup(s.Close)
		return s
	}
	e.S = start("S", true, "tcp4", "127.0.0.1:0")
	e.T = start("T", true, "tcp4", "127.0.0.1:0")
	e.H = start("H", false, "tcp4", "127.0.0.1:0")
	e.S6 = start("S6", true, "tcp6", "[::1]:0")
	return e
}

func port(s *httptest.Server) string {
	if s == nil {
		return "0"
	}
	return strconv.Itoa(s.Listener.Addr().(*net.TCPAddr).Port)
}

func (e *env) expand(s string) string {
	return strings.NewReplacer(
		"{sport}", port(e.S), "{tport}", port(e.T), "{hport}", port(e.H), "{s6port}", port(e.S6),
	).Replace(s)
}

func (e *env) handler(name string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		e.mu.Lock()
		e.hits = append(e.hits, hit{server: name, method: r.Method, host: r.Host, path: r.URL.Path, body: string(body), header: r.Header.Clone()})
		e.mu.Unlock()
		if spec, ok := e.routes[r.URL.Path]; ok {
			code, loc, _ := strings.Cut(spec, " ")
			status, err := strconv.Atoi(code)
			if err != nil {
				panic("bad route " + spec)
			}
			if loc != "" {
				w.Header().Set("Location", e.expand(loc))
			}
			w.WriteHeader(status)
			return
		}
		io.WriteString(w, "ok "+r.URL.Path)
	})
}

// lookup resolves every name to 127.0.0.1, mapping ports 443, 8443 and 80
// onto S, T and H and keeping any other port.
func (e *env) lookup(_ context.Context, host, p string) ([]netip.AddrPort, error) {
	switch p {
	case "443":
		p = port(e.S)
	case "8443":
		p = port(e.T)
	case "80":
		p = port(e.H)
	}
	n, err := strconv.Atoi(p)
	if err != nil {
		return nil, err
	}
	return []netip.AddrPort{netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(n))}, nil
}

// client builds a pinned client that trusts the test certificate, resolves
// through lookup and, since every test server is on loopback, has the
// address guard off unless opts turn it on again.
func (e *env) client(pinned string, opts ...Option) *http.Client {
	e.t.Helper()
	base := []Option{WithTLSConfig(&tls.Config{RootCAs: e.pool}), withLookup(e.lookup), DenyPrivateAddresses(false), loopbackOnly}
	c, err := New(e.expand(pinned), configured, append(base, opts...)...)
	if err != nil {
		e.t.Fatalf("New: %v", err)
	}
	e.t.Cleanup(c.CloseIdleConnections)
	return c
}

func (e *env) lines() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []string
	for _, h := range e.hits {
		out = append(out, h.line())
	}
	return out
}

func (e *env) checkHits(want []string) {
	e.t.Helper()
	var exp []string
	for _, w := range want {
		exp = append(exp, e.expand(w))
	}
	if got := e.lines(); !slices.Equal(got, exp) {
		e.t.Errorf("servers saw:\n\t%s\nwant:\n\t%s", strings.Join(got, "\n\t"), strings.Join(exp, "\n\t"))
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, h := range e.hits {
		for _, p := range probe {
			if v := h.header.Get(p[0]); v != "" && v != p[1] {
				e.t.Errorf("%s: %s = %q, want %q or nothing", h.line(), p[0], v, p[1])
			}
		}
	}
}

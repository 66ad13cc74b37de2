package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/Tahul/caddy-zidane-mcp/pinnedfetch"
)

// ConnConfig says how to reach NATS.
type ConnConfig struct {
	// URLs of the NATS servers (nats://, tls://). Plain nats:// is allowed
	// to loopback only: anywhere else the connection must use TLS (a
	// tls:// URL or TLSCA), since what travels on it is the gateway's state.
	// A plain connection ignores the servers NATS advertises, which are
	// not loopback.
	URLs []string
	// CredsFile is a NATS user credentials file (JWT and NKey seed).
	CredsFile string
	// TLSCA, TLSCert and TLSKey are PEM files: the CA that signs the
	// servers' certificates, and this client's certificate and key.
	TLSCA, TLSCert, TLSKey string
	// Name is the connection's name, as the NATS server's monitoring shows it.
	Name string
	// Logger gets what NATS reports asynchronously (a permission the NATS
	// user lacks, a slow consumer, a reconnection); nil discards it.
	Logger *slog.Logger
}

// Check refuses a config that could not work or would not be safe, with a
// message that says what to set.
func (c ConnConfig) Check() error {
	if len(c.URLs) == 0 {
		return errors.New("no NATS URL: give one or more, such as tls://nats-1.internal:4222")
	}
	tlsOn := c.TLSCA != "" || c.TLSCert != ""
	if (c.TLSCert == "") != (c.TLSKey == "") {
		return errors.New("tls_cert and tls_key go together: give both, or neither")
	}
	for _, raw := range c.URLs {
		u, err := url.Parse(raw)
		if err != nil || u.Host == "" {
			return fmt.Errorf("NATS url %q is not a URL such as nats://127.0.0.1:4222 or tls://nats-1.internal:4222", raw)
		}
		if u.User != nil {
			return fmt.Errorf("NATS url %q carries a user or password: give credentials in a creds file (creds), not in the URL, which logs and listings show", redactURL(u))
		}
		switch u.Scheme {
		case "tls":
		case "nats":
			if !tlsOn && !pinnedfetch.IsLoopbackHost(u.Hostname()) {
				return fmt.Errorf("NATS url %q is plain nats:// to a host that is not loopback: use tls://, or give tls_ca, so the gateway's state does not cross the network in the clear", raw)
			}
		default:
			return fmt.Errorf("NATS url %q: the scheme must be nats:// (loopback) or tls://", raw)
		}
	}
	return nil
}

// plain says whether the connection goes without TLS: no TLS file and no
// tls:// URL (nats.go engages TLS for every server when one URL asks).
func (c ConnConfig) plain() bool {
	if c.TLSCA != "" || c.TLSCert != "" {
		return false
	}
	for _, raw := range c.URLs {
		if u, err := url.Parse(raw); err == nil && u.Scheme == "tls" {
			return false
		}
	}
	return true
}

func redactURL(u *url.URL) string {
	v := *u
	v.User = nil
	return v.String()
}

// Conn is a connection to NATS with JetStream.
type Conn struct {
	nc    *nats.Conn
	js    jetstream.JetStream
	files []string // the secret files the connection was made with
	log   *slog.Logger

	mu   sync.Mutex
	back chan struct{} // closed when the connection comes back after it was lost
}

// reconnected is closed the next time the connection comes back after it
// was lost. The watches start again then: the consumer behind each lived
// in the memory of the server it was made on, which may be gone (NATS
// restarted), and nats.go alone would notice only after two missed
// heartbeats (see Storage.Watch).
func (c *Conn) reconnected() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.back == nil {
		c.back = make(chan struct{})
	}
	return c.back
}

func (c *Conn) noteReconnected() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.back != nil {
		close(c.back)
	}
	c.back = make(chan struct{})
}

// SecretFiles are the files that hold what authenticates this connection
// to NATS (the credentials file, the TLS client certificate and key):
// what an agent on this host must not read.
func (c *Conn) SecretFiles() []string { return append([]string(nil), c.files...) }

// Dial connects to NATS. It keeps reconnecting for as long as the Conn is
// open; Close ends it.
func Dial(c ConnConfig) (*Conn, error) {
	if err := c.Check(); err != nil {
		return nil, err
	}
	log := c.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	conn := &Conn{log: log}
	opts := []nats.Option{
		nats.Name(c.Name),
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			subject := ""
			if sub != nil {
				subject = sub.Subject
			}
			log.Warn("NATS reports an error", "error", err, "subject", subject)
		}),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				log.Warn("NATS connection lost; reconnecting", "error", err)
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			log.Info("NATS connection back", "server", nc.ConnectedUrlRedacted())
			conn.noteReconnected()
		}),
		nats.Timeout(5 * time.Second),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(time.Second),
	}
	if c.plain() {
		// The servers a NATS server advertises (its cluster's others) would
		// be dialled with this connection's scheme: in the clear, off this
		// host. A plain connection stays with the loopback servers given.
		opts = append(opts, nats.IgnoreDiscoveredServers())
	}
	if c.CredsFile != "" {
		opts = append(opts, nats.UserCredentials(c.CredsFile))
	}
	if c.TLSCA != "" {
		opts = append(opts, nats.RootCAs(c.TLSCA))
	}
	if c.TLSCert != "" {
		opts = append(opts, nats.ClientCert(c.TLSCert, c.TLSKey))
	}
	nc, err := nats.Connect(strings.Join(c.URLs, ","), opts...)
	if err != nil {
		return nil, fmt.Errorf("connecting to NATS at %s: %w", strings.Join(c.URLs, ", "), err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("NATS JetStream: %w", err)
	}
	var files []string
	for _, f := range []string{c.CredsFile, c.TLSCert, c.TLSKey} {
		if f != "" {
			files = append(files, f)
		}
	}
	conn.nc, conn.js, conn.files = nc, js, files
	return conn, nil
}

// Close closes the connection.
func (c *Conn) Close() { c.nc.Close() }

// Storage opens the storage on c.
func (c *Conn) Storage(ctx context.Context, opts StorageOptions) (*Storage, error) {
	if opts.Logger == nil {
		opts.Logger = c.log
	}
	st, err := NewStorage(ctx, c.js, c.nc.MaxPayload(), opts)
	if err == nil {
		st.conn = c
	}
	return st, err
}

package caddymodule

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/Tahul/caddy-zidane-mcp/cluster"
)

// ClusterConfig is the cluster's settings: the NATS JetStream that every
// replica shares, this replica's id and address, and the cluster key. They
// are the settings of `storage zidane_nats` (NATSStorage), which opens
// them as Caddy's storage (TLS certificates, tokens, sessions, upstream
// credentials; see package cluster for how values, large values and locks
// are kept). The zidane app's cluster block, their former place, still
// takes them, with a bare storage zidane_nats.
type ClusterConfig struct {
	// URLs of the NATS servers: tls://host:4222, or nats:// to loopback.
	URLs []string `json:"urls,omitempty"`
	// CredsFile is a NATS user credentials file.
	CredsFile string `json:"creds_file,omitempty"`
	// TLSCA, TLSCert and TLSKey are PEM files for TLS to NATS.
	TLSCA   string `json:"tls_ca,omitempty"`
	TLSCert string `json:"tls_cert,omitempty"`
	TLSKey  string `json:"tls_key,omitempty"`
	// Bucket names the KV bucket (default "zidane").
	Bucket string `json:"bucket,omitempty"`
	// Replicas of each bucket: 3 on a three-node NATS cluster (default 1).
	Replicas int `json:"replicas,omitempty"`
	// LockTTL is how long a lock outlives its holder (default 15s).
	LockTTL caddy.Duration `json:"lock_ttl,omitempty"`
	// Key is the cluster key as a placeholder ({env.VAR}, read when the
	// app is provisioned, so the key never sits in the config); by default
	// the environment variable ZIDANE_CLUSTER_KEY. 32 bytes in base64.
	// Every value is sealed with a key derived from it.
	Key string `json:"key,omitempty"`
	// Node is this replica's id in the cluster (1 to 64 of A-Z a-z 0-9 .
	// _ -): the aggregated route seals it into the 2025-11-25 session ids
	// it gives out, so another replica knows where to forward them.
	// Default: the host name, which must then be such an id. Every replica
	// needs its own.
	Node string `json:"node,omitempty"`
	// Advertise is the URL other replicas forward this one's sessions to:
	// https://host:port (http:// to loopback only), reaching the same
	// Caddy sites. Required for an aggregated route or a sessions endpoint
	// in cluster mode; setting it registers this replica in the node
	// registry.
	Advertise string `json:"advertise,omitempty"`
}

// natsPool holds one connection and storage per cluster block, across
// config reloads: the storage keeps the locks it holds and is what the
// app's pools are keyed by.
var natsPool = caddy.NewUsagePool()

type natsState struct {
	conn *cluster.Conn
	st   *cluster.Storage
	cfg  ClusterConfig
	log  *slog.Logger

	mu    sync.Mutex
	nodes *cluster.Nodes // when advertise is set and the app started them
}

func (n *natsState) Destruct() error {
	n.mu.Lock()
	if n.nodes != nil {
		n.nodes.Close()
	}
	n.mu.Unlock()
	n.conn.Close()
	return nil
}

// startNodes registers this replica in the node registry, once per
// connection, when the block advertises an address. The app does it, as
// the server that answers there; the storage does not, since
// `caddy storage export` opens it too and must not pass for a replica.
func (n *natsState) startNodes() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cfg.Advertise == "" || n.nodes != nil {
		return nil
	}
	node, err := n.cfg.nodeID()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	n.nodes, err = n.st.StartNodes(ctx, cluster.NodeOptions{Node: node, Advertise: n.cfg.Advertise, Logger: n.log})
	return err
}

// natsStateOf finds the pooled connection that st was opened on, and its
// pool key.
func natsStateOf(st *cluster.Storage) (key string, state *natsState) {
	natsPool.Range(func(k, v any) bool {
		if n, ok := v.(*natsState); ok && n.st == st {
			key, state = k.(string), n
			return false
		}
		return true
	})
	return key, state
}

func (c *ClusterConfig) connConfig(log *slog.Logger) cluster.ConnConfig {
	return cluster.ConnConfig{
		URLs: c.URLs, CredsFile: c.CredsFile, TLSCA: c.TLSCA, TLSCert: c.TLSCert, TLSKey: c.TLSKey,
		Name: "caddy-zidane-mcp", Logger: log,
	}
}

// check refuses a block that cannot open, with what to set instead.
func (c *ClusterConfig) check() error {
	if err := c.connConfig(nil).Check(); err != nil {
		return err
	}
	if c.Replicas < 0 || c.Replicas > 5 {
		return fmt.Errorf("replicas %d: JetStream keeps 1 to 5 replicas; use 3 on a three-node cluster", c.Replicas)
	}
	if c.LockTTL != 0 && time.Duration(c.LockTTL) < time.Second {
		return fmt.Errorf("lock_ttl %v is under 1s; JetStream expires entries about once a second", time.Duration(c.LockTTL))
	}
	if c.Key != "" && !onePlaceholder.MatchString(c.Key) {
		return literalError("key", "{env.VAR} (or leave it out and set "+ClusterKeyEnv+")")
	}
	if _, err := c.clusterKey(); err != nil {
		return err
	}
	if c.Node != "" {
		if err := cluster.CheckNodeID(c.Node); err != nil {
			return fmt.Errorf("node: %w", err)
		}
	}
	if c.Advertise != "" {
		if err := cluster.CheckAdvertise(c.Advertise); err != nil {
			return err
		}
		if _, err := c.nodeID(); err != nil {
			return err
		}
	}
	return nil
}

// onePlaceholder matches a value that is one placeholder of Caddy's
// replacer and nothing else: the cluster key has no part that may be
// written out, where /config/ and autosave.json would show it.
var onePlaceholder = regexp.MustCompile(`^\{[A-Za-z][A-Za-z0-9_\-]*\.[A-Za-z0-9_.\-/]+\}$`)

// ClusterKeyEnv is the environment variable read for the cluster key when
// the cluster block's key option is not set.
const ClusterKeyEnv = "ZIDANE_CLUSTER_KEY"

// clusterKey reads and decodes the cluster key.
func (c *ClusterConfig) clusterKey() ([]byte, error) {
	raw, where := c.Key, "key "+c.Key
	if raw == "" {
		raw, where = os.Getenv(ClusterKeyEnv), ClusterKeyEnv
	} else {
		raw = caddy.NewReplacer().ReplaceKnown(raw, "")
	}
	raw = strings.TrimSpace(raw)
	if raw == "" {
		return nil, fmt.Errorf("no cluster key: %s is empty; set it in caddy's environment, on every replica alike, to 32 random bytes in base64 (`openssl rand -base64 32`)", where)
	}
	key, err := base64.StdEncoding.DecodeString(raw)
	if err != nil {
		key, err = base64.RawURLEncoding.DecodeString(strings.TrimRight(raw, "="))
	}
	if err != nil || len(key) != cluster.KeySize {
		return nil, fmt.Errorf("%s must be %d bytes in base64 (`openssl rand -base64 32`); the value given is not", where, cluster.KeySize)
	}
	return key, nil
}

// nodeID is the configured node id, or the host name.
func (c *ClusterConfig) nodeID() (string, error) {
	if c.Node != "" {
		return c.Node, nil
	}
	h, err := os.Hostname()
	if err != nil {
		return "", fmt.Errorf("node: no node id is set and the host name is unknown (%v); set node, such as node gw-1", err)
	}
	if err := cluster.CheckNodeID(h); err != nil {
		return "", fmt.Errorf("node: no node id is set and the host name %q is not one: set node, 1 to %d characters of A-Z a-z 0-9 . _ -, such as node gw-1", h, cluster.MaxNodeIDLen)
	}
	return h, nil
}

// open checks the block, then connects (or reuses the connection of the
// same block, kept across reloads) and returns the shared storage and the
// pool key, which the caller releases with natsPool.Delete. It registers
// no node (see natsState.startNodes).
func (c *ClusterConfig) open(log *slog.Logger) (*cluster.Storage, string, error) {
	if err := c.check(); err != nil {
		return nil, "", fmt.Errorf("zidane cluster: %w", err)
	}
	b, _ := json.Marshal(c)
	poolKey := string(b)
	v, _, err := natsPool.LoadOrNew(poolKey, func() (caddy.Destructor, error) {
		conn, err := cluster.Dial(c.connConfig(log))
		if err != nil {
			return nil, err
		}
		key, err := c.clusterKey()
		if err != nil {
			conn.Close()
			return nil, err
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		node := cmp.Or(c.Node, "caddy") // names this replica in the locks it holds
		if c.Advertise != "" {
			if node, err = c.nodeID(); err != nil {
				conn.Close()
				return nil, err
			}
		}
		st, err := conn.Storage(ctx, cluster.StorageOptions{Key: key,
			Bucket: c.Bucket, Replicas: c.Replicas, LockTTL: time.Duration(c.LockTTL),
			// The name is the whole block's (its settings, no secret):
			// what is kept per storage across reloads (the token store,
			// the sessions engine) follows this connection, which a
			// changed block replaces.
			Name: fmt.Sprintf("%v#%x", c.URLs, sha256.Sum256(b)), Owner: node,
		})
		if err != nil {
			conn.Close()
			return nil, err
		}
		return &natsState{conn: conn, st: st, cfg: *c, log: log}, nil
	})
	if err != nil {
		return nil, "", fmt.Errorf("zidane cluster: %w", err)
	}
	return v.(*natsState).st, poolKey, nil
}

// unmarshalCaddyfile reads the block of
//
//	cluster {
//		url       <url>...
//		creds     <file>
//		tls_ca    <file>
//		tls_cert  <file>
//		tls_key   <file>
//		bucket    <name>
//		replicas  <n>
//		lock_ttl  <duration>
//		key       {env.VAR}
//		node      <id>
//		advertise <url>
//	}
//
// with d on the cluster token, nested at depth.
func (c *ClusterConfig) unmarshalCaddyfile(d *caddyfile.Dispenser, depth int) error {
	if d.NextArg() {
		return d.Err("cluster takes no argument, only a block: cluster { url tls://nats-1:4222 … }")
	}
	return c.options(d, depth)
}

// options reads the options of a block at depth, from the next one on.
func (c *ClusterConfig) options(d *caddyfile.Dispenser, depth int) error {
	for d.NextBlock(depth) {
		if err := c.option(d); err != nil {
			return err
		}
	}
	return c.requireURL(d)
}

// requireURL refuses a block that names no NATS server.
func (c *ClusterConfig) requireURL(d *caddyfile.Dispenser) error {
	if len(c.URLs) == 0 {
		return d.Err("zidane cluster: no url: give the NATS servers, such as url tls://nats-1.internal:4222 tls://nats-2.internal:4222")
	}
	return nil
}

// option reads the option d is on.
func (c *ClusterConfig) option(d *caddyfile.Dispenser) error {
	one := func(dst *string) error {
		if !d.NextArg() {
			return d.ArgErr()
		}
		*dst = d.Val()
		if d.NextArg() {
			return d.ArgErr()
		}
		return nil
	}
	var err error
	switch d.Val() {
	case "url":
		c.URLs = append(c.URLs, d.RemainingArgs()...)
		if len(c.URLs) == 0 {
			return d.Err("url needs one or more NATS URLs, such as tls://nats-1.internal:4222")
		}
	case "creds":
		err = one(&c.CredsFile)
	case "tls_ca":
		err = one(&c.TLSCA)
	case "tls_cert":
		err = one(&c.TLSCert)
	case "tls_key":
		err = one(&c.TLSKey)
	case "bucket":
		err = one(&c.Bucket)
	case "replicas":
		var v string
		if err = one(&v); err == nil {
			n, perr := strconv.Atoi(v)
			if perr != nil || n < 1 || n > 5 {
				return d.Errf("replicas %q: give 1 to 5 (3 on a three-node NATS cluster)", v)
			}
			c.Replicas = n
		}
	case "key":
		if err = one(&c.Key); err == nil && !onePlaceholder.MatchString(c.Key) {
			return d.Err(literalError("key", "{env.VAR} (or leave it out and set "+ClusterKeyEnv+")").Error())
		}
	case "node":
		if err = one(&c.Node); err == nil {
			if cerr := cluster.CheckNodeID(c.Node); cerr != nil {
				return d.Errf("node: %v", cerr)
			}
		}
	case "advertise":
		if err = one(&c.Advertise); err == nil {
			if cerr := cluster.CheckAdvertise(c.Advertise); cerr != nil {
				return d.Err(cerr.Error())
			}
		}
	case "lock_ttl":
		var v string
		if err = one(&v); err == nil {
			dur, perr := caddy.ParseDuration(v)
			if perr != nil || dur < time.Second {
				return d.Errf("lock_ttl %q: give a duration of 1s or more, such as 15s", v)
			}
			c.LockTTL = caddy.Duration(dur)
		}
	default:
		return d.Errf("zidane cluster: unknown option %q; the options are url, creds, tls_ca, tls_cert, tls_key, bucket, replicas, lock_ttl, key, node, advertise", d.Val())
	}
	return err
}

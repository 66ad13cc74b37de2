package caddymodule

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/caddyserver/certmagic"
	"go.uber.org/zap/exp/zapslog"

	"github.com/Tahul/caddy-zidane-mcp/cluster"
)

func init() {
	caddy.RegisterModule(NATSStorage{})
}

// NATSStorage is `storage zidane_nats`: Caddy's storage (TLS certificates,
// and everything the zidane app keeps: tokens, sessions, upstream
// credentials) on NATS JetStream, shared by every replica that names the
// same servers and bucket. See package cluster for how values, large
// values and locks are kept.
type NATSStorage struct {
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
	// storage is provisioned, so the key never sits in the config); by
	// default the environment variable ZIDANE_CLUSTER_KEY. 32 bytes in
	// base64. Every value is sealed with a key derived from it.
	Key string `json:"key,omitempty"`
	// Node is this replica's id in the cluster (1 to 64 of A-Z a-z 0-9 .
	// _ -): the aggregated route seals it into the 2025-11-25 session ids
	// it gives out, so another replica knows where to forward them.
	// Default: the host name, which must then be such an id. Every replica
	// needs its own.
	Node string `json:"node,omitempty"`
	// Advertise is the URL other replicas forward this one's sessions to:
	// https://host:port (http:// to loopback only), reaching the same
	// Caddy sites. Required for an aggregated route on this storage;
	// setting it registers this replica in the node registry.
	Advertise string `json:"advertise,omitempty"`

	key string // natsPool key
	log *slog.Logger
}

// CaddyModule returns the Caddy module information.
func (NATSStorage) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "caddy.storage.zidane_nats",
		New: func() caddy.Module { return new(NATSStorage) },
	}
}

// natsPool holds one connection and storage per configuration, across
// config reloads: the storage keeps the locks it holds and is what the
// app's pools are keyed by.
var natsPool = caddy.NewUsagePool()

type natsState struct {
	conn  *cluster.Conn
	st    *cluster.Storage
	nodes *cluster.Nodes // when advertise is set
}

func (n *natsState) Destruct() error {
	if n.nodes != nil {
		n.nodes.Close()
	}
	n.conn.Close()
	return nil
}

func (s *NATSStorage) connConfig() cluster.ConnConfig {
	return cluster.ConnConfig{
		URLs: s.URLs, CredsFile: s.CredsFile, TLSCA: s.TLSCA, TLSCert: s.TLSCert, TLSKey: s.TLSKey,
		Name: "caddy-zidane-mcp", Logger: s.log,
	}
}

// Provision checks the configuration.
func (s *NATSStorage) Provision(ctx caddy.Context) error {
	if ctx.Context != nil {
		s.log = slog.New(zapslog.NewHandler(ctx.Logger().Core()))
	}
	if err := s.connConfig().Check(); err != nil {
		return fmt.Errorf("storage zidane_nats: %w", err)
	}
	if s.Replicas < 0 || s.Replicas > 5 {
		return fmt.Errorf("storage zidane_nats: replicas %d: JetStream keeps 1 to 5 replicas; use 3 on a three-node cluster", s.Replicas)
	}
	if s.LockTTL != 0 && time.Duration(s.LockTTL) < time.Second {
		return fmt.Errorf("storage zidane_nats: lock_ttl %v is under 1s; JetStream expires entries about once a second", time.Duration(s.LockTTL))
	}
	if s.Key != "" && !onePlaceholder.MatchString(s.Key) {
		return fmt.Errorf("storage zidane_nats: %w", literalError("key", "{env.VAR} (or leave it out and set "+ClusterKeyEnv+")"))
	}
	if _, err := s.clusterKey(); err != nil {
		return fmt.Errorf("storage zidane_nats: %w", err)
	}
	if s.Node != "" {
		if err := cluster.CheckNodeID(s.Node); err != nil {
			return fmt.Errorf("storage zidane_nats: node: %w", err)
		}
	}
	if s.Advertise != "" {
		if err := checkAdvertise(s.Advertise); err != nil {
			return fmt.Errorf("storage zidane_nats: %w", err)
		}
		if _, err := s.nodeID(); err != nil {
			return fmt.Errorf("storage zidane_nats: %w", err)
		}
	}
	b, _ := json.Marshal(s)
	s.key = string(b)
	return nil
}

// onePlaceholder matches a value that is one placeholder of Caddy's
// replacer and nothing else: the cluster key has no part that may be
// written out, where /config/ and autosave.json would show it.
var onePlaceholder = regexp.MustCompile(`^\{[A-Za-z][A-Za-z0-9_\-]*\.[A-Za-z0-9_.\-]+\}$`)

// ClusterKeyEnv is the environment variable read for the cluster key when
// the storage's key option is not set.
const ClusterKeyEnv = "ZIDANE_CLUSTER_KEY"

// clusterKey reads and decodes the cluster key.
func (s *NATSStorage) clusterKey() ([]byte, error) {
	raw, where := s.Key, "key "+s.Key
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
func (s *NATSStorage) nodeID() (string, error) {
	if s.Node != "" {
		return s.Node, nil
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

// CertMagicStorage connects (or reuses this configuration's connection)
// and returns the storage.
func (s *NATSStorage) CertMagicStorage() (certmagic.Storage, error) {
	if s.key == "" {
		if err := s.Provision(caddy.Context{}); err != nil {
			return nil, err
		}
	}
	v, _, err := natsPool.LoadOrNew(s.key, func() (caddy.Destructor, error) {
		conn, err := cluster.Dial(s.connConfig())
		if err != nil {
			return nil, fmt.Errorf("storage zidane_nats: %w", err)
		}
		key, err := s.clusterKey()
		if err != nil {
			conn.Close()
			return nil, fmt.Errorf("storage zidane_nats: %w", err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		node := cmp.Or(s.Node, "caddy") // names this replica in the locks it holds
		if s.Advertise != "" {
			if node, err = s.nodeID(); err != nil {
				conn.Close()
				return nil, fmt.Errorf("storage zidane_nats: %w", err)
			}
		}
		st, err := conn.Storage(ctx, cluster.StorageOptions{Key: key,
			Bucket: s.Bucket, Replicas: s.Replicas, LockTTL: time.Duration(s.LockTTL),
			// The name is the whole block's (its settings, no secret):
			// what is kept per storage across reloads (the token store,
			// the sessions engine) follows this connection, which a
			// changed block replaces.
			Name: fmt.Sprintf("%v#%x", s.URLs, sha256.Sum256([]byte(s.key))), Owner: node,
		})
		if err != nil {
			conn.Close()
			return nil, fmt.Errorf("storage zidane_nats: %w", err)
		}
		state := &natsState{conn: conn, st: st}
		if s.Advertise != "" {
			if state.nodes, err = st.StartNodes(ctx, cluster.NodeOptions{Node: node, Advertise: s.Advertise, Logger: s.log}); err != nil {
				conn.Close()
				return nil, fmt.Errorf("storage zidane_nats: %w", err)
			}
		}
		return state, nil
	})
	if err != nil {
		return nil, err
	}
	return v.(*natsState).st, nil
}

// Cleanup releases this configuration's hold on the connection.
func (s *NATSStorage) Cleanup() error {
	if s.key == "" {
		return nil
	}
	_, err := natsPool.Delete(s.key)
	return err
}

// UnmarshalCaddyfile reads
//
//	storage zidane_nats {
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
func (s *NATSStorage) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // the module name
	if d.NextArg() {
		return d.ArgErr()
	}
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
	for d.NextBlock(0) {
		var err error
		switch d.Val() {
		case "url":
			s.URLs = append(s.URLs, d.RemainingArgs()...)
			if len(s.URLs) == 0 {
				return d.Err("url needs one or more NATS URLs, such as tls://nats-1.internal:4222")
			}
		case "creds":
			err = one(&s.CredsFile)
		case "tls_ca":
			err = one(&s.TLSCA)
		case "tls_cert":
			err = one(&s.TLSCert)
		case "tls_key":
			err = one(&s.TLSKey)
		case "bucket":
			err = one(&s.Bucket)
		case "replicas":
			var v string
			if err = one(&v); err == nil {
				n, perr := strconv.Atoi(v)
				if perr != nil || n < 1 || n > 5 {
					return d.Errf("replicas %q: give 1 to 5 (3 on a three-node NATS cluster)", v)
				}
				s.Replicas = n
			}
		case "key":
			if err = one(&s.Key); err == nil && !onePlaceholder.MatchString(s.Key) {
				return d.Err(literalError("key", "{env.VAR} (or leave it out and set "+ClusterKeyEnv+")").Error())
			}
		case "node":
			if err = one(&s.Node); err == nil {
				if cerr := cluster.CheckNodeID(s.Node); cerr != nil {
					return d.Errf("node: %v", cerr)
				}
			}
		case "advertise":
			if err = one(&s.Advertise); err == nil {
				if cerr := checkAdvertise(s.Advertise); cerr != nil {
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
				s.LockTTL = caddy.Duration(dur)
			}
		default:
			return d.Errf("storage zidane_nats: unknown option %q; the options are url, creds, tls_ca, tls_cert, tls_key, bucket, replicas, lock_ttl, key, node, advertise", d.Val())
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// errClusterStorageOffline is what the CLI says instead of writing a
// storage that is not the one the servers use.
var errClusterStorageOffline = errors.New("this configuration keeps its state in NATS (storage zidane_nats), which the CLI does not write behind the servers' backs; run the command while a server is up, against its admin API (--address)")

// Interface guards.
var (
	_ caddy.StorageConverter = (*NATSStorage)(nil)
	_ caddy.Provisioner      = (*NATSStorage)(nil)
	_ caddy.CleanerUpper     = (*NATSStorage)(nil)
	_ caddyfile.Unmarshaler  = (*NATSStorage)(nil)
)

// clusterMarkerKey, in the local file storage, says that a server on this
// host keeps its state in NATS: the CLI's offline mode, which writes the
// local file storage, refuses to run while it is there. The app writes it
// when it starts on zidane_nats storage and removes it when it starts on
// the file storage.
const clusterMarkerKey = "zidane/state-in-nats"

// refuseClusterOffline says why the CLI must not write the local storage:
// the config it was given (without --config, a Caddyfile in the working
// directory, which caddy would run), or the last server that ran on this
// host, keeps its state in NATS.
func refuseClusterOffline(configFile, adapter string) error {
	raw, _, _, err := caddycmd.LoadConfig(configFile, adapter)
	if err == nil && len(raw) > 0 {
		var cfg struct {
			Storage struct {
				Module string `json:"module"`
			} `json:"storage"`
		}
		if json.Unmarshal(raw, &cfg) == nil && cfg.Storage.Module == "zidane_nats" {
			return errClusterStorageOffline
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if caddy.DefaultStorage.Exists(ctx, clusterMarkerKey) {
		return fmt.Errorf("%w (a server on this host last ran on NATS storage: %s says so; delete it if this host no longer does)", errClusterStorageOffline, caddy.DefaultStorage.Filename(clusterMarkerKey))
	}
	return nil
}

// markStorage writes or removes the cluster marker in the local file
// storage, after what st is.
func markStorage(st certmagic.Storage) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, ok := st.(*cluster.Storage); ok {
		return caddy.DefaultStorage.Store(ctx, clusterMarkerKey, []byte("this host's caddy keeps its zidane state in NATS (storage zidane_nats)\n"))
	}
	if fs, ok := st.(*certmagic.FileStorage); ok && fs.Path == caddy.DefaultStorage.Path && caddy.DefaultStorage.Exists(ctx, clusterMarkerKey) {
		return caddy.DefaultStorage.Delete(ctx, clusterMarkerKey)
	}
	return nil
}

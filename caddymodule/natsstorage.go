package caddymodule

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
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
// credentials) on NATS JetStream, shared by every replica of a cluster. It
// carries the cluster's settings (ClusterConfig) and opens them on its own,
// as Caddy's lifecycle has it (storage first, then the apps, which find
// it in their context), so that `caddy storage export` and `import`, which
// load the storage without any app, open it too. The zidane app takes the
// cluster from it: its settings are given once, here.
//
// A config written before the settings moved here, with a bare
// `storage zidane_nats` and the settings in the zidane app's cluster
// block, still runs: the storage then provisions the app to open that
// block (the reverse of Caddy's order, so the storage commands cannot open
// it). docs/upgrade.md says how to move the block.
type NATSStorage struct {
	ClusterConfig

	st      *cluster.Storage
	poolKey string // this storage's hold on natsPool, when it opened the cluster itself
}

// CaddyModule returns the Caddy module information.
func (NATSStorage) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "caddy.storage.zidane_nats",
		New: func() caddy.Module { return new(NATSStorage) },
	}
}

// errNoClusterBlock is the refusal of a bare storage zidane_nats without
// the zidane app's cluster block.
var errNoClusterBlock = errors.New("storage zidane_nats has no settings: give the cluster's in its block, storage zidane_nats { url tls://nats-1:4222 … } (see docs/upgrade.md), or remove storage zidane_nats to keep Caddy's file storage")

// Provision opens the cluster's storage from the settings, or, for a bare
// storage zidane_nats, provisions the zidane app, whose cluster block
// opens it: Caddy provisions its storage before its apps, and the app, so
// provisioned, finds no storage yet in ctx: that is how it knows it is the
// cluster's (see App.provisionStorage).
func (s *NATSStorage) Provision(ctx caddy.Context) error {
	if !s.bare() {
		st, key, err := s.open(slog.New(zapslog.NewHandler(ctx.Logger().Core())))
		if err != nil {
			return fmt.Errorf("storage zidane_nats: %w", err)
		}
		s.st, s.poolKey = st, key
		return nil
	}
	v, err := ctx.AppIfConfigured("zidane")
	if errors.Is(err, caddy.ErrNotConfigured) {
		return errNoClusterBlock
	}
	if err != nil {
		return err
	}
	app := v.(*App)
	if app.cluster == nil {
		return errNoClusterBlock
	}
	s.st = app.cluster
	return nil
}

// bare reports whether the storage was given no settings.
func (s *NATSStorage) bare() bool {
	b, _ := json.Marshal(s.ClusterConfig)
	return string(b) == "{}"
}

// Cleanup releases the storage's hold on the connection; the app holds its
// own while it runs.
func (s *NATSStorage) Cleanup() error {
	if s.poolKey != "" {
		_, _ = natsPool.Delete(s.poolKey)
	}
	return nil
}

// CertMagicStorage returns the cluster's storage.
func (s *NATSStorage) CertMagicStorage() (certmagic.Storage, error) {
	if s.st == nil {
		return nil, errNoClusterBlock
	}
	return s.st, nil
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
//
// or a bare `storage zidane_nats`, whose settings are the zidane global
// option's cluster block (the form before they moved here).
func (s *NATSStorage) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // the module name
	if d.NextArg() {
		return d.Errf("storage zidane_nats takes no argument (found %q), only a block: storage zidane_nats { url tls://nats-1:4222 … }", d.Val())
	}
	nesting := d.Nesting()
	if !d.NextBlock(nesting) {
		return nil
	}
	if err := s.option(d); err != nil {
		return err
	}
	return s.options(d, nesting)
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
			Apps struct {
				Zidane struct {
					Cluster json.RawMessage `json:"cluster"`
				} `json:"zidane"`
			} `json:"apps"`
		}
		if json.Unmarshal(raw, &cfg) == nil && (cfg.Storage.Module == "zidane_nats" || len(cfg.Apps.Zidane.Cluster) > 0) {
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

package caddymodule

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/caddyserver/certmagic"

	"github.com/Tahul/caddy-zidane-mcp/cluster"
)

func init() {
	caddy.RegisterModule(NATSStorage{})
}

// NATSStorage is `storage zidane_nats`: Caddy's storage (TLS certificates,
// and everything the zidane app keeps: tokens, sessions, upstream
// credentials) on NATS JetStream, shared by every replica of a cluster. It
// has no settings of its own: it is the storage that the zidane app's
// cluster block opens (ClusterConfig), so that the cluster is configured in
// one place and Caddy's storage is the cluster's. Caddy provisions its
// storage before its apps, so this module provisions the zidane app first.
type NATSStorage struct {
	st *cluster.Storage
}

// CaddyModule returns the Caddy module information.
func (NATSStorage) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "caddy.storage.zidane_nats",
		New: func() caddy.Module { return new(NATSStorage) },
	}
}

// errNoClusterBlock is the refusal of storage zidane_nats without the
// zidane app's cluster block.
var errNoClusterBlock = errors.New("storage zidane_nats is the storage that the zidane global option's cluster block opens, and none was provisioned: add zidane { cluster { url tls://nats-1:4222 … } } (see the README, \"Shared storage on NATS\"), or remove storage zidane_nats to keep Caddy's file storage; `caddy storage export` and `import` load no app, so they cannot open it")

// Provision provisions the zidane app, whose cluster block opens the
// storage. Caddy provisions its storage before its apps, and the app, so
// provisioned, finds no storage yet in ctx: that is how it knows it is the
// cluster's (see App.provisionStorage).
func (s *NATSStorage) Provision(ctx caddy.Context) error {
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

// CertMagicStorage returns the cluster's storage.
func (s *NATSStorage) CertMagicStorage() (certmagic.Storage, error) {
	if s.st == nil {
		return nil, errNoClusterBlock
	}
	return s.st, nil
}

// UnmarshalJSON refuses settings, which belong to the zidane app's
// cluster block, saying so: caddy's strict decoding would only name an
// unknown field.
func (s *NATSStorage) UnmarshalJSON(b []byte) error {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(b, &fields); err != nil {
		return fmt.Errorf("storage zidane_nats: %w", err)
	}
	delete(fields, "module")
	if len(fields) > 0 {
		return fmt.Errorf("storage zidane_nats takes no settings (found %s): the cluster's settings go in the zidane app's cluster object, apps.zidane.cluster (in a Caddyfile, zidane { cluster { … } }); see the README, \"Shared storage on NATS\"", strings.Join(slices.Sorted(maps.Keys(fields)), ", "))
	}
	return nil
}

// UnmarshalCaddyfile reads `storage zidane_nats`, which takes nothing: the
// cluster's settings are the zidane global option's cluster block.
func (s *NATSStorage) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // the module name
	if d.NextArg() {
		return d.ArgErr()
	}
	if d.NextBlock(0) {
		return d.Errf("storage zidane_nats takes no block (found %q): the cluster's settings go in the zidane global option, zidane { cluster { url … key … node … advertise … } }; see the README, \"Shared storage on NATS\"", d.Val())
	}
	return nil
}

// errClusterStorageOffline is what the CLI says instead of writing a
// storage that is not the one the servers use.
var errClusterStorageOffline = errors.New("this configuration keeps its state in NATS (the zidane cluster block, storage zidane_nats), which the CLI does not write behind the servers' backs; run the command while a server is up, against its admin API (--address)")

// Interface guards.
var (
	_ caddy.StorageConverter = (*NATSStorage)(nil)
	_ caddy.Provisioner      = (*NATSStorage)(nil)
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

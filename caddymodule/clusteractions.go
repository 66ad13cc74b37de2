package caddymodule

import (
	"context"
	"fmt"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/Tahul/caddy-zidane-mcp/cluster"
	"github.com/Tahul/caddy-zidane-mcp/storage"
)

// actionsPool holds, per NATS storage, the subscription through which the
// operators' upstream actions (restart, retire) taken on one replica reach
// every other.
var actionsPool = caddy.NewUsagePool()

type actionsEntry struct{ actions *cluster.Actions }

func (e *actionsEntry) Destruct() error {
	e.actions.Close()
	return nil
}

func actionsKey(st storage.Storage) string { return "actions|" + storageKey(st) }

// provisionActions, on NATS storage, carries out here the actions other
// replicas announce. The caller releases the pool entry (App.Cleanup).
func provisionActions(st storage.Storage) (key string, err error) {
	cs, ok := st.(*cluster.Storage)
	if !ok {
		return "", nil
	}
	key = actionsKey(st)
	_, _, err = actionsPool.LoadOrNew(key, func() (caddy.Destructor, error) {
		a, err := cs.Actions(func(act cluster.Action) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			n, err := liveAggregates.restart(ctx, act.Upstream, act.Kind == "retire")
			log := auditLogger().With(zap.String("event", "upstream_"+act.Kind), zap.String("upstream", act.Upstream), zap.String("from", "another replica"), zap.Int("routes", n))
			if err != nil {
				log.Warn("upstream action from another replica failed", zap.Error(err))
				return
			}
			log.Info("upstream action from another replica")
		})
		if err != nil {
			return nil, fmt.Errorf("zidane: %w", err)
		}
		return &actionsEntry{actions: a}, nil
	})
	if err != nil {
		return "", err
	}
	return key, nil
}

// announceAction tells the other replicas on st to carry out act too: false
// when st is not shared.
func announceAction(st storage.Storage, act cluster.Action) (bool, error) {
	if _, ok := st.(*cluster.Storage); !ok {
		return false, nil
	}
	var e *actionsEntry
	actionsPool.Range(func(k, v any) bool {
		if k == actionsKey(st) {
			e = v.(*actionsEntry)
			return false
		}
		return true
	})
	if e == nil {
		return false, fmt.Errorf("no running zidane app on this storage carries actions to the other replicas")
	}
	return true, e.actions.Announce(act)
}

package caddymodule

import (
	"context"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/Tahul/caddy-zidane-mcp/approvals"
	"github.com/Tahul/caddy-zidane-mcp/storage"
)

// approvalPrunePool holds, per storage, the timer that deletes the
// approvals and the rounds past their lifetime (approvals.Store.Prune),
// with the call arguments and backend states they kept: holding a call
// and issuing a round prune too, but on a quiet gateway nothing else would
// delete them. One timer per storage, whatever configs run on it; on NATS
// storage every replica prunes, each record under its lock.
var approvalPrunePool = caddy.NewUsagePool()

// approvalPruneEvery is how often the timer prunes.
const approvalPruneEvery = time.Minute

type approvalPruner struct {
	cancel context.CancelFunc
	done   chan struct{}
}

func (p *approvalPruner) Destruct() error {
	p.cancel()
	<-p.done
	return nil
}

// provisionApprovalPruner starts, unless one runs on st already, the
// timer that prunes st's approvals every every. The caller releases the
// pool entry (App.Cleanup).
func provisionApprovalPruner(st storage.Storage, every time.Duration) (key string, err error) {
	key = "approvals-prune|" + storageKey(st)
	_, _, err = approvalPrunePool.LoadOrNew(key, func() (caddy.Destructor, error) {
		s, err := approvals.New(approvals.Options{Store: st})
		if err != nil {
			return nil, err
		}
		ctx, cancel := context.WithCancel(context.Background())
		p := &approvalPruner{cancel: cancel, done: make(chan struct{})}
		go func() {
			defer close(p.done)
			t := time.NewTicker(every)
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
					pctx, done := context.WithTimeout(ctx, every)
					s.Prune(pctx)
					done()
				}
			}
		}()
		return p, nil
	})
	if err != nil {
		return "", err
	}
	return key, nil
}

package cluster

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
)

// UsageLimiter is a rate limiter whose usage replicas share: what it let
// through, taken in batches, and a debit for what others let through
// (policy.Limiter).
type UsageLimiter interface {
	RecordUsage()
	TakeUsage() map[string]int
	Debit(key string, n int, now time.Time)
}

// Bounds on usage messages. Senders hold the cluster key, so these guard
// against a replica's bug more than against an attacker.
const (
	maxUsageKeys   = 4096    // keys per message; more go in the next
	maxUsagePerKey = 1 << 20 // events per key per message
)

// LimitShare shares one limiter's usage with the other replicas over core
// NATS (publish and subscribe: no JetStream write, and nothing on the
// request path). Every period it publishes what the limiter let through,
// and debits what the others did. While NATS is away each replica limits
// on its own, and says so once in the log.
type LimitShare struct {
	bus  *bus
	lim  UsageLimiter
	log  *slog.Logger
	sub  *nats.Subscription
	stop chan struct{}
	done chan struct{}
}

// ShareLimits starts sharing lim's usage with every replica that shares a
// limiter of the same name, every period.
func (c *Conn) ShareLimits(clusterKey []byte, name string, lim UsageLimiter, period time.Duration, log *slog.Logger) (*LimitShare, error) {
	id := sha256.Sum256([]byte(name))
	b, err := newBus(c.nc, clusterKey, "rate-limit usage v1", "zidane.limits."+hex.EncodeToString(id[:12]))
	if err != nil {
		return nil, err
	}
	s := &LimitShare{bus: b, lim: lim, log: log, stop: make(chan struct{}), done: make(chan struct{})}
	lim.RecordUsage()
	if s.sub, err = b.subscribe(s.receive); err != nil {
		return nil, fmt.Errorf("rate-limit sharing: %w", err)
	}
	go s.run(period)
	return s, nil
}

// ShareLimits shares lim's usage with the replicas on this storage's NATS
// connection, sealed with its cluster key (see [Conn.ShareLimits]).
func (s *Storage) ShareLimits(name string, lim UsageLimiter, period time.Duration, log *slog.Logger) (*LimitShare, error) {
	if s.conn == nil {
		return nil, fmt.Errorf("rate-limit sharing: this storage was not opened on a cluster connection")
	}
	return s.conn.ShareLimits(s.opts.Key, name, lim, period, log)
}

// Close stops sharing.
func (s *LimitShare) Close() {
	close(s.stop)
	<-s.done
	_ = s.sub.Unsubscribe()
}

func (s *LimitShare) run(period time.Duration) {
	defer close(s.done)
	t := time.NewTicker(period)
	defer t.Stop()
	away := false
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
		usage := s.lim.TakeUsage()
		if !s.bus.nc.IsConnected() {
			if !away {
				s.log.Warn("NATS is away: rate limits now hold per replica, each with the whole budget, until it is back")
				away = true
			}
			continue // what this replica let through meanwhile is not owed to the others
		}
		if away {
			s.log.Info("NATS is back: rate limits are shared across replicas again")
			away = false
		}
		s.publish(usage)
	}
}

func (s *LimitShare) publish(usage map[string]int) {
	for len(usage) > 0 {
		batch := usage
		if len(usage) > maxUsageKeys {
			batch = make(map[string]int, maxUsageKeys)
			for k, n := range usage {
				if len(batch) == maxUsageKeys {
					break
				}
				batch[k] = n
				delete(usage, k)
			}
		} else {
			usage = nil
		}
		if err := s.bus.publish(batch); err != nil {
			s.log.Warn("could not share rate-limit usage with the other replicas", "error", err)
			return
		}
	}
}

// receive debits another replica's usage.
func (s *LimitShare) receive(body json.RawMessage) {
	var usage map[string]int
	if json.Unmarshal(body, &usage) != nil || len(usage) > maxUsageKeys {
		return
	}
	now := time.Now()
	for k, n := range usage {
		s.lim.Debit(k, min(n, maxUsagePerKey), now)
	}
}

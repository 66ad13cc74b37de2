package cluster

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"
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
	maxUsageKeys    = 4096             // keys per message; more go in the next
	maxUsagePerKey  = 1 << 20          // events per key per message
	usageFreshness  = 10 * time.Second // older (or newer) messages are dropped
	maxUsageSenders = 256              // replicas remembered for replay checks
	macHeader       = "Zidane-Mac"
)

// usageMsg is what a replica publishes: the events each key let through
// since its last message.
type usageMsg struct {
	Node  string         `json:"n"`
	Seq   uint64         `json:"s"`
	At    int64          `json:"t"` // Unix milliseconds
	Usage map[string]int `json:"u"`
}

// LimitShare shares one limiter's usage with the other replicas over core
// NATS (publish and subscribe: no JetStream write, and nothing on the
// request path). Every period it publishes what the limiter let through,
// and debits what the others did. While NATS is away each replica limits
// on its own, and says so once in the log.
type LimitShare struct {
	nc      *nats.Conn
	mac     []byte
	subject string
	node    string
	lim     UsageLimiter
	log     *slog.Logger
	sub     *nats.Subscription
	stop    chan struct{}
	done    chan struct{}

	mu   sync.Mutex
	seq  uint64
	last map[string]senderState // node -> its last accepted message
}

type senderState struct {
	seq  uint64
	seen time.Time
}

// ShareLimits starts sharing lim's usage with every replica that shares a
// limiter of the same name, every period.
func (c *Conn) ShareLimits(clusterKey []byte, name string, lim UsageLimiter, period time.Duration, log *slog.Logger) (*LimitShare, error) {
	mac, err := Derive(clusterKey, "rate-limit usage v1")
	if err != nil {
		return nil, err
	}
	id := sha256.Sum256([]byte(name))
	s := &LimitShare{
		nc: c.nc, mac: mac, subject: "zidane.limits." + hex.EncodeToString(id[:12]),
		node: randomHex(8), lim: lim, log: log,
		stop: make(chan struct{}), done: make(chan struct{}), last: map[string]senderState{},
	}
	lim.RecordUsage()
	if s.sub, err = c.nc.Subscribe(s.subject, s.receive); err != nil {
		return nil, fmt.Errorf("rate-limit sharing: subscribing to %s: %w", s.subject, err)
	}
	go s.run(period)
	return s, nil
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
		if !s.nc.IsConnected() {
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
		s.mu.Lock()
		s.seq++
		m := usageMsg{Node: s.node, Seq: s.seq, At: time.Now().UnixMilli(), Usage: batch}
		s.mu.Unlock()
		data, _ := json.Marshal(m)
		msg := &nats.Msg{Subject: s.subject, Data: data, Header: nats.Header{}}
		msg.Header.Set(macHeader, s.sign(data))
		if err := s.nc.PublishMsg(msg); err != nil {
			s.log.Warn("could not share rate-limit usage with the other replicas", "error", err)
			return
		}
	}
}

func (s *LimitShare) sign(data []byte) string {
	h := hmac.New(sha256.New, s.mac)
	h.Write([]byte(s.subject))
	h.Write([]byte{0})
	h.Write(data)
	return base64.RawStdEncoding.EncodeToString(h.Sum(nil))
}

// receive debits another replica's usage, if the message is authentic
// (MACed with the cluster key), fresh, and not one seen before.
func (s *LimitShare) receive(msg *nats.Msg) {
	got, err := base64.RawStdEncoding.DecodeString(msg.Header.Get(macHeader))
	if err != nil || !hmac.Equal(got, mustDecode(s.sign(msg.Data))) {
		return // not from a replica of this cluster
	}
	var m usageMsg
	if json.Unmarshal(msg.Data, &m) != nil || m.Node == "" || m.Node == s.node || len(m.Usage) > maxUsageKeys {
		return
	}
	now := time.Now()
	at := time.UnixMilli(m.At)
	if at.Before(now.Add(-usageFreshness)) || at.After(now.Add(usageFreshness)) {
		return
	}
	s.mu.Lock()
	prev, known := s.last[m.Node]
	if known && m.Seq <= prev.seq {
		s.mu.Unlock()
		return // a replay
	}
	if !known && len(s.last) >= maxUsageSenders {
		for n, st := range s.last {
			if now.Sub(st.seen) > usageFreshness {
				delete(s.last, n)
			}
		}
		if len(s.last) >= maxUsageSenders {
			s.mu.Unlock()
			return
		}
	}
	s.last[m.Node] = senderState{seq: m.Seq, seen: now}
	s.mu.Unlock()
	for k, n := range m.Usage {
		s.lim.Debit(k, min(n, maxUsagePerKey), now)
	}
}

func mustDecode(s string) []byte {
	b, _ := base64.RawStdEncoding.DecodeString(s)
	return b
}

// ShareLimits shares lim's usage with the replicas on this storage's NATS
// connection, MACed with its cluster key (see [Conn.ShareLimits]).
func (s *Storage) ShareLimits(name string, lim UsageLimiter, period time.Duration, log *slog.Logger) (*LimitShare, error) {
	if s.conn == nil {
		return nil, fmt.Errorf("rate-limit sharing: this storage was not opened on a cluster connection")
	}
	return s.conn.ShareLimits(s.opts.Key, name, lim, period, log)
}

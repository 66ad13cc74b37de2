package cluster

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// replayClaimTimeout bounds one claim, on the request path: a NATS that
// does not answer in time refuses the proof (503), never lets it in.
const replayClaimTimeout = 2 * time.Second

// replayMaxBytes bounds the replay bucket. A full bucket refuses new
// claims (JetStream KV discards new messages, never old ones), so that
// a flood of proofs makes the check unavailable, never forgetful. An entry
// is under 200 bytes on disk: 64 MiB hold some 300,000 proofs, 2,500 a
// second over the two windows each is kept.
const replayMaxBytes = 64 << 20

// Replay is the cluster's replay check of DPoP proofs (a dpop.Replay):
// each proof is claimed in a KV bucket ("<Bucket>_dpop") shared by every
// replica, by an atomic create, so a proof taken on one replica is a
// replay on every other.
//
// The bucket's max age does the forgetting: an entry lives twice the
// proof window, which outlasts every proof's claim (until its iat plus
// the window, and a proof's iat is at most one window ahead of the
// clock). This is rather than a per-key TTL (nats.go's KeyTTL), which
// needs a bucket with limit markers and a server of 2.11 or later, for
// the same guarantee: a claim is never forgotten before its proof is
// stale.
//
// The keys are an HMAC of the proof's replay key under a key derived from
// the cluster key, so a NATS user without it cannot tell which entry is
// which proof's. It can still delete entries, which lets a replay in:
// NATS permissions must prevent that, as for the storage (see the package
// doc).
type Replay struct {
	kv  jetstream.KeyValue
	mac []byte
}

// Replay opens (creating it if need be) the replay bucket of this storage
// for proofs of window (the dpop Verifier's Window; every replica uses the
// same).
func (s *Storage) Replay(ctx context.Context, window time.Duration) (*Replay, error) {
	if window <= 0 {
		return nil, errors.New("cluster replay: the proof window must be positive")
	}
	key, err := s.DeriveKey("dpop replay v1")
	if err != nil {
		return nil, err
	}
	kv, err := s.js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket: s.opts.Bucket + "_dpop", History: 1, Replicas: s.opts.Replicas, TTL: 2 * window, MaxBytes: replayMaxBytes,
		Description: "caddy-zidane-mcp: the DPoP proofs taken, each kept until it is stale",
	})
	if err != nil {
		return nil, fmt.Errorf("cluster replay: opening the KV bucket: %w", err)
	}
	return &Replay{kv: kv, mac: key}, nil
}

// Claim takes key, once across the cluster: fresh when this replica
// created its entry, not when an entry was there. until is not used: the
// bucket keeps every entry twice the window (see [Replay]). An error (NATS
// unreachable, slow, the bucket full) means the check could not answer.
func (r *Replay) Claim(ctx context.Context, key string, _ time.Time) (bool, error) {
	m := hmac.New(sha256.New, r.mac)
	m.Write([]byte(key))
	k := base64.RawURLEncoding.EncodeToString(m.Sum(nil))
	ctx, cancel := context.WithTimeout(ctx, replayClaimTimeout)
	defer cancel()
	_, err := r.kv.Create(ctx, k, []byte{1})
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, jetstream.ErrKeyExists):
		return false, nil
	}
	return false, fmt.Errorf("cluster replay: %w", err)
}

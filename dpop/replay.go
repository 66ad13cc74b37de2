package dpop

import (
	"context"
	"crypto/sha256"
	"errors"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/internal/replay"
)

// replayFrom is the sender name under which Local files every key: the
// key already names the client's key (jkt).
const replayFrom = "dpop"

// errFull is Local's answer when its bound is reached; Verify reports it
// as ErrUnavailable.
var errFull = errors.New("dpop: the replay check is full")

// Local is the [Replay] of one node, on the module's one replay check
// (internal/replay): bounded by memory, each key kept until its proof is
// stale and no longer, never evicting a key early (a key evicted early
// is a replay let in). It forgets by the node's wall clock, which is
// also the clock a Verifier is given in production. A cluster needs the
// replicas to share one check.
type Local struct {
	check  *replay.Check
	window time.Duration
}

// NewLocal returns a replay check for a [Verifier] whose Window is window
// (DefaultWindow when zero), holding at most limit proofs at once
// (limit × replay.IDBytes of memory). Past it, proofs are refused with
// ErrUnavailable until older ones expire.
func NewLocal(limit int, window time.Duration) *Local {
	if window <= 0 {
		window = DefaultWindow
	}
	return &Local{check: replay.New(limit, window), window: window}
}

// Claim takes key until until. The check keeps 128-bit ids: key's
// SHA-256, cut to 128 bits, is one (key is itself a hash, so any 128 of
// its bits are as random as the check asks).
func (l *Local) Claim(_ context.Context, key string, until time.Time) (bool, error) {
	sum := sha256.Sum256([]byte(key))
	var id [16]byte
	copy(id[:], sum[:])
	// The check keeps an id until its time plus its window; the proof's
	// time is until less the window.
	switch l.check.Take(replayFrom, id, until.Add(-l.window).UnixMilli(), time.Now()) {
	case replay.Taken:
		return true, nil
	case replay.Full:
		return false, errFull
	default: // Replayed, or Stale: older than what the check remembers
		return false, nil
	}
}

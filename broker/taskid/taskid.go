package taskid

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/Tahul/caddy-zidane-mcp/internal/seal"
)

// MaxUpstream bounds the task id an upstream may give (MCP
// 2026-07-28's Tasks extension, SEP-2663): real servers use a UUID or a
// short random string. A longer one is withheld from the client.
const MaxUpstream = 512

// taskIDVersion is the first byte of every task handle, so that the format
// can change without a new field.
const taskIDVersion = 1

// taskIDPurpose is the purpose the key seals task handles for: the key
// may be the one that seals session ids, whose purpose differs, so that
// neither opens as the other.
const taskIDPurpose = "task id"

// ErrUnknown is wrapped by every [Sealer.Open] failure: the handle was
// not given to this principal on this route (or was altered, or forged).
// The routes answer it as the Tasks extension answers an unknown task
// (-32602).
var ErrUnknown = errors.New("unknown task")

// Sealer seals an upstream's task id into the handle the gateway gives the
// client that created the task, and opens it again, bound to that
// principal and that route, as [sessionid.Sealer] does for session ids.
//
// A handle is base64url (no padding) of a version byte and, sealed by
// internal/seal, the upstream's name (length-prefixed; empty on a route
// with one upstream) and its task id. The associated data is the version,
// the principal's token id and the route, length-prefixed. A handle
// therefore opens only for the token and the route it was sealed for:
// presented by another token, on another route, altered or forged, it
// fails to open, and neither the caller nor an attacker can tell which.
// The aggregated route finds the upstream in the handle, where no client
// can change it. Nothing is kept per task: a route holds no table of
// handles that could grow.
//
// Each Seal and Open is one AES-GCM operation. A Sealer is safe for
// concurrent use.
type Sealer struct {
	sealer *seal.Sealer
	maxLen int // the longest handle Seal gives out
}

// New returns a Sealer for a 32-byte key. Keep the key across
// reloads and share it between replicas, as the session ids' key is
// (it may be the same key): handles sealed under a key that is gone no
// longer open, and their tasks are lost to their clients.
func New(key []byte) (*Sealer, error) {
	sl, err := seal.New(key, taskIDPurpose)
	if err != nil {
		return nil, fmt.Errorf("task handle key: %w", err)
	}
	// The upstream's name is a configured name, short; 255 bytes of it
	// and its length are room enough.
	plain := binary.MaxVarintLen64 + 255 + MaxUpstream
	return &Sealer{sealer: sl, maxLen: base64.RawURLEncoding.EncodedLen(1 + plain + sl.Overhead())}, nil
}

// Seal returns the handle to give principal (a token id) on route for the
// task taskID of upstream ("" on a route with one upstream). It refuses an
// empty task id and one longer than [MaxUpstream]. Every call uses a
// fresh nonce, so one task sealed twice gives two handles that both open.
func (t *Sealer) Seal(upstream, taskID, principal, route string) (string, error) {
	if taskID == "" || len(taskID) > MaxUpstream {
		return "", fmt.Errorf("the upstream gave a task id of %d bytes; a task id has 1 to %d", len(taskID), MaxUpstream)
	}
	if len(upstream) > 255 {
		return "", fmt.Errorf("upstream name of %d bytes", len(upstream))
	}
	plain := binary.AppendUvarint(make([]byte, 0, binary.MaxVarintLen64+len(upstream)+len(taskID)), uint64(len(upstream)))
	plain = append(append(plain, upstream...), taskID...)
	raw := t.sealer.Seal([]byte{taskIDVersion}, plain, taskAD(principal, route))
	return base64.RawURLEncoding.EncodeToString(raw), nil
}

// Open returns the upstream and the task id sealed in handle, if handle
// was sealed by [Sealer.Seal] under the same key for the same principal
// and route. Every failure wraps [ErrUnknown], and says whether the
// handle was malformed or did not open, never which of principal, route
// or key was wrong.
func (t *Sealer) Open(handle, principal, route string) (upstream, taskID string, err error) {
	if len(handle) > t.maxLen {
		return "", "", fmt.Errorf("%w: the task id is too long to be one this gateway gave out", ErrUnknown)
	}
	raw, err := base64.RawURLEncoding.DecodeString(handle)
	if err != nil || len(raw) < 1+t.sealer.Overhead() || raw[0] != taskIDVersion {
		return "", "", fmt.Errorf("%w: the task id is not one this gateway gives out", ErrUnknown)
	}
	plain, err := t.sealer.Open(nil, raw[1:], taskAD(principal, route))
	if err != nil {
		return "", "", fmt.Errorf("%w: the task id was not given to this token on this endpoint", ErrUnknown)
	}
	n, k := binary.Uvarint(plain)
	if k <= 0 || n > uint64(len(plain)-k) || len(plain)-k-int(n) == 0 {
		// Sealed by this key, so never: the layout is Seal's.
		return "", "", fmt.Errorf("%w: the task id is not one this gateway gives out", ErrUnknown)
	}
	return string(plain[k : k+int(n)]), string(plain[k+int(n):]), nil
}

// taskAD binds a handle to its principal and route.
func taskAD(principal, route string) []byte {
	return seal.AD(string(rune(taskIDVersion)), principal, route)
}

// upstreamKey holds, in a request's context, the upstream that holds the
// task its task method names.
type upstreamKey struct{}

// WithUpstream returns ctx naming upstream as the one that holds the task
// the request's tasks/get, tasks/update or tasks/cancel names (by the
// upstream's id, in the body). The edge sets it once it opened the
// client's handle; the aggregated route sends the request there.
func WithUpstream(ctx context.Context, upstream string) context.Context {
	return context.WithValue(ctx, upstreamKey{}, upstream)
}

// UpstreamFrom returns the upstream [WithUpstream] put in ctx, if any.
func UpstreamFrom(ctx context.Context) (string, bool) {
	up, ok := ctx.Value(upstreamKey{}).(string)
	return up, ok && up != ""
}

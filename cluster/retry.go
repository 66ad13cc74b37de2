package cluster

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Retries while JetStream is between leaders: when a server that led a
// stream dies, the others elect a new leader (nats-server's raft election
// timeout is 4 to 9 s), and requests meanwhile get no answer. A storage
// operation is retried for up to retryFor, each attempt bounded by
// attemptTimeout, so such a failover is a stall, not an error.
const (
	retryFor       = 12 * time.Second
	attemptTimeout = 2 * time.Second
)

// ErrUnavailable: NATS did not answer within the retries (no quorum, or a
// failover that outlasted them); nothing was stored.
var ErrUnavailable = errors.New("NATS did not answer (it may have lost its quorum, or be failing over); nothing was stored: retry once NATS is back")

// errStaleView marks a compare-and-set failure that a retry resolves.
var errStaleView = errors.New("NATS answered from a view that is changing")

// transient says whether err is one JetStream gives while a stream has no
// leader, or while the connection reconnects to another server.
func transient(err error) bool {
	if err == nil {
		return false
	}
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) && apiErr.Code == 503 {
		return true // "JetStream system temporarily unavailable" and kin
	}
	var legacyErr *nats.APIError // the reads from a stream's leader
	if errors.As(err, &legacyErr) && legacyErr.Code == 503 {
		return true
	}
	return errors.Is(err, errStaleView) || errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, nats.ErrNoResponders) ||
		errors.Is(err, nats.ErrTimeout) || errors.Is(err, nats.ErrConnectionReconnecting) ||
		errors.Is(err, context.DeadlineExceeded)
}

// blobAttemptTimeout bounds one attempt at reading or writing an object:
// a value of megabytes may take longer than attemptTimeout on a slow link.
const blobAttemptTimeout = 30 * time.Second

// retry runs fn until it succeeds, fails for good, ctx ends, or retryFor
// has passed; tried reports how many attempts there were.
func retry[T any](ctx context.Context, fn func(context.Context) (T, error)) (v T, tried int, err error) {
	return retryEach(ctx, attemptTimeout, fn)
}

// retryEach is retry with each attempt bounded by attempt.
func retryEach[T any](ctx context.Context, attempt time.Duration, fn func(context.Context) (T, error)) (v T, tried int, err error) {
	deadline := time.Now().Add(max(retryFor, attempt))
	wait := 50 * time.Millisecond
	for {
		actx, cancel := context.WithTimeout(ctx, attempt)
		v, err = fn(actx)
		cancel()
		tried++
		if err == nil || !transient(err) || ctx.Err() != nil || time.Now().After(deadline) {
			switch {
			case err != nil && ctx.Err() != nil:
				err = errors.Join(err, ctx.Err())
			case transient(err):
				err = fmt.Errorf("%w (%v)", ErrUnavailable, err)
			}
			return v, tried, err
		}
		select {
		case <-ctx.Done():
			return v, tried, errors.Join(err, ctx.Err())
		case <-time.After(wait):
		}
		wait = min(2*wait, time.Second)
	}
}

// retry0 is retry for an operation with no value.
func retry0(ctx context.Context, fn func(context.Context) error) error {
	_, _, err := retry(ctx, func(ctx context.Context) (struct{}, error) { return struct{}{}, fn(ctx) })
	return err
}

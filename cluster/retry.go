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
	return retryWhile(ctx, attempt, attempt, max(retryFor, attempt), transient, fn)
}

// retryWhile runs fn again while again says so of its error, until ctx
// ends or bound has passed. The first attempt is bounded by first, and
// each next one by twice the last's bound, at most attempt.
func retryWhile[T any](ctx context.Context, first, attempt, bound time.Duration, again func(error) bool, fn func(context.Context) (T, error)) (v T, tried int, err error) {
	deadline := time.Now().Add(bound)
	wait := 50 * time.Millisecond
	each := min(first, attempt)
	for {
		actx, cancel := context.WithTimeout(ctx, each)
		v, err = fn(actx)
		cancel()
		tried++
		each = min(2*each, attempt)
		if err == nil || !again(err) || ctx.Err() != nil || time.Now().After(deadline) {
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

// Set-up of a bucket or stream (setUp). A JetStream API request that a
// NATS server drops is never answered later, and replicas started
// together meet two cases of it: a NATS cluster that has just started
// drops requests until it has a meta leader, and a request about a stream
// that another replica is creating at that instant (nats.go's
// CreateOrUpdate* sends an update first) may go unanswered. With
// nats-server 2.15.2 on three servers, 2 of 12 concurrent creates through
// CreateOrUpdateStream waited out 8 s, where each of the others took 10
// to 170 ms. So an unanswered request is sent again soon, not waited on:
// the first attempt is bounded by setupFirstAttempt, each next one by
// twice the last's bound, up to attemptTimeout, for a link slower than
// that. setupFor bounds the whole when the caller's ctx allows longer.
//
// A cluster that has just elected its meta leader may not know its other
// servers yet, and refuses a replicated stream with "no suitable peers for
// placement" (1 of 10 starts with a fresh three-server cluster): that is
// tried again for setupPeersFor, after which it is the answer, since a
// cluster with fewer servers than the replicas asked for gives it too.
const (
	setupFirstAttempt = 250 * time.Millisecond
	setupFor          = time.Minute
	setupPeersFor     = 10 * time.Second
)

// jsErrNoPeers is JetStream's "no suitable peers for placement"
// (nats-server's JSClusterNoPeersErrF), which nats.go names no constant.
const jsErrNoPeers jetstream.ErrorCode = 10005

// setUp runs fn, which creates, updates or looks up a bucket or stream
// (nats.go's CreateOrUpdate*: an update, else a create), until it
// succeeds, fails for good, or ctx ends (setupFor at most). Besides what
// JetStream gives while it has no leader, it tries again on "stream name
// already in use": a replica that creates a bucket at the same instant as
// another, with a config that differs (the locks bucket's TTL), gets it,
// and its next attempt updates the bucket the other made. A config that
// no update can reconcile (another storage type, a stream that is not a
// bucket) fails on that update, with the server's error: never hidden
// behind a retry.
func setUp[T any](ctx context.Context, fn func(context.Context) (T, error)) (T, error) {
	start := time.Now()
	var noPeersSince time.Time
	again := func(err error) bool {
		if !noPeers(err) {
			return transient(err) || errors.Is(err, jetstream.ErrStreamNameAlreadyInUse)
		}
		if noPeersSince.IsZero() {
			noPeersSince = time.Now()
		}
		return time.Since(noPeersSince) < setupPeersFor
	}
	v, tried, err := retryWhile(ctx, setupFirstAttempt, attemptTimeout, setupFor, again, fn)
	switch {
	case err == nil:
	case noPeers(err):
		err = fmt.Errorf("%w: the NATS cluster has fewer JetStream servers than `replicas` asks for, or they have not all joined it", err)
	case !errors.Is(err, ErrUnavailable) && transient(err) && errors.Is(ctx.Err(), context.DeadlineExceeded):
		// The caller's time ran out while NATS did not answer: say so,
		// not twice "context deadline exceeded".
		err = fmt.Errorf("%w (no answer in %v, over %d attempts)", ErrUnavailable, time.Since(start).Round(time.Second), tried)
	}
	return v, err
}

func noPeers(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == jsErrNoPeers
}

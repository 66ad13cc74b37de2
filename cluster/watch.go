package cluster

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Why the watches here start again on their own. A KV watch in nats.go
// v1.55.0 (jetstream.KeyValue.Watch) is an ordered push consumer:
// ephemeral, one replica, kept in the memory of the server it was made on.
// When that server goes (NATS restarts, or that server of a NATS cluster
// dies) the consumer goes with it. On reconnection nats.go subscribes
// again to the consumer's delivery subject, but nothing is delivered
// there until it makes a new consumer, which it does only when its
// activity check (every two idle heartbeats, 2 × 5 s) finds that a whole
// period passed with neither a message nor a heartbeat: 10 to 20 s after
// the last heartbeat before the server went, and 10 s more each time that
// new consumer cannot be made yet (JetStream not ready: resetOrderedConsumer
// leaves it to the next check). Measured with nats-server 2.15.2, a write
// made just after a restart reached the watcher 9 to 19 s later. So each
// watch here is made again as soon as the connection comes back, is
// checked against the stream's leader every WatchCheck (a consumer lost
// while the connection stayed up), and tells its caller to read again
// whenever it may have missed a write.
const (
	// WatchCheck is how often [Storage.Watch] reads the key's last
	// revision from the stream's leader, and calls fn if the watch has not
	// brought it: a write a watch missed is told within WatchCheck. A watch
	// that has not brought in a whole WatchCheck what the leader had is
	// made again. [NodeArea] checks its watch the same way.
	WatchCheck = 2 * time.Second

	// WatchResync is how often [Storage.Watch] calls fn though nothing
	// seems to have changed: fn reads what is stored, and a read that
	// failed (NATS answered nothing for longer than its retries, then
	// came back without the connection going) is done again within it.
	WatchResync = 30 * time.Second

	// A watch that could not be made, or that ended on its own, is made
	// again after watchRetryMin, doubling up to watchRetryMax: no tight
	// loop while NATS answers nothing, and a prompt one once it does. A
	// watch is never made while the connection is down: the next try
	// waits for it to come back.
	watchRetryMin = 100 * time.Millisecond
	watchRetryMax = 2 * time.Second
)

// watching says how a watch loop makes its watches and what it does with
// them. Its functions run on the loop's goroutine, one at a time.
type watching struct {
	// name says what the watch follows (a storage key, an area), for the
	// log; it names no secret.
	name string
	// log gets one line each time a watch is made again after the last
	// one ended on its own (see keepWatching); nil discards it.
	log *slog.Logger
	// open makes a watch that lives until ctx ends.
	open func(ctx context.Context) (jetstream.KeyWatcher, error)
	// began is called each time a watch is made.
	began func()
	// take gets each entry of the watch, and the nil that ends its
	// initial values.
	take func(jetstream.KeyValueEntry)
	// check, when set, runs every `every`; false makes the watch again.
	check func() bool
	every time.Duration
}

// Why a watch ended.
type watchEnd int

const (
	watchDone   watchEnd = iota // its context ended
	watchClosed                 // nats.go closed it
	watchBack                   // the connection came back after it was lost
	watchBehind                 // its check found it behind
)

// reason says why a watch that ended this way is made again, for the log.
func (e watchEnd) reason() string {
	switch e {
	case watchClosed:
		return "nats.go closed the last one"
	case watchBack:
		return "the NATS connection came back"
	case watchBehind:
		return "the last one fell behind the stream's leader"
	}
	return ""
}

// keepWatching runs watches made by w.open until ctx ends, making a new
// one when the last could not be made or ended; see WatchCheck.
//
// Each watch made again after the last ended on its own is logged, once it
// is up and w.began has run (what it follows was read again then): this
// happens only when NATS went away or lost a consumer, and it is how an
// operator, or a test, sees that the gateway made its watches again
// itself rather than waiting for nats.go's.
func (s *Storage) keepWatching(ctx context.Context, w watching) {
	pause := watchRetryMin
	var again watchEnd // why the last watch ended, until the next is made
	for ctx.Err() == nil {
		back := s.reconnected()
		if back != nil && !s.js.Conn().IsConnected() {
			select {
			case <-ctx.Done():
			case <-back:
			}
			continue
		}
		wctx, stop := context.WithCancel(ctx)
		kw, err := w.open(wctx)
		if err == nil {
			w.began()
			if again != watchDone && w.log != nil {
				w.log.Info("NATS watch made again", "watch", w.name, "reason", again.reason())
			}
			made := time.Now()
			end := follow(wctx, kw, back, w)
			again = end
			_ = kw.Stop()
			stop()
			if end != watchClosed {
				pause = watchRetryMin
				continue
			}
			if time.Since(made) > watchRetryMax {
				pause = watchRetryMin
			}
		} else {
			stop()
		}
		select {
		case <-ctx.Done():
		case <-back:
			pause = watchRetryMin
		case <-time.After(pause):
			pause = min(2*pause, watchRetryMax)
		}
	}
}

// follow hands kw's entries to w.take, and runs w.check, until the watch
// ends or should be made again.
func follow(ctx context.Context, kw jetstream.KeyWatcher, back <-chan struct{}, w watching) watchEnd {
	var tick <-chan time.Time
	if w.check != nil {
		t := time.NewTicker(w.every)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case e, ok := <-kw.Updates():
			if !ok {
				return watchClosed
			}
			w.take(e)
		case <-back:
			return watchBack
		case <-tick:
			if !w.check() {
				return watchBehind
			}
		case <-ctx.Done():
			return watchDone
		}
	}
}

// reconnected is closed the next time the storage's connection comes back
// after it was lost; nil (never) for a storage opened without a [Conn].
func (s *Storage) reconnected() <-chan struct{} {
	if s.conn == nil {
		return nil
	}
	return s.conn.reconnected()
}

// lastRevision is the stream sequence of the last entry on subject of the
// data bucket (a put, a delete or a purge; subject may hold wildcards),
// read from the stream's leader, which has every write it acknowledged; 0
// when there is none.
func (s *Storage) lastRevision(ctx context.Context, subject string) (uint64, error) {
	ctx, cancel := context.WithTimeout(ctx, attemptTimeout)
	defer cancel()
	m, err := s.leader.GetLastMsg("KV_"+s.opts.Bucket, subject, nats.Context(ctx))
	if errors.Is(err, nats.ErrMsgNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	return m.Sequence, nil
}

// Watch calls fn once its watch on key is up, then each time key is
// written or deleted, by any replica, until ctx ends; fn runs on Watch's
// goroutine, one call at a time, and reads the key itself. A write is told
// through the watch at once, and whatever the watch missed is told all the
// same: when the connection comes back after it was lost, the watch is
// made again and fn called (a write made while no watch ran is then
// read), and every WatchCheck the key's last revision is read from the
// stream's leader, fn being called if the watch has not told it. fn is
// also called every WatchResync, so that a read of fn's that failed is
// done again. fn may be called when nothing changed; writes close
// together may be told once. A watch made again is logged, naming key,
// through the storage's logger (see StorageOptions.Logger).
func (s *Storage) Watch(ctx context.Context, key string, fn func()) {
	k, err := kvKey(key)
	if err != nil {
		return
	}
	subject := "$KV." + s.opts.Bucket + "." + k
	resync := WatchResync
	if s.watchResync != 0 {
		resync = s.watchResync
	}
	var (
		called  time.Time // when fn was last called
		told    uint64    // the last revision fn was called for
		known   bool      // told was read
		brought uint64    // the last revision the current watch brought, or there when it began
		based   bool      // brought was read
		missed  uint64    // a revision the last check found and the watch had not brought
	)
	call := func() {
		called = time.Now()
		fn()
	}
	s.keepWatching(ctx, watching{
		name: key, log: s.log,
		open: func(ctx context.Context) (jetstream.KeyWatcher, error) {
			return s.data.Watch(ctx, k, jetstream.UpdatesOnly())
		},
		began: func() {
			// fn reads what is there now: the writes before the watch,
			// which it does not bring, are read too.
			missed, based = 0, false
			if last, err := s.lastRevision(ctx, subject); err == nil {
				told, known, brought, based = max(told, last), true, last, true
			}
			call()
		},
		take: func(e jetstream.KeyValueEntry) {
			if e == nil {
				return
			}
			brought = max(brought, e.Revision())
			told = max(told, brought)
			call()
		},
		every: WatchCheck,
		check: func() bool {
			last, err := s.lastRevision(ctx, subject)
			if err != nil {
				return true // NATS is away: the reconnection makes the watch again
			}
			if missed != 0 && brought < missed {
				return false
			}
			if !based {
				brought, based = max(brought, last), true
			}
			if !known || last > told {
				told, known = last, true
				call()
			} else if time.Since(called) >= resync {
				call()
			}
			missed = 0
			if last > brought {
				missed = last
			}
			return true
		},
	})
}

package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// EventStream is one JetStream stream, "<bucket>_<name>", that every node
// publishes to and follows: the stream numbers what the nodes publish in
// one sequence, so the numbers are the cluster's, and every node sees
// every message in that order. Each message is sealed (AES-256-GCM, with
// a key derived from the cluster key for the stream, bound to the stream's
// name): a NATS user without the cluster key reads none and adds none a
// node takes. It can still put a copy of an old message back, which the
// follower must tell apart (the body should say who published it and in
// which order), or NATS permissions prevent.
type EventStream struct {
	stream  jetstream.Stream
	js      jetstream.JetStream
	name    string
	subject string
	sealer  *sealer
	log     *slog.Logger
}

// OpenEventStream opens (creating it if need be) the stream name of this
// storage's bucket, keeping its last keep messages.
func (s *Storage) OpenEventStream(ctx context.Context, name string, keep int64, log *slog.Logger) (*EventStream, error) {
	if s.js == nil {
		return nil, errors.New("event stream: this storage has no JetStream connection")
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	stream := s.opts.Bucket + "_" + name
	subject := "zidane.stream." + s.opts.Bucket + "." + name
	sl, err := newSealer(s.opts.Key, "event stream v1 "+stream)
	if err != nil {
		return nil, err
	}
	st, err := setUp(ctx, func(ctx context.Context) (jetstream.Stream, error) {
		return s.js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
			Name: stream, Subjects: []string{subject}, Replicas: s.opts.Replicas,
			MaxMsgs: keep, Discard: jetstream.DiscardOld, Storage: jetstream.FileStorage,
			Description: "caddy-zidane-mcp: " + name + ", numbered for the whole cluster",
		})
	})
	if err != nil {
		return nil, fmt.Errorf("event stream %q: %w", stream, err)
	}
	return &EventStream{stream: st, js: s.js, name: stream, subject: subject, sealer: sl, log: log}, nil
}

// Publish adds body to the stream and returns its number. id names the
// message for JetStream's duplicate window, so a publish retried after a
// lost acknowledgement is kept once.
func (e *EventStream) Publish(ctx context.Context, id string, body []byte) (uint64, error) {
	ack, err := e.js.Publish(ctx, e.subject, e.sealer.seal(nil, body, []byte(e.name)), jetstream.WithMsgID(id))
	if err != nil {
		return 0, fmt.Errorf("event stream %q: %w", e.name, err)
	}
	return ack.Sequence, nil
}

// Last is the number of the stream's last message (0 when empty).
func (e *EventStream) Last(ctx context.Context) (uint64, error) {
	info, err := e.stream.Info(ctx)
	if err != nil {
		return 0, fmt.Errorf("event stream %q: %w", e.name, err)
	}
	return info.State.LastSeq, nil
}

// Follow calls fn with every message of the stream, in order, with its
// number and the time the stream took it: the last `last` messages kept,
// then each new one as it comes, until stop is called. fn runs on one
// goroutine, and must not block long. A message that does not open under
// the cluster key is skipped.
func (e *EventStream) Follow(ctx context.Context, last uint64, fn func(seq uint64, at time.Time, body []byte)) (stop func(), err error) {
	info, err := e.stream.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("event stream %q: %w", e.name, err)
	}
	start := uint64(1)
	if info.State.LastSeq >= last {
		start = info.State.LastSeq - last + 1
	}
	cons, err := e.stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: start,
	})
	if err != nil {
		return nil, fmt.Errorf("event stream %q: %w", e.name, err)
	}
	var mu sync.Mutex // fn runs on one goroutine at a time
	cc, err := cons.Consume(func(msg jetstream.Msg) {
		md, err := msg.Metadata()
		if err != nil {
			return
		}
		body, err := e.sealer.open(msg.Data(), []byte(e.name))
		if err != nil {
			e.log.Warn("event stream: a message does not open under the cluster key; skipped", "stream", e.name, "seq", md.Sequence.Stream)
			return
		}
		mu.Lock()
		defer mu.Unlock()
		fn(md.Sequence.Stream, md.Timestamp, body)
	})
	if err != nil {
		return nil, fmt.Errorf("event stream %q: %w", e.name, err)
	}
	return cc.Stop, nil
}

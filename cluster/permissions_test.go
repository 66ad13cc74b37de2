package cluster

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/internal/natstest"
	"github.com/Tahul/caddy-zidane-mcp/internal/testtls"
	"github.com/Tahul/caddy-zidane-mcp/policy"
)

// LeastPrivilege is the NATS authorization the README gives for the
// gateway's NATS user with the default bucket: what TestLeastPrivilegeNATSUser
// runs the whole storage, the rate-limit sharing, the admin actions and
// the node registry under. Keep the two in step.
const leastPrivilege = `
	publish: {
		allow: [
			"$JS.API.INFO",
			"$JS.API.STREAM.INFO.KV_zidane", "$JS.API.STREAM.INFO.KV_zidane_locks", "$JS.API.STREAM.INFO.KV_zidane_nodes", "$JS.API.STREAM.INFO.OBJ_zidane_blobs",
			"$JS.API.STREAM.CREATE.KV_zidane", "$JS.API.STREAM.CREATE.KV_zidane_locks", "$JS.API.STREAM.CREATE.KV_zidane_nodes", "$JS.API.STREAM.CREATE.OBJ_zidane_blobs",
			"$JS.API.STREAM.UPDATE.KV_zidane", "$JS.API.STREAM.UPDATE.KV_zidane_locks", "$JS.API.STREAM.UPDATE.KV_zidane_nodes", "$JS.API.STREAM.UPDATE.OBJ_zidane_blobs",
			"$JS.API.STREAM.MSG.GET.KV_zidane", "$JS.API.STREAM.MSG.GET.KV_zidane_locks", "$JS.API.STREAM.MSG.GET.KV_zidane_nodes", "$JS.API.STREAM.MSG.GET.OBJ_zidane_blobs",
			"$JS.API.DIRECT.GET.KV_zidane.>", "$JS.API.DIRECT.GET.KV_zidane_locks.>", "$JS.API.DIRECT.GET.KV_zidane_nodes.>", "$JS.API.DIRECT.GET.OBJ_zidane_blobs.>",
			"$JS.API.STREAM.PURGE.OBJ_zidane_blobs",
			"$JS.API.CONSUMER.CREATE.KV_zidane.>", "$JS.API.CONSUMER.CREATE.KV_zidane_locks.>", "$JS.API.CONSUMER.CREATE.KV_zidane_nodes.>", "$JS.API.CONSUMER.CREATE.OBJ_zidane_blobs.>",
			"$JS.API.CONSUMER.DELETE.KV_zidane.>", "$JS.API.CONSUMER.DELETE.KV_zidane_locks.>", "$JS.API.CONSUMER.DELETE.KV_zidane_nodes.>", "$JS.API.CONSUMER.DELETE.OBJ_zidane_blobs.>",
			"$JS.FC.KV_zidane.>", "$JS.FC.KV_zidane_locks.>", "$JS.FC.KV_zidane_nodes.>", "$JS.FC.OBJ_zidane_blobs.>",
			"$KV.zidane.>", "$KV.zidane_locks.>", "$KV.zidane_nodes.>", "$O.zidane_blobs.>",
			"$JS.API.STREAM.INFO.zidane_session_events", "$JS.API.STREAM.CREATE.zidane_session_events", "$JS.API.STREAM.UPDATE.zidane_session_events",
			"$JS.API.CONSUMER.CREATE.zidane_session_events.>", "$JS.API.CONSUMER.DELETE.zidane_session_events.>", "$JS.API.CONSUMER.MSG.NEXT.zidane_session_events.>",
			"zidane.stream.zidane.>", "zidane.rpc.zidane.>",
			"zidane.limits.>", "zidane.admin.zidane"
		]
	}
	subscribe: {
		allow: ["_INBOX.>", "zidane.limits.>", "zidane.admin.zidane", "zidane.rpc.zidane.>"]
	}
	allow_responses: true`

// recordLog is a slog handler that keeps the messages it gets.
type recordLog struct {
	mu   sync.Mutex
	msgs []string
}

func (r *recordLog) Enabled(context.Context, slog.Level) bool { return true }
func (r *recordLog) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	var b strings.Builder
	b.WriteString(rec.Message)
	rec.Attrs(func(a slog.Attr) bool { fmt.Fprintf(&b, " %s=%v", a.Key, a.Value); return true })
	r.msgs = append(r.msgs, b.String())
	return nil
}
func (r *recordLog) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *recordLog) WithGroup(string) slog.Handler      { return r }
func (r *recordLog) all() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.msgs...)
}

// The gateway runs with the README's least-privilege NATS user over
// mutual TLS (the user is the client certificate's subject): storage,
// large values, locks, watches, rate-limit sharing and admin actions all
// work, and NATS reports no permission the user lacks. Another user, with
// no permission on the gateway's subjects, reaches none of it.
func TestLeastPrivilegeNATSUser(t *testing.T) {
	certs := testtls.Files(t, "zidane", "intruder")
	ns := natstest.FromConfig(t, fmt.Sprintf(`
listen: "127.0.0.1:-1"
jetstream { store_dir: %q }
tls {
	cert_file: %q
	key_file: %q
	ca_file: %q
	verify_and_map: true
}
authorization {
	users [
		{ user: "CN=zidane", permissions: { %s } }
		{ user: "CN=intruder", permissions: { publish: ["$JS.API.INFO"], subscribe: ["_INBOX.>"] } }
	]
}
`, t.TempDir(), filepath.Join(certs, "server.pem"), filepath.Join(certs, "server-key.pem"), filepath.Join(certs, "ca.pem"), leastPrivilege))
	url := strings.Replace(ns.ClientURL(), "nats://", "tls://", 1)

	logs := &recordLog{}
	dial := func(user string) (*Conn, error) {
		return Dial(ConnConfig{URLs: []string{url}, TLSCA: filepath.Join(certs, "ca.pem"),
			TLSCert: filepath.Join(certs, user+".pem"), TLSKey: filepath.Join(certs, user+"-key.pem"), Logger: slog.New(logs)})
	}
	ctx := testCtx(t)
	var replicas []*Storage
	for range 2 {
		c, err := dial("zidane")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Close)
		st, err := c.Storage(ctx, StorageOptions{Key: testKey, LockTTL: 2 * time.Second, LockPoll: 50 * time.Millisecond})
		if err != nil {
			t.Fatalf("storage as the least-privilege user: %v", err)
		}
		// What logs into NATS is what agents are denied (caddymodule's
		// deniedPaths): the client certificate and its key, not the CA.
		if got, want := st.SecretFiles(), []string{filepath.Join(certs, "zidane.pem"), filepath.Join(certs, "zidane-key.pem")}; !slices.Equal(got, want) {
			t.Fatalf("secret files %v, want %v", got, want)
		}
		replicas = append(replicas, st)
	}
	a, b := replicas[0], replicas[1]

	// Storage: values, large values, listing, locks, fenced writes, watch.
	fired := make(chan struct{}, 8)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go b.Watch(wctx, "zidane/tokens.json", func() { fired <- struct{}{} })
	big := bytes.Repeat([]byte("transcript "), 200_000)
	steps := []struct {
		name string
		run  func() error
	}{
		{"store", func() error { return a.Store(ctx, "zidane/tokens.json", []byte("v1")) }},
		{"load on the other", func() error {
			v, err := b.Load(ctx, "zidane/tokens.json")
			if err == nil && string(v) != "v1" {
				err = fmt.Errorf("got %q", v)
			}
			return err
		}},
		{"large value", func() error {
			if err := a.Store(ctx, "zidane/sessions/s1/transcript.jsonl", big); err != nil {
				return err
			}
			v, err := b.Load(ctx, "zidane/sessions/s1/transcript.jsonl")
			if err == nil && !bytes.Equal(v, big) {
				err = errors.New("the large value came back different")
			}
			return err
		}},
		{"list", func() error {
			keys, err := b.List(ctx, "zidane", true)
			if err == nil && len(keys) < 4 {
				err = fmt.Errorf("listed %v", keys)
			}
			return err
		}},
		{"locked update", func() error {
			return updateCounter(ctx, a)
		}},
		{"node area", func() error {
			area, err := b.FollowNodeArea("directory", func(_, _ string, v []byte) (any, bool) { return string(v), true }, nil)
			if err != nil {
				return err
			}
			defer area.Close()
			if err := a.Store(ctx, "zidane/nodes/gw-a/directory/sessions/s1", []byte("entry")); err != nil {
				return err
			}
			if err := area.Sync(ctx); err != nil {
				return err
			}
			n := 0
			area.Each(func(_, _ string, v any) { n++ })
			if n != 1 {
				return fmt.Errorf("the area holds %d values", n)
			}
			return nil
		}},
		{"delete", func() error {
			if err := a.Delete(ctx, "zidane/sessions"); err != nil {
				return err
			}
			if _, err := b.Load(ctx, "zidane/sessions/s1/transcript.jsonl"); !errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("after delete: %v", err)
			}
			return nil
		}},
	}
	for _, s := range steps {
		if err := s.run(); err != nil {
			t.Errorf("%s: %v", s.name, err)
		}
	}
	// The watch saw a write (it may have started after the first).
	deadline := time.Now().Add(20 * time.Second)
	for seen := false; !seen; {
		if err := a.Store(ctx, "zidane/tokens.json", []byte("v2")); err != nil {
			t.Fatal(err)
		}
		select {
		case <-fired:
			seen = true
		case <-time.After(100 * time.Millisecond):
			if time.Now().After(deadline) {
				t.Fatal("the watch never fired")
			}
		}
	}

	// Rate-limit sharing and admin actions.
	la, lb := policy.NewLimiter(policy.Limit{Rate: 1, Burst: 3}), policy.NewLimiter(policy.Limit{Rate: 1, Burst: 3})
	for _, p := range []struct {
		st  *Storage
		lim *policy.Limiter
	}{{a, la}, {b, lb}} {
		s, err := p.st.ShareLimits("limits|/mcp", p.lim, 10*time.Millisecond, slog.New(logs))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Close)
	}
	got := make(chan Action, 1)
	ab, err := b.Actions(func(act Action) { got <- act })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ab.Close)
	aa, err := a.Actions(func(Action) {})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(aa.Close)
	for range 3 {
		la.Allow("tok", time.Now())
	}
	waitEmpty(t, lb, "tok")
	// The subscription may not be in place at the first announce.
	for done := false; !done; {
		if err := aa.Announce(Action{Kind: "retire", Upstream: "local"}); err != nil {
			t.Fatal(err)
		}
		select {
		case act := <-got:
			if act != (Action{Kind: "retire", Upstream: "local"}) {
				t.Fatalf("action %+v", act)
			}
			done = true
		case <-time.After(100 * time.Millisecond):
			if time.Now().After(deadline) {
				t.Fatal("the action never arrived")
			}
		}
	}
	// The node registry: each sees the other.
	na, err := a.StartNodes(ctx, NodeOptions{Node: "gw-a", Advertise: "http://127.0.0.1:1", TTL: 2 * time.Second, Logger: slog.New(logs)})
	if err != nil {
		t.Fatalf("node registry as the least-privilege user: %v", err)
	}
	t.Cleanup(na.Close)
	nb, err := b.StartNodes(ctx, NodeOptions{Node: "gw-b", Advertise: "http://127.0.0.1:2", TTL: 2 * time.Second, Logger: slog.New(logs)})
	if err != nil {
		t.Fatalf("node registry as the least-privilege user: %v", err)
	}
	t.Cleanup(nb.Close)
	if !waitFor(20*time.Second, func() bool { _, ab := na.Lookup("gw-b"); _, ba := nb.Lookup("gw-a"); return ab && ba }) {
		t.Fatal("the nodes did not see each other under the least-privilege user")
	}
	// Requests between nodes, and the sessions' event stream.
	ra, err := a.ServeRPC("sessions", "gw-a", func(context.Context, string, json.RawMessage) (json.RawMessage, error) { return nil, nil }, slog.New(logs))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ra.Close)
	rb, err := b.ServeRPC("sessions", "gw-b", func(_ context.Context, m string, _ json.RawMessage) (json.RawMessage, error) {
		return json.Marshal(m)
	}, slog.New(logs))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rb.Close)
	if got, err := ra.Call(ctx, "gw-b", "read", nil); err != nil || string(got) != `"read"` {
		t.Fatalf("a request between nodes as the least-privilege user: %s, %v", got, err)
	}
	ea, err := a.OpenEventStream(ctx, "session_events", 100, slog.New(logs))
	if err != nil {
		t.Fatalf("the event stream as the least-privilege user: %v", err)
	}
	eb, err := b.OpenEventStream(ctx, "session_events", 100, slog.New(logs))
	if err != nil {
		t.Fatalf("the event stream as the least-privilege user: %v", err)
	}
	seen := make(chan uint64, 4)
	stop, err := eb.Follow(ctx, 10, func(seq uint64, _ time.Time, _ []byte) { seen <- seq })
	if err != nil {
		t.Fatalf("following the event stream as the least-privilege user: %v", err)
	}
	t.Cleanup(stop)
	seq, err := ea.Publish(ctx, "e1", []byte("event"))
	if err != nil {
		t.Fatalf("publishing an event as the least-privilege user: %v", err)
	}
	select {
	case got := <-seen:
		if got != seq {
			t.Fatalf("followed seq %d, published %d", got, seq)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the event never reached the follower")
	}
	for _, m := range logs.all() {
		if strings.Contains(strings.ToLower(m), "permission") {
			t.Errorf("NATS reported a permission the least-privilege user lacks: %s", m)
		}
	}

	// Another NATS user of the same server reaches none of it.
	c, err := dial("intruder")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	ictx, icancel := context.WithTimeout(ctx, 3*time.Second)
	defer icancel()
	if _, err := c.Storage(ictx, StorageOptions{Key: testKey}); err == nil {
		t.Fatal("a NATS user without the gateway's permissions opened its storage")
	}
}

func updateCounter(ctx context.Context, st *Storage) error {
	if err := st.Lock(ctx, "zidane/counter"); err != nil {
		return err
	}
	defer st.Unlock(ctx, "zidane/counter")
	if _, err := st.Load(ctx, "zidane/counter"); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return st.Store(ctx, "zidane/counter", []byte("1"))
}

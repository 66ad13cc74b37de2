package caddymodule

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/certmagic"
	"go.uber.org/zap"

	"github.com/Tahul/caddy-zidane-mcp/auditchain"
	"github.com/Tahul/caddy-zidane-mcp/cluster"
	"github.com/Tahul/caddy-zidane-mcp/storage"
)

// auditCheckpointsPrefix is where Caddy's storage keeps each audit chain's
// latest checkpoint, by chain id: the running config's storage, so NATS
// JetStream in a cluster, shared by every replica and off every host.
const auditCheckpointsPrefix = "zidane/audit/checkpoints/"

// Bounds of the keeper.
const (
	keepWriteTimeout = 10 * time.Second // one write of a checkpoint, the last one at a stop included
	keepReadTimeout  = 2 * time.Second  // the look-up when the chain opens its file, on its first write
	keepRetryMax     = 30 * time.Second // between retries of a failed write
	keptCopyLimit    = 1 << 20          // a checkpoint_copy file read back
)

func auditCheckpointKey(chain string) string { return auditCheckpointsPrefix + chain }

// auditLogsPrefix is where Caddy's storage keeps, for each audit log file
// of each host, the latest checkpoint written to it, whatever its chain:
// a log whose files are all removed begins a new chain, and this is what
// tells that from a first start (auditchain.Keeper.Last). The host is in
// the key because a cluster's replicas share the storage, and usually the
// path too.
const auditLogsPrefix = "zidane/audit/logs/"

func auditLogKey(node, log string) string {
	sum := sha256.Sum256([]byte(node + "\x00" + log))
	return auditLogsPrefix + hex.EncodeToString(sum[:16])
}

// keptCheckpoint is the value stored for a chain: its latest checkpoint's
// line, and which log it is (for people, and for a listing).
type keptCheckpoint struct {
	Log        string `json:"log"`            // the log file's absolute path
	Node       string `json:"node,omitempty"` // the host name of the process that wrote it
	Checkpoint string `json:"checkpoint"`     // the checkpoint record, without its newline
}

// auditKeeper is the auditchain.Keeper of one audit file: every checkpoint
// the chain writes (after it is synced) is kept in the running config's
// storage and, with checkpoint_copy, in that file. Keep hands it over
// without blocking the chain (it runs under the chain's lock, on the
// request path for a start checkpoint); one goroutine writes the latest,
// retries it until it is written or a newer one replaces it, and writes
// the last one (the stop checkpoint) before the file's chain closes.
type auditKeeper struct {
	log  string // the audit file's path
	node string

	copyPath atomic.Pointer[string] // the newest writer instance's checkpoint_copy, "" for none

	mu      sync.Mutex
	pending *auditchain.Anchor // the latest, not yet written
	held    certmagic.Storage  // the storage written last, kept open
	release func()             // releases held
	lastErr string

	kick chan struct{}
	stop chan struct{}
	done chan struct{}
}

func newAuditKeeper(log string) *auditKeeper {
	node, _ := os.Hostname()
	k := &auditKeeper{log: log, node: node, kick: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	empty := ""
	k.copyPath.Store(&empty)
	go k.run()
	return k
}

// Keep implements auditchain.Keeper. It takes hold of the running
// config's storage here, not in the goroutine: a stop checkpoint comes
// when no config runs any more, and goes where the last one kept.
func (k *auditKeeper) Keep(a auditchain.Anchor) {
	k.storage()
	k.mu.Lock()
	k.pending = &a
	k.mu.Unlock()
	select {
	case k.kick <- struct{}{}:
	default:
	}
}

// Latest implements auditchain.Keeper: of what the storage and the copy
// hold, the checkpoint of the highest seq (both are written by this
// writer, the copy maybe ahead of a storage that was down).
func (k *auditKeeper) Latest(chain string) (*auditchain.Anchor, error) {
	var best *auditchain.Anchor
	if st := k.storage(); st != nil {
		ctx, cancel := context.WithTimeout(context.Background(), keepReadTimeout)
		a, err := loadKeptCheckpoint(ctx, st, chain)
		cancel()
		if err != nil {
			return nil, err
		}
		best = a
	}
	if p := *k.copyPath.Load(); p != "" {
		if a, err := readCheckpointCopy(p); err == nil && a.Chain == chain && (best == nil || a.Seq > best.Seq) {
			best = a
		}
	}
	return best, nil
}

// Last implements auditchain.Keeper: the checkpoint written last to this
// log file, whatever its chain, from the storage and the copy.
func (k *auditKeeper) Last() (*auditchain.Anchor, error) {
	var best *auditchain.Anchor
	if st := k.storage(); st != nil {
		ctx, cancel := context.WithTimeout(context.Background(), keepReadTimeout)
		a, err := loadKept(ctx, st, auditLogKey(k.node, k.log))
		cancel()
		if err != nil {
			return nil, err
		}
		best = a
	}
	if p := *k.copyPath.Load(); p != "" {
		if a, err := readCheckpointCopy(p); err == nil && (best == nil || (a.Chain == best.Chain && a.Seq > best.Seq)) {
			best = a
		}
	}
	return best, nil
}

// loadKeptCheckpoint reads chain's latest checkpoint from st; nil when none
// is kept.
func loadKeptCheckpoint(ctx context.Context, st storage.Storage, chain string) (*auditchain.Anchor, error) {
	if !auditchain.ValidChainID(chain) {
		return nil, fmt.Errorf("%q is not an audit chain id (%d hex digits)", chain, auditchain.ChainIDLen)
	}
	return loadKept(ctx, st, auditCheckpointKey(chain))
}

// loadKept reads the checkpoint kept at key in st; nil when none is.
func loadKept(ctx context.Context, st storage.Storage, key string) (*auditchain.Anchor, error) {
	raw, err := st.Load(ctx, key)
	if storage.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", key, err)
	}
	kc, err := decodeKeptCheckpoint(raw, key)
	if err != nil {
		return nil, err
	}
	return auditchain.ParseAnchor([]byte(kc.Checkpoint), key+" in Caddy's storage")
}

func decodeKeptCheckpoint(raw []byte, key string) (keptCheckpoint, error) {
	var kc keptCheckpoint
	if err := json.Unmarshal(raw, &kc); err != nil {
		return kc, fmt.Errorf("%s is not a kept audit checkpoint: %v", key, err)
	}
	return kc, nil
}

// readCheckpointCopy reads a checkpoint_copy file.
func readCheckpointCopy(path string) (*auditchain.Anchor, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, keptCopyLimit+1))
	if err != nil {
		return nil, err
	}
	if len(b) > keptCopyLimit {
		return nil, fmt.Errorf("%s is over 1 MiB: no checkpoint is", path)
	}
	return auditchain.ParseAnchor(b, path)
}

// storage is the storage to keep checkpoints in: the running config's,
// held open (a cluster's NATS connection outlives its config until the
// keeper lets it go), or, with no config running (caddy stopping), the
// one held.
func (k *auditKeeper) storage() certmagic.Storage {
	var st certmagic.Storage
	if ctx := caddy.ActiveContext(); ctx.Context != nil {
		st = ctx.Storage()
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	// Before the first config runs, a record written while it is
	// provisioned (an OAuth client's state, say) opens the log: its
	// storage is set up by then, and without it the chain could not tell
	// a cut.
	if st == nil && k.held == nil {
		if ctx := auditProvisioning.Load(); ctx != nil {
			st = ctx.Storage()
		}
	}
	if st == nil || st == k.held {
		return k.held
	}
	if k.release != nil {
		k.release()
	}
	k.held, k.release = st, holdStorage(st)
	return st
}

func (k *auditKeeper) run() {
	defer close(k.done)
	var retry <-chan time.Time
	backoff := time.Second
	for {
		select {
		case <-k.kick:
		case <-retry:
		case <-k.stop:
			return
		}
		if err := k.flush(); err != nil {
			retry = time.After(backoff)
			backoff = min(2*backoff, keepRetryMax)
		} else {
			retry, backoff = nil, time.Second
		}
	}
}

// flush writes the pending checkpoint, if any.
func (k *auditKeeper) flush() error {
	k.mu.Lock()
	a := k.pending
	k.mu.Unlock()
	if a == nil {
		return nil
	}
	err := k.write(a)
	k.mu.Lock()
	defer k.mu.Unlock()
	// A checkpoint behind the kept one is never kept: trying again would
	// not change that.
	if (err == nil || errors.Is(err, errKeptAhead)) && k.pending == a {
		k.pending = nil
	}
	k.report(err)
	return err
}

// report logs a failure to keep a checkpoint when it differs from the last
// one, and a recovery. It goes to Caddy's log, not the audit log, which
// may be the very file whose checkpoints cannot be kept. k.mu is held.
func (k *auditKeeper) report(err error) {
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	if msg == k.lastErr {
		return
	}
	k.lastErr = msg
	l := caddy.Log().Named("zidane.audit_writer")
	if err != nil {
		l.Error("keeping the audit log's latest checkpoint outside it; retrying (audit verify will report the log cut before the checkpoint it finds, or find none)", zap.String("log", k.log), zap.Error(err))
	} else {
		l.Info("the audit log's latest checkpoint is kept outside it again", zap.String("log", k.log))
	}
}

// errKeptAhead is a checkpoint not kept because a later one of its chain
// is: the log was cut before this run, which its writer could not tell
// when it opened the file (the storage did not answer then).
var errKeptAhead = errors.New("the checkpoint kept outside the log is later than the one just written")

func (k *auditKeeper) write(a *auditchain.Anchor) error {
	var errs []error
	if st := k.storage(); st != nil {
		v, _ := json.Marshal(keptCheckpoint{Log: k.log, Node: k.node, Checkpoint: string(a.Line)})
		ctx, cancel := context.WithTimeout(context.Background(), keepWriteTimeout)
		err := keepForward(ctx, st, a, v)
		if err == nil {
			err = st.Store(ctx, auditLogKey(k.node, k.log), v)
		}
		cancel()
		if err != nil {
			errs = append(errs, fmt.Errorf("storing %s: %w", auditCheckpointKey(a.Chain), err))
		}
	} else {
		errs = append(errs, errors.New("no configuration runs yet: Caddy's storage is not known"))
	}
	if p := *k.copyPath.Load(); p != "" {
		if old, err := readCheckpointCopy(p); err == nil && old.Chain == a.Chain && (old.Seq > a.Seq || (old.Seq == a.Seq && old.Hash != a.Hash)) {
			errs = append(errs, fmt.Errorf("checkpoint_copy %s: %w (seq %d of chain %s): the log was cut before this run; audit verify --anchor reports it", p, errKeptAhead, old.Seq, a.Chain))
		} else if err := writeFileAtomic(p, append(a.Line, '\n')); err != nil {
			errs = append(errs, fmt.Errorf("checkpoint_copy %s: %w", p, err))
		}
	}
	return errors.Join(errs...)
}

// keepForward stores v, the value of checkpoint a, under a's chain, unless
// a later checkpoint of the chain is kept there: a kept checkpoint never
// goes back, so a log cut before a run that went on writing it still ends
// before (or differs at) the seq kept, which audit verify reports.
func keepForward(ctx context.Context, st storage.Storage, a *auditchain.Anchor, v []byte) error {
	kept, err := loadKept(ctx, st, auditCheckpointKey(a.Chain))
	if err != nil {
		return err
	}
	if kept != nil && (kept.Seq > a.Seq || (kept.Seq == a.Seq && kept.Hash != a.Hash)) {
		return fmt.Errorf("%w (seq %d of chain %s): the log was cut before this run; audit verify reports it", errKeptAhead, kept.Seq, a.Chain)
	}
	return st.Store(ctx, auditCheckpointKey(a.Chain), v)
}

// close writes the pending checkpoint (the stop checkpoint, written just
// before) and stops the goroutine; then it lets the storage go.
func (k *auditKeeper) close() {
	close(k.stop)
	<-k.done
	_ = k.flush()
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.release != nil {
		k.release()
		k.release, k.held = nil, nil
	}
}

// writeFileAtomic replaces the file at path with data: a reader sees the
// old content or the new, never a part.
func writeFileAtomic(path string, data []byte) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
	}
	return err
}

// holdStorage keeps st usable until release: for a cluster's storage, a
// reference on its NATS connection, which otherwise closes with the last
// config that uses it, maybe before the audit writer's last checkpoint
// (Caddy cleans a config's modules up in no set order). Other storages
// need nothing. st is the running config's: its zidane app names the
// connection's pool entry, which is built, so taking a reference never
// waits.
func holdStorage(st certmagic.Storage) (release func()) {
	cs, ok := st.(*cluster.Storage)
	app := liveApp()
	if !ok || app == nil || app.cluster != cs || app.clusterKey == "" {
		return func() {}
	}
	key := app.clusterKey
	if _, _, err := natsPool.LoadOrNew(key, func() (caddy.Destructor, error) {
		return nil, errors.New("the connection closed meanwhile")
	}); err != nil {
		return func() {}
	}
	var once sync.Once
	return func() { once.Do(func() { _, _ = natsPool.Delete(key) }) }
}

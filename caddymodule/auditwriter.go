package caddymodule

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/logging"
	"github.com/dustin/go-humanize"
	"go.uber.org/zap"

	"github.com/Tahul/caddy-zidane-mcp/auditchain"
	"github.com/Tahul/caddy-zidane-mcp/gatewayfiles"
)

func init() {
	caddy.RegisterModule(AuditWriter{})
}

// AuditSigningKeyEnv is the environment variable read for the audit log's
// signing key when signing_key is not set.
const AuditSigningKeyEnv = "ZIDANE_AUDIT_SIGNING_KEY"

// Bounds of the audit writer's options.
const (
	defaultCheckpointEvery = time.Minute
	minCheckpointEvery     = time.Second
	maxCheckpointEvery     = 24 * time.Hour
	maxRollSizeMB          = 1 << 20 // 1 TiB
	maxRollKeep            = 100000
	maxRollKeepDays        = 3650
)

// AuditWriter is the log writer `zidane_audit`: a file, rotated as Caddy's
// `file` writer rotates it, whose records are hash-chained (each carries a
// seq and the SHA-256 of the record before it) with a checkpoint signed
// with Ed25519 every CheckpointEvery and at every stop. Each checkpoint,
// once synced, is also kept outside the log: in the running config's
// storage under its chain id, and in CheckpointCopy (see auditKeeper).
// `caddy zidane audit verify` checks the log and compares its end with the
// kept checkpoint. See package auditchain for the format.
//
// One process writes one file: a configuration reloaded with the same file
// goes on with the same chain, its new options (key, interval, rotation)
// taking over after a checkpoint signed with the old key.
type AuditWriter struct {
	// Filename is the file to write. Placeholders of the environment are
	// replaced.
	Filename string `json:"filename,omitempty"`
	// Roll is false to never rotate the file.
	Roll *bool `json:"roll,omitempty"`
	// RollSizeMB, RollKeep, RollKeepDays and RollCompression are as for
	// Caddy's file writer: rotate at this size (default 100), keep this many
	// rotated files (default 10) for this many days (default 90),
	// compressed with none, gzip (the default) or zstd.
	RollSizeMB      int    `json:"roll_size_mb,omitempty"`
	RollKeep        int    `json:"roll_keep,omitempty"`
	RollKeepDays    int    `json:"roll_keep_days,omitempty"`
	RollCompression string `json:"roll_compression,omitempty"`
	// CheckpointEvery is how often a checkpoint is written, when records
	// were written since the last one. Default 1m; 1s to 24h.
	CheckpointEvery caddy.Duration `json:"checkpoint_every,omitempty"`
	// SigningKey is the Ed25519 signing key as a placeholder ({env.VAR},
	// read when the writer is provisioned, so that the key never sits in
	// the config); by default the environment variable
	// ZIDANE_AUDIT_SIGNING_KEY. The 32-byte seed in base64.
	SigningKey string `json:"signing_key,omitempty"`
	// CheckpointCopy is a file where the latest checkpoint is also kept,
	// replaced at each checkpoint, beside Caddy's storage, which keeps it
	// always: a place the log's writer's files are not, such as another
	// volume or a mount of another host, which `caddy zidane audit verify
	// --anchor` reads. It may not be in the log's directory. Placeholders
	// of the environment are replaced.
	CheckpointCopy string `json:"checkpoint_copy,omitempty"`

	path       string
	copyPath   string
	signer     *auditchain.Signer
	file       *auditFile
	releaseOwn func() // this writer's hold on agentDeny
}

// CaddyModule returns the Caddy module information.
func (AuditWriter) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "caddy.logging.writers.zidane_audit",
		New: func() caddy.Module { return new(AuditWriter) },
	}
}

// Provision checks the options, reads the signing key and attaches to the
// chain of the file.
func (w *AuditWriter) Provision(caddy.Context) error {
	if err := w.check(); err != nil {
		return fmt.Errorf("log writer zidane_audit: %w", err)
	}
	// The log is the evidence: its directory, which holds its rotated
	// files and lock, and the file its key may be read from, are no
	// agent's; nor is the directory of checkpoint_copy, where an agent
	// could put back an older checkpoint (the copy is replaced by a
	// rename in that directory).
	own := append(gatewayfiles.PlaceholderFiles(w), logDir(w.path, whyAuditLog))
	if w.copyPath != "" {
		own = append(own, logDir(w.copyPath, whyCheckpointCopy))
	}
	w.releaseOwn = agentDeny.Hold(own)
	attachAudit(w)
	return nil
}

func (w *AuditWriter) check() error {
	if strings.TrimSpace(w.Filename) == "" {
		return errors.New("file is missing: give the audit log's file, such as /var/log/caddy/zidane-audit.log")
	}
	name, err := caddy.NewReplacer().ReplaceOrErr(w.Filename, true, true)
	if err != nil {
		return fmt.Errorf("file %q: %v", w.Filename, err)
	}
	if w.path, err = caddy.FastAbs(name); err != nil {
		return fmt.Errorf("file %q: %v", name, err)
	}
	if st, err := os.Stat(w.path); err == nil && !st.Mode().IsRegular() {
		return fmt.Errorf("file %s is not a regular file: give the path of a file (it is created if missing)", w.path)
	}
	if err := w.checkCopy(); err != nil {
		return err
	}
	switch {
	case w.RollSizeMB < 0 || w.RollSizeMB > maxRollSizeMB:
		return fmt.Errorf("roll_size %d MiB: give a size such as 100MiB, at most 1TiB", w.RollSizeMB)
	case w.RollKeep < 0 || w.RollKeep > maxRollKeep:
		return fmt.Errorf("roll_keep %d: give a positive whole number, at most %d", w.RollKeep, maxRollKeep)
	case w.RollKeepDays < 0 || w.RollKeepDays > maxRollKeepDays:
		return fmt.Errorf("roll_keep_for %d days: give a positive duration such as 90d, at most %dd", w.RollKeepDays, maxRollKeepDays)
	}
	switch w.RollCompression {
	case "", "none", "gzip", "zstd":
	default:
		return fmt.Errorf("roll_compression %q: give none, gzip or zstd", w.RollCompression)
	}
	if d := time.Duration(w.CheckpointEvery); d != 0 && (d < minCheckpointEvery || d > maxCheckpointEvery) {
		return fmt.Errorf("checkpoint_every %v: give a duration from 1s to 24h, such as 1m", d)
	}
	if w.SigningKey != "" && !onePlaceholder.MatchString(w.SigningKey) {
		return literalError("signing_key", "{env.VAR} (or leave it out and set "+AuditSigningKeyEnv+")")
	}
	raw, where := w.SigningKey, "signing_key "+w.SigningKey
	if raw == "" {
		raw, where = os.Getenv(AuditSigningKeyEnv), AuditSigningKeyEnv
	} else {
		raw = caddy.NewReplacer().ReplaceKnown(raw, "")
	}
	if strings.TrimSpace(raw) == "" {
		return fmt.Errorf("signing_key: no audit signing key: %s is empty; set it in caddy's environment to 32 random bytes in base64 (`openssl rand -base64 32`), and keep `caddy zidane audit public-key` of it where you verify", where)
	}
	signer, err := auditchain.ParseSigningKey(raw)
	if err != nil {
		return fmt.Errorf("signing_key: %s %w", where, err)
	}
	w.signer = signer
	return nil
}

// checkCopy resolves checkpoint_copy, and refuses one where whoever can
// write the log can write it too.
func (w *AuditWriter) checkCopy() error {
	w.copyPath = ""
	if strings.TrimSpace(w.CheckpointCopy) == "" {
		return nil
	}
	name, err := caddy.NewReplacer().ReplaceOrErr(w.CheckpointCopy, true, true)
	if err != nil {
		return fmt.Errorf("checkpoint_copy %q: %v", w.CheckpointCopy, err)
	}
	if w.copyPath, err = caddy.FastAbs(name); err != nil {
		return fmt.Errorf("checkpoint_copy %q: %v", name, err)
	}
	if filepath.Dir(w.copyPath) == filepath.Dir(w.path) {
		return fmt.Errorf("checkpoint_copy %s is in the audit log's directory, where whoever can cut the log can change it too: put it in another directory, ideally on another volume", w.copyPath)
	}
	if st, err := os.Stat(w.copyPath); err == nil && !st.Mode().IsRegular() {
		return fmt.Errorf("checkpoint_copy %s is not a regular file: give the path of a file (it is created if missing)", w.copyPath)
	}
	return nil
}

func (w AuditWriter) String() string { return "zidane_audit " + w.path }

// WriterKey identifies the writer by its file and options: a reload that
// changes an option opens a new writer, which takes the file's chain over.
func (w AuditWriter) WriterKey() string {
	opts, _ := json.Marshal(w)
	key := ""
	if w.signer != nil {
		key = w.signer.KeyID() // the public key's id: the variable may change between reloads
	}
	return "zidane_audit:" + w.path + "\x00" + string(opts) + "\x00" + key
}

// OpenWriter returns the writer Caddy's logger writes to, which goes to
// the chain of the writer's file. The file itself is opened at the first
// record, so that a config that is only validated writes nothing.
//
// Caddy keeps the writers it opens in a pool by WriterKey and never closes
// them (the close that its logging registers is lost), so the chain's
// lifetime follows the module instances instead: Provision attaches one,
// Cleanup detaches it, and the last detach writes the stop checkpoint.
func (w *AuditWriter) OpenWriter() (io.WriteCloser, error) {
	if w.file == nil {
		return nil, errors.New("log writer zidane_audit: not provisioned")
	}
	h := &auditHandle{path: w.path}
	h.file.Store(w.file)
	return h, nil
}

// Cleanup detaches the instance from its file's chain.
func (w *AuditWriter) Cleanup() error {
	if w.releaseOwn != nil {
		w.releaseOwn()
		w.releaseOwn = nil
	}
	if w.file == nil {
		return nil
	}
	err := detachAudit(w)
	w.file = nil
	return err
}

func (w AuditWriter) every() time.Duration {
	if w.CheckpointEvery == 0 {
		return defaultCheckpointEvery
	}
	return time.Duration(w.CheckpointEvery)
}

// fileOptions are the options of the file under the chain.
func (w AuditWriter) fileOptions() string {
	return fmt.Sprint(w.Roll == nil || *w.Roll, w.RollSizeMB, w.RollKeep, w.RollKeepDays, w.RollCompression)
}

// openFile opens the file as Caddy's file writer does, rotation included.
func (w AuditWriter) openFile() (io.Writer, error) {
	fw := logging.FileWriter{
		Filename:        w.path,
		Roll:            w.Roll,
		RollSizeMB:      w.RollSizeMB,
		RollKeep:        w.RollKeep,
		RollKeepDays:    w.RollKeepDays,
		RollCompression: w.RollCompression,
	}
	return fw.OpenWriter()
}

// auditFiles are the chains this process writes, by file.
var (
	auditMu    sync.Mutex
	auditFiles = map[string]*auditFile{}
)

// auditFile is one file's chain and the writer instances attached to it;
// the newest instance's options are in force.
type auditFile struct {
	chain     *auditchain.Chain
	keeper    *auditKeeper // keeps each checkpoint outside the log
	instances []*AuditWriter
	unlock    func() // releases the file's lock; set under the chain's lock
	reset     chan time.Duration
	stop      chan struct{}
	done      chan struct{}
}

// auditHandle is what Caddy's logger writes to.
type auditHandle struct {
	path string
	file atomic.Pointer[auditFile]
}

// Write records p. Caddy may keep a handle past the chain it was opened
// on (its pool outlives configs): a handle whose chain has closed goes on
// with the file's chain of the config running now.
func (h *auditHandle) Write(p []byte) (int, error) {
	n, err := h.file.Load().chain.Write(p)
	if errors.Is(err, auditchain.ErrClosed) {
		auditMu.Lock()
		f := auditFiles[h.path]
		auditMu.Unlock()
		if f != nil {
			h.file.Store(f)
			return f.chain.Write(p)
		}
	}
	return n, err
}

// Close does nothing: the chain closes when its last instance is cleaned up.
func (h *auditHandle) Close() error { return nil }

func attachAudit(w *AuditWriter) {
	logTakeOver(attachAuditLocked(w))
}

func attachAuditLocked(w *AuditWriter) error {
	auditMu.Lock()
	defer auditMu.Unlock()
	var err error
	f := auditFiles[w.path]
	if f == nil {
		path := w.path
		f = &auditFile{
			reset: make(chan time.Duration, 1),
			stop:  make(chan struct{}),
			done:  make(chan struct{}),
		}
		// The lock is taken where the chain opens the file, at its first
		// record: a config that is only validated takes none.
		tail := func() (auditchain.Tail, error) {
			if f.unlock == nil {
				unlock, err := lockAuditFile(path)
				if err != nil {
					return auditchain.Tail{}, err
				}
				f.unlock = unlock
			}
			return auditchain.ReadChainTail(path)
		}
		f.chain = auditchain.New(w.openFile, tail, w.signer)
		f.keeper = newAuditKeeper(path)
		f.chain.SetKeeper(f.keeper)
		auditFiles[path] = f
		go f.tick(w.every())
	} else {
		err = f.takeOver(f.instances[len(f.instances)-1], w)
	}
	w.file = f
	f.instances = append(f.instances, w)
	f.keeper.copyPath.Store(&w.copyPath)
	return err
}

// logTakeOver logs what a take-over could not write, outside auditMu: the
// log it goes to may be this writer.
func logTakeOver(err error) {
	if err != nil {
		caddy.Log().Named("zidane.audit_writer").Error("handing the audit log over to the new configuration", zap.Error(err))
	}
}

func detachAudit(w *AuditWriter) error {
	err, takeOverErr := detachAuditLocked(w)
	logTakeOver(takeOverErr)
	return err
}

func detachAuditLocked(w *AuditWriter) (err, takeOverErr error) {
	auditMu.Lock()
	defer auditMu.Unlock()
	f := w.file
	i := slices.Index(f.instances, w)
	if i < 0 {
		return nil, nil
	}
	newest := i == len(f.instances)-1
	f.instances = slices.Delete(f.instances, i, i+1)
	if len(f.instances) == 0 {
		if auditFiles[w.path] == f {
			delete(auditFiles, w.path)
		}
		close(f.stop)
		<-f.done
		err := f.chain.Close()
		f.keeper.close() // the stop checkpoint is kept before the file's lock goes
		if f.unlock != nil {
			f.unlock()
		}
		return err, nil
	}
	if newest {
		next := f.instances[len(f.instances)-1]
		f.keeper.copyPath.Store(&next.copyPath)
		return nil, f.takeOver(w, next)
	}
	return nil, nil
}

// takeOver puts next's options in force after old's: a checkpoint signed
// with old's key first, then next's key, interval and file options.
func (f *auditFile) takeOver(old, next *AuditWriter) error {
	if old.signer.KeyID() == next.signer.KeyID() && old.every() == next.every() && old.fileOptions() == next.fileOptions() {
		return nil
	}
	var errs []error
	if err := f.chain.Checkpoint(auditchain.ReasonReload); err != nil {
		errs = append(errs, fmt.Errorf("the reload checkpoint of %s: %w", old.path, err))
	}
	f.chain.SetSigner(next.signer)
	if old.fileOptions() != next.fileOptions() {
		if err := f.chain.Reopen(next.openFile); err != nil {
			errs = append(errs, fmt.Errorf("reopening %s with its new options: %w", next.path, err))
		}
	}
	select {
	case <-f.reset:
	default:
	}
	f.reset <- next.every()
	return errors.Join(errs...)
}

// tick writes the interval checkpoints.
func (f *auditFile) tick(every time.Duration) {
	defer close(f.done)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-f.stop:
			return
		case d := <-f.reset:
			t.Reset(d)
		case <-t.C:
			if err := f.chain.Checkpoint(auditchain.ReasonInterval); err != nil {
				caddy.Log().Named("zidane.audit_writer").Error("writing an audit log checkpoint", zap.Error(err))
			}
		}
	}
}

// UnmarshalCaddyfile reads
//
//	output zidane_audit {
//		file             <path>
//		checkpoint_every <duration>
//		signing_key      {env.VAR}
//		roll_disabled
//		roll_size        <size>
//		roll_keep        <n>
//		roll_keep_for    <duration>
//		roll_compression none|gzip|zstd
//		checkpoint_copy  <path>
//	}
func (w *AuditWriter) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // the module name
	if d.NextArg() {
		return d.Err("zidane_audit takes no argument: give the file in its block, as `file <path>`")
	}
	one := func() (string, error) {
		name := d.Val()
		if !d.NextArg() {
			return "", d.Errf("%s takes one value", name)
		}
		v := d.Val()
		if d.NextArg() {
			return "", d.Errf("%s takes one value", name)
		}
		return v, nil
	}
	for d.NextBlock(0) {
		opt := d.Val()
		switch opt {
		case "file":
			v, err := one()
			if err != nil {
				return err
			}
			w.Filename = v
		case "checkpoint_every":
			v, err := one()
			if err != nil {
				return err
			}
			dur, perr := caddy.ParseDuration(v)
			if perr != nil || dur < minCheckpointEvery || dur > maxCheckpointEvery {
				return d.Errf("checkpoint_every %q: give a duration from 1s to 24h, such as 1m", v)
			}
			w.CheckpointEvery = caddy.Duration(dur)
		case "signing_key":
			v, err := one()
			if err != nil {
				return err
			}
			if !onePlaceholder.MatchString(v) {
				return d.Err(literalError("signing_key", "{env.VAR} (or leave it out and set "+AuditSigningKeyEnv+")").Error())
			}
			w.SigningKey = v
		case "checkpoint_copy":
			v, err := one()
			if err != nil {
				return err
			}
			w.CheckpointCopy = v
		case "roll_disabled":
			if d.NextArg() {
				return d.Err("roll_disabled takes no value")
			}
			off := false
			w.Roll = &off
		case "roll_size":
			v, err := one()
			if err != nil {
				return err
			}
			size, perr := humanize.ParseBytes(v)
			if perr != nil || size == 0 || strings.HasPrefix(v, "-") {
				return d.Errf("roll_size %q: give a size such as 100MiB", v)
			}
			if size > maxRollSizeMB*humanize.MiByte {
				return d.Errf("roll_size %q: at most 1TiB", v)
			}
			w.RollSizeMB = int(math.Ceil(float64(size) / humanize.MiByte))
		case "roll_keep":
			v, err := one()
			if err != nil {
				return err
			}
			n, perr := strconv.Atoi(v)
			if perr != nil || n < 1 || n > maxRollKeep {
				return d.Errf("roll_keep %q: give a positive whole number, at most %d", v, maxRollKeep)
			}
			w.RollKeep = n
		case "roll_keep_for":
			v, err := one()
			if err != nil {
				return err
			}
			dur, perr := caddy.ParseDuration(v)
			if perr != nil || dur <= 0 || dur > maxRollKeepDays*24*time.Hour {
				return d.Errf("roll_keep_for %q: give a positive duration such as 90d, at most %dd", v, maxRollKeepDays)
			}
			w.RollKeepDays = int(math.Ceil(dur.Hours() / 24))
		case "roll_compression":
			v, err := one()
			if err != nil {
				return err
			}
			switch v {
			case "none", "gzip", "zstd":
			default:
				return d.Errf("roll_compression %q: give none, gzip or zstd", v)
			}
			w.RollCompression = v
		default:
			return d.Errf("zidane_audit: unknown option %q; the options are file, checkpoint_every, signing_key, checkpoint_copy, roll_disabled, roll_size, roll_keep, roll_keep_for, roll_compression", opt)
		}
	}
	if w.Filename == "" {
		return d.Err("zidane_audit: file is missing: give the audit log's file, such as `file /var/log/caddy/zidane-audit.log`")
	}
	return nil
}

// Interface guards.
var (
	_ caddy.WriterOpener    = (*AuditWriter)(nil)
	_ caddy.Provisioner     = (*AuditWriter)(nil)
	_ caddy.CleanerUpper    = (*AuditWriter)(nil)
	_ caddyfile.Unmarshaler = (*AuditWriter)(nil)
)

package auditchain

import (
	"bytes"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"
)

// Reasons a checkpoint is written for.
const (
	ReasonStart    = "start"    // the chain (re)opens its file: a new chain, or a restart
	ReasonInterval = "interval" // the configured interval passed with records written
	ReasonReload   = "reload"   // the configuration changed (its key, its interval or its file options)
	ReasonStop     = "stop"     // the log closes
	ReasonRecover  = "recover"  // a write failed part-way, and the next one terminates what it left
)

// ErrClosed is what Write returns once the chain has closed.
var ErrClosed = errors.New("auditchain: the audit log is closed")

// Opener opens the file a chain writes to.
type Opener func() (io.Writer, error)

// Chain writes records to one file, chained. It is safe for concurrent use:
// writes are serialized, in the order they take its lock. It opens the
// file at the first record, or the first checkpoint, so that a
// configuration that is only validated writes nothing.
type Chain struct {
	mu      sync.Mutex
	open    Opener
	tail    func() (Tail, error)
	out     io.Writer
	opened  bool
	started bool // the start checkpoint is written
	closed  bool
	signer  *Signer
	keeper  Keeper
	now     func() time.Time
	id      string // the chain id; set when the file opens
	cut     *Cut   // for the start checkpoint: the file was cut before the kept checkpoint

	seq     uint64 // of the last record written; 0 before the first
	prev    Hash   // its hash
	dirty   int    // records since the last checkpoint
	partial *Partial
	buf     []byte
}

// New returns a chain that writes through open, signing with signer. tail
// reads the last record already in the file (see ReadTail), which the chain
// goes on from.
func New(open Opener, tail func() (Tail, error), signer *Signer) *Chain {
	return &Chain{open: open, tail: tail, signer: signer, now: time.Now}
}

// SetKeeper makes k keep each checkpoint outside the log, and makes the
// chain check, when it opens its file, that the file holds k's latest
// checkpoint of the chain. Set it before the first write.
func (c *Chain) SetKeeper(k Keeper) {
	c.mu.Lock()
	c.keeper = k
	c.mu.Unlock()
}

// SetSigner makes s sign the checkpoints from now on.
func (c *Chain) SetSigner(s *Signer) {
	c.mu.Lock()
	c.signer = s
	c.mu.Unlock()
}

// Write records one entry (one JSON object, as zap's JSON encoder writes
// it). It reports len(entry) written once the record is in the file.
func (c *Chain) Write(entry []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.ready(); err != nil {
		return 0, err
	}
	line := appendRecord(c.buf[:0], c.seq+1, c.prev, entry)
	if cap(line) <= 64<<10 {
		c.buf = line
	}
	if err := c.emit(line); err != nil {
		return 0, err
	}
	c.dirty++
	return len(entry), nil
}

// ready opens the file at first use, writes the start checkpoint, and
// after a failed write the checkpoint that acknowledges what it left.
func (c *Chain) ready() error {
	if c.closed {
		return ErrClosed
	}
	if !c.opened {
		tail, err := c.tail()
		if err != nil {
			return err
		}
		out, err := c.open()
		if err != nil {
			return err
		}
		c.out, c.opened = out, true
		c.seq, c.prev, c.partial = tail.Seq, tail.Hash, tail.Partial
		c.id = tail.Chain
		switch {
		case c.id != "":
			c.checkKept(tail)
		case tail.Seq == 0:
			c.id = newChainID()
			c.checkGone()
		default:
			c.id = newChainID() // a chain written before chains had ids
		}
	}
	if !c.started {
		if err := c.checkpoint(ReasonStart, c.seq == 0); err != nil {
			return err
		}
		c.started = true
		return nil
	}
	if c.partial != nil {
		return c.checkpoint(ReasonRecover, false)
	}
	return nil
}

// checkKept compares the file's end with the latest checkpoint kept of the
// chain: a file that ends before it, or holds another record at its seq,
// was cut while no process wrote it, and the start checkpoint says so.
// (A kept checkpoint before the file's end is not read back from the
// file: Verify compares it.) When the keeper cannot tell, nothing is said.
func (c *Chain) checkKept(tail Tail) {
	if c.keeper == nil {
		return
	}
	a, err := c.keeper.Latest(c.id)
	if err != nil || a == nil || a.Chain != c.id {
		return
	}
	if a.Seq > tail.Seq || (a.Seq == tail.Seq && a.Hash != tail.Hash) {
		c.cut = &Cut{Kept: a.Seq}
	}
}

// checkGone asks, for a log with no record, whether a checkpoint of it is
// kept: then its files were removed while no process wrote them, and the
// genesis checkpoint of the new chain says so. When the keeper cannot
// tell, nothing is said.
func (c *Chain) checkGone() {
	if c.keeper == nil {
		return
	}
	a, err := c.keeper.Last()
	if err != nil || a == nil || a.Chain == c.id {
		return
	}
	c.cut = &Cut{Kept: a.Seq, Chain: a.Chain}
}

// emit writes line (with its newline) and advances the chain to it.
func (c *Chain) emit(line []byte) error {
	n, err := c.out.Write(line)
	if err == nil && n < len(line) {
		err = io.ErrShortWrite
	}
	if err != nil {
		if n > 0 {
			// What reached the file is a remnant the next record must
			// terminate and a checkpoint acknowledge.
			c.partial = partialOf(line[:min(n, len(line)-1)])
		}
		return fmt.Errorf("auditchain: writing record %d: %w", c.seq+1, err)
	}
	c.seq++
	c.prev = HashLine(line[:len(line)-1])
	return nil
}

// checkpoint writes a signed checkpoint record. genesis starts a chain.
func (c *Chain) checkpoint(reason string, genesis bool) error {
	if c.signer == nil {
		return errors.New("auditchain: no signing key")
	}
	cp := checkpoint{TS: c.now().UTC().Format(time.RFC3339Nano), Reason: reason, KeyID: c.signer.id, Chain: c.id, Genesis: genesis, Partial: c.partial, Cut: c.cut}
	cpJSON, err := json.Marshal(cp)
	if err != nil {
		return err
	}
	var line []byte
	if c.partial != nil {
		line = append(line, '\n') // terminates the remnant
	}
	start := len(line)
	line = appendPrefix(line, c.seq+1, c.prev)
	line = append(line, ","+checkpointKey...)
	line = append(line, cpJSON...)
	line = append(line, '}')
	sig := ed25519.Sign(c.signer.priv, append([]byte(signContext), line[start:]...))
	line = append(line[:len(line)-1], sigKey...)
	line = base64Std.AppendEncode(line, sig)
	line = append(line, `"}`...)
	line = append(line, '\n')
	n, err := c.out.Write(line)
	if err == nil && n < len(line) {
		err = io.ErrShortWrite
	}
	if err != nil {
		if n > start {
			// The remnant is now terminated; what this write left is one.
			c.partial = partialOf(line[start:min(n, len(line)-1)])
		}
		return fmt.Errorf("auditchain: writing checkpoint %d: %w", c.seq+1, err)
	}
	c.partial, c.cut = nil, nil
	c.seq++
	c.prev = HashLine(line[start : len(line)-1])
	c.dirty = 0
	// What a checkpoint vouches for is on the disk before it counts, and
	// before it is kept elsewhere: a kept checkpoint is never ahead of the
	// file.
	if s, ok := c.out.(interface{ Sync() error }); ok {
		if err := s.Sync(); err != nil {
			return fmt.Errorf("auditchain: syncing checkpoint %d: %w", c.seq, err)
		}
	}
	if c.keeper != nil {
		c.keeper.Keep(Anchor{Chain: c.id, Seq: c.seq, Hash: c.prev, Line: bytes.Clone(line[start : len(line)-1])})
	}
	return nil
}

// Checkpoint writes a checkpoint now, for reason, if records were written
// since the last one (or, for any reason but ReasonInterval, if the file is
// open at all).
func (c *Chain) Checkpoint(reason string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || !c.opened || (reason == ReasonInterval && c.dirty == 0 && c.partial == nil) {
		return nil
	}
	return c.checkpoint(reason, false)
}

// Reopen replaces the file the chain writes to (its options changed),
// closing the old one; the chain goes on in the new one.
func (c *Chain) Reopen(open Opener) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return ErrClosed
	}
	c.open = open
	if !c.opened {
		return nil
	}
	out, err := open()
	if err != nil {
		return err
	}
	if cl, ok := c.out.(io.Closer); ok {
		_ = cl.Close()
	}
	c.out = out
	return nil
}

// Close writes the stop checkpoint (if the file was ever opened) and closes
// the file. Writes after it fail with ErrClosed.
func (c *Chain) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	if !c.opened {
		return nil
	}
	err := c.checkpoint(ReasonStop, false)
	if cl, ok := c.out.(io.Closer); ok {
		err = errors.Join(err, cl.Close())
	}
	return err
}

// ID is the chain id, once the file is open; "" before.
func (c *Chain) ID() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.id
}

// Head is the seq and hash of the last record written.
func (c *Chain) Head() (uint64, Hash) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.seq, c.prev
}

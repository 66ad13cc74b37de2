package auditchain

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"crypto/ed25519"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/klauspost/compress/zstd"
)

// Source is one file of a chain, opened from its start at each Open.
type Source struct {
	Name string
	Open func() (io.ReadCloser, error)
}

// FileSource reads the file at path, gzip- or zstd-compressed (as rotation
// leaves old files) or not: the content tells.
func FileSource(path string) Source {
	return Source{Name: path, Open: func() (io.ReadCloser, error) {
		f, err := os.Open(path)
		if err != nil {
			return nil, err
		}
		st, err := f.Stat()
		if err == nil && !st.Mode().IsRegular() {
			err = fmt.Errorf("%s is not a regular file", path)
		}
		if err != nil {
			f.Close()
			return nil, err
		}
		br := bufio.NewReaderSize(f, 64<<10)
		magic, _ := br.Peek(4)
		switch {
		case bytes.HasPrefix(magic, []byte{0x1f, 0x8b}):
			zr, err := gzip.NewReader(br)
			if err != nil {
				f.Close()
				return nil, fmt.Errorf("%s: %v", path, err)
			}
			return readCloser{zr, func() error { zr.Close(); return f.Close() }}, nil
		case bytes.Equal(magic, []byte{0x28, 0xb5, 0x2f, 0xfd}):
			zr, err := zstd.NewReader(br, zstd.WithDecoderMaxMemory(256<<20), zstd.WithDecoderConcurrency(1))
			if err != nil {
				f.Close()
				return nil, fmt.Errorf("%s: %v", path, err)
			}
			return readCloser{zr, func() error { zr.Close(); return f.Close() }}, nil
		}
		return readCloser{br, f.Close}, nil
	}}
}

type readCloser struct {
	io.Reader
	close func() error
}

func (r readCloser) Close() error { return r.close() }

// Location is a line of a file.
type Location struct {
	File string
	Line int
}

func (l Location) String() string { return fmt.Sprintf("%s:%d", filepath.Clean(l.File), l.Line) }

// Kinds of Failure.
const (
	KindRemoved   = "removed"
	KindReordered = "reordered"
	KindChanged   = "changed"
	KindSignature = "signature"
	KindTruncated = "truncated"
	KindStart     = "start"
	KindCut       = "cut"
)

// Failure is the first place where the chain does not hold.
type Failure struct {
	At   Location
	Seq  uint64 // the seq of the record at At, when it has one
	Kind string
	Msg  string
}

func (f *Failure) Error() string {
	if f.Seq > 0 {
		return fmt.Sprintf("%s: seq %d: %s", f.At, f.Seq, f.Msg)
	}
	return fmt.Sprintf("%s: %s", f.At, f.Msg)
}

// Options of Verify.
type Options struct {
	// Keys verify the checkpoints; each checkpoint names its key's id.
	Keys []ed25519.PublicKey
	// Partial accepts a chain that begins after seq 1, as one does once
	// rotation has deleted its oldest files. Without it, the first record
	// must be the genesis checkpoint.
	Partial bool
	// Anchor, when set, returns the chain's latest checkpoint kept outside
	// the log (nil when none is kept). Verify calls it once, with the
	// chain id of the first checkpoint that names one, checks its
	// signature, and fails when the log ends before it (KindCut) or holds
	// another record at its seq. An error it returns ends Verify.
	Anchor func(chain string) (*Anchor, error)
}

// Report is what Verify found in a chain that holds.
type Report struct {
	Files       []string // in the order of the chain
	Empty       []string // files given that hold no record
	Records     int
	First, Last uint64
	Checkpoints int
	KeyIDs      []string // of the keys that signed checkpoints, in order of first use
	// LastCheckpoint is the last checkpoint's place, seq and reason.
	LastCheckpoint       Location
	LastCheckpointSeq    uint64
	LastCheckpointReason string
	// Unsigned is how many records follow the last checkpoint.
	Unsigned int
	// Recovered lists the remnants of cut-short writes that a checkpoint
	// acknowledged.
	Recovered []Location
	// Chain is the chain id the checkpoints name ("" for a log written
	// before checkpoints named one).
	Chain string
	// Anchor is the checkpoint kept outside the log that Options.Anchor
	// gave, and AnchorAt the record of the log it is. AnchorBefore: it
	// lies before the first record given (--partial), so it could not be
	// compared. CheckpointsAfter counts the log's checkpoints after it
	// (written after it was kept, or it lags).
	Anchor           *Anchor
	AnchorAt         Location
	AnchorBefore     bool
	CheckpointsAfter int
}

// Verify checks the chain across srcs, which it orders by the seq of their
// first record. It returns a *Failure naming the first record that was
// removed, reordered or changed, or that a crash cut short, or the first
// checkpoint whose signature fails.
func Verify(srcs []Source, opts Options) (*Report, error) {
	keys := map[string]ed25519.PublicKey{}
	for _, k := range opts.Keys {
		keys[KeyID(k)] = k
	}
	rep := &Report{}
	var ordered []Source
	firsts := map[string]uint64{}
	for _, s := range srcs {
		seq, loc, ok, err := firstSeq(s)
		if err != nil {
			return nil, err
		}
		if !ok {
			rep.Empty = append(rep.Empty, s.Name)
			continue
		}
		if seq == 0 {
			return nil, &Failure{At: loc, Kind: KindChanged, Msg: "the first line is not an audit record, so the file cannot be put in order"}
		}
		firsts[s.Name] = seq
		ordered = append(ordered, s)
	}
	sort.SliceStable(ordered, func(i, j int) bool { return firsts[ordered[i].Name] < firsts[ordered[j].Name] })
	for _, s := range ordered {
		rep.Files = append(rep.Files, s.Name)
	}
	v := &verifier{keys: keys, opts: opts, rep: rep, srcs: ordered}
	lr := newLineReader(ordered)
	defer lr.close()
	for {
		l, ok, err := lr.next()
		if err != nil {
			return nil, err
		}
		if !ok {
			break
		}
		if f := v.line(l); f != nil {
			return nil, f
		}
		if v.err != nil {
			return nil, v.err
		}
	}
	if f := v.end(); f != nil {
		return nil, f
	}
	return rep, nil
}

// firstSeq reads the seq of a source's first record; ok is false for a
// file without lines, and seq 0 means its first line is no record.
func firstSeq(s Source) (seq uint64, loc Location, ok bool, err error) {
	lr := newLineReader([]Source{s})
	defer lr.close()
	for {
		l, more, err := lr.next()
		if err != nil {
			return 0, loc, false, err
		}
		if !more {
			return 0, loc, loc.Line > 0, nil
		}
		if len(l.b) == 0 && l.terminated && l.loc.Line == 1 {
			continue // the newline that terminates a remnant of the file before
		}
		seq, _, _, perr := parsePrefix(l.b)
		if perr == nil {
			return seq, l.loc, true, nil
		}
		// A record cut short, at the start of a file: the checkpoint that
		// acknowledges it, next, takes its seq.
		if loc.Line == 0 && l.terminated {
			loc = l.loc
			continue
		}
		if loc.Line == 0 {
			// The file is one record cut short (a crash in its first
			// write): it goes last, where Verify says so.
			return math.MaxUint64, l.loc, true, nil
		}
		if loc.Line == 0 {
			loc = l.loc
		}
		return 0, loc, true, nil
	}
}

type rawLine struct {
	loc        Location
	src        int // index of its source
	b          []byte
	terminated bool
}

type lineReader struct {
	srcs []Source
	i    int
	rc   io.ReadCloser
	br   *bufio.Reader
	line int
	buf  []byte
}

func newLineReader(srcs []Source) *lineReader { return &lineReader{srcs: srcs, i: -1} }

func (r *lineReader) close() {
	if r.rc != nil {
		r.rc.Close()
		r.rc = nil
	}
}

// next returns the next line of the sources; its bytes are valid until the
// next call.
func (r *lineReader) next() (rawLine, bool, error) {
	for {
		if r.rc == nil {
			r.i++
			if r.i >= len(r.srcs) {
				return rawLine{}, false, nil
			}
			rc, err := r.srcs[r.i].Open()
			if err != nil {
				return rawLine{}, false, err
			}
			r.rc, r.br, r.line = rc, bufio.NewReaderSize(rc, 64<<10), 0
		}
		r.buf = r.buf[:0]
		for {
			chunk, err := r.br.ReadSlice('\n')
			r.buf = append(r.buf, chunk...)
			if len(r.buf) > MaxLine+1 {
				return rawLine{}, false, &Failure{At: Location{r.srcs[r.i].Name, r.line + 1}, Kind: KindChanged,
					Msg: fmt.Sprintf("a line longer than %d bytes: no audit record is", MaxLine)}
			}
			if err == bufio.ErrBufferFull {
				continue
			}
			if err != nil && err != io.EOF {
				return rawLine{}, false, fmt.Errorf("reading %s: %w", r.srcs[r.i].Name, err)
			}
			break
		}
		if len(r.buf) == 0 {
			r.close()
			continue
		}
		r.line++
		l := rawLine{loc: Location{r.srcs[r.i].Name, r.line}, src: r.i, b: r.buf}
		if r.buf[len(r.buf)-1] == '\n' {
			l.b, l.terminated = r.buf[:len(r.buf)-1], true
		}
		return l, true, nil
	}
}

// verifier holds the state of the chain as Verify reads it.
type verifier struct {
	keys map[string]ed25519.PublicKey
	opts Options
	rep  *Report
	srcs []Source

	have bool
	seq  uint64
	hash Hash
	loc  Location
	src  int

	// last is the state before the last record accepted, and that
	// record's bytes as a remnant, for a checkpoint that acknowledges it.
	last *undo
	// held is a line that is no record, or is cut short, kept until the
	// next line tells whether a checkpoint acknowledges it.
	held *heldLine
	// mismatch is a record whose prev is not the hash of the record before
	// it; the next record tells which of the two was changed.
	mismatch *mismatch
	// prevUnterminated: the line before ended its file without a newline.
	prevUnterminated bool
	// anchorSeen: the record of the kept checkpoint was read, and holds.
	anchorSeen bool
	// err is an error of Options.Anchor, or of what it gave.
	err error
}

type undo struct {
	have    bool
	seq     uint64
	hash    Hash
	loc     Location
	src     int
	remnant *Partial
	unsign  int
	records int
}

type heldLine struct {
	loc        Location
	remnant    *Partial
	terminated bool
	err        error
	seq        uint64
}

type mismatch struct {
	prevLoc, loc Location
	prevSeq, seq uint64
}

func (v *verifier) line(l rawLine) *Failure {
	if v.prevUnterminated && l.loc.Line == 1 && len(l.b) == 0 && l.terminated {
		v.prevUnterminated = false
		return nil // the newline that terminates the remnant of the file before
	}
	v.prevUnterminated = !l.terminated
	p, perr := parseLine(l.b)
	if v.held != nil {
		h := v.held
		v.held = nil
		if perr != nil || p.cp == nil || p.cp.Partial == nil || *p.cp.Partial != *h.remnant {
			return h.failure()
		}
		v.rep.Recovered = append(v.rep.Recovered, h.loc)
		return v.record(l, p, true)
	}
	if perr != nil || !l.terminated {
		seq := leadingSeq(l.b)
		v.held = &heldLine{loc: l.loc, remnant: partialOf(l.b), terminated: l.terminated, err: perr, seq: seq}
		return nil
	}
	if p.cp != nil && p.cp.Partial != nil {
		// The record before this checkpoint was cut short by a failed
		// write, though what reached the file reads as a whole record.
		if v.last == nil || *v.last.remnant != *p.cp.Partial {
			return &Failure{At: l.loc, Seq: p.seq, Kind: KindChanged, Msg: "this checkpoint acknowledges a cut-short record that is not the line before it"}
		}
		v.rep.Recovered = append(v.rep.Recovered, v.loc)
		v.restore(*v.last)
		return v.record(l, p, true)
	}
	return v.record(l, p, false)
}

// leadingSeq is the seq a line begins with, or 0.
func leadingSeq(b []byte) uint64 {
	rest, ok := bytes.CutPrefix(b, []byte(seqKey))
	if !ok {
		return 0
	}
	var n uint64
	for i, c := range rest {
		if c < '0' || c > '9' || i >= 19 {
			break
		}
		n = n*10 + uint64(c-'0')
	}
	return n
}

func (h *heldLine) failure() *Failure {
	f := &Failure{At: h.loc, Seq: h.seq, Kind: KindChanged}
	switch {
	case !h.terminated:
		f.Kind = KindTruncated
		f.Msg = fmt.Sprintf("the line is cut short (%d bytes without a newline): caddy stopped mid-write (a crash, a full disk), or something cut the file; every record before it verifies", h.remnant.Bytes)
	default:
		f.Msg = fmt.Sprintf("not an audit record (%v): the line was changed, or is a write cut short that no checkpoint acknowledges", h.err)
	}
	return f
}

func (v *verifier) restore(u undo) {
	v.have, v.seq, v.hash, v.loc, v.src = u.have, u.seq, u.hash, u.loc, u.src
	v.rep.Unsigned, v.rep.Records = u.unsign, u.records
	v.last = nil
}

// record checks one record against the chain so far and accepts it.
func (v *verifier) record(l rawLine, p parsed, acked bool) *Failure {
	fail := func(kind, format string, args ...any) *Failure {
		return &Failure{At: l.loc, Seq: p.seq, Kind: kind, Msg: fmt.Sprintf(format, args...)}
	}
	sigOK := false
	if p.cp != nil {
		key, ok := v.keys[p.cp.KeyID]
		if !ok {
			return fail(KindSignature, "the checkpoint is signed by key %s, which no --public-key given is (they are %s)", p.cp.KeyID, v.keyIDs())
		}
		sigOK = ed25519.Verify(key, append([]byte(signContext), p.body...), p.sig)
	}
	if m := v.mismatch; m != nil {
		v.mismatch = nil
		if p.prev == v.hash {
			return &Failure{At: m.prevLoc, Seq: m.prevSeq, Kind: KindChanged, Msg: fmt.Sprintf("the record was changed: its hash is not the prev that seq %d (%s) carries", m.seq, m.loc)}
		}
		return &Failure{At: m.loc, Seq: m.seq, Kind: KindChanged, Msg: fmt.Sprintf("the record was changed: its prev is not the hash of seq %d (%s), and its own hash is not the prev of the record after it (its prev was edited, or seq %d was changed too)", m.prevSeq, m.prevLoc, m.prevSeq)}
	}
	if !v.have {
		switch {
		case p.prev == Genesis && (p.seq != 1 || p.cp == nil || !p.cp.Genesis):
			return fail(KindChanged, "the record chains from genesis but is not the genesis checkpoint of seq 1")
		case p.prev != Genesis && p.seq == 1:
			return fail(KindChanged, "seq 1 does not chain from genesis")
		case p.prev != Genesis && !v.opts.Partial:
			return fail(KindStart, "the first record given is seq %d, not the chain's first (seq 1): seqs 1 to %d are not in the files given (rotated away, or removed); give the older files too, or pass --partial to verify from seq %d on", p.seq, p.seq-1, p.seq)
		}
		v.rep.First = p.seq
	} else {
		linked := p.prev == v.hash
		switch {
		case linked && p.seq == v.seq+1:
		case linked:
			return fail(KindChanged, "its seq was changed: it chains from seq %d (%s), so it is seq %d", v.seq, v.loc, v.seq+1)
		case p.seq == v.seq+1 && sigOK:
			return &Failure{At: v.loc, Seq: v.seq, Kind: KindChanged, Msg: fmt.Sprintf("the record was changed: its hash is not the prev that the checkpoint of seq %d (%s) carries", p.seq, l.loc)}
		case p.seq == v.seq+1:
			v.mismatch = &mismatch{prevLoc: v.loc, prevSeq: v.seq, loc: l.loc, seq: p.seq}
		case p.seq > v.seq+1:
			want := v.seq + 1
			if at, ok := v.find(want, l); ok {
				return fail(KindReordered, "records are out of order: seq %d comes after seq %d (%s), and seq %d is later, at %s", p.seq, v.seq, v.loc, want, at)
			}
			if want == p.seq-1 {
				return fail(KindRemoved, "seq %d was removed: it is missing between seq %d (%s) and this record", want, v.seq, v.loc)
			}
			return fail(KindRemoved, "seqs %d to %d were removed: they are missing between seq %d (%s) and this record", want, p.seq-1, v.seq, v.loc)
		default:
			return fail(KindReordered, "records are out of order: seq %d comes after seq %d (%s); records were moved or repeated, or the files given belong to different chains", p.seq, v.seq, v.loc)
		}
	}
	if p.cp != nil && !sigOK {
		return fail(KindSignature, "the checkpoint's signature does not verify with key %s: the checkpoint was changed, or records before it were changed and the chain recomputed", p.cp.KeyID)
	}
	if p.cp != nil && p.cp.Partial != nil && !acked {
		return fail(KindChanged, "this checkpoint acknowledges a cut-short record that is not the line before it")
	}
	v.last = &undo{have: v.have, seq: v.seq, hash: v.hash, loc: v.loc, src: v.src, remnant: partialOf(l.b), unsign: v.rep.Unsigned, records: v.rep.Records}
	v.have, v.seq, v.hash, v.loc, v.src = true, p.seq, HashLine(l.b), l.loc, l.src
	v.rep.Records++
	v.rep.Last = p.seq
	if p.cp != nil {
		if f := v.chainOf(l, p); f != nil {
			return f
		}
	}
	if f := v.matchAnchor(l, p); f != nil {
		return f
	}
	if p.cp != nil {
		v.rep.Checkpoints++
		v.rep.LastCheckpoint, v.rep.LastCheckpointSeq, v.rep.LastCheckpointReason = l.loc, p.seq, p.cp.Reason
		v.rep.Unsigned = 0
		if len(v.rep.KeyIDs) == 0 || v.rep.KeyIDs[len(v.rep.KeyIDs)-1] != p.cp.KeyID {
			v.rep.KeyIDs = append(v.rep.KeyIDs, p.cp.KeyID)
		}
	} else {
		v.rep.Unsigned++
	}
	return nil
}

// chainOf checks the chain id a checkpoint names, and at the first one
// looks up the checkpoint kept outside the log. A start checkpoint that
// says its file was found cut is a failure of its own.
func (v *verifier) chainOf(l rawLine, p parsed) *Failure {
	if c := p.cp.Cut; c != nil {
		f := &Failure{At: l.loc, Seq: p.seq, Kind: KindCut}
		switch {
		case c.Chain != "" && c.Chain != p.cp.Chain:
			f.Msg = fmt.Sprintf("caddy found no record of the log when it began it again here, as a new chain: the latest checkpoint kept of it outside the log is seq %d of chain %s; expected seq 1 to %d of that chain, which were removed before this run, with every file that held them", c.Kept, c.Chain, c.Kept)
		case c.Kept >= p.seq:
			f.Msg = fmt.Sprintf("caddy found the log cut when it went on writing it here: it ended at seq %d, but the latest checkpoint kept outside the log was seq %d; expected seq %d to %d, which were removed before this run (this run numbers on from seq %d)", p.seq-1, c.Kept, p.seq, c.Kept, p.seq)
		default:
			f.Msg = fmt.Sprintf("caddy found the log rewritten when it went on writing it here: its seq %d was not the checkpoint kept outside the log; expected that checkpoint as seq %d", c.Kept, c.Kept)
		}
		return f
	}
	id := p.cp.Chain
	switch {
	case id == "":
		return nil // written before checkpoints named their chain
	case v.rep.Chain != "" && id != v.rep.Chain:
		return &Failure{At: l.loc, Seq: p.seq, Kind: KindChanged, Msg: fmt.Sprintf("this checkpoint names chain %s, and the checkpoints before it chain %s: the files given hold two logs put together", id, v.rep.Chain)}
	case v.rep.Chain != "":
		return nil
	}
	v.rep.Chain = id
	if v.opts.Anchor == nil {
		return nil
	}
	a, err := v.opts.Anchor(id)
	if err != nil {
		v.err = err
		return nil
	}
	if a == nil {
		return nil
	}
	if a.Chain != id {
		v.err = fmt.Errorf("the checkpoint kept in %s is of chain %s, and this log's checkpoints name chain %s: it is another log's", a.From, a.Chain, id)
		return nil
	}
	if err := a.verify(v.keys); err != nil {
		v.err = err
		return nil
	}
	v.rep.Anchor = a
	switch {
	case a.Seq < v.rep.First:
		v.rep.AnchorBefore = true
	case a.Seq < p.seq:
		return &Failure{At: l.loc, Seq: p.seq, Kind: KindChanged, Msg: fmt.Sprintf("the checkpoint kept in %s is seq %d, before the first checkpoint of its chain in the log (this one): the log was rewritten", a.From, a.Seq)}
	}
	return nil
}

// matchAnchor compares the record of the kept checkpoint's seq with it,
// and counts the checkpoints after it.
func (v *verifier) matchAnchor(l rawLine, p parsed) *Failure {
	a := v.rep.Anchor
	switch {
	case a == nil || v.rep.AnchorBefore:
	case v.anchorSeen:
		if p.cp != nil {
			v.rep.CheckpointsAfter++
		}
	case p.seq == a.Seq:
		if HashLine(l.b) != a.Hash {
			return &Failure{At: l.loc, Seq: p.seq, Kind: KindChanged, Msg: fmt.Sprintf("the record is not the checkpoint of seq %d kept in %s: the log was rewritten from here, or before", a.Seq, a.From)}
		}
		v.anchorSeen, v.rep.AnchorAt = true, l.loc
	}
	return nil
}

// keyIDs lists the ids of the keys given.
func (v *verifier) keyIDs() string {
	ids := make([]string, 0, len(v.keys))
	for id := range v.keys {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	if len(ids) == 0 {
		return "none"
	}
	return strings.Join(ids, ", ")
}

// find looks for the record of seq after the line at (and not before)
// from, reading the sources again from there.
func (v *verifier) find(seq uint64, from rawLine) (Location, bool) {
	lr := newLineReader(v.srcs[from.src:])
	defer lr.close()
	for {
		l, ok, err := lr.next()
		if err != nil || !ok {
			return Location{}, false
		}
		if l.src == 0 && l.loc.Line <= from.loc.Line {
			continue
		}
		if s, _, _, err := parsePrefix(l.b); err == nil && s == seq {
			return l.loc, true
		}
	}
}

func (v *verifier) end() *Failure {
	// A line that is no record fails as such; a cut mid-line, or after a
	// whole line, before the kept checkpoint is a cut.
	if h := v.held; h != nil && h.terminated {
		return h.failure()
	}
	if m := v.mismatch; m != nil && v.held == nil {
		return &Failure{At: m.loc, Seq: m.seq, Kind: KindChanged, Msg: fmt.Sprintf("the chain breaks here: its prev is not the hash of seq %d (%s); one of the two was changed", m.prevSeq, m.prevLoc)}
	}
	if a := v.rep.Anchor; a != nil && !v.rep.AnchorBefore && !v.anchorSeen {
		f := &Failure{At: v.loc, Kind: KindCut, Msg: fmt.Sprintf("the log was cut: it ends at seq %d, but the latest checkpoint kept in %s is seq %d; expected seq %d next (seqs %d to %d at least were removed)", v.seq, a.From, a.Seq, v.seq+1, v.seq+1, a.Seq)}
		if h := v.held; h != nil {
			f.At = h.loc
			f.Msg = fmt.Sprintf("the log was cut in the middle of a line (this one, %d bytes without a newline): it ends at seq %d, but the latest checkpoint kept in %s is seq %d; expected seq %d next (seqs %d to %d at least were removed)", h.remnant.Bytes, v.seq, a.From, a.Seq, v.seq+1, v.seq+1, a.Seq)
		}
		return f
	}
	if h := v.held; h != nil {
		return h.failure()
	}
	return nil
}

// ErrNoRecords is what a caller may report when no file held a record.
var ErrNoRecords = errors.New("no audit record in the files given")

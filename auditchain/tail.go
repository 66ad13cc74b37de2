package auditchain

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// Tail is where a file's chain ends: the seq and hash of its last record
// (zero for a file with none), the bytes after it that a crash cut short,
// if any, and the chain id its last checkpoint names ("" when it names
// none, or the file holds no checkpoint).
type Tail struct {
	Seq     uint64
	Hash    Hash
	Partial *Partial
	Chain   string

	checkpoints bool // the file holds a checkpoint
}

// ReadTail reads the end of the file at path. A missing or empty file has
// the zero Tail. It reads back from the end, at most 2×MaxLine bytes.
func ReadTail(path string) (Tail, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return Tail{}, nil
	}
	if err != nil {
		return Tail{}, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return Tail{}, err
	}
	if !st.Mode().IsRegular() {
		return Tail{}, fmt.Errorf("%s is not a regular file", path)
	}
	size := st.Size()
	if size == 0 {
		return Tail{}, nil
	}
	// Read back in growing chunks until the last complete line is whole.
	chunk := int64(64 << 10)
	for {
		n := min(chunk, size)
		buf := make([]byte, n)
		if _, err := f.ReadAt(buf, size-n); err != nil && err != io.EOF {
			return Tail{}, err
		}
		var t Tail
		body := buf
		if buf[len(buf)-1] != '\n' {
			i := bytes.LastIndexByte(buf, '\n')
			if i < 0 && n < size {
				if chunk >= 2*MaxLine {
					return Tail{}, fmt.Errorf("%s ends with a line longer than %d bytes: it is not an audit log this writer wrote", path, MaxLine)
				}
				chunk *= 2
				continue
			}
			t.Partial = partialOf(buf[i+1:])
			body = buf[:i+1]
		}
		if len(body) == 0 {
			return t, nil // only a remnant: the chain starts anew after it
		}
		line := body[:len(body)-1]
		start := bytes.LastIndexByte(line, '\n')
		if start < 0 && n < size {
			if chunk >= 2*MaxLine {
				return Tail{}, fmt.Errorf("%s ends with a line longer than %d bytes: it is not an audit log this writer wrote", path, MaxLine)
			}
			chunk *= 2
			continue
		}
		line = line[start+1:]
		p, err := parseLine(line)
		if err != nil {
			return Tail{}, fmt.Errorf("the last line of %s is not an audit record (%v): the file holds lines some other writer wrote; give the audit log a file of its own", path, err)
		}
		t.Seq, t.Hash = p.seq, HashLine(line)
		if p.cp != nil {
			t.Chain, t.checkpoints = p.cp.Chain, true
			return t, nil
		}
		complete := size - int64(len(buf)-len(body)) // the remnant left out
		t.Chain, t.checkpoints, err = lastChain(f, complete)
		if err != nil {
			return Tail{}, fmt.Errorf("%s: %w", path, err)
		}
		return t, nil
	}
}

// lastChain reads the first size bytes of r back from the end, a chunk at
// a time, for the last checkpoint, and returns the chain it names. A
// restart normally finds it in the last line (the stop checkpoint), or
// within the last checkpoint interval.
func lastChain(r io.ReaderAt, size int64) (chain string, found bool, err error) {
	const chunk = 64 << 10
	var carry []byte // the end of a line whose start is in the chunk before
	for end := size; end > 0; {
		n := min(chunk, end)
		data := make([]byte, n, n+int64(len(carry)))
		if _, err := r.ReadAt(data, end-n); err != nil && err != io.EOF {
			return "", false, err
		}
		end -= n
		data = append(data, carry...)
		lines := bytes.Split(data, []byte("\n"))
		first := 1 // lines[0] may begin in the chunk before
		if end == 0 {
			first = 0
		}
		for i := len(lines) - 1; i >= first; i-- {
			if p, ok := checkpointLine(lines[i]); ok {
				return p.cp.Chain, true, nil
			}
		}
		carry = lines[0]
		if len(carry) > MaxLine {
			return "", false, fmt.Errorf("a line longer than %d bytes: it is not an audit log this writer wrote", MaxLine)
		}
	}
	return "", false, nil
}

// checkpointLine parses line when it is a checkpoint.
func checkpointLine(line []byte) (parsed, bool) {
	_, _, rest, err := parsePrefix(line)
	if err != nil || !bytes.HasPrefix(rest, []byte(","+checkpointKey)) {
		return parsed{}, false
	}
	p, err := parseLine(line)
	return p, err == nil && p.cp != nil
}

// ReadChainTail is ReadTail for a file that rotation renames: when the file
// at path holds no complete record (missing, empty, or only a record cut
// short, as a crash right after a rotation leaves it), the chain goes on
// from the last record of its newest rotated file, named as Caddy's file
// writer names them (NAME-<time>-<reason>EXT, maybe .gz or .zst).
//
// A current file that holds records but no checkpoint (one rotated since
// the last checkpoint) takes the chain id of the newest rotated file.
func ReadChainTail(path string) (Tail, error) {
	t, err := ReadTail(path)
	if err != nil || (t.Seq != 0 && t.checkpoints) {
		return t, err
	}
	prev, ok, err := newestRotated(path)
	if err != nil || !ok {
		return t, err
	}
	bt, err := tailOfSource(FileSource(prev))
	if err != nil {
		return Tail{}, err
	}
	if t.Seq != 0 {
		t.Chain, t.checkpoints = bt.Chain, bt.checkpoints
		return t, nil
	}
	switch {
	case bt.Partial != nil && t.Partial != nil:
		return Tail{}, fmt.Errorf("%s and %s both end with a record cut short: move one of them away", prev, path)
	case t.Partial != nil:
		bt.Partial = t.Partial
	}
	return bt, nil
}

// newestRotated is the path of the newest rotated file of path.
func newestRotated(path string) (string, bool, error) {
	dir, base := filepath.Split(path)
	ext := filepath.Ext(base)
	prefix := strings.TrimSuffix(base, ext) + "-"
	entries, err := os.ReadDir(filepath.Clean(dir))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return "", false, nil
		}
		return "", false, err
	}
	best, bestKey := "", ""
	for _, e := range entries {
		name := e.Name()
		if !e.Type().IsRegular() || !strings.HasPrefix(name, prefix) {
			continue
		}
		key, compressed := name, false
		for _, z := range []string{".gz", ".zst"} {
			if k, ok := strings.CutSuffix(name, z); ok {
				key, compressed = k, true
			}
		}
		if !strings.HasSuffix(key, ext) {
			continue
		}
		// The time in the name orders them; an uncompressed file wins over
		// its compressed copy, which may be half written.
		if !compressed {
			key += "\x01"
		}
		if key > bestKey {
			best, bestKey = name, key
		}
	}
	if best == "" {
		return "", false, nil
	}
	return filepath.Join(dir, best), true, nil
}

// tailOfSource reads a whole source for its last record, and what follows
// it cut short.
func tailOfSource(s Source) (Tail, error) {
	lr := newLineReader([]Source{s})
	defer lr.close()
	var t Tail
	var lastErr error // of the last complete line: the lines before it are Verify's to judge
	for {
		l, ok, err := lr.next()
		if err != nil {
			return Tail{}, err
		}
		if !ok {
			return t, lastErr
		}
		if !l.terminated {
			t.Partial = partialOf(l.b)
			continue
		}
		if len(l.b) == 0 {
			continue
		}
		p, err := parseLine(l.b)
		if err != nil {
			lastErr = fmt.Errorf("%s: not an audit record (%v): the chain cannot go on from it", l.loc, err)
			continue
		}
		t.Seq, t.Hash, lastErr = p.seq, HashLine(l.b), nil
		if p.cp != nil {
			t.Chain, t.checkpoints = p.cp.Chain, true
		}
	}
}

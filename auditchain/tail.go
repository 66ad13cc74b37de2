package auditchain

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
)

// Tail is where a file's chain ends: the seq and hash of its last record
// (zero for a file with none), and the bytes after it that a crash cut
// short, if any.
type Tail struct {
	Seq     uint64
	Hash    Hash
	Partial *Partial
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
		return t, nil
	}
}

package acpclient

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"
)

// maxLine is the longest line the agent may write to stdout, the same
// limit the SDK's reader has: a longer one is a protocol error here
// rather than a connection that silently stops reading.
const maxLine = 10 << 20

// checkWire copies the agent's stdout to w line by line and checks that
// each line is a JSON-RPC 2.0 message. The SDK logs and skips a line that
// is not; an agent that writes logs to stdout is broken, and saying so
// beats a turn that never ends. It returns nil at EOF, or the protocol
// error (the rest of the stream is not copied then).
//
// u, when set, counts the session/update notifications passed on.
func checkWire(r io.Reader, w io.Writer, u *updates) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), maxLine)
	for sc.Scan() {
		line := sc.Bytes()
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		method, notification, err := checkMessage(line)
		if err != nil {
			return err
		}
		// One write per line: the SDK's reader is line-based too.
		buf := make([]byte, 0, len(line)+1)
		buf = append(append(buf, line...), '\n')
		if _, err := w.Write(buf); err != nil {
			return nil // the connection is closing; nothing to report
		}
		if u != nil && notification && method == "session/update" {
			u.passed.Add(1) // once the SDK has it: one it never got is waited for by no one
		}
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return fmt.Errorf("the agent wrote a line longer than %d MiB to stdout", maxLine>>20)
		}
		return nil // a read error is the pipe closing: the process is ending
	}
	return nil
}

// checkMessage checks that line is a JSON-RPC 2.0 message, and returns
// its method, if any, and whether it is a notification (no id).
func checkMessage(line []byte) (method string, notification bool, err error) {
	var m struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Method  string          `json:"method"`
	}
	if err := json.Unmarshal(line, &m); err != nil {
		return "", false, fmt.Errorf("the agent wrote a line to stdout that is not JSON (%s); an ACP agent must write only JSON-RPC messages to stdout, and logs to stderr", quote(line))
	}
	if m.JSONRPC != "2.0" || (m.Method == "" && len(m.ID) == 0) {
		return "", false, fmt.Errorf("the agent wrote a JSON line to stdout that is not a JSON-RPC 2.0 message (%s)", quote(line))
	}
	return m.Method, len(m.ID) == 0, nil
}

// updates counts the session/update notifications that the wire check
// passed to the SDK and those the client applied, so that an agent's end
// waits for the last of them (see supervise): the SDK applies
// notifications on a goroutine of its own, and fails the call in flight
// as soon as the agent exits, without waiting for them. Without this, a
// crashed turn could end before the agent's last words reach it.
type updates struct {
	passed, applied atomic.Int64
	kick            chan struct{} // one buffered: an update was applied
}

func newUpdates() *updates { return &updates{kick: make(chan struct{}, 1)} }

// apply records that the client applied one update.
func (u *updates) apply() {
	u.applied.Add(1)
	select {
	case u.kick <- struct{}{}:
	default:
	}
}

// wait returns once every update passed on has been applied, or after d.
// (The SDK may skip one it cannot decode; d bounds the wait then.)
func (u *updates) wait(d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	for u.applied.Load() < u.passed.Load() {
		select {
		case <-u.kick:
		case <-t.C:
			return
		}
	}
}

// quote shows the start of a bad line, enough to recognise it.
func quote(b []byte) string {
	const n = 120
	s := string(b)
	if len(s) > n {
		s = s[:n]
		for !utf8.ValidString(s) {
			s = s[:len(s)-1]
		}
		s += "…"
	}
	return fmt.Sprintf("%q", s)
}

// stderrRing keeps the last lines an agent wrote to stderr, for the error
// that reports its end, and logs each line as it comes.
type stderrRing struct {
	mu    sync.Mutex
	lines []string
	next  int
	full  bool
}

const (
	stderrLines   = 20
	stderrLineMax = 512
)

func (s *stderrRing) add(line string) {
	if len(line) > stderrLineMax {
		line = line[:stderrLineMax]
		for !utf8.ValidString(line) {
			line = line[:len(line)-1]
		}
		line += "…"
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lines == nil {
		s.lines = make([]string, stderrLines)
	}
	s.lines[s.next] = line
	s.next = (s.next + 1) % stderrLines
	if s.next == 0 {
		s.full = true
	}
}

// tail returns the kept lines, oldest first.
func (s *stderrRing) tail() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lines == nil {
		return nil
	}
	if !s.full {
		return append([]string(nil), s.lines[:s.next]...)
	}
	return append(append([]string(nil), s.lines[s.next:]...), s.lines[:s.next]...)
}

// read consumes r until EOF. A line longer than the reader's buffer keeps
// its start and loses the rest: stderr is free-form and must not grow
// without bound.
func (s *stderrRing) read(r io.Reader, log *slog.Logger) {
	br := bufio.NewReaderSize(r, 4096)
	for {
		frag, err := br.ReadSlice('\n')
		if line := strings.TrimRight(string(frag), "\r\n"); line != "" {
			s.add(line)
			log.Debug("agent stderr", "line", line)
		}
		for errors.Is(err, bufio.ErrBufferFull) {
			_, err = br.ReadSlice('\n')
		}
		if err != nil {
			return
		}
	}
}

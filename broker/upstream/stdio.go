package upstream

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sort"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// stdioTransport runs the stdio upstream's command for one connection: it
// builds the process with a minimal environment and sends its stderr to the
// logger (the Conn's, or the aggregated route's), line by line. Closing the
// connection ends the process (stdin closed, then SIGTERM after 5s).
type stdioTransport struct {
	t *Transports
}

func (st *stdioTransport) Connect(ctx context.Context) (mcp.Connection, error) {
	c := st.t
	cmd := exec.Command(c.Expanded.Command, c.Expanded.Args...)
	cmd.Env = stdioEnv(c.Expanded.Env)
	cmd.Dir = c.Expanded.Cwd
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("creating the stderr pipe for the command: %w", err)
	}
	cmd.Stderr = w // the child gets the file itself: no copying goroutine
	conn, err := (&mcp.CommandTransport{Command: cmd}).Connect(ctx)
	// The child holds its own copy of w now (or never started): close
	// ours, so that r ends when the process and its children have exited.
	w.Close()
	go logStderr(r, func(line string, cut bool) {
		if cut {
			c.logger.Warn("stdio upstream wrote to stderr", "upstream", c.name, "line", line,
				"truncated", fmt.Sprintf("the line was longer than %d bytes and was cut", MaxStderrLine))
			return
		}
		c.logger.Warn("stdio upstream wrote to stderr", "upstream", c.name, "line", line)
	})
	if err != nil {
		var ee *exec.Error
		if errors.As(err, &ee) {
			return nil, fmt.Errorf("starting command %q: %v", c.Expanded.Command, ee.Err)
		}
		return nil, fmt.Errorf("starting command %q: %w", c.Expanded.Command, err)
	}
	if c.PIDDir == "" || cmd.Process == nil {
		return conn, nil
	}
	file, err := writePIDFile(c.PIDDir, c.name, cmd.Process.Pid, cmd.Args)
	if err != nil {
		c.logger.Warn("stdio upstream: writing its pid file failed", "upstream", c.name, "error", err.Error())
		return conn, nil
	}
	return &pidFileConn{Connection: conn, file: file}, nil
}

// pidFileConn removes the process's pid file once closing the connection
// has ended the process (go-sdk's launcher: stdin closed, SIGTERM after
// 5s, SIGKILL 5s later).
type pidFileConn struct {
	mcp.Connection
	file string
	once sync.Once
}

func (p *pidFileConn) Close() error {
	err := p.Connection.Close()
	p.once.Do(func() { removePIDFile(p.file) })
	return err
}

// stdioEnv is the environment of a stdio upstream: PATH and HOME from this
// process, then the configured env (which may override them), sorted.
func stdioEnv(extra map[string]string) []string {
	env := map[string]string{}
	for _, k := range []string{"PATH", "HOME"} {
		if v, ok := os.LookupEnv(k); ok {
			env[k] = v
		}
	}
	for k, v := range extra {
		env[k] = v
	}
	out := make([]string, 0, len(env))
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}

// logStderr reads r until it ends and calls emit for every line (without
// its line break), each cut at [MaxStderrLine] bytes; cut says so. It
// closes r.
func logStderr(r io.ReadCloser, emit func(line string, cut bool)) {
	defer r.Close()
	br := bufio.NewReaderSize(r, MaxStderrLine)
	buf := make([]byte, 0, MaxStderrLine)
	cut := false
	flush := func() {
		line := buf
		if n := len(line); n > 0 && line[n-1] == '\r' && !cut {
			line = line[:n-1]
		}
		emit(string(line), cut)
		buf, cut = buf[:0], false
	}
	for {
		chunk, err := br.ReadSlice('\n')
		complete := len(chunk) > 0 && chunk[len(chunk)-1] == '\n'
		if complete {
			chunk = chunk[:len(chunk)-1]
		}
		if room := MaxStderrLine - len(buf); len(chunk) > room {
			buf = append(buf, chunk[:room]...)
			cut = true
		} else {
			buf = append(buf, chunk...)
		}
		if complete {
			flush()
		}
		if err != nil && err != bufio.ErrBufferFull {
			if len(buf) > 0 || cut {
				flush()
			}
			return
		}
	}
}

package demoagent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	acp "github.com/coder/acp-go-sdk"
)

// Exit statuses of the prompts that end the process on purpose.
const (
	ExitCrash   = 3 // the "crash" prompt
	ExitGarbage = 4 // the "garbage" prompt
)

// DefaultMaxSleep caps the duration of a "sleep:" prompt when
// Options.MaxSleep is zero.
const DefaultMaxSleep = 10 * time.Minute

// SteeringEnv names the environment variable that switches steering off when
// it holds a false value ("0", "false").
const SteeringEnv = "ZIDANE_DEMO_AGENT_STEERING"

// Options tune the demo agent. The zero value is ready to use.
type Options struct {
	// DisableSteering stops advertising and accepting the
	// _session/steering extension, so clients fall back to queueing.
	DisableSteering bool
	// MaxSleep caps a "sleep:" prompt; zero means DefaultMaxSleep.
	MaxSleep time.Duration
	// Logger receives diagnostics, never the protocol; nil discards them.
	Logger *slog.Logger
}

// OptionsFromEnv reads SteeringEnv.
func OptionsFromEnv() Options {
	var o Options
	if v, err := strconv.ParseBool(os.Getenv(SteeringEnv)); err == nil && !v {
		o.DisableSteering = true
	}
	return o
}

// ExitError is what Run returns when a prompt ("crash", "garbage") asked the
// agent process to end with Code. By then Run has stopped writing to out.
type ExitError struct {
	Code   int
	Reason string
}

func (e *ExitError) Error() string {
	return fmt.Sprintf("demo agent exits with status %d: %s", e.Code, e.Reason)
}

// Run serves ACP, reading requests from in and writing to out, until in
// reaches its end (it returns nil), ctx ends (it returns ctx.Err()) or a
// prompt asks the process to exit (it returns an *ExitError). It never closes
// in or out; an in-process caller closes them after Run returns, as the end
// of a process would.
func Run(ctx context.Context, in io.Reader, out io.Writer, opts Options) error {
	if opts.MaxSleep <= 0 {
		opts.MaxSleep = DefaultMaxSleep
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	w := &protocolWriter{w: out}
	exits := make(chan *ExitError, 1)
	a := newAgent(opts, func(e *ExitError, lastLine []byte) {
		w.cut(lastLine)
		select {
		case exits <- e:
		default:
		}
	})
	// The SDK starts reading at once; hold its reads until the connection
	// is wired up, or an early request would race with the setup.
	wired := make(chan struct{})
	conn := acp.NewAgentSideConnection(a, w, gatedReader{in, wired})
	conn.SetLogger(opts.Logger)
	a.conn = conn
	close(wired)

	select {
	case <-conn.Done():
		return nil
	case <-ctx.Done():
		w.cut(nil)
		return ctx.Err()
	case e := <-exits:
		opts.Logger.Info("exiting on request", "status", e.Code, "reason", e.Reason)
		return e
	}
}

// Main runs the demo agent on the process's stdio with options from the
// environment, logging to stderr, and returns the status the process should
// exit with.
func Main(ctx context.Context) int {
	opts := OptionsFromEnv()
	opts.Logger = slog.New(slog.NewTextHandler(os.Stderr, nil)).With("agent", "zidane-demo")
	err := Run(ctx, os.Stdin, os.Stdout, opts)
	if e, ok := errors.AsType[*ExitError](err); ok {
		return e.Code
	}
	return 0
}

// protocolWriter is the agent's stdout. Once cut, it refuses every write, as
// the stdout of an exited process would.
type protocolWriter struct {
	mu   sync.Mutex
	w    io.Writer
	dead atomic.Bool
}

var errExited = errors.New("demo agent has exited")

func (p *protocolWriter) Write(b []byte) (int, error) {
	if p.dead.Load() {
		return 0, errExited
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.dead.Load() {
		return 0, errExited
	}
	return p.w.Write(b)
}

// cut writes lastLine, if any, and refuses every later write. With no last
// line it does not wait for a write in progress.
func (p *protocolWriter) cut(lastLine []byte) {
	if lastLine == nil {
		p.dead.Store(true)
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.dead.Load() {
		_, _ = p.w.Write(lastLine)
	}
	p.dead.Store(true)
}

// gatedReader holds reads until open is closed.
type gatedReader struct {
	r    io.Reader
	open <-chan struct{}
}

func (g gatedReader) Read(b []byte) (int, error) {
	<-g.open
	return g.r.Read(b)
}

package acpclient

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	acp "github.com/coder/acp-go-sdk"

	"github.com/Tahul/caddy-zidane-mcp/message"
)

// SteeringMethod is the ACP extension method that adds guidance to a
// running turn. An agent advertises it with
// InitializeResponse._meta.steering.supported = true; its params are
// {"sessionId": "...", "text": "..."}.
const SteeringMethod = "_session/steering"

// Stop timings. An agent gets stopGrace to exit after its stdin closes,
// then the same again after SIGTERM, before its group gets SIGKILL; an
// agent whose stdout closed while it kept running gets stopGrace too.
const stopGrace = 1500 * time.Millisecond

// Options says how to launch an agent.
type Options struct {
	// Command is the program and its arguments; Command[0] is looked up in
	// the gateway's PATH.
	Command []string
	// Env is added to the minimal environment (see the Env function).
	Env map[string]string
	// Home and TempDir, when set, are the agent's HOME and TMPDIR: a
	// directory of its own rather than the gateway's, which holds Caddy's
	// data and configuration. Env may override them.
	Home, TempDir string
	// User, when set, is the account the agent runs as; the gateway needs
	// the right to switch to it (root, or CAP_SETUID and CAP_SETGID).
	User *User
	// Dir is the agent's working directory and the root that fs/* requests
	// may read and write. It must be an absolute path to a directory.
	Dir string
	// Handler receives updates, permission requests and questions.
	Handler Handler
	// Logger gets the agent's stderr lines (Debug) and its end (Info/Warn).
	Logger *slog.Logger
	// ClientName and ClientVersion are sent as clientInfo in initialize.
	ClientName, ClientVersion string
}

// User is an account to run an agent as.
type User struct {
	Name     string
	UID, GID uint32
	// Groups are the supplementary groups.
	Groups []uint32
}

// Info is what the agent said about itself in initialize.
type Info struct {
	Name, Version string
	// LoadSession reports the loadSession capability: the agent can resume
	// a session by its id after a restart.
	LoadSession bool
	// Steering reports _meta.steering.supported.
	Steering bool
}

// Agent is one running agent process and its ACP connection.
type Agent struct {
	info   Info
	conn   *acp.ClientSideConnection
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	root   *os.Root
	stderr stderrRing
	log    *slog.Logger

	closeOnce   sync.Once
	closing     chan struct{} // Close was called
	brokenOnce  sync.Once
	stdinBroken chan struct{} // a write to the agent's stdin failed: it is ending
	protoErr    chan error    // the wire check failed (buffered, one)
	done        chan struct{} // the process is gone and its pipes are drained
	updates     *updates      // session/update notifications passed to the SDK, and applied
	err         error         // why, set before done closes
}

// ExitError says why an agent ended when nobody asked it to.
type ExitError struct {
	// Status is how the process ended, as os/exec words it ("exit status
	// 3", "signal: killed").
	Status string
	// Protocol is set when the agent broke the protocol and was stopped.
	Protocol string
	// Stderr holds the last lines the agent wrote to stderr.
	Stderr []string
}

func (e *ExitError) Error() string {
	var b strings.Builder
	if e.Protocol != "" {
		b.WriteString(e.Protocol)
		b.WriteString("; the agent was stopped")
	} else {
		b.WriteString("the agent process ended (")
		b.WriteString(e.Status)
		b.WriteString(")")
	}
	if len(e.Stderr) > 0 {
		b.WriteString("; its last stderr lines: ")
		b.WriteString(strings.Join(e.Stderr, " | "))
	} else if e.Protocol == "" {
		b.WriteString(" and wrote nothing to stderr")
	}
	return b.String()
}

// ErrClosed is Err after Close stopped the agent.
var ErrClosed = errors.New("the agent was stopped")

// Start launches the agent and runs initialize, within ctx. On error
// nothing is left running.
func Start(ctx context.Context, opts Options) (*Agent, error) {
	if len(opts.Command) == 0 || opts.Command[0] == "" {
		return nil, errors.New("agent command is empty: configure the program that speaks ACP on stdio")
	}
	if opts.Handler == nil {
		return nil, errors.New("acpclient: Options.Handler is nil")
	}
	if !filepath.IsAbs(opts.Dir) {
		return nil, fmt.Errorf("agent directory %q is not absolute", opts.Dir)
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	env, err := Env(map[string]string{"HOME": opts.Home, "TMPDIR": opts.TempDir}, opts.Env, nil)
	if err != nil {
		return nil, err
	}
	root, err := os.OpenRoot(opts.Dir)
	if err != nil {
		return nil, fmt.Errorf("agent directory: %w", err)
	}
	a := &Agent{
		root:        root,
		log:         log,
		closing:     make(chan struct{}),
		stdinBroken: make(chan struct{}),
		protoErr:    make(chan error, 1),
		done:        make(chan struct{}),
		updates:     newUpdates(),
	}
	if err := a.launch(opts, env); err != nil {
		root.Close()
		return nil, err
	}
	info, err := a.initialize(ctx, opts)
	if err != nil {
		a.Close()
		var exit *ExitError
		if !errors.As(err, &exit) {
			err = a.withStderr(err)
		}
		return nil, fmt.Errorf("initialize: %w", err)
	}
	a.info = info
	return a, nil
}

func (a *Agent) launch(opts Options, env []string) error {
	cmd := exec.Command(opts.Command[0], opts.Command[1:]...)
	cmd.Dir = opts.Dir
	cmd.Env = env
	if err := setProcAttr(cmd, opts.User); err != nil {
		return err
	}
	// Pipes of our own rather than cmd.StdoutPipe: Wait closes those as
	// soon as the process exits, which can cut off the last messages.
	inR, inW, err := os.Pipe()
	if err != nil {
		return err
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		inR.Close()
		inW.Close()
		return err
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		inR.Close()
		inW.Close()
		outR.Close()
		outW.Close()
		return err
	}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = inR, outW, errW
	if err := cmd.Start(); err != nil {
		for _, f := range []*os.File{inR, inW, outR, outW, errR, errW} {
			f.Close()
		}
		return fmt.Errorf("start agent %q: %w", opts.Command[0], err)
	}
	inR.Close()
	outW.Close()
	errW.Close()
	a.cmd, a.stdin = cmd, inW

	checked, toSDK := io.Pipe()
	wireDone := make(chan struct{})
	go func() {
		defer close(wireDone)
		if err := checkWire(outR, toSDK, a.updates); err != nil {
			a.protoErr <- err
		}
		toSDK.Close()
	}()
	stderrDone := make(chan struct{})
	go func() {
		defer close(stderrDone)
		a.stderr.read(errR, a.log)
	}()

	c := &client{root: a.root, rootDir: filepath.Clean(opts.Dir), h: opts.Handler, updates: a.updates}
	a.conn = acp.NewClientSideConnection(c, &stdinWriter{w: inW, broken: a.stdinBroken, once: &a.brokenOnce}, checked)
	a.conn.SetLogger(a.log)
	go a.supervise(outR, errR, checked, wireDone, stderrDone)
	return nil
}

// supervise waits for the process to end, for whatever reason, and stops
// it when it must: on Close, on a protocol error, or when its stdout
// closed while it kept running. Every path ends in SIGKILL to the group,
// so nothing the agent spawned outlives it.
func (a *Agent) supervise(outR, errR *os.File, checked *io.PipeReader, wireDone, stderrDone chan struct{}) {
	exited := make(chan error, 1)
	go func() { exited <- a.cmd.Wait() }()

	var (
		waitErr  error
		protocol error
		closed   bool
	)
	select {
	case waitErr = <-exited:
	case protocol = <-a.protoErr:
		kill(a.cmd)
		waitErr = <-exited
	case <-a.conn.Done():
		// The wire check reports a protocol error before it closes the
		// SDK's input, so one that caused this is already waiting.
		select {
		case protocol = <-a.protoErr:
			kill(a.cmd)
			waitErr = <-exited
		default:
			waitErr = a.stopWithin(exited, stopGrace, false)
		}
	case <-a.closing:
		closed = true
		a.stdin.Close()
		waitErr = a.stopWithin(exited, stopGrace, true)
	}
	kill(a.cmd) // what the agent spawned, if anything is left in its group
	a.stdin.Close()

	// Let the readers drain what the process wrote before it ended; a child
	// that kept the pipes open was just killed, so this is short. Closing
	// checked unblocks the wire check if the SDK stopped reading.
	drained := time.NewTimer(time.Second)
	for _, ch := range []chan struct{}{wireDone, stderrDone} {
		select {
		case <-ch:
		case <-drained.C:
			outR.Close()
			errR.Close()
			checked.CloseWithError(errors.New("agent ended"))
			<-ch
		}
	}
	drained.Stop()
	outR.Close()
	errR.Close()
	a.root.Close()
	// What the agent said before it ended by itself reaches the handler
	// before anyone learns that it ended. (An agent stopped by Close is
	// not waited for: its caller may be the handler's own.)
	if !closed {
		a.updates.wait(time.Second)
	}
	if protocol == nil {
		select {
		case protocol = <-a.protoErr:
		default:
		}
	}

	switch {
	case protocol != nil:
		a.err = &ExitError{Status: status(waitErr), Protocol: protocol.Error(), Stderr: a.stderr.tail()}
		a.log.Warn("agent broke the protocol", "error", a.err)
	case closed:
		a.err = ErrClosed
		a.log.Debug("agent stopped")
	default:
		a.err = &ExitError{Status: status(waitErr), Stderr: a.stderr.tail()}
		a.log.Warn("agent ended", "error", a.err)
	}
	close(a.done)
}

// stopWithin gives the process grace to exit, then SIGTERM and the same
// grace again (when term is set), then SIGKILL.
func (a *Agent) stopWithin(exited chan error, grace time.Duration, term bool) error {
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case err := <-exited:
		return err
	case <-t.C:
	}
	if term {
		terminate(a.cmd)
		t.Reset(grace)
		select {
		case err := <-exited:
			return err
		case <-t.C:
		}
	}
	kill(a.cmd)
	return <-exited
}

func status(err error) string {
	if err == nil {
		return "exit status 0"
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ProcessState.String()
	}
	return err.Error()
}

func (a *Agent) initialize(ctx context.Context, opts Options) (Info, error) {
	name := opts.ClientName
	if name == "" {
		name = "caddy-zidane-mcp"
	}
	resp, err := a.conn.Initialize(ctx, acp.InitializeRequest{
		ProtocolVersion: acp.ProtocolVersionNumber,
		ClientInfo:      &acp.Implementation{Name: name, Version: opts.ClientVersion},
		ClientCapabilities: acp.ClientCapabilities{
			Fs:          acp.FileSystemCapabilities{ReadTextFile: true, WriteTextFile: true},
			Terminal:    false,
			Elicitation: &acp.ElicitationCapabilities{Form: &acp.ElicitationFormCapabilities{}},
		},
	})
	if err != nil {
		return Info{}, a.callError(err)
	}
	if resp.ProtocolVersion != acp.ProtocolVersionNumber {
		return Info{}, fmt.Errorf("the agent speaks ACP protocol version %d; this gateway speaks version %d", resp.ProtocolVersion, acp.ProtocolVersionNumber)
	}
	info := Info{LoadSession: resp.AgentCapabilities.LoadSession, Steering: steering(resp.Meta)}
	if resp.AgentInfo != nil {
		info.Name, info.Version = resp.AgentInfo.Name, resp.AgentInfo.Version
	}
	return info, nil
}

// steering reads _meta.steering.supported.
func steering(meta map[string]any) bool {
	s, ok := meta["steering"].(map[string]any)
	if !ok {
		return false
	}
	supported, _ := s["supported"].(bool)
	return supported
}

// Info is what the agent said in initialize.
func (a *Agent) Info() Info { return a.info }

// NewSession runs session/new and returns the agent's session id.
func (a *Agent) NewSession(ctx context.Context, cwd string, servers []acp.McpServer) (string, error) {
	if servers == nil {
		servers = []acp.McpServer{}
	}
	resp, err := a.conn.NewSession(ctx, acp.NewSessionRequest{Cwd: cwd, McpServers: servers})
	if err != nil {
		return "", fmt.Errorf("session/new: %w", a.callError(err))
	}
	return string(resp.SessionId), nil
}

// LoadSession runs session/load. The agent replays the session's history
// as session/update notifications before it answers; the handler sees
// them outside any turn.
func (a *Agent) LoadSession(ctx context.Context, id, cwd string, servers []acp.McpServer) error {
	if !a.info.LoadSession {
		return errors.New("the agent does not support session/load")
	}
	if servers == nil {
		servers = []acp.McpServer{}
	}
	if _, err := a.conn.LoadSession(ctx, acp.LoadSessionRequest{SessionId: acp.SessionId(id), Cwd: cwd, McpServers: servers}); err != nil {
		return fmt.Errorf("session/load: %w", a.callError(err))
	}
	return nil
}

// Prompt runs one turn and returns its stop reason. Do not cancel ctx to
// stop a turn: the SDK then abandons it. Call Cancel and let Prompt
// return stop reason "cancelled". An error means the turn failed; when
// the agent itself is gone, the error is its *ExitError.
func (a *Agent) Prompt(ctx context.Context, sessionID, text string) (acp.StopReason, error) {
	resp, err := a.conn.Prompt(ctx, acp.PromptRequest{
		SessionId: acp.SessionId(sessionID),
		Prompt:    []acp.ContentBlock{acp.TextBlock(text)},
	})
	if err != nil {
		return "", a.callError(err)
	}
	return resp.StopReason, nil
}

// Cancel sends the session/cancel notification.
func (a *Agent) Cancel(ctx context.Context, sessionID string) error {
	return a.callError(a.conn.Cancel(ctx, acp.CancelNotification{SessionId: acp.SessionId(sessionID)}))
}

// Steer sends text to the running turn through SteeringMethod. A
// *acp.RequestError with code -32601 means the agent does not know it.
func (a *Agent) Steer(ctx context.Context, sessionID, text string) error {
	_, err := a.conn.CallExtension(ctx, SteeringMethod, map[string]string{"sessionId": sessionID, "text": text})
	return a.callError(err)
}

// IsMethodNotFound reports whether err is the agent's JSON-RPC "method
// not found".
func IsMethodNotFound(err error) bool {
	var re *acp.RequestError
	return errors.As(err, &re) && re.Code == message.CodeMethodNotFound
}

// callError replaces the SDK's "peer disconnected" or "broken pipe" with
// why the agent ended, once that is known. supervise bounds the wait after
// a disconnect; after a failed write the agent gets stopGrace to end.
func (a *Agent) callError(err error) error {
	if err == nil {
		return nil
	}
	select {
	case <-a.conn.Done():
		<-a.done
	case <-a.stdinBroken:
		t := time.NewTimer(stopGrace)
		defer t.Stop()
		select {
		case <-a.done:
		case <-t.C:
			return err
		}
	default:
		return err
	}
	if errors.Is(a.err, ErrClosed) {
		return ErrClosed
	}
	return a.err
}

// stdinWriter notes that a write to the agent failed, so that the error
// of the call that wrote can say why the agent went away.
type stdinWriter struct {
	w      io.Writer
	broken chan struct{}
	once   *sync.Once
}

func (s *stdinWriter) Write(b []byte) (int, error) {
	n, err := s.w.Write(b)
	if err != nil {
		s.once.Do(func() { close(s.broken) })
	}
	return n, err
}

func (a *Agent) withStderr(err error) error {
	if tail := a.stderr.tail(); len(tail) > 0 {
		return fmt.Errorf("%w; the agent's last stderr lines: %s", err, strings.Join(tail, " | "))
	}
	return err
}

// Done is closed once the agent process is gone and Err says why.
func (a *Agent) Done() <-chan struct{} { return a.done }

// Err is why the agent ended: ErrClosed after Close, an *ExitError
// otherwise; nil while it runs.
func (a *Agent) Err() error {
	select {
	case <-a.done:
		return a.err
	default:
		return nil
	}
}

// Stderr returns the last lines the agent wrote to stderr.
func (a *Agent) Stderr() []string { return a.stderr.tail() }

// Close stops the agent: its stdin closes, then it gets SIGTERM and at
// last SIGKILL (to its whole group), each after a grace of 1.5s. It
// returns once the process is gone, within about 4 seconds.
func (a *Agent) Close() error {
	a.closeOnce.Do(func() { close(a.closing) })
	<-a.done
	return nil
}

// Pid is the agent's process id, for logs.
func (a *Agent) Pid() int { return a.cmd.Process.Pid }

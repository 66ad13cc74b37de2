package demoagent

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	acp "github.com/coder/acp-go-sdk"
)

// subprocessEnv makes the test binary serve the demo agent on its stdio, so
// that tests can drive a real separate process.
const subprocessEnv = "DEMOAGENT_SUBPROCESS"

func TestMain(m *testing.M) {
	if os.Getenv(subprocessEnv) == "1" {
		os.Exit(Main(context.Background()))
	}
	os.Exit(m.Run())
}

// hangGuard bounds every wait; a test never asserts a duration.
const hangGuard = 20 * time.Second

// client is the client side of ACP as a test drives it: it records every
// session/update and hands permission and elicitation requests to the test.
type client struct {
	mu      sync.Mutex
	updates []acp.SessionNotification
	changed chan struct{}

	// permission and elicit answer requests; nil fails the request.
	permission func(context.Context, acp.RequestPermissionRequest) (acp.RequestPermissionResponse, error)
	elicit     func(context.Context, acp.UnstableCreateElicitationRequest) (acp.UnstableCreateElicitationResponse, error)
}

func newClient() *client { return &client{changed: make(chan struct{})} }

func (c *client) SessionUpdate(_ context.Context, n acp.SessionNotification) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.updates = append(c.updates, n)
	close(c.changed)
	c.changed = make(chan struct{})
	return nil
}

func (c *client) RequestPermission(ctx context.Context, p acp.RequestPermissionRequest) (acp.RequestPermissionResponse, error) {
	if c.permission == nil {
		return acp.RequestPermissionResponse{}, errors.New("test client: unexpected permission request")
	}
	return c.permission(ctx, p)
}

func (c *client) UnstableCreateElicitation(ctx context.Context, p acp.UnstableCreateElicitationRequest) (acp.UnstableCreateElicitationResponse, error) {
	if c.elicit == nil {
		return acp.UnstableCreateElicitationResponse{}, errors.New("test client: unexpected elicitation")
	}
	return c.elicit(ctx, p)
}

func (c *client) UnstableCompleteElicitation(context.Context, acp.UnstableCompleteElicitationNotification) error {
	return nil
}

func (c *client) ReadTextFile(context.Context, acp.ReadTextFileRequest) (acp.ReadTextFileResponse, error) {
	return acp.ReadTextFileResponse{}, acp.NewMethodNotFound(acp.ClientMethodFsReadTextFile)
}

func (c *client) WriteTextFile(context.Context, acp.WriteTextFileRequest) (acp.WriteTextFileResponse, error) {
	return acp.WriteTextFileResponse{}, acp.NewMethodNotFound(acp.ClientMethodFsWriteTextFile)
}

func (c *client) CreateTerminal(context.Context, acp.CreateTerminalRequest) (acp.CreateTerminalResponse, error) {
	return acp.CreateTerminalResponse{}, acp.NewMethodNotFound(acp.ClientMethodTerminalCreate)
}

func (c *client) KillTerminal(context.Context, acp.KillTerminalRequest) (acp.KillTerminalResponse, error) {
	return acp.KillTerminalResponse{}, acp.NewMethodNotFound(acp.ClientMethodTerminalKill)
}

func (c *client) TerminalOutput(context.Context, acp.TerminalOutputRequest) (acp.TerminalOutputResponse, error) {
	return acp.TerminalOutputResponse{}, acp.NewMethodNotFound(acp.ClientMethodTerminalOutput)
}

func (c *client) ReleaseTerminal(context.Context, acp.ReleaseTerminalRequest) (acp.ReleaseTerminalResponse, error) {
	return acp.ReleaseTerminalResponse{}, acp.NewMethodNotFound(acp.ClientMethodTerminalRelease)
}

func (c *client) WaitForTerminalExit(context.Context, acp.WaitForTerminalExitRequest) (acp.WaitForTerminalExitResponse, error) {
	return acp.WaitForTerminalExitResponse{}, acp.NewMethodNotFound(acp.ClientMethodTerminalWaitForExit)
}

// snapshot returns the updates of one session so far.
func (c *client) snapshot(id acp.SessionId) []acp.SessionUpdate {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []acp.SessionUpdate
	for _, n := range c.updates {
		if n.SessionId == id {
			out = append(out, n.Update)
		}
	}
	return out
}

// await blocks until done holds for the updates of session id.
func (c *client) await(t *testing.T, id acp.SessionId, what string, done func([]acp.SessionUpdate) bool) {
	t.Helper()
	deadline := time.After(hangGuard)
	for {
		c.mu.Lock()
		changed := c.changed
		c.mu.Unlock()
		if done(c.snapshot(id)) {
			return
		}
		select {
		case <-changed:
		case <-deadline:
			t.Fatalf("no %s after %s; updates: %s", what, hangGuard, describe(c.snapshot(id)))
		}
	}
}

// message concatenates the agent_message_chunks of updates.
func message(updates []acp.SessionUpdate) string {
	var b strings.Builder
	for _, u := range updates {
		if u.AgentMessageChunk != nil && u.AgentMessageChunk.Content.Text != nil {
			b.WriteString(u.AgentMessageChunk.Content.Text.Text)
		}
	}
	return b.String()
}

func chunkCount(updates []acp.SessionUpdate) int {
	n := 0
	for _, u := range updates {
		if u.AgentMessageChunk != nil {
			n++
		}
	}
	return n
}

func describe(updates []acp.SessionUpdate) string {
	var parts []string
	for _, u := range updates {
		switch {
		case u.AgentMessageChunk != nil:
			parts = append(parts, "chunk "+message([]acp.SessionUpdate{u}))
		case u.UserMessageChunk != nil:
			parts = append(parts, "user chunk")
		case u.ToolCall != nil:
			parts = append(parts, "tool_call "+u.ToolCall.Title)
		case u.ToolCallUpdate != nil:
			parts = append(parts, "tool_call_update")
		case u.SessionInfoUpdate != nil:
			parts = append(parts, "session_info_update")
		default:
			parts = append(parts, "other")
		}
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

// peer is a client connected to a demo agent.
type peer struct {
	conn   *acp.ClientSideConnection
	client *client
	// exited delivers Run's error (in-process) once the agent has stopped.
	exited chan error
}

// startInProcess serves the demo agent with Run over pipes. When Run
// returns, the agent's ends of the pipes close, as a process's would.
func startInProcess(t *testing.T, opts Options, c *client) *peer {
	t.Helper()
	c2aR, c2aW := io.Pipe()
	a2cR, a2cW := io.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	exited := make(chan error, 1)
	go func() {
		err := Run(ctx, c2aR, a2cW, opts)
		a2cW.Close()
		c2aR.Close()
		exited <- err
	}()
	p := &peer{conn: connect(c, c2aW, a2cR, nil), client: c, exited: exited}
	t.Cleanup(func() {
		cancel()
		c2aW.Close()
		a2cR.Close()
	})
	return p
}

// subprocess is a demo agent process: the test binary re-executed.
type subprocess struct {
	*peer
	cmd       *exec.Cmd
	stdin     io.Closer
	stderr    *lockedBuffer
	clientLog *lockedBuffer // the SDK's diagnostics on the client side
}

// startSubprocess re-executes the test binary as the demo agent.
func startSubprocess(t *testing.T, c *client, env ...string) *subprocess {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), subprocessEnv+"=1"), env...)
	stderr, clientLog := &lockedBuffer{}, &lockedBuffer{}
	cmd.Stderr = stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stdin.Close()
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return &subprocess{
		peer:      &peer{conn: connect(c, stdin, stdout, clientLog), client: c},
		cmd:       cmd,
		stdin:     stdin,
		stderr:    stderr,
		clientLog: clientLog,
	}
}

// exitStatus waits for the process to end and returns its exit status.
func (s *subprocess) exitStatus(t *testing.T) int {
	t.Helper()
	wait(t, s.conn.Done(), "end of the agent's stdout")
	err := s.cmd.Wait()
	if err == nil {
		return 0
	}
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		t.Fatalf("wait: %v", err)
	}
	return ee.ExitCode()
}

// connect is the client side of ACP over w and r, logging to log (nil
// discards).
func connect(c *client, w io.Writer, r io.Reader, log io.Writer) *acp.ClientSideConnection {
	wired := make(chan struct{})
	conn := acp.NewClientSideConnection(c, w, gatedReader{r, wired})
	if log == nil {
		log = io.Discard
	}
	conn.SetLogger(slog.New(slog.NewTextHandler(log, nil)))
	close(wired)
	return conn
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	t.Cleanup(cancel)
	return ctx
}

// initialize runs initialize; elicitation says whether the client
// advertises form elicitation.
func (p *peer) initialize(t *testing.T, elicitation bool) acp.InitializeResponse {
	t.Helper()
	req := acp.InitializeRequest{ProtocolVersion: acp.ProtocolVersionNumber}
	if elicitation {
		req.ClientCapabilities.Elicitation = &acp.ElicitationCapabilities{Form: &acp.ElicitationFormCapabilities{}}
	}
	resp, err := p.conn.Initialize(testCtx(t), req)
	if err != nil {
		t.Fatalf("initialize: %v", err)
	}
	return resp
}

func (p *peer) newSession(t *testing.T, cwd string, servers ...acp.McpServer) acp.SessionId {
	t.Helper()
	resp, err := p.conn.NewSession(testCtx(t), acp.NewSessionRequest{Cwd: cwd, McpServers: append([]acp.McpServer{}, servers...)})
	if err != nil {
		t.Fatalf("session/new: %v", err)
	}
	if resp.SessionId == "" {
		t.Fatal("session/new returned no session id")
	}
	return resp.SessionId
}

func (p *peer) prompt(ctx context.Context, id acp.SessionId, text string) (acp.PromptResponse, error) {
	return p.conn.Prompt(ctx, acp.PromptRequest{SessionId: id, Prompt: []acp.ContentBlock{acp.TextBlock(text)}})
}

// ready starts an initialized peer with one session in a temporary cwd.
func ready(t *testing.T, opts Options, c *client) (*peer, acp.SessionId) {
	t.Helper()
	p := startInProcess(t, opts, c)
	p.initialize(t, true)
	return p, p.newSession(t, t.TempDir())
}

// promptAsync runs a prompt in the background.
func (p *peer) promptAsync(t *testing.T, id acp.SessionId, text string) <-chan promptResult {
	ch := make(chan promptResult, 1)
	ctx := testCtx(t)
	go func() {
		resp, err := p.prompt(ctx, id, text)
		ch <- promptResult{resp, err}
	}()
	return ch
}

type promptResult struct {
	resp acp.PromptResponse
	err  error
}

func wait[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(hangGuard):
		t.Fatalf("no %s after %s", what, hangGuard)
		panic("unreachable")
	}
}

package acpclient

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	acp "github.com/coder/acp-go-sdk"

	"github.com/Tahul/caddy-zidane-mcp/sessions/demoagent"
)

// The test binary doubles as agent processes: the demo agent with
// ACPCLIENT_TEST_AGENT=demo, and agents that misbehave on purpose.
func TestMain(m *testing.M) {
	switch os.Getenv("ACPCLIENT_TEST_AGENT") {
	case "demo":
		os.Exit(demoagent.Main(context.Background()))
	case "chatty":
		// Writes a log line to stdout, as a broken agent would.
		os.Stdout.WriteString("starting up...\n")
		time.Sleep(time.Minute)
		os.Exit(0)
	case "env":
		os.Stderr.WriteString(strings.Join(os.Environ(), "\n") + "\n")
		os.Exit(7)
	}
	os.Exit(m.Run())
}

type recorder struct {
	mu      sync.Mutex
	updates []acp.SessionNotification
	answer  acp.RequestPermissionResponse
}

func (r *recorder) SessionUpdate(n acp.SessionNotification) {
	r.mu.Lock()
	r.updates = append(r.updates, n)
	r.mu.Unlock()
}

func (r *recorder) RequestPermission(context.Context, acp.RequestPermissionRequest) acp.RequestPermissionResponse {
	return r.answer
}

func (r *recorder) Elicit(context.Context, acp.UnstableCreateElicitationForm) acp.UnstableCreateElicitationResponse {
	return acp.UnstableCreateElicitationResponse{Decline: &acp.UnstableCreateElicitationDecline{Action: "decline"}}
}

func (r *recorder) text() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var b strings.Builder
	for _, u := range r.updates {
		if c := u.Update.AgentMessageChunk; c != nil && c.Content.Text != nil {
			b.WriteString(c.Content.Text.Text)
		}
	}
	return b.String()
}

func start(t *testing.T, kind string, h Handler, env ...string) (*Agent, error) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	e := map[string]string{"ACPCLIENT_TEST_AGENT": kind, "GORACE": "atexit_sleep_ms=0"}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		e[k] = v
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	a, err := Start(ctx, Options{Command: []string{exe}, Env: e, Dir: t.TempDir(), Handler: h})
	if a != nil {
		t.Cleanup(func() { a.Close() })
	}
	return a, err
}

func TestTurnWithTheDemoAgent(t *testing.T) {
	r := &recorder{answer: acp.RequestPermissionResponse{Outcome: acp.RequestPermissionOutcome{
		Selected: &acp.RequestPermissionOutcomeSelected{Outcome: "selected", OptionId: "allow"},
	}}}
	a, err := start(t, "demo", r)
	if err != nil {
		t.Fatal(err)
	}
	if info := a.Info(); info.Name != demoagent.Name || !info.LoadSession || !info.Steering {
		t.Errorf("info = %+v", info)
	}
	ctx := context.Background()
	id, err := a.NewSession(ctx, t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	stop, err := a.Prompt(ctx, id, "approve: ls")
	if err != nil || stop != acp.StopReasonEndTurn {
		t.Fatalf("prompt = %v, %v", stop, err)
	}
	if got := r.text(); !strings.Contains(got, "Allowed: ls") {
		t.Errorf("agent said %q", got)
	}
	// A failed turn is an error, and the agent lives on.
	if _, err := a.Prompt(ctx, id, "fail"); err == nil || errors.As(err, new(*ExitError)) {
		t.Fatalf("fail prompt error = %v, want the agent's JSON-RPC error", err)
	}
	if a.Err() != nil {
		t.Fatalf("agent ended: %v", a.Err())
	}
	if err := a.Close(); err != nil || !errors.Is(a.Err(), ErrClosed) {
		t.Fatalf("close = %v, err = %v", err, a.Err())
	}
}

func TestSteeringSwitchedOff(t *testing.T) {
	a, err := start(t, "demo", &recorder{}, demoagent.SteeringEnv+"=0")
	if err != nil {
		t.Fatal(err)
	}
	if a.Info().Steering {
		t.Fatal("steering advertised")
	}
	id, err := a.NewSession(context.Background(), t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Steer(context.Background(), id, "x"); !IsMethodNotFound(err) {
		t.Fatalf("steer error = %v, want method not found", err)
	}
}

func TestCrashReportsExitStatusAndStderr(t *testing.T) {
	a, err := start(t, "demo", &recorder{})
	if err != nil {
		t.Fatal(err)
	}
	id, err := a.NewSession(context.Background(), t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	_, err = a.Prompt(context.Background(), id, "crash")
	var exit *ExitError
	if !errors.As(err, &exit) {
		t.Fatalf("error = %v, want *ExitError", err)
	}
	if exit.Status != "exit status 3" || len(exit.Stderr) == 0 || !strings.Contains(err.Error(), "exit status 3") {
		t.Errorf("exit = %+v", exit)
	}
	<-a.Done()
}

// slowRecorder takes its time over each update, as a busy engine may.
type slowRecorder struct{ recorder }

func (r *slowRecorder) SessionUpdate(n acp.SessionNotification) {
	time.Sleep(50 * time.Millisecond)
	r.recorder.SessionUpdate(n)
}

// What an agent says just before it crashes reaches the handler before the
// turn's call fails: the SDK applies notifications on a goroutine of its
// own and fails the call at once when the agent exits, so the end waits for
// the updates the wire passed on.
func TestCrashKeepsTheAgentsLastWords(t *testing.T) {
	r := &slowRecorder{}
	a, err := start(t, "demo", r)
	if err != nil {
		t.Fatal(err)
	}
	id, err := a.NewSession(context.Background(), t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err = a.Prompt(context.Background(), id, "crash"); !errors.As(err, new(*ExitError)) {
		t.Fatalf("error = %v, want *ExitError", err)
	}
	if got := r.text(); !strings.Contains(got, "Crashing on purpose") {
		t.Fatalf("when the crashed turn's call returned, the handler had %q; want the agent's last words", got)
	}
}

func TestLogOnStdoutIsAProtocolError(t *testing.T) {
	_, err := start(t, "chatty", &recorder{})
	var exit *ExitError
	if !errors.As(err, &exit) || !strings.Contains(exit.Protocol, `"starting up..."`) || !strings.Contains(err.Error(), "logs to stderr") {
		t.Fatalf("error = %v, want a protocol error quoting the line", err)
	}
}

// TestEnvironmentIsMinimal: the agent gets PATH, LANG, the HOME and
// TMPDIR it is given and its configured env, nothing else of the
// gateway's (not even the gateway's HOME, which holds Caddy's data).
func TestEnvironmentIsMinimal(t *testing.T) {
	t.Setenv("ZIDANE_TEST_SECRET", "s3cret")
	t.Setenv("PATH", "/usr/bin:/bin")
	t.Setenv("HOME", "/home/gateway")
	t.Setenv("USER", "gateway")
	home, tmp, dir := t.TempDir(), t.TempDir(), t.TempDir()
	t.Setenv("TMPDIR", "/tmp/gateway")
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err = Start(ctx, Options{Command: []string{exe}, Dir: dir, Handler: &recorder{}, Home: home, TempDir: tmp,
		Env: map[string]string{"ACPCLIENT_TEST_AGENT": "env", "GORACE": "atexit_sleep_ms=0", "GIVEN": "${ZIDANE_TEST_SECRET}-x"}})
	var exit *ExitError
	if !errors.As(err, &exit) || exit.Status != "exit status 7" {
		t.Fatalf("error = %v", err)
	}
	got := map[string]string{}
	for _, kv := range exit.Stderr {
		k, v, _ := strings.Cut(kv, "=")
		got[k] = v
	}
	want := map[string]string{
		"PATH": "/usr/bin:/bin", "LANG": got["LANG"], "HOME": home, "TMPDIR": tmp,
		"GIVEN": "s3cret-x", "ACPCLIENT_TEST_AGENT": "env", "GORACE": "atexit_sleep_ms=0",
	}
	if got["LANG"] == "" || len(got) != len(want) {
		t.Fatalf("agent environment = %v, want exactly %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("agent %s = %q, want %q", k, got[k], v)
		}
	}
}

func TestEnvExpansion(t *testing.T) {
	lookup := func(k string) (string, bool) {
		v, ok := map[string]string{"A": "1", "HOME": "/h"}[k]
		return v, ok
	}
	env, err := Env(map[string]string{"HOME": "/scratch"}, map[string]string{"X": "${A}$B${A}"}, lookup)
	if err != nil || strings.Join(env, " ") != "HOME=/scratch LANG=C.UTF-8 PATH=/usr/local/bin:/usr/bin:/bin X=1$B1" {
		t.Fatalf("env = %v, %v", env, err)
	}
	if _, err := Env(nil, map[string]string{"X": "${MISSING}"}, lookup); err == nil || !strings.Contains(err.Error(), "${MISSING} is not set") {
		t.Errorf("missing var error = %v", err)
	}
	if _, err := Env(nil, map[string]string{"X": "sk-s3cret${A"}, lookup); err == nil || strings.Contains(err.Error(), "s3cret") {
		t.Errorf("unterminated ${: %v, want an error that does not quote the value", err)
	}
}

func TestStartErrors(t *testing.T) {
	if _, err := Start(context.Background(), Options{Dir: t.TempDir(), Handler: &recorder{}}); err == nil || !strings.Contains(err.Error(), "command is empty") {
		t.Errorf("empty command: %v", err)
	}
	_, err := Start(context.Background(), Options{Command: []string{"/nonexistent/agent"}, Dir: t.TempDir(), Handler: &recorder{}})
	if err == nil || !strings.Contains(err.Error(), "/nonexistent/agent") {
		t.Errorf("missing program: %v", err)
	}
}

func TestFileSystemStaysInsideTheDirectory(t *testing.T) {
	dir := t.TempDir()
	outside := t.TempDir()
	if err := os.WriteFile(filepath.Join(outside, "secret"), []byte("s"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(dir, "escape")); err != nil {
		t.Fatal(err)
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	c := &client{root: root, rootDir: dir, h: &recorder{}}
	ctx := context.Background()

	if _, err := c.WriteTextFile(ctx, acp.WriteTextFileRequest{Path: filepath.Join(dir, "a", "b.txt"), Content: "one\ntwo\nthree\n"}); err != nil {
		t.Fatal(err)
	}
	got, err := c.ReadTextFile(ctx, acp.ReadTextFileRequest{Path: filepath.Join(dir, "a", "b.txt"), Line: acp.Ptr(2), Limit: acp.Ptr(1)})
	if err != nil || got.Content != "two\n" {
		t.Fatalf("read line 2 = %q, %v", got.Content, err)
	}
	for _, p := range []string{
		filepath.Join(outside, "secret"),
		filepath.Join(dir, "..", filepath.Base(outside), "secret"),
		filepath.Join(dir, "escape", "secret"),
		"relative.txt",
	} {
		if _, err := c.ReadTextFile(ctx, acp.ReadTextFileRequest{Path: p}); err == nil {
			t.Errorf("read %s allowed", p)
		}
		if _, err := c.WriteTextFile(ctx, acp.WriteTextFileRequest{Path: p, Content: "x"}); err == nil {
			t.Errorf("write %s allowed", p)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(outside, "secret")); string(b) != "s" {
		t.Errorf("a file outside was changed: %q", b)
	}
	_, err = c.ReadTextFile(ctx, acp.ReadTextFileRequest{Path: filepath.Join(dir, "missing")})
	var re *acp.RequestError
	if !errors.As(err, &re) || re.Code != -32002 {
		t.Errorf("missing file error = %v, want -32002", err)
	}
	if _, err := c.CreateTerminal(ctx, acp.CreateTerminalRequest{}); !IsMethodNotFound(err) {
		t.Errorf("terminal/create = %v, want method not found", err)
	}
}

func TestCheckMessage(t *testing.T) {
	for line, ok := range map[string]bool{
		`{"jsonrpc":"2.0","id":1,"result":{}}`:          true,
		`{"jsonrpc":"2.0","method":"session/update"}`:   true,
		`{"jsonrpc":"2.0","id":"x","error":{"code":1}}`: true,
		`not json`:                                      false,
		`{"hello":"world"}`:                             false,
		`{"jsonrpc":"1.0","id":1,"result":{}}`:          false,
		`[{"jsonrpc":"2.0","method":"session/update"}]`: false,
	} {
		if _, _, err := checkMessage([]byte(line)); (err == nil) != ok {
			t.Errorf("checkMessage(%s) = %v", line, err)
		}
	}
}

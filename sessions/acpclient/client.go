package acpclient

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	acp "github.com/coder/acp-go-sdk"

	"github.com/Tahul/caddy-zidane-mcp/message"
)

// Handler receives what the agent sends to the client. The engine
// implements it; it is called from the SDK's goroutines.
type Handler interface {
	// SessionUpdate gets the agent's session/update notifications in the
	// order they arrived. It must record the update and return at once:
	// the SDK handles notifications one at a time through a queue of 1024
	// and closes the connection when that queue overflows.
	SessionUpdate(n acp.SessionNotification)
	// RequestPermission blocks until someone answers or ctx ends (the agent
	// withdrew the request, or disconnected); it then answers cancelled.
	RequestPermission(ctx context.Context, req acp.RequestPermissionRequest) acp.RequestPermissionResponse
	// Elicit asks a form-mode question. The SDK drops the request's
	// sessionId, so it belongs to this process's one session.
	Elicit(ctx context.Context, form acp.UnstableCreateElicitationForm) acp.UnstableCreateElicitationResponse
}

// maxReadFile bounds fs/read_text_file: the answer is one JSON-RPC line.
const maxReadFile = 8 << 20

// client implements acp.Client for one agent process.
type client struct {
	root    *os.Root // the agent's working directory; fs/* never leaves it
	rootDir string
	h       Handler
	updates *updates // counts what SessionUpdate applied
}

var _ acp.Client = (*client)(nil)

func (c *client) SessionUpdate(_ context.Context, n acp.SessionNotification) error {
	c.h.SessionUpdate(n)
	if c.updates != nil {
		c.updates.apply()
	}
	return nil
}

func (c *client) RequestPermission(ctx context.Context, req acp.RequestPermissionRequest) (acp.RequestPermissionResponse, error) {
	return c.h.RequestPermission(ctx, req), nil
}

// UnstableCreateElicitation is found by the SDK through an interface
// assertion; only the form mode is advertised and served.
func (c *client) UnstableCreateElicitation(ctx context.Context, req acp.UnstableCreateElicitationRequest) (acp.UnstableCreateElicitationResponse, error) {
	if req.Form == nil {
		return acp.UnstableCreateElicitationResponse{}, acp.NewInvalidParams(map[string]any{
			"error": "this client supports form-mode elicitation only (it did not advertise url mode)",
		})
	}
	return c.h.Elicit(ctx, *req.Form), nil
}

// rel turns the absolute path an fs/* request names into a path inside the
// root, or explains why it may not be used.
func (c *client) rel(p string) (string, error) {
	if !filepath.IsAbs(p) {
		return "", acp.NewInvalidParams(map[string]any{"error": fmt.Sprintf("path %q is not absolute; ACP fs paths are absolute", p)})
	}
	rel, err := filepath.Rel(c.rootDir, filepath.Clean(p))
	if err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
		return "", acp.NewInvalidParams(map[string]any{"error": fmt.Sprintf("path %q is outside the session's directory %s", p, c.rootDir)})
	}
	return rel, nil
}

func (c *client) ReadTextFile(_ context.Context, req acp.ReadTextFileRequest) (acp.ReadTextFileResponse, error) {
	rel, err := c.rel(req.Path)
	if err != nil {
		return acp.ReadTextFileResponse{}, err
	}
	info, err := c.root.Stat(rel)
	if err != nil {
		return acp.ReadTextFileResponse{}, fsError(req.Path, err)
	}
	if info.IsDir() {
		return acp.ReadTextFileResponse{}, acp.NewInvalidParams(map[string]any{"error": fmt.Sprintf("%s is a directory", req.Path)})
	}
	if info.Size() > maxReadFile {
		return acp.ReadTextFileResponse{}, acp.NewInvalidParams(map[string]any{"error": fmt.Sprintf("%s is larger than %d MiB; read it with a tool instead", req.Path, maxReadFile>>20)})
	}
	b, err := c.root.ReadFile(rel)
	if err != nil {
		return acp.ReadTextFileResponse{}, fsError(req.Path, err)
	}
	return acp.ReadTextFileResponse{Content: lines(string(b), req.Line, req.Limit)}, nil
}

// lines selects limit lines from the 1-based line on, as fs/read_text_file
// defines them.
func lines(s string, line, limit *int) string {
	if line == nil && limit == nil {
		return s
	}
	all := strings.SplitAfter(s, "\n")
	start := 0
	if line != nil && *line > 1 {
		start = min(*line-1, len(all))
	}
	end := len(all)
	if limit != nil && *limit >= 0 {
		end = min(start+*limit, len(all))
	}
	return strings.Join(all[start:end], "")
}

func (c *client) WriteTextFile(_ context.Context, req acp.WriteTextFileRequest) (acp.WriteTextFileResponse, error) {
	rel, err := c.rel(req.Path)
	if err != nil {
		return acp.WriteTextFileResponse{}, err
	}
	if rel == "." {
		return acp.WriteTextFileResponse{}, acp.NewInvalidParams(map[string]any{"error": fmt.Sprintf("%s is the session's directory, not a file", req.Path)})
	}
	if dir := filepath.Dir(rel); dir != "." {
		if err := c.root.MkdirAll(dir, 0o755); err != nil {
			return acp.WriteTextFileResponse{}, fsError(req.Path, err)
		}
	}
	// O_TRUNC on an existing file keeps its mode; a new file gets 0644.
	f, err := c.root.OpenFile(rel, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return acp.WriteTextFileResponse{}, fsError(req.Path, err)
	}
	_, werr := f.WriteString(req.Content)
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr != nil {
		return acp.WriteTextFileResponse{}, fsError(req.Path, werr)
	}
	return acp.WriteTextFileResponse{}, nil
}

// fsError maps a file-system error to a JSON-RPC error the agent can act
// on: ACP's "resource not found" (-32002) for a missing file.
func fsError(p string, err error) error {
	if errors.Is(err, fs.ErrNotExist) {
		return &acp.RequestError{Code: message.CodeResourceNotFound, Message: "Resource not found", Data: map[string]any{"path": p}}
	}
	msg := err.Error()
	var pe *fs.PathError
	if errors.As(err, &pe) {
		// os.Root reports an escaping symlink as "path escapes from parent".
		msg = fmt.Sprintf("%s: %v", p, pe.Err)
	}
	return acp.NewInternalError(map[string]any{"error": msg})
}

// Terminals are not advertised in clientCapabilities; an agent that calls
// them anyway gets "method not found".

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

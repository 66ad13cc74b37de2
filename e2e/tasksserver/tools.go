package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/Tahul/caddy-zidane-mcp/message"
)

// taskSupport says whether a tool runs as a task: never, when the client
// declares the extension, or only so (a client that does not gets -32021).
type taskSupport int

const (
	taskNever taskSupport = iota
	taskOptional
	taskRequired
)

// tool is one fixture: its definition, how it supports tasks, and its
// work, which runs inline for a synchronous call and in a task otherwise.
type tool struct {
	def     *mcp.Tool
	support taskSupport
	// ready, when set, says whether a call may become a task now: a
	// tool that gathers input with a multi-round-trip first (SEP-2322)
	// creates its task on the round that carries the input.
	ready func(p *mcp.CallToolParamsRaw) bool
	work  func(args map[string]any, p *mcp.CallToolParamsRaw) work
}

// maxSeconds bounds slow_compute's seconds.
const maxSeconds = 600

// tools are the fixtures the conformance suite's tasks-* scenarios call.
var tools = []tool{
	{
		def: &mcp.Tool{Name: "greet", Description: "Greets by name, synchronously (never a task).",
			InputSchema: objectSchema(map[string]any{"name": map[string]any{"type": "string"}}, "name")},
		work: func(args map[string]any, _ *mcp.CallToolParamsRaw) work {
			return func(context.Context, asker) (*mcp.CallToolResult, error) {
				name, _ := args["name"].(string)
				return text(fmt.Sprintf("Hello, %s!", name)), nil
			}
		},
	},
	{
		def: &mcp.Tool{Name: "slow_compute", Description: "Sleeps for `seconds` (0 to 600), then returns; a task when the client declares the tasks extension. Cancelled while it sleeps, the task ends cancelled.",
			InputSchema: objectSchema(map[string]any{
				"seconds": map[string]any{"type": "integer", "minimum": 0, "maximum": maxSeconds},
				"label":   map[string]any{"type": "string"},
			}, "seconds")},
		support: taskOptional,
		work: func(args map[string]any, _ *mcp.CallToolParamsRaw) work {
			return func(ctx context.Context, _ asker) (*mcp.CallToolResult, error) {
				secs, ok := args["seconds"].(float64)
				if !ok || secs < 0 || secs > maxSeconds || secs != float64(int(secs)) {
					return nil, &jsonrpc.Error{Code: message.CodeInvalidParams, Message: fmt.Sprintf("seconds must be a whole number from 0 to %d", maxSeconds)}
				}
				label, _ := args["label"].(string)
				if err := sleep(ctx, time.Duration(secs)*time.Second); err != nil {
					return nil, err
				}
				return text(fmt.Sprintf("computed %q after %d seconds", label, int(secs))), nil
			}
		},
	},
	{
		def: &mcp.Tool{Name: "failing_job", Description: "Runs for about a second, then reports a tool error; only as a task.",
			InputSchema: objectSchema(nil)},
		support: taskRequired,
		work: func(map[string]any, *mcp.CallToolParamsRaw) work {
			return func(ctx context.Context, _ asker) (*mcp.CallToolResult, error) {
				if err := sleep(ctx, time.Second); err != nil {
					return nil, err
				}
				res := text("the job failed, as this tool always does")
				res.IsError = true
				return res, nil
			}
		},
	},
	{
		def: &mcp.Tool{Name: "protocol_error_job", Description: "Panics: its task fails with a JSON-RPC error.",
			InputSchema: objectSchema(nil)},
		support: taskOptional,
		work: func(map[string]any, *mcp.CallToolParamsRaw) work {
			return func(context.Context, asker) (*mcp.CallToolResult, error) {
				panic("protocol_error_job fails on purpose")
			}
		},
	},
	{
		def: &mcp.Tool{Name: "confirm_delete", Description: "Asks the client to confirm (elicitation), then reports whether the file would be deleted.",
			InputSchema: objectSchema(map[string]any{"filename": map[string]any{"type": "string"}}, "filename")},
		support: taskOptional,
		work: func(args map[string]any, _ *mcp.CallToolParamsRaw) work {
			return func(ctx context.Context, ask asker) (*mcp.CallToolResult, error) {
				file, _ := args["filename"].(string)
				answers, err := ask(ctx, mcp.InputRequestMap{"confirm": &mcp.ElicitParams{Mode: "form",
					Message:         fmt.Sprintf("Delete %s?", file),
					RequestedSchema: objectSchema(map[string]any{"confirm": map[string]any{"type": "boolean"}}, "confirm")}})
				if err != nil {
					return nil, err
				}
				if c := accepted(answers["confirm"]); c != nil && c["confirm"] == true {
					return text(fmt.Sprintf("deleted %s", file)), nil
				}
				return text(fmt.Sprintf("kept %s: the deletion was not confirmed", file)), nil
			}
		},
	},
	{
		def: &mcp.Tool{Name: "multi_input", Description: "Asks the client two questions at once (two elicitations), then answers with both.",
			InputSchema: objectSchema(nil)},
		support: taskOptional,
		work: func(map[string]any, *mcp.CallToolParamsRaw) work {
			return func(ctx context.Context, ask asker) (*mcp.CallToolResult, error) {
				schema := objectSchema(map[string]any{"name": map[string]any{"type": "string"}, "confirm": map[string]any{"type": "boolean"}})
				answers, err := ask(ctx, mcp.InputRequestMap{
					"first":  &mcp.ElicitParams{Mode: "form", Message: "First question: your name?", RequestedSchema: schema},
					"second": &mcp.ElicitParams{Mode: "form", Message: "Second question: your name again?", RequestedSchema: schema},
				})
				if err != nil {
					return nil, err
				}
				first, _ := accepted(answers["first"])["name"].(string)
				second, _ := accepted(answers["second"])["name"].(string)
				return text(fmt.Sprintf("answers: %q and %q", first, second)), nil
			}
		},
	},
	{
		def: &mcp.Tool{Name: "test_tool_with_task", Description: "Asks for the caller's name with a multi-round-trip result, then greets them from a task; only as a task.",
			InputSchema: objectSchema(nil)},
		support: taskRequired,
		ready:   func(p *mcp.CallToolParamsRaw) bool { return userName(p) != "" },
		work: func(_ map[string]any, p *mcp.CallToolParamsRaw) work {
			name := userName(p)
			return func(ctx context.Context, ask asker) (*mcp.CallToolResult, error) {
				if name == "" {
					// The first round: a multi-round-trip result asks.
					answers, err := ask(ctx, userNameRequest)
					if err != nil {
						return nil, err
					}
					name, _ = accepted(answers["user_name"])["name"].(string)
				}
				return text(fmt.Sprintf("Hello, %s! (greeted from a task)", name)), nil
			}
		},
	},
}

// userName is the name an accepted user_name input response carries.
func userName(p *mcp.CallToolParamsRaw) string {
	if p == nil {
		return ""
	}
	if e, ok := p.InputResponses["user_name"].(*mcp.ElicitResult); ok && e != nil && e.Action == "accept" {
		name, _ := e.Content["name"].(string)
		return name
	}
	return ""
}

// userNameRequest is the input request of test_tool_with_task's first
// round.
var userNameRequest = mcp.InputRequestMap{"user_name": &mcp.ElicitParams{Mode: "form", Message: "What is your name?",
	RequestedSchema: objectSchema(map[string]any{"name": map[string]any{"type": "string"}}, "name")}}

func text(s string) *mcp.CallToolResult {
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: s}}}
}

func objectSchema(props map[string]any, required ...string) map[string]any {
	if props == nil {
		props = map[string]any{}
	}
	s := map[string]any{"type": "object", "properties": props}
	if len(required) > 0 {
		s["required"] = required
	}
	return s
}

// accepted is the content of an accepted elicitation response, or nil.
func accepted(raw json.RawMessage) map[string]any {
	var r struct {
		Action  string         `json:"action"`
		Content map[string]any `json:"content"`
	}
	if json.Unmarshal(raw, &r) != nil || r.Action != "accept" {
		return nil
	}
	return r.Content
}

// sleep waits for d, or returns ctx's error.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// needInput is a synchronous call's work asking for input it was not
// given: the call answers with a multi-round-trip result (SEP-2322).
type needInput struct{ requests mcp.InputRequestMap }

func (needInput) Error() string { return "input required" }

// inlineAsker answers a synchronous call's question from the call's own
// inputResponses, or asks for them with needInput.
func inlineAsker(p *mcp.CallToolParamsRaw) asker {
	return func(_ context.Context, requests mcp.InputRequestMap) (map[string]json.RawMessage, error) {
		out := map[string]json.RawMessage{}
		for k := range requests {
			resp, ok := p.InputResponses[k]
			if !ok {
				return nil, needInput{requests}
			}
			raw, err := json.Marshal(resp)
			if err != nil {
				return nil, err
			}
			out[k] = raw
		}
		return out, nil
	}
}

// newServer is the go-sdk server with the fixtures, the middleware that
// turns a declaring client's call of a task-supporting tool into a task,
// and the extension's methods.
func newServer(s *store) (*mcp.Server, error) {
	server := mcp.NewServer(&mcp.Implementation{Name: "zidane-e2e-tasksserver", Version: "1"}, &mcp.ServerOptions{
		Capabilities: &mcp.ServerCapabilities{
			Tools:      &mcp.ToolCapabilities{},
			Extensions: map[string]any{extensionID: map[string]any{}},
		},
	})
	byName := map[string]tool{}
	for _, t := range tools {
		byName[t.def.Name] = t
		server.AddTool(t.def, syncHandler(t))
	}
	server.AddReceivingMiddleware(func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			p, ok := req.GetParams().(*mcp.CallToolParamsRaw)
			if method != "tools/call" || !ok || p == nil {
				return next(ctx, method, req)
			}
			t, ok := byName[p.Name]
			if !ok || t.support == taskNever {
				return next(ctx, method, req)
			}
			if !declares(req) {
				if t.support == taskRequired {
					return nil, missingCapability(fmt.Sprintf("tool %q runs only as a task: declare the %s extension in the request's client capabilities", p.Name, extensionID))
				}
				return next(ctx, method, req)
			}
			if t.ready != nil && !t.ready(p) {
				// The tool's own handler answers the first round.
				return next(ctx, method, req)
			}
			args, err := arguments(p)
			if err != nil {
				return nil, err
			}
			task, err := s.start(t.work(args, p))
			if err != nil {
				return nil, err
			}
			s.mu.Lock()
			res := &createTaskResult{ResultType: "task", taskFields: s.fields(task)}
			s.mu.Unlock()
			return res, nil
		}
	})
	type taskParams struct {
		mcp.ParamsBase
		TaskID *string `json:"taskId"`
	}
	type updateParams struct {
		mcp.ParamsBase
		TaskID         *string                    `json:"taskId"`
		InputResponses map[string]json.RawMessage `json:"inputResponses"`
	}
	errs := []error{
		mcp.AddReceivingCustomMethod(server, "tasks/get", func(ctx context.Context, ss *mcp.ServerSession, p *taskParams) (*detailedTask, error) {
			id, err := taskID(ss, p.Meta, p.TaskID)
			if err != nil {
				return nil, err
			}
			d, err := s.detailed(id)
			return d, notFound(err, id)
		}),
		mcp.AddReceivingCustomMethod(server, "tasks/update", func(ctx context.Context, ss *mcp.ServerSession, p *updateParams) (*ackResult, error) {
			id, err := taskID(ss, p.Meta, p.TaskID)
			if err != nil {
				return nil, err
			}
			if p.InputResponses == nil {
				return nil, &jsonrpc.Error{Code: message.CodeInvalidParams, Message: "tasks/update needs params.inputResponses, an object of responses by input request key"}
			}
			if err := s.update(id, p.InputResponses); err != nil {
				return nil, notFound(err, id)
			}
			return &ackResult{ResultType: "complete"}, nil
		}),
		mcp.AddReceivingCustomMethod(server, "tasks/cancel", func(ctx context.Context, ss *mcp.ServerSession, p *taskParams) (*ackResult, error) {
			id, err := taskID(ss, p.Meta, p.TaskID)
			if err != nil {
				return nil, err
			}
			if err := s.cancelTask(id); err != nil {
				return nil, notFound(err, id)
			}
			return &ackResult{ResultType: "complete"}, nil
		}),
	}
	return server, errors.Join(errs...)
}

// syncHandler runs a tool's work inline: a call that is not a task.
func syncHandler(t tool) mcp.ToolHandler {
	return func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		args, err := arguments(req.Params)
		if err != nil {
			return nil, err
		}
		res, err := protect(func() (*mcp.CallToolResult, error) {
			return t.work(args, req.Params)(ctx, inlineAsker(req.Params))
		})
		if ni := (needInput{}); errors.As(err, &ni) {
			return &mcp.CallToolResult{InputRequests: ni.requests}, nil
		}
		return res, err
	}
}

// arguments are a call's arguments as an object.
func arguments(p *mcp.CallToolParamsRaw) (map[string]any, error) {
	args := map[string]any{}
	if len(p.Arguments) > 0 && string(p.Arguments) != "null" {
		if err := json.Unmarshal(p.Arguments, &args); err != nil {
			return nil, &jsonrpc.Error{Code: message.CodeInvalidParams, Message: "arguments must be an object"}
		}
	}
	return args, nil
}

// declares reports whether a request declares the extension: in its own
// _meta client capabilities (MCP 2026-07-28), or, for a session of an
// older version, in the capabilities it initialized with.
func declares(req mcp.Request) bool {
	meta := req.GetParams().GetMeta()
	if c, ok := meta[mcp.MetaKeyClientCapabilities]; ok {
		return capsDeclare(c)
	}
	if ss, ok := req.GetSession().(*mcp.ServerSession); ok {
		if ip := ss.InitializeParams(); ip != nil && ip.Capabilities != nil {
			_, ok := ip.Capabilities.Extensions[extensionID]
			return ok
		}
	}
	return false
}

// capsDeclare reports whether client capabilities, as decoded from _meta,
// name the extension.
func capsDeclare(caps any) bool {
	c, ok := caps.(map[string]any)
	if !ok {
		return false
	}
	ext, ok := c["extensions"].(map[string]any)
	if !ok {
		return false
	}
	_, ok = ext[extensionID]
	return ok
}

// taskID checks a task method's request: it declares the extension, and
// names a task.
func taskID(ss *mcp.ServerSession, meta mcp.Meta, id *string) (string, error) {
	declared := false
	if c, ok := meta[mcp.MetaKeyClientCapabilities]; ok {
		declared = capsDeclare(c)
	} else if ip := ss.InitializeParams(); ip != nil && ip.Capabilities != nil {
		_, declared = ip.Capabilities.Extensions[extensionID]
	}
	if !declared {
		return "", missingCapability(fmt.Sprintf("the tasks methods need the %s extension: declare it in the request's client capabilities", extensionID))
	}
	if id == nil || *id == "" {
		return "", &jsonrpc.Error{Code: message.CodeInvalidParams, Message: "params.taskId is required: the id of a task this server created"}
	}
	return *id, nil
}

// missingCapability is the -32021 error, with the extension named as
// SEP-2663 shows it.
func missingCapability(msg string) error {
	data, _ := json.Marshal(map[string]any{"requiredCapabilities": map[string]any{"extensions": map[string]any{extensionID: map[string]any{}}}})
	return &jsonrpc.Error{Code: message.CodeMissingClientCapability, Message: msg, Data: data}
}

// notFound is the -32602 of a task id the server does not hold (any other
// error passes).
func notFound(err error, id string) error {
	if errors.Is(err, errNotFound) {
		return &jsonrpc.Error{Code: message.CodeInvalidParams, Message: fmt.Sprintf("failed to retrieve task %q: task not found (it never existed, or its ttlMs passed)", id)}
	}
	return err
}

package main

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/Tahul/caddy-zidane-mcp/message"
)

// The statuses of a task (SEP-2663).
const (
	statusWorking       = "working"
	statusInputRequired = "input_required"
	statusCompleted     = "completed"
	statusFailed        = "failed"
	statusCancelled     = "cancelled"
)

// pollInterval is the pollIntervalMs the server suggests.
const pollInterval = 250 * time.Millisecond

// store holds the tasks: at most max at once, each for ttl after it was
// created.
type store struct {
	max int
	ttl time.Duration

	mu    sync.Mutex
	tasks map[string]*task
}

func newStore(max int, ttl time.Duration) *store {
	return &store{max: max, ttl: ttl, tasks: map[string]*task{}}
}

// task is one task. Its fields are guarded by the store's mutex.
type task struct {
	id               string
	status           string
	message          string
	created, updated time.Time
	result           json.RawMessage // completed
	rpcErr           *jsonrpc.Error  // failed
	// pending are the outstanding input requests, by key, as they go on
	// the wire; answers the responses to them so far.
	pending map[string]json.RawMessage
	answers map[string]json.RawMessage
	// issued are the keys of every input request the task made: a key is
	// never used twice in a task's life.
	issued map[string]bool
	wake   chan struct{} // a tasks/update delivered responses
	cancel context.CancelFunc
	expiry *time.Timer
}

// terminal reports whether status is one a task never leaves.
func terminal(status string) bool {
	return status == statusCompleted || status == statusFailed || status == statusCancelled
}

// work is what a task does: the tool's result, or a protocol error. It may
// ask the client for input.
type work func(ctx context.Context, ask asker) (*mcp.CallToolResult, error)

// asker asks the client for input: it returns a response for every key of
// requests.
type asker func(ctx context.Context, requests mcp.InputRequestMap) (map[string]json.RawMessage, error)

// start creates a task that runs w, and returns it once tasks/get finds
// it (SEP-2663: no CreateTaskResult before the task is durably created).
func (s *store) start(w work) (*task, error) {
	now := time.Now().UTC()
	ctx, cancel := context.WithCancel(context.Background())
	t := &task{id: rand.Text(), status: statusWorking, created: now, updated: now,
		issued: map[string]bool{}, wake: make(chan struct{}, 1), cancel: cancel}
	s.mu.Lock()
	if len(s.tasks) >= s.max {
		s.mu.Unlock()
		cancel()
		return nil, &jsonrpc.Error{Code: message.CodeInternalError,
			Message: fmt.Sprintf("the server holds %d tasks, its limit; retry once some have expired (each is kept for %d ms)", s.max, s.ttl.Milliseconds())}
	}
	s.tasks[t.id] = t
	t.expiry = time.AfterFunc(s.ttl, func() { s.expire(t.id) })
	s.mu.Unlock()
	go s.run(ctx, t, w)
	return t, nil
}

// expire drops a task whose ttl has passed, and stops its work.
func (s *store) expire(id string) {
	s.mu.Lock()
	t := s.tasks[id]
	delete(s.tasks, id)
	s.mu.Unlock()
	if t != nil {
		t.cancel()
	}
}

// run runs a task's work and records how it ended. A panic is a protocol
// error (failed), as an error of the work is; a cancelled task stays
// cancelled whatever its work returns.
func (s *store) run(ctx context.Context, t *task, w work) {
	res, err := protect(func() (*mcp.CallToolResult, error) { return w(ctx, s.asker(ctx, t)) })
	var raw json.RawMessage
	if err == nil {
		if raw, err = json.Marshal(res); err != nil {
			err = &jsonrpc.Error{Code: message.CodeInternalError, Message: "the tool's result could not be encoded: " + err.Error()}
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if terminal(t.status) {
		return
	}
	t.updated = time.Now().UTC()
	t.pending = nil
	if err != nil {
		t.status, t.rpcErr = statusFailed, asRPCError(err)
		t.message = "the job failed: " + t.rpcErr.Message
		return
	}
	t.status, t.result, t.message = statusCompleted, raw, ""
}

// protect calls f, and turns a panic into a protocol error.
func protect(f func() (*mcp.CallToolResult, error)) (res *mcp.CallToolResult, err error) {
	defer func() {
		if p := recover(); p != nil {
			res, err = nil, &jsonrpc.Error{Code: message.CodeInternalError, Message: fmt.Sprintf("internal error: the tool panicked: %v", p)}
		}
	}()
	return f()
}

// asRPCError is err as the JSON-RPC error a failed task carries.
func asRPCError(err error) *jsonrpc.Error {
	var re *jsonrpc.Error
	if errors.As(err, &re) {
		return re
	}
	return &jsonrpc.Error{Code: message.CodeInternalError, Message: err.Error()}
}

// asker is how t's work asks for input: the requests become the task's
// inputRequests (status input_required) until tasks/update has answered
// every one of them.
func (s *store) asker(ctx context.Context, t *task) asker {
	return func(ctx2 context.Context, requests mcp.InputRequestMap) (map[string]json.RawMessage, error) {
		wire, err := wireRequests(requests)
		if err != nil {
			return nil, err
		}
		s.mu.Lock()
		for k := range wire {
			if t.issued[k] {
				s.mu.Unlock()
				return nil, fmt.Errorf("input request key %q was used before in this task", k)
			}
			t.issued[k] = true
		}
		if terminal(t.status) {
			s.mu.Unlock()
			return nil, context.Canceled
		}
		t.pending, t.answers = wire, map[string]json.RawMessage{}
		t.status, t.message, t.updated = statusInputRequired, "waiting for the client's input", time.Now().UTC()
		s.mu.Unlock()
		for {
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-ctx2.Done():
				return nil, ctx2.Err()
			case <-t.wake:
			}
			s.mu.Lock()
			if len(t.pending) == 0 && !terminal(t.status) {
				answers := t.answers
				t.answers = nil
				s.mu.Unlock()
				return answers, nil
			}
			s.mu.Unlock()
		}
	}
}

// wireRequests is requests as they go on the wire, by key.
func wireRequests(requests mcp.InputRequestMap) (map[string]json.RawMessage, error) {
	data, err := json.Marshal(requests)
	if err != nil {
		return nil, err
	}
	var wire map[string]json.RawMessage
	return wire, json.Unmarshal(data, &wire)
}

// lookup returns the task with id.
func (s *store) lookup(id string) (*task, error) {
	t, ok := s.tasks[id]
	if !ok {
		return nil, errNotFound
	}
	return t, nil
}

// detailed is the DetailedTask of the task with id: what tasks/get
// answers.
func (s *store) detailed(id string) (*detailedTask, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t, err := s.lookup(id)
	if err != nil {
		return nil, err
	}
	d := &detailedTask{taskFields: s.fields(t), ResultType: "complete"}
	switch t.status {
	case statusInputRequired:
		d.InputRequests = maps.Clone(t.pending)
	case statusCompleted:
		d.Result = t.result
	case statusFailed:
		d.Error = t.rpcErr
	}
	return d, nil
}

// fields are the Task fields of t.
func (s *store) fields(t *task) taskFields {
	return taskFields{
		TaskID:         t.id,
		Status:         t.status,
		StatusMessage:  t.message,
		CreatedAt:      t.created.Format(time.RFC3339Nano),
		LastUpdatedAt:  t.updated.Format(time.RFC3339Nano),
		TTLMs:          s.ttl.Milliseconds(),
		PollIntervalMs: pollInterval.Milliseconds(),
	}
}

// update delivers responses to the task's outstanding input requests.
// Responses to keys that are not outstanding (never issued, answered
// already) are ignored, as SEP-2663 has servers do; the task stays
// input_required until every outstanding request is answered.
func (s *store) update(id string, responses map[string]json.RawMessage) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	t, err := s.lookup(id)
	if err != nil {
		return err
	}
	delivered := false
	for _, k := range slices.Sorted(maps.Keys(responses)) {
		if _, ok := t.pending[k]; !ok {
			continue
		}
		delete(t.pending, k)
		t.answers[k] = responses[k]
		delivered = true
	}
	if !delivered {
		return nil
	}
	t.updated = time.Now().UTC()
	if len(t.pending) == 0 && t.status == statusInputRequired {
		t.status, t.message = statusWorking, ""
	}
	select {
	case t.wake <- struct{}{}:
	default:
	}
	return nil
}

// cancelTask cancels the task's work; a terminal task stays as it is.
func (s *store) cancelTask(id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	t, err := s.lookup(id)
	if err != nil {
		return err
	}
	if terminal(t.status) {
		return nil
	}
	t.status, t.message, t.updated, t.pending = statusCancelled, "cancelled by the client", time.Now().UTC(), nil
	t.cancel()
	return nil
}

// taskFields are the fields of SEP-2663's Task.
type taskFields struct {
	TaskID         string `json:"taskId"`
	Status         string `json:"status"`
	StatusMessage  string `json:"statusMessage,omitempty"`
	CreatedAt      string `json:"createdAt"`
	LastUpdatedAt  string `json:"lastUpdatedAt"`
	TTLMs          int64  `json:"ttlMs"`
	PollIntervalMs int64  `json:"pollIntervalMs"`
}

// createTaskResult is a CreateTaskResult: the task flat on the result,
// with resultType "task".
type createTaskResult struct {
	mcp.ResultBase
	ResultType string `json:"resultType"`
	taskFields
}

// detailedTask is tasks/get's result.
type detailedTask struct {
	mcp.ResultBase
	ResultType string `json:"resultType"`
	taskFields
	InputRequests map[string]json.RawMessage `json:"inputRequests,omitempty"`
	Result        json.RawMessage            `json:"result,omitempty"`
	Error         *jsonrpc.Error             `json:"error,omitempty"`
}

// ackResult is the empty acknowledgement of tasks/update and tasks/cancel.
type ackResult struct {
	mcp.ResultBase
	ResultType string `json:"resultType"`
}

package caddymodule

import (
	"context"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
)

// exitGrace is how long requests still running when the process starts to
// exit get to finish before their context is cancelled.
const exitGrace = 2 * time.Second

var (
	exitOnce sync.Once
	exitCtx  context.Context
)

// processExit returns a context that ends shortly after the process begins
// to exit. Caddy's default shutdown waits for every open request without
// limit, and an MCP stream (an SSE GET, a long tool call) never ends on its
// own: without this, a SIGTERM with a client connected would hang. A reload
// does not end it: open streams stay on the old handler until they end.
//
// Caddy has no hook that runs before its HTTP servers stop (OnExit runs
// after), so a process-wide goroutine watches caddy.Exiting.
func processExit() context.Context {
	exitOnce.Do(func() {
		var cancel context.CancelFunc
		exitCtx, cancel = context.WithCancel(context.Background())
		go func() {
			t := time.NewTicker(100 * time.Millisecond)
			defer t.Stop()
			for range t.C {
				if caddy.Exiting() {
					time.Sleep(exitGrace)
					cancel()
					return
				}
			}
		}()
	})
	return exitCtx
}

//lint:file-ignore SA1019 session events travel as notifications/message to 2025-11-25 clients only (deprecated from 2026-07-28, SEP-2577, whose clients get resource updates instead); see doc.go.

package mcpendpoint

import (
	"context"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/Tahul/caddy-zidane-mcp/sessions"
)

const (
	// eventLogger is the logger name of session-event log notifications.
	eventLogger = "session-event"
	// peerQueue bounds the events waiting to be pushed to one MCP session.
	// When a client is so slow that it fills, further events are not pushed
	// to it; they stay in the engine's log for `events` and `wait`.
	peerQueue = 256
	// pushTimeout bounds one push.
	pushTimeout = 10 * time.Second
	// peerSweepEvery is how often closed MCP sessions are forgotten.
	peerSweepEvery = 30 * time.Second
)

// peer is a connected MCP session that events may be pushed to. It costs
// nothing while no event is on its way: the queue grows on demand and a
// goroutine drains it only while it holds events, because an endpoint may
// hold ten thousand idle MCP sessions.
type peer struct {
	ss *mcp.ServerSession
	// channel is set when the client declared the claude/channel capability.
	channel bool

	mu      sync.Mutex
	queue   []sessions.Event
	pushing bool // a drain goroutine runs
	gone    bool // the MCP session closed
}

// track starts pushing to ss until it closes.
func (e *Endpoint) track(ss *mcp.ServerSession) {
	p := &peer{ss: ss}
	if ip := ss.InitializeParams(); ip != nil && ip.Capabilities != nil {
		_, p.channel = ip.Capabilities.Experimental[channelCapability]
	}
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		// Not inline: Close waits for the initialize call we are inside.
		go ss.Close()
		return
	}
	e.peers[ss.ID()] = p
	e.mu.Unlock()
}

// sweepPeers forgets the MCP sessions that have closed, every interval.
// One sweep over the server's live sessions costs less than a goroutine
// per session waiting for its end.
func (e *Endpoint) sweepPeers(interval time.Duration) {
	defer e.wg.Done()
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-e.stopSweep:
			return
		case <-t.C:
			e.forgetClosed()
		}
	}
}

// untrack forgets the peer of MCP session id at once, rather than at the
// next sweep: its session was closed for idleness.
func (e *Endpoint) untrack(id string) {
	e.mu.Lock()
	p := e.peers[id]
	delete(e.peers, id)
	e.mu.Unlock()
	if p != nil {
		p.mu.Lock()
		p.gone, p.queue = true, nil
		p.mu.Unlock()
	}
}

// forgetClosed drops the peers whose MCP session is no longer live.
func (e *Endpoint) forgetClosed() {
	live := map[string]bool{}
	for ss := range e.server.Sessions() {
		live[ss.ID()] = true
	}
	e.mu.Lock()
	var gone []*peer
	for id, p := range e.peers {
		if !live[id] {
			delete(e.peers, id)
			gone = append(gone, p)
			e.idle.Closed(id)
		}
	}
	e.mu.Unlock()
	for _, p := range gone {
		p.mu.Lock()
		p.gone, p.queue = true, nil
		p.mu.Unlock()
	}
}

// onEvent is the engine subscription. It must not block: it hands the event
// to the target session's queue.
func (e *Endpoint) onEvent(ev sessions.Event) {
	e.queueUpdate(ev.SessionID)
	if ev.Target == "" {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	p := e.peers[ev.Target]
	if p == nil || e.closed {
		return // not connected: the event stays in the engine's log
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.gone {
		return
	}
	if len(p.queue) >= peerQueue {
		e.log.Warn("mcpendpoint: push queue full, event left in the engine's log",
			"mcp_session", ev.Target, "session", ev.SessionID, "seq", ev.Seq)
		return
	}
	p.queue = append(p.queue, ev)
	if !p.pushing {
		p.pushing = true
		e.wg.Add(1) // under e.mu, so never after Close began waiting
		go e.drain(p)
	}
}

// drain pushes p's queued events in order, then ends.
func (e *Endpoint) drain(p *peer) {
	defer e.wg.Done()
	for {
		p.mu.Lock()
		if p.gone || len(p.queue) == 0 {
			p.pushing, p.queue = false, nil
			p.mu.Unlock()
			return
		}
		ev := p.queue[0]
		p.queue = p.queue[1:]
		p.mu.Unlock()
		e.push(p, ev)
	}
}

// eventData is the data of a session-event log notification: the event,
// and the text a model reads.
type eventData struct {
	sessions.Event
	Text string `json:"text"`
}

// push sends ev to one MCP session. With no GET stream open, go-sdk keeps
// the message in its EventStore and replays it when the stream opens.
func (e *Endpoint) push(p *peer, ev sessions.Event) {
	ctx, cancel := context.WithTimeout(context.Background(), pushTimeout)
	defer cancel()
	text := ev.Render()
	level := eventLevel(ev.Status)
	err := p.ss.Log(ctx, &mcp.LoggingMessageParams{
		Logger: eventLogger,
		Level:  level,
		Data:   eventData{Event: ev, Text: text},
	})
	if err == nil && p.channel {
		err = p.ss.Log(ctx, &mcp.LoggingMessageParams{
			Logger: channelLogger,
			Level:  level,
			Data:   channelParams{Content: text, Meta: channelMeta(ev)},
		})
	}
	if err != nil {
		e.log.Debug("mcpendpoint: push failed, event left in the engine's log",
			"mcp_session", p.ss.ID(), "session", ev.SessionID, "seq", ev.Seq, "error", err)
	}
}

// eventLevel is the MCP log level of an event: warning for what needs the
// caller (a failure, a pending decision), info otherwise.
func eventLevel(s sessions.EventStatus) mcp.LoggingLevel {
	switch s {
	case sessions.EventError, sessions.EventNeedsAttention:
		return "warning"
	default:
		return "info"
	}
}

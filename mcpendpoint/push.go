//lint:file-ignore SA1019 session events travel as notifications/message, deprecated only from protocol 2026-07-28 (SEP-2577), which this stateful endpoint does not speak; see doc.go.

package mcpendpoint

import (
	"context"
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
)

// peer is a connected MCP session that events may be pushed to.
type peer struct {
	ss *mcp.ServerSession
	// channel is set when the client declared the claude/channel capability.
	channel bool
	queue   chan sessions.Event
}

// track starts pushing to ss until it closes.
func (e *Endpoint) track(ss *mcp.ServerSession) {
	p := &peer{ss: ss, queue: make(chan sessions.Event, peerQueue)}
	if ip := ss.InitializeParams(); ip != nil && ip.Capabilities != nil {
		_, p.channel = ip.Capabilities.Experimental[channelCapability]
	}
	id := ss.ID()

	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		// Not inline: Close waits for the initialize call we are inside.
		go ss.Close()
		return
	}
	e.peers[id] = p
	e.wg.Add(1)
	e.mu.Unlock()

	gone := make(chan struct{})
	go func() {
		ss.Wait()
		e.mu.Lock()
		if e.peers[id] == p {
			delete(e.peers, id)
		}
		e.mu.Unlock()
		close(gone)
	}()
	go func() {
		defer e.wg.Done()
		for {
			select {
			case ev := <-p.queue:
				e.push(p, ev)
			case <-gone:
				return
			}
		}
	}()
}

// onEvent is the engine subscription. It must not block: it hands the event
// to the target session's queue.
func (e *Endpoint) onEvent(ev sessions.Event) {
	if ev.Target == "" {
		return
	}
	e.mu.Lock()
	p := e.peers[ev.Target]
	e.mu.Unlock()
	if p == nil {
		return // not connected: the event stays in the engine's log
	}
	select {
	case p.queue <- ev:
	default:
		e.log.Warn("mcpendpoint: push queue full, event left in the engine's log",
			"mcp_session", ev.Target, "session", ev.SessionID, "seq", ev.Seq)
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

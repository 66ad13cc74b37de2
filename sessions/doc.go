// Package sessions is the session engine: coding-agent sessions, each with
// its own agent process driven over the Agent Client Protocol (ACP), its own
// FIFO prompt queue, steering, cancellation, interactions (first answer
// wins), a bounded event log and transcripts, persisted through the
// project's storage interface. It never speaks MCP and never checks a
// credential: the MCP endpoint calls it through the Sessions interface with
// an Owner the edge already authenticated. It does decide ownership: each
// session belongs to the owner that created it, whose credentials alone act
// on it and see it, and whose MCP session its events are pushed to, unless
// a caller's Access reaches other owners' sessions (share_sessions,
// sessions:any). It tells the gateway, through Config hooks, when a session
// launches an agent (MCPServers, to mint the agent's credentials) and when
// it ends (Ended, to delete them). Who sees which session is one rule
// ([Sees]); a cluster's directory of every node's sessions applies it to
// the listings ([Engine.Listing]) each node writes when its engine says a
// session changed ([Engine.OnChange]).
//
// Agents are treated as hostile code on the host. Each gets a minimal
// environment (PATH and LANG, a HOME and TMPDIR in a scratch directory of
// its session's, its configured env), optionally another user, and, with a
// Sandbox, runs under package confine: it writes only its cwd, worktree and
// scratch directory, reads only the system and its own directories, and
// connects only to its MCP servers' ports and AgentPorts. Config.Deny (the
// gateway's data and configuration, the files it reads secrets from, its
// logs; asked again at every create and launch) is out of every agent's
// reach, through the sandbox and through the fs/* methods the gateway
// serves alike, and a session whose cwd or worktree is, holds or is inside
// one of its paths is refused with ErrDenied. The
// git that makes a worktree runs with no hooks, a scrubbed environment, and
// the agent's user and sandbox, since the repository is the agent's.
package sessions

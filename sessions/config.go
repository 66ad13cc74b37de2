package sessions

import (
	"log/slog"
	"sort"
	"time"

	acp "github.com/coder/acp-go-sdk"

	"github.com/Tahul/caddy-zidane-mcp/gatewayfiles"
	"github.com/Tahul/caddy-zidane-mcp/sessions/acpclient"
	"github.com/Tahul/caddy-zidane-mcp/storage"
)

// AgentConfig says how to launch one kind of agent.
type AgentConfig struct {
	// Command is the program that speaks ACP on stdio, and its arguments,
	// e.g. ["claude-agent-acp"] or ["caddy", "zidane", "demo-agent"].
	Command []string
	// Env is added to the agent's minimal environment: PATH and LANG from
	// the gateway, and HOME and TMPDIR in the session's scratch directory
	// (see Config.ScratchRoot); nothing else of the gateway's environment
	// passes. In a value, ${NAME} is the gateway's NAME, so a secret can
	// stay in the environment rather than in the configuration.
	Env map[string]string
	// User, when set, is the account the agent (and the git that makes its
	// worktree) runs as; the scratch directory is given to it.
	User *User
	// Sandbox, when set, confines the agent through Config.Confine; nil
	// runs it unconfined.
	Sandbox *Sandbox
}

// User is an account to run an agent as.
type User = acpclient.User

// Sandbox is what a confined agent may reach besides what every confined
// agent may: reading the system directories (confine.SystemRead) and its
// command's directories, writing its session's cwd, worktree and scratch
// directory, and TCP connects to the ports of the MCP servers it is given
// and to AgentPorts. What Config.Deny returns stays out of reach whatever
// is listed.
type Sandbox struct {
	// Read are more paths it may read and execute.
	Read []string
	// Write are more paths it may write.
	Write []string
	// Connect are more TCP ports it may connect to.
	Connect []uint16
	// ConnectAny lifts the network rule.
	ConnectAny bool
	// BestEffort confines as far as the kernel allows instead of failing
	// the launch on a kernel that cannot enforce the rules.
	BestEffort bool
}

// AgentPorts are the TCP ports every confined agent may connect to, on
// any host: HTTPS, HTTP, SSH (git) and DNS. Loopback services on other
// ports, Caddy's admin API among them, are out of reach.
var AgentPorts = []uint16{443, 80, 22, 53}

// McpServer is an MCP server an agent should connect to, given to it in
// session/new and session/load. Set Command for a stdio server, or URL
// for an HTTP one (SSE for the older SSE transport).
type McpServer struct {
	Name    string
	Command string
	Args    []string
	Env     map[string]string
	URL     string
	Headers map[string]string
	SSE     bool
}

// SessionInfo is what the MCPServers hook knows about a session.
type SessionInfo struct {
	SessionID string
	Title     string
	Cwd       string
	Agent     string
	// Owner is who created the session: its credential (TokenID, and the
	// Expires and Issued of the creator's latest call), and the owner it
	// acts for (ID). MCPSession is where the session's events go.
	Owner Owner
	// Tools and Subscribe are CreateRequest's, for orchestrator sessions.
	Tools     []string
	Subscribe bool
	// Base is CreateRequest.Base: where the agent reaches the gateway.
	Base string
}

// Config configures an Engine.
type Config struct {
	// Agents are the agents sessions may use, by name.
	Agents map[string]AgentConfig
	// DefaultAgent is used when a CreateRequest names none. With a single
	// configured agent it may be left empty.
	DefaultAgent string
	// Storage keeps sessions across restarts (keys under zidane/sessions/,
	// or zidane/nodes/<Node>/sessions/ with a Node). Nil keeps them in
	// memory only.
	Storage storage.Storage
	// Node is this gateway's node id in a cluster whose replicas share
	// Storage ([CheckNode]). It ends every session and request id
	// ("ses_<16>.<node>"), so that any replica knows which one runs a
	// session ([NodeOf]), and it keeps each node's sessions under a key of
	// its own, so a node resumes its own sessions at restart and no one
	// else's. Empty on a single node.
	Node string
	// LinkFor returns the link shown for a session (e.g. a page of the
	// gateway), on the session's base (CreateRequest.Base); nil means no
	// link.
	LinkFor func(sessionID, base string) string
	// MCPServers returns the MCP servers a session's agent gets in
	// session/new and session/load. It is called at every launch, a
	// resume included, so it can mint fresh credentials. Nil means none.
	MCPServers func(s SessionInfo) []McpServer
	// Ended, when set, is called once a session can take no more prompts
	// (its agent failed, or could not resume after a restart) or is
	// dropped to stay within MaxSessions, so that the gateway deletes the
	// credentials it minted for the session's agent. It runs in a
	// goroutine of its own; Close waits for it as for the agents.
	Ended func(sessionID string)
	// WorktreeRoot is where worktree environments are created, as
	// <WorktreeRoot>/<repository>-<branch>. Empty means a .worktrees
	// directory next to the repository: <repo>/../.worktrees/.
	WorktreeRoot string
	// Roots, when set, confine sessions to these directory trees: a
	// session's cwd, and for a worktree environment the repository, its git
	// directory and the new worktree, must each lie inside one of them once
	// symlinks are resolved (see [Engine.SetRoots]). Empty means any
	// directory of this host, as the gateway's user can reach it.
	Roots []string
	// Confine is the command that confines an agent with a Sandbox: it
	// takes the flags of confine.Policy.Args, "--" and the agent's command,
	// such as ["/usr/bin/caddy", "zidane", "confine"]. It must be set when
	// an agent has a Sandbox.
	Confine []string
	// Deny returns the paths agents must never reach, as they are now:
	// Caddy's data and config directories, the files the gateway reads
	// secrets from, its logs. It is called at every create and launch, so
	// that a file a reloaded configuration names counts at once. A session
	// whose cwd or worktree is, holds or is inside one is refused (with
	// ErrDenied), for the fs/* methods that the gateway serves as well as
	// for the sandbox. Nil denies nothing.
	Deny func() []gatewayfiles.File
	// Denied, when set, is told of an agent launch refused for a path of
	// Deny (a session resumed or relaunched in a directory that has since
	// become the gateway's): a refusal that no tool call answers, so that
	// the gateway audits it. owner is the session's owner; err wraps
	// ErrDenied and says why.
	Denied func(owner Owner, sessionID string, err error)
	// ScratchRoot holds each session's scratch directory (its agent's HOME
	// and TMPDIR), <ScratchRoot>/<session id>, made at the first launch
	// and removed when the session ends. Default:
	// <os.TempDir()>/zidane-agents.
	ScratchRoot string
	// Limits bound what the engine holds; zero fields take the defaults.
	Limits Limits
	// Logger gets agent launches and ends, agent stderr (Debug) and
	// storage failures. Nil discards.
	Logger *slog.Logger
}

// Limits bound the engine. Every zero field takes the default shown.
type Limits struct {
	MaxQueue           int // prompts queued per session: 100
	MaxTurns           int // transcript turns kept per session: 200
	MaxAnswerBytes     int // agent text kept per turn: 1 MiB
	MaxTranscriptBytes int // transcript text kept per session: 8 MiB
	MaxPromptBytes     int // one prompt or steering text: 256 KiB
	MaxEvents          int // events kept overall: 10,000
	MaxSessionEvents   int // events stored per session: 500
	MaxPending         int // pending interactions per session: 32
	MaxSessions        int // sessions kept (ended ones are dropped first): 1,000
	MaxAgents          int // agent processes running at once: 64
	// MaxSessionsPerToken bounds the live (not ended) sessions that one
	// token created: default a tenth of MaxSessions (100), so that one
	// token cannot keep the gateway full. MaxAgentsPerToken bounds the
	// agent processes that one token's sessions hold: default a quarter of
	// MaxAgents (16), so that a token running long turns leaves the other
	// three quarters to everyone else. Both are at least 1.
	MaxSessionsPerToken int
	MaxAgentsPerToken   int
	LaunchTimeout       time.Duration // initialize + session/new or session/load: 60s
	CancelTimeout       time.Duration // a turn's end after session/cancel: 10s
	// IdleTimeout stops the process of a session that has been idle this
	// long, when its agent supports session/load: the session stays idle
	// and the next prompt relaunches the agent and loads the session.
	// Agents without session/load are never stopped for idleness. Before
	// a launch is refused for MaxAgents or MaxAgentsPerToken, the least
	// recently used such idle agent is stopped the same way, whatever its
	// idle time. Default 30m; negative disables the timer (not that
	// eviction).
	IdleTimeout time.Duration
}

// DefaultMaxEvents is Limits.MaxEvents unless set.
const DefaultMaxEvents = 10000

func (l Limits) withDefaults() Limits {
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&l.MaxQueue, 100)
	def(&l.MaxTurns, 200)
	def(&l.MaxAnswerBytes, 1<<20)
	def(&l.MaxTranscriptBytes, 8<<20)
	def(&l.MaxPromptBytes, 256<<10)
	def(&l.MaxEvents, DefaultMaxEvents)
	def(&l.MaxSessionEvents, 500)
	def(&l.MaxPending, 32)
	def(&l.MaxSessions, 1000)
	def(&l.MaxAgents, 64)
	def(&l.MaxSessionsPerToken, max(1, l.MaxSessions/10))
	def(&l.MaxAgentsPerToken, max(1, l.MaxAgents/4))
	if l.LaunchTimeout <= 0 {
		l.LaunchTimeout = 60 * time.Second
	}
	if l.CancelTimeout <= 0 {
		l.CancelTimeout = 10 * time.Second
	}
	if l.IdleTimeout == 0 {
		l.IdleTimeout = 30 * time.Minute
	}
	return l
}

func (c *Config) agentNames() []string {
	names := make([]string, 0, len(c.Agents))
	for n := range c.Agents {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// acpServers turns the hook's servers into ACP's form.
func acpServers(list []McpServer) []acp.McpServer {
	out := make([]acp.McpServer, 0, len(list))
	for _, s := range list {
		switch {
		case s.URL != "" && s.SSE:
			out = append(out, acp.McpServer{Sse: &acp.McpServerSseInline{Name: s.Name, Type: "sse", Url: s.URL, Headers: headers(s.Headers)}})
		case s.URL != "":
			out = append(out, acp.McpServer{Http: &acp.McpServerHttpInline{Name: s.Name, Type: "http", Url: s.URL, Headers: headers(s.Headers)}})
		default:
			env := make([]acp.EnvVariable, 0, len(s.Env))
			for _, k := range sortedKeys(s.Env) {
				env = append(env, acp.EnvVariable{Name: k, Value: s.Env[k]})
			}
			args := s.Args
			if args == nil {
				args = []string{}
			}
			out = append(out, acp.McpServer{Stdio: &acp.McpServerStdio{Name: s.Name, Command: s.Command, Args: args, Env: env}})
		}
	}
	return out
}

func headers(m map[string]string) []acp.HttpHeader {
	h := make([]acp.HttpHeader, 0, len(m))
	for _, k := range sortedKeys(m) {
		h = append(h, acp.HttpHeader{Name: k, Value: m[k]})
	}
	return h
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

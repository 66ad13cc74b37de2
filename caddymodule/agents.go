package caddymodule

import (
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/certmagic"

	"go.uber.org/zap"

	"github.com/Tahul/caddy-zidane-mcp/cluster"
	"github.com/Tahul/caddy-zidane-mcp/gatewayfiles"

	"github.com/Tahul/caddy-zidane-mcp/sessions"
	"github.com/Tahul/caddy-zidane-mcp/sessions/confine"
)

// SandboxConfig is what a session's agent may reach. By default every
// agent is confined (Landlock, on Linux 6.7 and later): it reads the system
// directories (/usr, /bin, /sbin, /lib*, /etc, /opt, /proc, /sys, /run) and
// the directories of its command, writes only its session's cwd, worktree
// and scratch directory (its HOME and TMPDIR), and connects by TCP only to
// the ports of the MCP servers it is given (this gateway's) and to 443, 80,
// 22 and 53. Caddy's data and configuration directories, the files this
// config reads secrets from and its logs stay out of reach, and a Read or
// Write path that is, holds or is inside one is refused.
type SandboxConfig struct {
	// Off runs the agent unconfined: it can then read everything Caddy's
	// user can, and reach the admin API. A warning is logged at start.
	Off bool `json:"off,omitempty"`
	// Read are more paths the agent may read and execute (a toolchain
	// outside the system directories, say). A path that is, holds or is
	// inside a file the gateway keeps from agents is refused when the
	// config starts.
	Read []string `json:"read,omitempty"`
	// Write are more paths it may write; the same rule holds.
	Write []string `json:"write,omitempty"`
	// Connect are more TCP ports it may connect to, on any host (a model
	// server on a loopback port, say).
	Connect []int `json:"connect,omitempty"`
	// ConnectAny lifts the network rule: the agent may connect anywhere,
	// Caddy's admin API included.
	ConnectAny bool `json:"connect_any,omitempty"`
	// BestEffort confines the agent as far as the kernel allows, down to
	// not at all, where by default a launch on a kernel that cannot enforce
	// the rules fails.
	BestEffort bool `json:"best_effort,omitempty"`
}

// engine is the session engine's form of c: nil when the sandbox is off.
func (c *SandboxConfig) engine() *sessions.Sandbox {
	if c == nil {
		return &sessions.Sandbox{}
	}
	if c.Off {
		return nil
	}
	sb := &sessions.Sandbox{Read: c.Read, Write: c.Write, ConnectAny: c.ConnectAny, BestEffort: c.BestEffort}
	for _, p := range c.Connect {
		sb.Connect = append(sb.Connect, uint16(p))
	}
	return sb
}

// selfCommand is this binary with args, as agents and the confiner are
// launched.
func selfCommand(args ...string) ([]string, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("finding this binary, which confines agents: %v", err)
	}
	return append([]string{self}, args...), nil
}

// provisionAgents checks the agents' sandboxes, looks up their users and
// collects the paths no agent may reach.
func (a *App) provisionAgents(ctx caddy.Context) error {
	log := ctx.Logger().Named("sessions")
	a.agentUsers = map[string]*sessions.User{}
	names := make([]string, 0, len(a.Agents))
	for name := range a.Agents {
		names = append(names, name)
	}
	sort.Strings(names)
	confined, bestEffort := 0, 0
	if _, ok := a.Agents[demoAgentName]; !ok {
		confined++ // the built-in demo agent
	}
	for _, name := range names {
		ac := a.Agents[name]
		if ac == nil {
			continue
		}
		if sb := ac.Sandbox; sb != nil {
			for _, p := range append(append([]string{}, sb.Read...), sb.Write...) {
				if !filepath.IsAbs(p) {
					return fmt.Errorf("agent %s: sandbox path %q is not absolute; give it from the root", name, p)
				}
			}
			for _, p := range sb.Connect {
				if p < 1 || p > 65535 {
					return fmt.Errorf("agent %s: sandbox connect %d is not a TCP port (1 to 65535)", name, p)
				}
			}
			if sb.Off {
				log.Warn("an agent runs unconfined (sandbox off): it can read what Caddy's user can and reach Caddy's admin API",
					zap.String("agent", name))
			} else if sb.BestEffort {
				bestEffort++
			}
		}
		if ac.Sandbox == nil || !ac.Sandbox.Off {
			confined++
		}
		if ac.User != "" {
			u, err := lookupAgentUser(ac.User)
			if err != nil {
				return fmt.Errorf("agent %s: %w", name, err)
			}
			a.agentUsers[name] = u
		} else if os.Geteuid() == 0 {
			// Confined, it still reads what root may read under the
			// sandbox's system directories (/etc, /run), beyond the few
			// files confine.SystemDeny keeps from it.
			log.Warn("an agent runs as root, without capabilities but able to read root's files under /etc and /run (operators' EnvironmentFile= secrets among them); give it `user NAME`",
				zap.String("agent", name))
		}
	}
	if confined > 0 {
		if err := confine.Check(); err != nil {
			// Launches fail with this message, unless the agent's sandbox
			// is best_effort or off; saying so at start saves a surprise.
			log.Warn("agents cannot be confined on this system, so their sessions will fail to start; set `sandbox { best_effort }` or `sandbox off` on each agent (the demo agent included: configure an agent named demo) to run them anyway",
				zap.Error(err))
		}
	}
	if def := a.DefaultAgent; def != "" && def != demoAgentName && a.Agents[def] == nil {
		known := []string{}
		if _, ok := a.Agents[demoAgentName]; !ok {
			known = append(known, demoAgentName)
		}
		known = append(known, names...)
		return fmt.Errorf("zidane: default_agent %q is not configured: name one of %s, or configure an agent of that name", def, strings.Join(known, ", "))
	}
	return nil
}

// lookupAgentUser finds name (or a numeric uid) and checks that Caddy can
// run a process as it.
func lookupAgentUser(name string) (*sessions.User, error) {
	u, err := user.Lookup(name)
	if err != nil {
		if _, nerr := strconv.Atoi(name); nerr == nil {
			u, err = user.LookupId(name)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("user %q: %v; give an account of this host", name, err)
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err1 != nil || err2 != nil {
		return nil, fmt.Errorf("user %q has no numeric uid and gid; agents can run as another user on Unix only", name)
	}
	out := &sessions.User{Name: u.Username, UID: uint32(uid), GID: uint32(gid)}
	if gids, err := u.GroupIds(); err == nil {
		for _, g := range gids {
			if n, err := strconv.ParseUint(g, 10, 32); err == nil {
				out.Groups = append(out.Groups, uint32(n))
			}
		}
	}
	if int(out.UID) != os.Geteuid() {
		if err := canSwitchUser(); err != nil {
			return nil, fmt.Errorf("user %q: %w; run caddy as root (or with CAP_SETUID and CAP_SETGID), or drop `user`", name, err)
		}
	}
	return out, nil
}

// ownFiles are the files of this app's config that no agent may reach:
// Caddy's data and config directories, the configured storage (a file
// storage's directory, a NATS storage's credentials and TLS client key and
// certificate), systemd's credentials, the files this config reads
// secrets or upstreams from ({file.…} placeholders included), and the
// files of the config caddy was started with (see deny.go).
func (a *App) ownFiles(log *zap.Logger) []gatewayfiles.File {
	own := []gatewayfiles.File{{Path: caddy.AppDataDir(), Why: whyDataDir}, {Path: caddy.AppConfigDir(), Why: whyConfigDir}}
	if fs, ok := a.storage.(*certmagic.FileStorage); ok && fs.Path != "" {
		own = append(own, gatewayfiles.File{Path: fs.Path, Why: whyStorage})
	}
	// On a cluster's storage: what logs into NATS, with which an agent
	// could delete values or put back old ones.
	if cs, ok := a.storage.(*cluster.Storage); ok {
		for _, f := range cs.SecretFiles() {
			own = append(own, gatewayfiles.File{Path: f, Why: whyNATS})
		}
		// The cluster's settings, wherever they were given (storage
		// zidane_nats's, or this app's cluster block below): a
		// {file.…} key is the cluster key.
		if _, st := natsStateOf(cs); st != nil {
			own = append(own, gatewayfiles.PlaceholderFiles(&st.cfg)...)
		}
	}
	if dir := os.Getenv("CREDENTIALS_DIRECTORY"); dir != "" {
		own = append(own, gatewayfiles.File{Path: dir, Why: whyCredentials})
	}
	for _, f := range a.UpstreamsFiles {
		own = append(own, gatewayfiles.File{Path: f, Why: whyUpstreams})
	}
	for _, u := range a.upstreams {
		if o := u.OAuth; o != nil {
			own = append(own, gatewayfiles.File{Path: o.PrivateKeyFile, Why: whyOAuthKey}, gatewayfiles.File{Path: o.IDTokenFile, Why: whyIDToken},
				gatewayfiles.File{Path: o.AssertionFile, Why: whyAssertion})
		}
	}
	own = append(own, gatewayfiles.PlaceholderFiles(a)...)
	own = append(own, processConfigFiles(os.Args, log)...)
	var out []gatewayfiles.File
	for _, f := range own {
		if abs, ok := gatewayfiles.Abs(f.Path, f.Why); ok {
			out = append(out, abs)
		}
	}
	return gatewayfiles.Merge(out)
}

package sessions

import (
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"

	"github.com/Tahul/caddy-zidane-mcp/gatewayfiles"
	"github.com/Tahul/caddy-zidane-mcp/internal/pathtree"
	"github.com/Tahul/caddy-zidane-mcp/sessions/confine"
)

// denied are the paths of Config.Deny as they are now.
func (e *Engine) denied() []gatewayfiles.File {
	if e.cfg.Deny == nil {
		return nil
	}
	return e.cfg.Deny()
}

// deniedError is a session directory refused for a path of Config.Deny:
// a bad request, and ErrDenied.
type deniedError struct{ msg string }

func (e *deniedError) Error() string   { return e.msg }
func (e *deniedError) Unwrap() []error { return []error{ErrBadRequest, ErrDenied} }

// checkDenied refuses a directory of a session (what says which: "cwd",
// "the new worktree") that is, holds or is inside a path of Config.Deny:
// the agent writes there, the gateway serves its fs/* calls anywhere in
// it, and the sandbox would have to give it the directory.
func (e *Engine) checkDenied(what, dir string) error {
	return deniedIn(what, dir, e.denied())
}

func deniedIn(what, dir string, deny []gatewayfiles.File) error {
	f, how, ok := gatewayfiles.Reach(dir, deny)
	if !ok {
		return nil
	}
	shown := dir
	if real, err := pathtree.Resolve(dir); err == nil && real != filepath.Clean(dir) {
		shown = fmt.Sprintf("%s (which is %s)", dir, real)
	}
	return &deniedError{msg: fmt.Sprintf("%v: %s %s %s, which the gateway keeps from agents (read and write); agents may not work there: give the directory of a project that holds none of the gateway's secrets or logs",
		ErrBadRequest, what, shown, gatewayfiles.Describe(f, how))}
}

// agentCommand is the command that launches an agent: its own, or, with a
// sandbox, Config.Confine with the session's policy in front of it.
func (e *Engine) agentCommand(rec record, cfg AgentConfig, scratch string, servers []McpServer) []string {
	if cfg.Sandbox == nil {
		return cfg.Command
	}
	sb := cfg.Sandbox
	p := confine.Policy{
		Read:       sb.Read,
		Write:      append([]string{rec.Cwd, scratch}, sb.Write...),
		Deny:       gatewayfiles.Resolved(e.denied()),
		ConnectAny: sb.ConnectAny,
		BestEffort: sb.BestEffort,
	}
	if rec.Repo != "" {
		// A worktree: its whole checkout, and the repository's git
		// directory, where its commits and branches are written.
		if top := worktreeTop(rec.Cwd); top != "" {
			p.Write = append(p.Write, top)
		}
		if gd := filepath.Join(rec.Repo, ".git"); isDir(gd) {
			p.Write = append(p.Write, gd)
		}
	}
	ports := append(slices.Clone(AgentPorts), sb.Connect...)
	for _, s := range servers {
		if port := urlPort(s.URL); port != 0 {
			ports = append(ports, port)
		}
	}
	slices.Sort(ports)
	p.Connect = slices.Compact(ports)
	return slices.Concat(e.cfg.Confine, p.Args(), []string{"--"}, cfg.Command)
}

// worktreeTop is the top of the git worktree that holds dir: the nearest
// directory with a .git file (a worktree's .git is a file naming its
// repository), or "".
func worktreeTop(dir string) string {
	for d := dir; ; d = filepath.Dir(d) {
		if fi, err := os.Lstat(filepath.Join(d, ".git")); err == nil {
			if fi.Mode().IsRegular() {
				return d
			}
			return ""
		}
		if filepath.Dir(d) == d {
			return ""
		}
	}
}

func isDir(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.IsDir()
}

// urlPort is the TCP port an http(s) URL reaches, 0 for anything else.
func urlPort(raw string) uint16 {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return 0
	}
	if p := u.Port(); p != "" {
		n, err := strconv.ParseUint(p, 10, 16)
		if err != nil {
			return 0
		}
		return uint16(n)
	}
	switch u.Scheme {
	case "https":
		return 443
	case "http":
		return 80
	}
	return 0
}

package sessions

import (
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"

	"github.com/Tahul/caddy-zidane-mcp/internal/pathtree"
	"github.com/Tahul/caddy-zidane-mcp/sessions/confine"
)

// checkDenied refuses a session directory that is inside one of
// Config.Deny, or holds one: the gateway serves the agent's fs/* calls
// anywhere in it, and the sandbox would have to give it the directory.
func (e *Engine) checkDenied(cwd string) error {
	real, err := filepath.EvalSymlinks(cwd)
	if err != nil {
		real = cwd
	}
	for _, d := range e.cfg.Deny {
		if r, err := filepath.EvalSymlinks(d); err == nil {
			d = r
		}
		if pathtree.Within(real, d) || pathtree.Within(d, real) {
			return fmt.Errorf("%w: cwd %s holds or is inside %s, which is the gateway's own (Caddy's data or configuration, or a file of secrets); agents may not work there: give the directory of a project", ErrBadRequest, cwd, d)
		}
	}
	return nil
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
		Deny:       e.cfg.Deny,
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

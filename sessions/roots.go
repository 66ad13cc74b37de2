package sessions

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/Tahul/caddy-zidane-mcp/internal/pathtree"
)

// Roots confine the directories sessions work in. A path is inside a root
// when, with every symlink of both resolved (filepath.EvalSymlinks), the
// root is the path or one of its ancestors: a symlink inside a root that
// points out of it, `..` segments and /proc/self links all resolve to
// where they lead, and are judged there. Roots are resolved at each check,
// so a root created or moved after the configuration was loaded counts as
// it is now; a root that does not exist contains nothing.
//
// Two sets apply: the engine's (Config.Roots, the operator's) and the
// creating token's (Owner.Roots). A path must be inside both, so a token's
// roots can only narrow the operator's. An empty set does not confine.

// maxRoots bounds a roots list, the engine's or a token's.
const maxRoots = 64

// CleanRoots checks that every root is an absolute path and returns them
// cleaned.
func CleanRoots(list []string) ([]string, error) {
	if len(list) > maxRoots {
		return nil, fmt.Errorf("%d roots given; at most %d are allowed", len(list), maxRoots)
	}
	out := make([]string, 0, len(list))
	for _, r := range list {
		if !filepath.IsAbs(r) {
			return nil, fmt.Errorf("root %q is not an absolute path; give it from /, such as /srv/projects", r)
		}
		out = append(out, filepath.Clean(r))
	}
	return out, nil
}

// SetRoots replaces the engine's roots (Config.Roots). New sessions and
// every later launch of an agent, resumes included, are checked against
// them; running agents are left alone. Nil removes the confinement.
func (e *Engine) SetRoots(roots []string) error {
	clean, err := CleanRoots(roots)
	if err != nil {
		return fmt.Errorf("sessions: %w", err)
	}
	for _, r := range clean {
		if _, err := os.Stat(r); err != nil {
			e.log.Warn("a root does not exist (yet); it confines sessions to nothing until it does", "root", r, "error", err)
		}
	}
	e.mu.Lock()
	e.roots = clean
	e.mu.Unlock()
	return nil
}

// rootSets returns the roots that apply to a session of a token with
// tokenRoots: the engine's, then the token's.
func (e *Engine) rootSets(tokenRoots []string) [2][]string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return [2][]string{e.roots, tokenRoots}
}

// confined reports whether any roots apply.
func confined(sets [2][]string) bool { return len(sets[0]) > 0 || len(sets[1]) > 0 }

// inRoots resolves path and checks it against sets; what names the path in
// the refusal ("cwd", "the repository"). It returns the resolved path.
// With no roots set it returns path unchanged, unchecked.
func inRoots(sets [2][]string, what, path string) (string, error) {
	if !confined(sets) {
		return path, nil
	}
	real, err := pathtree.Resolve(path)
	if err != nil {
		return "", fmt.Errorf("%w: %s %s cannot be resolved (%v), so it cannot be checked against the allowed roots", ErrBadRequest, what, path, err)
	}
	shown := path
	if real != filepath.Clean(path) {
		shown = fmt.Sprintf("%s (which is %s)", path, real)
	}
	for i, set := range sets {
		if len(set) == 0 || insideAny(real, set) {
			continue
		}
		whose := "this gateway's allowed roots"
		if i == 1 {
			whose = "your token's allowed roots"
		}
		return "", fmt.Errorf("%w: %s %s is outside %s (%s); give a directory inside one of them", ErrBadRequest, what, shown, whose, strings.Join(set, ", "))
	}
	return real, nil
}

// insideAny reports whether the resolved path real lies in one of roots.
func insideAny(real string, roots []string) bool {
	for _, r := range roots {
		rr, err := filepath.EvalSymlinks(r)
		if err != nil {
			continue
		}
		if pathtree.Within(real, rr) {
			return true
		}
	}
	return false
}

// Package gatewayfiles knows which files are the gateway's own: those its
// configuration reads secrets from ({file.…} placeholders, key and
// credential files, TLS keys, the config file itself) and those it writes
// its evidence to (log files, with their rotated files and locks). The
// session engine keeps agents from every one of them, and refuses a
// session directory or sandbox path that reaches one.
//
// Each module of the gateway holds its own files in a [Registry] for as
// long as it is provisioned; [InConfig] finds those that Caddy's own
// modules read in a config; [Reach] says whether a path reaches one.
//
// What it never does: read the files, or decide what an agent may do
// elsewhere.
package gatewayfiles

import (
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/Tahul/caddy-zidane-mcp/internal/pathtree"
)

// File is one path of the gateway's, and what it is.
type File struct {
	// Path is absolute and clean: a file or a directory, which may not
	// exist yet (a log directory made at the first record).
	Path string
	// Why says what the path is, as a refusal shows it: "the JWT
	// public_key_file", "the zidane_audit log's directory".
	Why string
}

// Why texts shared by the gateway's modules.
const (
	WhyPlaceholder = "a file a {file.…} placeholder of the config reads"
	WhyCaddyLog    = "the directory of one of Caddy's file logs, with its rotated files"
	WhyTLS         = "a TLS certificate or key file of Caddy's tls app"
	WhyTLSFolder   = "a folder of TLS certificates and keys of Caddy's tls app"
	WhyPKI         = "a certificate or key file of Caddy's pki app"
	WhyClientCert  = "a TLS client certificate or key file of a reverse_proxy"
)

// Abs makes f's path absolute (against the working directory, as Caddy
// reads a relative path) and clean; ok is false when it cannot.
func Abs(path, why string) (File, bool) {
	if path == "" {
		return File{}, false
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return File{}, false
	}
	return File{Path: abs, Why: why}, true
}

// Registry holds the files of the gateway's provisioned modules. A module
// adds its files when it is provisioned and releases them at cleanup; a
// config reload provisions the new config before it cleans up the old, so
// a file both name is held throughout. Safe for concurrent use.
type Registry struct {
	mu   sync.Mutex
	next uint64
	held map[uint64][]File
}

// Hold adds files until release is called (more than once is harmless).
// Paths that cannot be made absolute are dropped.
func (r *Registry) Hold(files []File) (release func()) {
	clean := make([]File, 0, len(files))
	for _, f := range files {
		if a, ok := Abs(f.Path, f.Why); ok {
			clean = append(clean, a)
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.held == nil {
		r.held = map[uint64][]File{}
	}
	r.next++
	id := r.next
	r.held[id] = clean
	return func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		delete(r.held, id)
	}
}

// Files are the files held now, each path once (with the reason its
// oldest holder gave), sorted by path.
func (r *Registry) Files() []File {
	r.mu.Lock()
	ids := make([]uint64, 0, len(r.held))
	for id := range r.held {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	var all []File
	for _, id := range ids {
		all = append(all, r.held[id]...)
	}
	r.mu.Unlock()
	return Merge(all)
}

// Merge returns files with each path once (the first reason given for
// it), sorted by path.
func Merge(lists ...[]File) []File {
	seen := map[string]bool{}
	var out []File
	for _, l := range lists {
		for _, f := range l {
			if !seen[f.Path] {
				seen[f.Path] = true
				out = append(out, f)
			}
		}
	}
	slices.SortFunc(out, func(a, b File) int { return strings.Compare(a.Path, b.Path) })
	return out
}

// Paths are the paths of files.
func Paths(files []File) []string {
	out := make([]string, len(files))
	for i, f := range files {
		out[i] = f.Path
	}
	return out
}

// How a path reaches a file of the gateway's.
const (
	Is     = "is"
	Inside = "is inside"
	Holds  = "holds"
)

// Reach reports the first of files that path is, is inside, or holds, and
// which of the three. Symlinks are resolved on both sides, as far as the
// paths exist: a link to a denied directory, or a denied path reached
// through a link, is judged where it leads. A denied path that is itself a
// link counts both as named (whoever may replace the link chooses what the
// config reads) and where it leads.
func Reach(path string, files []File) (f File, how string, ok bool) {
	real, err := pathtree.Resolve(path)
	if err != nil {
		real = filepath.Clean(path)
	}
	for _, f := range files {
		for _, d := range forms(f.Path) {
			switch {
			case real == d:
				return f, Is, true
			case pathtree.Within(real, d):
				return f, Inside, true
			case pathtree.Within(d, real):
				return f, Holds, true
			}
		}
	}
	return File{}, "", false
}

// Describe says how a path reaches f, for a refusal that starts with the
// path: "is the JWT public_key_file", "is inside /var/log/zidane, the
// zidane_audit log's directory", "holds /etc/caddy/Caddyfile, the --config
// file caddy was started with".
func Describe(f File, how string) string {
	if how == Is {
		return "is " + f.Why
	}
	return how + " " + f.Path + ", " + f.Why
}

// Resolved returns every form (see Reach) of the paths of files, for a
// sandbox that holds the inodes that paths lead to.
func Resolved(files []File) []string {
	var out []string
	for _, f := range files {
		for _, p := range forms(f.Path) {
			if !slices.Contains(out, p) {
				out = append(out, p)
			}
		}
	}
	return out
}

// forms are path as named, with its parent resolved, and where it leads.
func forms(path string) []string {
	path = filepath.Clean(path)
	named := path
	if parent, err := pathtree.Resolve(filepath.Dir(path)); err == nil {
		named = filepath.Join(parent, filepath.Base(path))
	}
	out := []string{named}
	if real, err := pathtree.Resolve(path); err == nil && real != named {
		out = append(out, real)
	}
	return out
}

package upstream

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"sort"
	"sync"
)

const (
	// MaxToolNameLength is the longest namespaced name the broker hands
	// out; some clients (Claude's API among them) refuse longer tool names.
	MaxToolNameLength = 64

	// toolPrefix starts every aggregated tool and prompt name.
	toolPrefix = "mcp_"

	// hashLen is how many hex digits of SHA-256 a shortened name ends in.
	hashLen = 12

	// maxShortNames bounds the table of shortened names a Namespace keeps.
	maxShortNames = 1 << 16
)

// NamespaceTool returns the name under which the aggregated route offers
// tool of upstream server: mcp_<server>_<tool>.
//
// A name that would be longer than 64 characters, that would hold a
// character other than ASCII letters, digits, '_' and '-', or whose last
// '_'-separated part is 12 or more lowercase hex digits, is shortened
// instead: the start of mcp_<server>_<tool> (other characters turned into
// '_'), then '_' and the first 12 hex digits of SHA-256 over server, a NUL
// byte and tool. The result depends on server and tool alone, so it is the
// same on every run and every replica. A shortened name cannot be read back
// without a table; [Namespace] keeps one and also avoids names that another
// upstream's name would claim (upstreams "a" and "a_b").
func NamespaceTool(server, tool string) string {
	if name, ok := naturalName(server, tool); ok {
		return name
	}
	return shortName(server, tool, hashLen)
}

// NamespacePrompt returns the name under which the aggregated route offers
// a prompt; prompts follow the tools' scheme ([NamespaceTool]).
func NamespacePrompt(server, prompt string) string {
	return NamespaceTool(server, prompt)
}

// naturalName returns mcp_<server>_<tool> when it may be used as it is.
func naturalName(server, tool string) (string, bool) {
	name := toolPrefix + server + "_" + tool
	if tool == "" || len(name) > MaxToolNameLength || !validToolName(name) || looksShortened(name) {
		return "", false
	}
	return name, true
}

// shortName is a prefix of mcp_<server>_<tool>, '_', and n hex digits of
// the hash of the pair.
func shortName(server, tool string, n int) string {
	var in [256]byte
	sum := sha256.Sum256(append(append(append(in[:0], server...), 0), tool...))
	var digits [2 * sha256.Size]byte
	hex.Encode(digits[:], sum[:])

	var buf [MaxToolNameLength]byte
	keep := MaxToolNameLength - 1 - n
	out := buf[:0]
	for _, part := range [...]string{toolPrefix, server, "_", tool} {
		for i := 0; i < len(part) && len(out) < keep; i++ {
			c := part[i]
			if !toolNameByte(c) {
				c = '_'
			}
			out = append(out, c)
		}
	}
	out = append(out, '_')
	out = append(out, digits[:n]...)
	return string(out)
}

func toolNameByte(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-'
}

func validToolName(s string) bool {
	for i := 0; i < len(s); i++ {
		if !toolNameByte(s[i]) {
			return false
		}
	}
	return true
}

// looksShortened reports whether name ends like a shortened name: '_' and
// at least hashLen lowercase hex digits. Such names are never used as they
// are, so that a natural name can never equal a shortened one.
func looksShortened(name string) bool {
	n := 0
	for i := len(name) - 1; i >= 0; i-- {
		c := name[i]
		if c == '_' {
			return n >= hashLen
		}
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
		n++
	}
	return false
}

// Namespace maps aggregated names to (upstream, name) pairs and back, for
// tools and prompts alike. It is safe for concurrent use.
//
// A natural name mcp_<server>_<tool> is read back by the longest
// configured upstream name that it starts with: with upstreams "a" and
// "a_b", mcp_a_b_c is tool "c" of "a_b". So tool "b_c" of "a" gets a
// shortened name instead, and so does every name [NamespaceTool] shortens.
// Shortened names are read back through a table that [Namespace.Name]
// fills; a route lists an upstream's tools (naming them) before it can
// resolve a call. The table holds at most 65536 names and starts afresh
// when full, so a name from a very old listing may need a new listing.
type Namespace struct {
	servers map[string]bool

	mu    sync.RWMutex
	short map[string]Qualified
}

// Qualified is a tool or prompt of one upstream: the upstream's name and
// the tool's or prompt's own name there.
type Qualified struct {
	Server, Name string
}

// NewNamespace returns the namespace of the given upstream names, which
// must be valid ([ValidName]) and distinct.
func NewNamespace(servers []string) (*Namespace, error) {
	n := &Namespace{servers: make(map[string]bool, len(servers)), short: map[string]Qualified{}}
	for _, s := range servers {
		if !ValidName(s) {
			return nil, fmt.Errorf("upstream name %q: use 1 to %d letters, digits, '-' and '_'", s, MaxNameLength)
		}
		if n.servers[s] {
			return nil, fmt.Errorf("upstream %q is named twice; upstream names must be unique", s)
		}
		n.servers[s] = true
	}
	return n, nil
}

// Servers returns the upstream names, sorted.
func (n *Namespace) Servers() []string {
	out := make([]string, 0, len(n.servers))
	for s := range n.servers {
		out = append(out, s)
	}
	sort.Strings(out)
	return out
}

// Name returns the aggregated name of tool (or prompt) name of upstream
// server, and records it when it is shortened so that [Namespace.Resolve]
// can read it back. It is [NamespaceTool]'s name unless a longer upstream
// name would claim that, and the same on every call and every run.
func (n *Namespace) Name(server, name string) string {
	want := Qualified{server, name}
	if natural, ok := naturalName(server, name); ok {
		if got, ok := n.resolveNatural(natural); ok && got == want {
			return natural
		}
	}
	// Only a clash of 48-bit hash prefixes takes the loop round again.
	for digits := hashLen; ; digits += 4 {
		short := shortName(server, name, digits)
		n.mu.RLock()
		owner, taken := n.short[short]
		n.mu.RUnlock()
		if taken && owner == want {
			return short
		}
		if !taken {
			n.mu.Lock()
			owner, taken = n.short[short]
			if !taken {
				if len(n.short) >= maxShortNames {
					n.short = map[string]Qualified{}
				}
				n.short[short] = want
				owner = want
			}
			n.mu.Unlock()
			if owner == want {
				return short
			}
		}
		if digits >= 2*sha256.Size-4 {
			// Not reachable with SHA-256; keeps the loop bounded.
			return short
		}
	}
}

// Resolve reads an aggregated name back into its upstream and the
// upstream's own tool or prompt name. ok is false for a name that is not
// mcp_<server>_<name> of a configured upstream, and for a shortened name
// that is not in the table (list the tools again).
func (n *Namespace) Resolve(name string) (server, tool string, ok bool) {
	n.mu.RLock()
	q, found := n.short[name]
	n.mu.RUnlock()
	if found {
		return q.Server, q.Name, true
	}
	if looksShortened(name) {
		return "", "", false
	}
	q, ok = n.resolveNatural(name)
	return q.Server, q.Name, ok
}

// resolveNatural splits mcp_<server>_<tool> at the longest configured
// upstream name.
func (n *Namespace) resolveNatural(name string) (Qualified, bool) {
	if len(name) <= len(toolPrefix) || name[:len(toolPrefix)] != toolPrefix {
		return Qualified{}, false
	}
	rest := name[len(toolPrefix):]
	for i := min(len(rest)-2, MaxNameLength); i > 0; i-- {
		if rest[i] == '_' && n.servers[rest[:i]] {
			return Qualified{rest[:i], rest[i+1:]}, true
		}
	}
	return Qualified{}, false
}

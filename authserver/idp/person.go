package idp

import (
	"fmt"
	"slices"
	"strings"
	"unicode"

	"github.com/Tahul/caddy-zidane-mcp/policy"
)

// Person is who a browser is signed in as.
type Person struct {
	// Owner is who the person acts as: the owner of the grants they give
	// and of the sessions made with them (see policy.Principal.Owner).
	Owner string
	// Name is what pages call the person; it decides nothing.
	Name string
	// Scopes are the scopes the person may grant a client, sorted.
	Scopes []string
}

// maxScopes bounds a person's scopes, so that the session cookie stays
// well under the 4 KiB browsers keep of one cookie.
const maxScopes = 32

// maxNameRunes bounds a person's display name.
const maxNameRunes = 128

// check says what is wrong with p: an owner policy refuses for a person,
// no scope, too many, or scopes that are not scopes.
func (p Person) check() error {
	if err := policy.ValidatePersonOwner(p.Owner); err != nil {
		return err
	}
	if len(p.Scopes) == 0 {
		return fmt.Errorf("%s may grant no scope", p.Owner)
	}
	if len(p.Scopes) > maxScopes {
		return fmt.Errorf("%s would hold %d scopes; at most %d", p.Owner, len(p.Scopes), maxScopes)
	}
	return policy.ValidatePersonScopes(p.Scopes)
}

// displayName is name cut to maxNameRunes, with control and format
// characters (bidirectional overrides among them) dropped, so that a name
// from an IdP cannot disguise another on a page; owner when nothing is
// left.
func displayName(name, owner string) string {
	var b strings.Builder
	n := 0
	for _, r := range name {
		if n == maxNameRunes {
			break
		}
		if unicode.IsControl(r) || unicode.Is(unicode.Cf, r) || r == unicode.ReplacementChar {
			continue
		}
		b.WriteRune(r)
		n++
	}
	if s := strings.TrimSpace(b.String()); s != "" {
		return s
	}
	return owner
}

// sortedUnique returns scopes sorted, each once.
func sortedUnique(scopes []string) []string {
	out := slices.Clone(scopes)
	slices.Sort(out)
	return slices.Compact(out)
}

package policy

import (
	"fmt"
	"strings"
)

// ValidatePersonOwner checks an owner that names a person signed in from
// outside the token store (an IdP's claim, or the --owner of a sign-in
// link). It is the owner rule of [ValidateSpec], and more: such an owner
// must not take the form of a token id ("tok_…") or of a JWT subject
// ("jwt:…"), which would let a person named so by an IdP act for that
// token's or that subject's sessions. The prefixes are refused in any
// letter case, so that no reader that folds case sees one.
func ValidatePersonOwner(owner string) error {
	if owner == "" {
		return fmt.Errorf("the owner is empty: a person needs a name to own sessions")
	}
	if !ownerPattern.MatchString(owner) {
		return fmt.Errorf("owner %q: use 1-128 letters, digits and ':@|+._-', starting with a letter or digit", owner)
	}
	low := strings.ToLower(owner)
	for _, reserved := range []string{"tok_", JWTPrefix} {
		if strings.HasPrefix(low, reserved) {
			return fmt.Errorf("owner %q: a person's owner may not start with %q, which names tokens and JWT subjects", owner, reserved)
		}
	}
	return nil
}

// ValidatePersonScopes checks the scopes a person may grant: each is a
// scope as a token's are ([ValidateSpec]), and none is given twice.
func ValidatePersonScopes(scopes []string) error {
	seen := make(map[string]bool, len(scopes))
	for _, s := range scopes {
		if !scopePattern.MatchString(s) {
			return fmt.Errorf("scope %q: use letters, digits and ':._*-', at most 64 characters", s)
		}
		if seen[s] {
			return fmt.Errorf("scope %q is given twice", s)
		}
		seen[s] = true
	}
	return nil
}

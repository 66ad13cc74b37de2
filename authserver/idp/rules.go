package idp

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"github.com/Tahul/caddy-zidane-mcp/message"
	"github.com/Tahul/caddy-zidane-mcp/policy"
)

// Rule grants Scopes to a person whose ID token's Claim is Value, or is an
// array that holds Value: `scopes groups eng upstream:github` in the
// Caddyfile. A claim of another type (a number, an object) matches no
// rule.
type Rule struct {
	Claim  string   `json:"claim"`
	Value  string   `json:"value"`
	Scopes []string `json:"scopes"`
}

// maxRules bounds the rules of one IdP.
const maxRules = 256

// maxClaimValues bounds how many values of an array claim are compared.
const maxClaimValues = 1024

// Claims is how an IdP's ID token becomes a [Person].
type Claims struct {
	// OwnerClaim names the claim whose string is the person's owner:
	// "sub" when empty. A claim the person can change at the IdP (an
	// email, a name) is a poor owner: whoever takes it later takes the
	// sessions too. "email" is taken only with email_verified true.
	OwnerClaim string `json:"owner_claim,omitempty"`
	// NameClaim names the claim shown on pages: the first of name,
	// preferred_username and email that is a string, when empty.
	NameClaim string `json:"name_claim,omitempty"`
	// Rules grant scopes; a person no rule grants a scope is not signed
	// in. None by default.
	Rules []Rule `json:"rules,omitempty"`
}

// Errors of [Claims.person]. ErrNoScope is told the person on a page: they
// are who the IdP says, but this gateway gives them nothing.
var (
	ErrNoOwner = errors.New("the ID token names no usable owner")
	ErrNoScope = errors.New("no rule of this gateway grants you a scope")
)

func (c Claims) check() error {
	if len(c.Rules) > maxRules {
		return fmt.Errorf("%d scope rules; at most %d", len(c.Rules), maxRules)
	}
	for i, r := range c.Rules {
		if r.Claim == "" || r.Value == "" || len(r.Scopes) == 0 {
			return fmt.Errorf("scope rule %d: write `scopes <claim> <value> <scope…>`, e.g. `scopes groups eng upstream:github`", i+1)
		}
		for _, s := range r.Scopes {
			if err := (Person{Owner: "x", Scopes: []string{s}}).check(); err != nil {
				return fmt.Errorf("scope rule %d: %w", i+1, err)
			}
		}
	}
	return nil
}

// person reads the ID token's claims (raw JSON) into a Person. Claims that
// two readers could read differently (a member twice, two names equal but
// for case) are refused: the owner and the groups decide who acts as whom.
func (c Claims) person(raw []byte) (Person, error) {
	if err := message.Validate(raw); err != nil {
		return Person{}, fmt.Errorf("%w: the ID token's claims are not JSON that one reading fits", ErrNoOwner)
	}
	var claims map[string]json.RawMessage
	if err := json.Unmarshal(raw, &claims); err != nil {
		return Person{}, fmt.Errorf("%w: the ID token's claims are not a JSON object", ErrNoOwner)
	}
	ownerClaim := c.OwnerClaim
	if ownerClaim == "" {
		ownerClaim = "sub"
	}
	owner, ok := stringClaim(claims, ownerClaim)
	if !ok || owner == "" {
		return Person{}, fmt.Errorf("%w: its claim %q is missing, empty or not a string", ErrNoOwner, ownerClaim)
	}
	if ownerClaim == "email" && string(claims["email_verified"]) != "true" {
		return Person{}, fmt.Errorf("%w: the owner is the email claim, and the IdP does not say the address is verified (email_verified)", ErrNoOwner)
	}
	if err := policy.ValidatePersonOwner(owner); err != nil {
		return Person{}, fmt.Errorf("%w: %v", ErrNoOwner, err)
	}
	p := Person{Owner: owner}
	names := []string{c.NameClaim}
	if c.NameClaim == "" {
		names = []string{"name", "preferred_username", "email"}
	}
	for _, n := range names {
		if s, ok := stringClaim(claims, n); ok && s != "" {
			p.Name = s
			break
		}
	}
	p.Name = displayName(p.Name, owner)
	var scopes []string
	for _, r := range c.Rules {
		if matches(claims[r.Claim], r.Value) {
			scopes = append(scopes, r.Scopes...)
		}
	}
	if len(scopes) == 0 {
		return Person{Owner: owner, Name: p.Name}, ErrNoScope
	}
	p.Scopes = sortedUnique(scopes)
	if err := p.check(); err != nil {
		return Person{}, err
	}
	return p, nil
}

func stringClaim(claims map[string]json.RawMessage, name string) (string, bool) {
	raw, ok := claims[name]
	if !ok {
		return "", false
	}
	var s string
	if json.Unmarshal(raw, &s) != nil {
		return "", false
	}
	return s, true
}

// matches reports whether a claim is value, or an array of at most
// maxClaimValues that holds it as a string.
func matches(raw json.RawMessage, value string) bool {
	if len(raw) == 0 {
		return false
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s == value
	}
	var list []json.RawMessage
	if json.Unmarshal(raw, &list) != nil || len(list) > maxClaimValues {
		return false
	}
	return slices.ContainsFunc(list, func(e json.RawMessage) bool {
		var s string
		return json.Unmarshal(e, &s) == nil && s == value
	})
}

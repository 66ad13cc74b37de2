package policy

import (
	"strings"
	"testing"
)

// TestValidatePersonOwner: an IdP or a link may name a person anything its
// directory holds; the names that would act for a token or a JWT subject,
// in any case, and those the owner rule refuses are refused.
func TestValidatePersonOwner(t *testing.T) {
	for _, tc := range []struct {
		owner string
		word  string // in the refusal; "" means accepted
	}{
		{"alice", ""},
		{"alice@example.com", ""},
		{"auth0|5f7c8ec7c33c6c004bbafe82", ""},
		{"00u1abcd", ""},
		{"", "empty"},
		{"tok_0123456789abcdef", "tok_"},
		{"TOK_0123456789abcdef", "tok_"},
		{"jwt:alice", "jwt:"},
		{"JWT:alice", "jwt:"},
		{"-alice", "letters"},
		{"alice bob", "letters"},
		{"alice\n", "letters"},
		{strings.Repeat("a", 129), "letters"},
	} {
		err := ValidatePersonOwner(tc.owner)
		switch {
		case tc.word == "" && err != nil:
			t.Errorf("%q: refused: %v", tc.owner, err)
		case tc.word != "" && err == nil:
			t.Errorf("%q: accepted", tc.owner)
		case tc.word != "" && !strings.Contains(err.Error(), tc.word):
			t.Errorf("%q: %v, want a word of %q", tc.owner, err, tc.word)
		}
	}
}

func TestValidatePersonScopes(t *testing.T) {
	if err := ValidatePersonScopes([]string{"chat", "upstream:github"}); err != nil {
		t.Fatal(err)
	}
	for _, bad := range [][]string{{"chat", "chat"}, {"a b"}, {""}, {strings.Repeat("s", 65)}} {
		if err := ValidatePersonScopes(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

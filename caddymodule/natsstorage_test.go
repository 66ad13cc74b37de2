package caddymodule

import (
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
)

// The cluster key is given as one placeholder and nothing else: a literal
// key with a placeholder beside it (one that is empty, say) would sit in
// the config, which the admin API's /config/ and autosave.json show.
func TestNATSStorageKeyIsOnePlaceholder(t *testing.T) {
	const literalKey = "c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0MTI=" // 32 bytes in base64
	t.Setenv("ZIDANE_TEST_CLUSTER_KEY", literalKey)
	for _, c := range []struct {
		key  string
		want string // "" when accepted
	}{
		{"{env.ZIDANE_TEST_CLUSTER_KEY}", ""},
		{literalKey, "literal"},
		{literalKey + "{env.ZIDANE_TEST_UNSET}", "literal"},
		{"{env.ZIDANE_TEST_UNSET}" + literalKey, "literal"},
		{"c2VjcmV0c2VjcmV0{env.ZIDANE_TEST_UNSET}c2VjcmV0c2VjcmV0c2VjcmV0MTI=", "literal"},
	} {
		s := &NATSStorage{URLs: []string{"nats://127.0.0.1:4222"}, Key: c.key}
		err := s.Provision(caddy.Context{})
		switch {
		case c.want == "" && err != nil:
			t.Errorf("key %q: %v", c.key, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("key %q: %v, want a refusal saying %q", c.key, err, c.want)
		case err != nil && strings.Contains(err.Error(), "c2VjcmV0"):
			t.Errorf("the refusal shows the key: %v", err)
		}
	}
}

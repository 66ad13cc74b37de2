package caddymodule

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
)

// The cluster key is given as one placeholder and nothing else: a literal
// key with a placeholder beside it (one that is empty, say) would sit in
// the config, which the admin API's /config/ and autosave.json show.
func TestClusterKeyIsOnePlaceholder(t *testing.T) {
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
		cc := &ClusterConfig{URLs: []string{"nats://127.0.0.1:4222"}, Key: c.key}
		err := cc.check()
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

// The cluster's settings are one block in the zidane global option; the
// storage line takes none, and says where they go.
func TestClusterBlockInTheZidaneOption(t *testing.T) {
	d := caddyfile.NewTestDispenser(`zidane {
		cluster {
			url nats://127.0.0.1:4222 nats://127.0.0.1:4223
			node gw-1
			advertise http://127.0.0.1:8443
			replicas 3
			lock_ttl 20s
			key {env.ZIDANE_TEST_CLUSTER_KEY}
		}
		token_sync 2s
	}`)
	v, err := parseGlobal(d, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := string(v.(httpcaddyfile.App).Value)
	for _, want := range []string{`"cluster":{"urls":["nats://127.0.0.1:4222","nats://127.0.0.1:4223"]`, `"replicas":3`, `"lock_ttl":20000000000`, `"node":"gw-1"`, `"advertise":"http://127.0.0.1:8443"`, `"token_sync":2000000000`} {
		if !strings.Contains(got, want) {
			t.Errorf("zidane app JSON %s lacks %s", got, want)
		}
	}

	for _, c := range []struct{ caddyfile, want string }{
		{"zidane {\ncluster {\nnode gw-1\n}\n}", "no url"},
		{"zidane {\ncluster extra {\nurl nats://127.0.0.1:4222\n}\n}", "no argument"},
		{"zidane {\ncluster {\nurl nats://127.0.0.1:4222\nbucketz x\n}\n}", `unknown option "bucketz"`},
		{"zidane {\ncluster {\nurl nats://127.0.0.1:4222\n}\ncluster {\nurl nats://127.0.0.1:4222\n}\n}", "twice"},
		{"zidane {\ncluster {\nurl nats://127.0.0.1:4222\nkey c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0MTI=\n}\n}", "literal"},
	} {
		_, err := parseGlobal(caddyfile.NewTestDispenser(c.caddyfile), nil)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want a refusal saying %q", c.caddyfile, err, c.want)
		}
	}

	var s NATSStorage
	if err := s.UnmarshalCaddyfile(caddyfile.NewTestDispenser("zidane_nats")); err != nil {
		t.Errorf("storage zidane_nats: %v", err)
	}
	err = s.UnmarshalCaddyfile(caddyfile.NewTestDispenser("zidane_nats {\nurl nats://127.0.0.1:4222\n}"))
	if err == nil || !strings.Contains(err.Error(), "zidane { cluster {") {
		t.Errorf("storage zidane_nats with a block: %v, want a refusal saying where the settings go", err)
	}
}

// A JSON config written for the storage that held the cluster's settings
// is told where they went, not only that a field is unknown.
func TestNATSStorageJSONTakesNoSettings(t *testing.T) {
	var s NATSStorage
	if err := json.Unmarshal([]byte(`{"module":"zidane_nats"}`), &s); err != nil {
		t.Errorf("no settings: %v", err)
	}
	err := json.Unmarshal([]byte(`{"module":"zidane_nats","urls":["nats://127.0.0.1:4222"],"node":"gw-1"}`), &s)
	if err == nil || !strings.Contains(err.Error(), "found node, urls") || !strings.Contains(err.Error(), "apps.zidane.cluster") {
		t.Errorf("settings on the storage: %v, want a refusal naming them and apps.zidane.cluster", err)
	}
}

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

// The cluster block in the zidane global option, the form before the
// settings moved to the storage, still reads as it did.
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
	if err := s.UnmarshalCaddyfile(caddyfile.NewTestDispenser("zidane_nats")); err != nil || !s.bare() {
		t.Errorf("bare storage zidane_nats: %v (bare %v)", err, s.bare())
	}
}

// The storage carries the cluster's settings in its block, in the shape of
// the cluster block, so that Caddy opens it before any app and the
// storage commands open it with none.
func TestNATSStorageCarriesTheClusterSettings(t *testing.T) {
	var s NATSStorage
	err := s.UnmarshalCaddyfile(caddyfile.NewTestDispenser(`zidane_nats {
		url nats://127.0.0.1:4222 nats://127.0.0.1:4223
		node gw-1
		advertise http://127.0.0.1:8443
		replicas 3
		lock_ttl 20s
		key {env.ZIDANE_TEST_CLUSTER_KEY}
	}`))
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(&s)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"urls":["nats://127.0.0.1:4222","nats://127.0.0.1:4223"]`, `"replicas":3`, `"lock_ttl":20000000000`, `"node":"gw-1"`, `"advertise":"http://127.0.0.1:8443"`, `"key":"{env.ZIDANE_TEST_CLUSTER_KEY}"`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("storage JSON %s lacks %s", b, want)
		}
	}
	var back NATSStorage
	if err := json.Unmarshal(b, &back); err != nil || back.Node != "gw-1" || len(back.URLs) != 2 || back.bare() {
		t.Errorf("the JSON does not read back: %+v %v", back.ClusterConfig, err)
	}

	for _, c := range []struct{ caddyfile, want string }{
		{"zidane_nats extra", `takes no argument (found "extra")`},
		{"zidane_nats {\nnode gw-1\n}", "no url"},
		{"zidane_nats {\nurl nats://127.0.0.1:4222\nbucketz x\n}", `unknown option "bucketz"`},
		{"zidane_nats {\nurl nats://127.0.0.1:4222\nkey c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0MTI=\n}", "literal"},
	} {
		var s NATSStorage
		if err := s.UnmarshalCaddyfile(caddyfile.NewTestDispenser(c.caddyfile)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want a refusal saying %q", c.caddyfile, err, c.want)
		}
	}
}

package caddymodule

import (
	"encoding/base64"
	"strings"
	"testing"
)

func TestUpstreamTokenKey(t *testing.T) {
	good := base64.StdEncoding.EncodeToString([]byte("0123456789abcdef0123456789abcdef"))
	t.Setenv(UpstreamTokenKeyEnv, "")
	if _, err := (&App{}).upstreamTokenKey(); err == nil || !strings.Contains(err.Error(), "openssl rand -base64 32") {
		t.Fatalf("no key: %v, want an error saying how to make one", err)
	}
	t.Setenv(UpstreamTokenKeyEnv, good)
	if k, err := (&App{}).upstreamTokenKey(); err != nil || len(k) != 32 {
		t.Fatalf("key from the environment: %v (%d bytes)", err, len(k))
	}
	t.Setenv("OTHER_KEY", good)
	if k, err := (&App{UpstreamTokenKey: "{env.OTHER_KEY}"}).upstreamTokenKey(); err != nil || len(k) != 32 {
		t.Fatalf("key from a placeholder: %v", err)
	}
	short := base64.StdEncoding.EncodeToString([]byte("too short"))
	_, err := (&App{UpstreamTokenKey: short}).upstreamTokenKey()
	if err == nil || !strings.Contains(err.Error(), "32 bytes") || strings.Contains(err.Error(), short) {
		t.Fatalf("short key: %v, want an error that does not quote it", err)
	}
}

package upstreamauth

import (
	"bytes"
	"encoding/hex"
	"testing"
)

// Records and pending logins sealed by earlier releases (version 1: the
// same cipher without the purpose bound in) still open, for their upstream
// only; what is sealed now is version 2. These were sealed by that code
// under the key 32 bytes of 5, for the upstream github.
func TestRecordsOfEarlierReleasesOpen(t *testing.T) {
	key := bytes.Repeat([]byte{5}, 32)
	s, err := newSealer(key, "github")
	if err != nil {
		t.Fatal(err)
	}
	rec, _ := hex.DecodeString("01b32db52909a166140e6aca6ffca0f7e6df25070fba1f9d26c4de9dcdf23b25031487323012a34fcd847ac9e5a3a1ba5a38b45b13ad02a59d2ba215ea5e2a53569811a6fce9b03009e473d3c323b4feb6cfe77597edf4511a0fb05ba298d350c2e8a4242ffa5798237a67037b6b3fa02a97a0001aeb018745c22351103f310cd8616745cb5ecf3a837b73")
	r, err := s.open(rec)
	if err != nil || r.AccessToken != "at-secret" || r.RefreshToken != "rt-secret" || r.Issuer != "https://auth.example" {
		t.Fatalf("the earlier release's record: %+v, %v", r, err)
	}
	pending, _ := hex.DecodeString("013a59e648552372a11fbcc56a8ecd6fdc4be714ad7d6db455b3e0e035ff5cb83fe2cd12a67f0447223886")
	var p map[string]string
	if err := s.openValue(pending, "pending\x00k1", &p); err != nil || p["state"] != "s1" {
		t.Fatalf("the earlier release's pending login: %v, %v", p, err)
	}
	if err := s.openValue(pending, "pending\x00k2", &p); err == nil {
		t.Error("a pending login opened under another key")
	}
	other, _ := newSealer(key, "linear")
	if _, err := other.open(rec); err == nil {
		t.Error("github's record opened for linear")
	}

	now, err := s.seal(r)
	if err != nil || now[0] != 2 {
		t.Fatalf("sealed now: version %d, %v; want 2", now[0], err)
	}
	if again, err := s.open(now); err != nil || again.AccessToken != "at-secret" {
		t.Fatalf("%+v, %v", again, err)
	}
	if _, err := other.open(now); err == nil {
		t.Error("github's record opened for linear")
	}
	relabelled := bytes.Clone(now)
	relabelled[0] = 1
	if _, err := s.open(relabelled); err == nil {
		t.Error("a version 2 record relabelled 1 opened")
	}
}

package sessionpage

import (
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

func capOf(t *testing.T, link string) (string, string) {
	t.Helper()
	u, err := url.Parse(link)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimPrefix(u.Path, PathPrefix), u.Query().Get("cap")
}

func TestSignerBindsLinkToSession(t *testing.T) {
	s := NewSigner(time.Minute)
	link := s.Link("https://mcp.example.com/", "s_123")
	if !strings.HasPrefix(link, "https://mcp.example.com/zidane/session/s_123?cap=") {
		t.Fatalf("link = %s", link)
	}
	id, capability := capOf(t, link)
	if err := s.Verify(id, capability); err != nil {
		t.Fatalf("own link refused: %v", err)
	}
	if err := s.Verify("s_456", capability); !errors.Is(err, ErrCapability) || !strings.Contains(err.Error(), "another session") {
		t.Fatalf("link reused for another session: %v", err)
	}
	if err := NewSigner(time.Minute).Verify(id, capability); !errors.Is(err, ErrCapability) {
		t.Fatalf("another gateway's key accepted: %v", err)
	}
	if err := s.Verify(id, ""); !errors.Is(err, ErrCapability) {
		t.Fatalf("empty capability: %v", err)
	}
	if err := s.Verify(id, capability[:len(capability)-2]+"xx"); !errors.Is(err, ErrCapability) {
		t.Fatalf("altered signature accepted: %v", err)
	}
}

func TestSignerExpiry(t *testing.T) {
	s := NewSigner(time.Minute)
	now := time.Now()
	s.now = func() time.Time { return now }
	_, capability := capOf(t, s.Link("http://localhost:8080", "s_1"))
	s.now = func() time.Time { return now.Add(2 * time.Minute) }
	if err := s.Verify("s_1", capability); err == nil || !strings.Contains(err.Error(), "expired") {
		t.Fatalf("expired link: %v", err)
	}
}

func TestSignerRefusesOtherAlgorithms(t *testing.T) {
	s := NewSigner(time.Minute)
	claims := jwt.RegisteredClaims{Subject: "s_1", Audience: jwt.ClaimStrings{audience}, ExpiresAt: jwt.NewNumericDate(time.Now().Add(time.Minute))}
	none, _ := jwt.NewWithClaims(jwt.SigningMethodNone, claims).SignedString(jwt.UnsafeAllowNoneSignatureType)
	if err := s.Verify("s_1", none); !errors.Is(err, ErrCapability) {
		t.Fatalf("alg none accepted: %v", err)
	}
	hs512, _ := jwt.NewWithClaims(jwt.SigningMethodHS512, claims).SignedString(s.key)
	if err := s.Verify("s_1", hs512); !errors.Is(err, ErrCapability) {
		t.Fatalf("HS512 accepted: %v", err)
	}
	otherAud, _ := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.RegisteredClaims{Subject: "s_1", Audience: jwt.ClaimStrings{"x"},
		ExpiresAt: jwt.NewNumericDate(time.Now().Add(time.Minute))}).SignedString(s.key)
	if err := s.Verify("s_1", otherAud); !errors.Is(err, ErrCapability) {
		t.Fatalf("other audience accepted: %v", err)
	}
}

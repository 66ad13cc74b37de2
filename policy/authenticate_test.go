package policy

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// waitWaiting waits until q has n checks waiting for a slot.
func waitWaiting(t *testing.T, q *SuspectQueue, n int64) {
	t.Helper()
	for range 10000 {
		if q.waiting.Load() == n {
			return
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatalf("%d checks wait for a slot, want %d", q.waiting.Load(), n)
}

// A suspect request's JWT signature check waits for a slot of the queue;
// with its slot taken (by a flood of forged tokens), a valid token from
// that address waits its turn and is then accepted, never refused. What
// is not suspect, and what fails before a signature check, does not wait.
func TestSuspectSignatureChecksWaitTheirTurn(t *testing.T) {
	ctx := testCtx(t)
	k := ecKey(t, "ec-1")
	idp := newTestIdP(t, k)
	jwks := newVerifier(t, JWTConfig{JWKSURL: idp.url(), Algorithms: []string{"ES256"}})
	static := newVerifier(t, JWTConfig{PublicKeyPEM: k.pem(t), Algorithms: []string{"ES256"}})
	for name, v := range map[string]*JWTVerifier{"jwks": jwks, "static key": static} {
		t.Run(name, func(t *testing.T) {
			q := NewSuspectQueue(1)
			_, tokens := newFileStore(t)
			a := Authenticator{Tokens: tokens, JWT: v, Suspects: q}
			valid := "Bearer " + k.sign(t, claims(nil))
			if err := q.enter(ctx); err != nil { // a forged token's check holds the only slot
				t.Fatal(err)
			}
			type result struct {
				p   Principal
				err error
			}
			done := make(chan result, 1)
			go func() {
				p, err := a.AuthenticateSuspect(ctx, valid, time.Now())
				done <- result{p, err}
			}()
			waitWaiting(t, q, 1)

			if p, err := a.Authenticate(ctx, valid, time.Now()); err != nil || p.Name != "user-1" {
				t.Fatalf("a request that is not suspect, while the slot is held: %+v %v", p, err)
			}
			hs256 := jwt.NewWithClaims(jwt.SigningMethodHS256, claims(nil))
			hs256.Header["kid"] = "ec-1"
			hmac, err := hs256.SignedString(k.pem(t))
			if err != nil {
				t.Fatal(err)
			}
			early := map[string]string{
				"HS256 with the public key as secret": hmac,
				"alg none":                            jwtTestToken(`{"alg":"none","typ":"JWT"}`, `{"sub":"x"}`, ""),
				"an unknown opaque token":             NewTokenSecret(),
			}
			if v == jwks {
				// The key is looked up (and the set fetched again) before
				// any slot is asked for.
				early["a key id the issuer does not publish"] = ecKey(t, "ec-unknown").sign(t, claims(nil))
			}
			for name, raw := range early {
				if _, err := a.AuthenticateSuspect(ctx, "Bearer "+raw, time.Now()); !errors.Is(err, ErrTokenInvalid) || strings.Contains(err.Error(), "waited") {
					t.Errorf("suspect %s, refused before its signature, while the slot is held: %v", name, err)
				}
			}
			select {
			case r := <-done:
				t.Fatalf("the suspect check ended while the slot was held: %+v %v", r.p, r.err)
			default:
			}

			q.leave()
			r := <-done
			if r.err != nil || r.p.Name != "user-1" {
				t.Fatalf("the valid token, after its turn: %+v %v; want it accepted", r.p, r.err)
			}
			if n := len(q.slots); n != 0 {
				t.Fatalf("%d slots held after the checks ended", n)
			}
		})
	}
}

// A suspect check whose request ends while it waits is refused, says so,
// and leaves the queue.
func TestSuspectCheckEndsWithItsRequest(t *testing.T) {
	k := ecKey(t, "ec-1")
	q := NewSuspectQueue(1)
	a := Authenticator{JWT: newVerifier(t, JWTConfig{PublicKeyPEM: k.pem(t), Algorithms: []string{"ES256"}}), Suspects: q}
	if err := q.enter(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(testCtx(t))
	done := make(chan error, 1)
	go func() {
		_, err := a.AuthenticateSuspect(ctx, "Bearer "+k.sign(t, claims(nil)), time.Now())
		done <- err
	}()
	waitWaiting(t, q, 1)
	cancel()
	err := <-done
	if !errors.Is(err, ErrTokenInvalid) || !strings.Contains(err.Error(), "ended while its token waited") {
		t.Fatalf("a suspect check whose request ended: %v", err)
	}
	if q.waiting.Load() != 0 || len(q.slots) != 1 {
		t.Fatalf("after the request ended: %d waiting, %d slots held; want 0 and the 1 taken before", q.waiting.Load(), len(q.slots))
	}
}

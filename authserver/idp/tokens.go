package idp

import (
	"context"
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
	"golang.org/x/oauth2"

	"github.com/Tahul/caddy-zidane-mcp/internal/seal"
	"github.com/Tahul/caddy-zidane-mcp/storage"
)

// What the gateway keeps of a person's sign-in through the IdP, so that
// an upstream that trusts the same IdP can give that person their own
// token without a browser (token exchange, or an ID-JAG): the ID token of
// the sign-in and, when the IdP issued one (offline_access among the
// scopes), the refresh token that renews it.
//
//   - Sealed (AES-256-GCM, a key of its own derived from the sign-in key)
//     under TokenPrefix + a keyed hash of the person, with that key bound
//     in: a record copied to another person's key does not open. The
//     person's name is never in a key in clear.
//   - Its lifetime: the ID token's, renewed by the refresh token for at
//     most MaxKeptSignIn after the sign-in; a new sign-in replaces it. An
//     expired record is deleted when it is next read.
//   - Its revocation: [Service.ForgetSignIn], when the person's last grant
//     is revoked (with their upstream connections); a refresh the IdP
//     refuses, or whose ID token names another person, deletes it too.
//   - Never in a log, a listing or /config/: no code path prints it.

// TokenPrefix is the storage prefix of the people's kept sign-ins.
const TokenPrefix = "zidane/signin-idp-tokens/"

// MaxKeptSignIn bounds how long a sign-in is kept, renewed by its refresh
// token: as long as the longest grant the sign-in gives a client.
const MaxKeptSignIn = 90 * 24 * time.Hour

// renewBefore is how long before its expiry the ID token is renewed.
const renewBefore = time.Minute

// ErrNoSignIn is wrapped by [Service.SubjectToken]'s error when no usable
// sign-in of the person is kept: they must sign in again.
var ErrNoSignIn = errors.New("no sign-in of yours through the company IdP is kept: sign in to the gateway again")

// keptSignIn is the sealed record.
type keptSignIn struct {
	Owner        string    `json:"o"`
	IDToken      string    `json:"i"`
	RefreshToken string    `json:"r,omitempty"`
	Expiry       time.Time `json:"e"` // the ID token's
	SignedIn     time.Time `json:"s"`
}

// keeper keeps the sign-ins of one site.
type keeper struct {
	store  storage.Storage
	sealer *seal.Sealer
	mac    []byte
}

func newKeeper(st storage.Storage, key []byte) (*keeper, error) {
	sk, err := hkdf.Key(sha256.New, key, nil, "zidane signin kept idp tokens", seal.KeySize)
	if err != nil {
		return nil, err
	}
	mk, err := hkdf.Key(sha256.New, key, nil, "zidane signin kept idp tokens owner hash", 32)
	if err != nil {
		return nil, err
	}
	s, err := seal.New(sk, "signin idp tokens")
	if err != nil {
		return nil, err
	}
	return &keeper{store: st, sealer: s, mac: mk}, nil
}

// keyOf is the storage key of owner's record.
func (k *keeper) keyOf(owner string) string {
	m := hmac.New(sha256.New, k.mac)
	m.Write([]byte(owner))
	return TokenPrefix + hex.EncodeToString(m.Sum(nil)[:16])
}

func (k *keeper) seal(key string, rec *keptSignIn) ([]byte, error) {
	b, err := json.Marshal(rec)
	if err != nil {
		return nil, err
	}
	return k.sealer.Seal(nil, b, seal.AD(key)), nil
}

func (k *keeper) open(key string, b []byte, owner string) (*keptSignIn, error) {
	pt, err := k.sealer.Open(nil, b, seal.AD(key))
	if err != nil {
		return nil, err
	}
	var rec keptSignIn
	if err := json.Unmarshal(pt, &rec); err != nil || rec.Owner != owner || rec.IDToken == "" {
		return nil, errors.New("the kept sign-in does not read as this person's")
	}
	return &rec, nil
}

// keep stores owner's sign-in, replacing any earlier one.
func (k *keeper) keep(ctx context.Context, rec *keptSignIn) error {
	key := k.keyOf(rec.Owner)
	b, err := k.seal(key, rec)
	if err != nil {
		return err
	}
	return storage.Update(ctx, k.store, key, func([]byte) ([]byte, error) { return b, nil })
}

// SubjectToken returns the ID token of owner's sign-in through the IdP,
// renewed with its refresh token when it expires within a minute (under
// the storage lock: one renewal across replicas, and the IdP's rotated
// refresh token is never redeemed twice). The renewed ID token is
// verified as at the sign-in (signature, iss, aud, exp) and must name the
// same person. Its error wraps [ErrNoSignIn] when the person must sign in
// again.
func (s *Service) SubjectToken(ctx context.Context, owner string) (string, error) {
	if s.kept == nil {
		return "", fmt.Errorf("%w (this gateway keeps none)", ErrNoSignIn)
	}
	key := s.kept.keyOf(owner)
	b, err := s.kept.store.Load(ctx, key)
	if storage.IsNotExist(err) {
		return "", ErrNoSignIn
	}
	if err != nil {
		return "", fmt.Errorf("reading your kept sign-in: %v", err)
	}
	rec, err := s.kept.open(key, b, owner)
	if err != nil {
		s.forget(ctx, key)
		return "", ErrNoSignIn
	}
	now := s.now()
	if now.Add(renewBefore).Before(rec.Expiry) {
		return rec.IDToken, nil
	}
	if rec.RefreshToken == "" || s.rp == nil || now.Sub(rec.SignedIn) > MaxKeptSignIn {
		s.forget(ctx, key)
		return "", fmt.Errorf("%w (the ID token of your last sign-in expired)", ErrNoSignIn)
	}
	var out string
	var refused error
	err = storage.Update(ctx, s.kept.store, key, func(old []byte) ([]byte, error) {
		if old == nil {
			refused = ErrNoSignIn
			return nil, errNoRenewal
		}
		cur, err := s.kept.open(key, old, owner)
		if err != nil {
			refused = ErrNoSignIn
			return nil, errNoRenewal
		}
		if s.now().Add(renewBefore).Before(cur.Expiry) {
			out = cur.IDToken // another replica renewed it
			return nil, errNoRenewal
		}
		next, err := s.renew(ctx, cur)
		if err != nil {
			refused = err
			return nil, errNoRenewal
		}
		out = next.IDToken
		return s.kept.seal(key, next)
	})
	if errors.Is(err, errNoRenewal) {
		err = nil
	}
	if err != nil {
		return "", fmt.Errorf("renewing your sign-in: %v", err)
	}
	if refused != nil {
		s.forget(ctx, key)
		return "", refused
	}
	return out, nil
}

var errNoRenewal = errors.New("no renewal")

// renew redeems rec's refresh token at the IdP and checks the new ID
// token.
func (s *Service) renew(ctx context.Context, rec *keptSignIn) (*keptSignIn, error) {
	d, err := s.rp.discover(ctx)
	if err != nil {
		return nil, fmt.Errorf("the company IdP cannot be reached to renew your sign-in: %v", err)
	}
	ctx, cancel := context.WithTimeout(ctx, idpTimeout)
	defer cancel()
	tok, err := d.oauth.TokenSource(oidc.ClientContext(ctx, d.token), &oauth2.Token{RefreshToken: rec.RefreshToken, Expiry: time.Unix(1, 0)}).Token()
	if err != nil {
		var re *oauth2.RetrieveError
		if errors.As(err, &re) && re.ErrorCode != "" {
			return nil, fmt.Errorf("%w (the IdP refused to renew it: %s)", ErrNoSignIn, safeCode(re.ErrorCode))
		}
		return nil, fmt.Errorf("the company IdP did not renew your sign-in: %v", redact(err))
	}
	raw, _ := tok.Extra("id_token").(string)
	if raw == "" {
		return nil, fmt.Errorf("%w (the IdP renewed no ID token)", ErrNoSignIn)
	}
	idt, err := d.verifier.Verify(ctx, raw)
	if err != nil {
		return nil, fmt.Errorf("%w (the renewed ID token was refused: %v)", ErrNoSignIn, redact(err))
	}
	var claims rawClaims
	if err := idt.Claims(&claims); err != nil {
		return nil, fmt.Errorf("%w (the renewed ID token's claims do not read)", ErrNoSignIn)
	}
	p, err := s.rp.cfg.Claims.person(claims)
	if err != nil || p.Owner != rec.Owner {
		return nil, fmt.Errorf("%w (the renewed ID token names another person)", ErrNoSignIn)
	}
	next := *rec
	next.IDToken, next.Expiry = raw, idt.Expiry
	if tok.RefreshToken != "" {
		next.RefreshToken = tok.RefreshToken
	}
	return &next, nil
}

// forget deletes a kept sign-in.
func (s *Service) forget(ctx context.Context, key string) {
	if err := s.kept.store.Delete(context.WithoutCancel(ctx), key); err != nil && !storage.IsNotExist(err) {
		s.audit(Refusal{Step: "kept_signin", Reason: "storage", Detail: "a kept sign-in could not be deleted: " + err.Error(), Status: 500})
	}
}

// ForgetSignIn deletes what is kept of owner's sign-in through the IdP:
// the gateway can no longer get that person a token without a browser.
func (s *Service) ForgetSignIn(ctx context.Context, owner string) error {
	if s.kept == nil {
		return nil
	}
	if err := s.kept.store.Delete(ctx, s.kept.keyOf(owner)); err != nil && !storage.IsNotExist(err) {
		return fmt.Errorf("deleting the kept sign-in: %w", err)
	}
	return nil
}

// maxSwept bounds the kept sign-ins one sweep reads.
const maxSwept = 10000

// SweepKept deletes the kept sign-ins that can no longer give a token: an
// ID token expired with no refresh token to renew it, one kept longer than
// MaxKeptSignIn, or a record that does not open. A sign-in kept for a
// person who never calls an upstream that exchanges it is deleted here,
// not left in storage. It returns how many it deleted.
func (s *Service) SweepKept(ctx context.Context) (int, error) {
	if s.kept == nil {
		return 0, nil
	}
	keys, err := s.kept.store.List(ctx, strings.TrimSuffix(TokenPrefix, "/"), false)
	if storage.IsNotExist(err) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	if len(keys) > maxSwept {
		keys = keys[:maxSwept]
	}
	now, n := s.now(), 0
	for _, key := range keys {
		if ctx.Err() != nil {
			return n, ctx.Err()
		}
		if s.sweepOne(ctx, key, now) {
			n++
		}
	}
	return n, nil
}

// sweepOne deletes the record at key if it can give no token, under the
// storage lock, so that a sign-in stored meanwhile is not deleted.
func (s *Service) sweepOne(ctx context.Context, key string, now time.Time) bool {
	if err := s.kept.store.Lock(ctx, key); err != nil {
		return false
	}
	defer s.kept.store.Unlock(context.WithoutCancel(ctx), key)
	b, err := s.kept.store.Load(ctx, key)
	if err != nil {
		return false
	}
	var rec keptSignIn
	pt, err := s.kept.sealer.Open(nil, b, seal.AD(key))
	if err == nil {
		err = json.Unmarshal(pt, &rec)
	}
	if err == nil && s.kept.keyOf(rec.Owner) == key && now.Sub(rec.SignedIn) <= MaxKeptSignIn && (rec.RefreshToken != "" || now.Before(rec.Expiry)) {
		return false
	}
	err = s.kept.store.Delete(ctx, key)
	return err == nil || storage.IsNotExist(err)
}

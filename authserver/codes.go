package authserver

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"path"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/storage"
)

// CodesPrefix is where authorization codes are kept in storage, each under
// the SHA-256 of the code: storage never holds a code itself.
const CodesPrefix = "zidane/signin/codes"

// ConsentsPrefix is where the consent forms already answered are kept,
// each under the SHA-256 of its sealed request, until the form expires:
// a form is answered once, so that a replay of its POST (the browser's
// back button, or someone holding its cookie and fields) gives no second
// code.
const ConsentsPrefix = "zidane/signin/consents"

// tombstoneKeep is how long a redeemed code's record stays after the
// code's expiry, so that a second redemption within it is seen as reuse
// and revokes the grant (RFC 6749 §4.1.2).
const tombstoneKeep = 10 * time.Minute

// codeRecord is what an authorization code stands for.
type codeRecord struct {
	Client string `json:"client"`
	// ClientName is what the client called itself, for listings.
	ClientName string    `json:"client_name,omitempty"`
	Redirect   string    `json:"redirect_uri"`
	Resource   string    `json:"resource"`
	Challenge  string    `json:"code_challenge"`
	JKT        string    `json:"jkt,omitempty"`
	Owner      string    `json:"owner"`
	Scopes     []string  `json:"scopes"`
	Expires    time.Time `json:"expires"`
	// Redeemed is the tombstone: the code was presented once, and is
	// never good again.
	Redeemed bool `json:"redeemed,omitempty"`
	// Grant is the id of the grant issued from the code, revoked if the
	// code comes again.
	Grant string `json:"grant,omitempty"`
}

func codeKey(code string) string {
	sum := sha256.Sum256([]byte(code))
	return path.Join(CodesPrefix, hex.EncodeToString(sum[:]))
}

// issueCode stores rec under a new random code and returns the code.
func (s *Server) issueCode(ctx context.Context, rec codeRecord) (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	code := base64.RawURLEncoding.EncodeToString(b)
	rec.Expires = s.cfg.Now().Add(s.cfg.CodeLifetime)
	raw, err := json.Marshal(rec)
	if err != nil {
		return "", err
	}
	return code, s.cfg.Storage.Store(ctx, codeKey(code), raw)
}

// Errors of a redemption.
var (
	errCodeUnknown = errors.New("the code is unknown or expired; start the authorization again")
	errCodeExpired = errors.New("the code expired; start the authorization again")
)

// errRedeem is a code that does not match the token request.
type errRedeem string

func (e errRedeem) Error() string { return string(e) }

// errRedeemTarget is a token request for another resource than the
// code's: invalid_target rather than invalid_grant (RFC 8707 §2).
const errRedeemTarget = errRedeem("the resource is not the one the code was issued for")

// errCodeReused is a code presented again: the grant issued from it, if
// any, is to be revoked.
type errCodeReused struct{ grant string }

func (errCodeReused) Error() string {
	return "the code was already used; the grant issued from it is revoked, start the authorization again"
}

// redeemCode takes code once, cluster-wide (under the storage lock of its
// key): check refuses a record that does not match the token request,
// grant issues the grant and returns its id. The code is spent by any
// presentation that finds it, good or not, so that a code can be tried
// once: a stolen code with a guessed verifier leaves nothing to retry.
func (s *Server) redeemCode(ctx context.Context, code string, check func(*codeRecord) error, grant func(*codeRecord) (string, error)) error {
	now := s.cfg.Now()
	var result error
	err := storage.Update(ctx, s.cfg.Storage, codeKey(code), func(old []byte) ([]byte, error) {
		if old == nil {
			return nil, errCodeUnknown
		}
		var rec codeRecord
		if err := json.Unmarshal(old, &rec); err != nil {
			return nil, errCodeUnknown
		}
		if rec.Redeemed {
			return nil, errCodeReused{grant: rec.Grant}
		}
		if now.After(rec.Expires) {
			return nil, errCodeExpired
		}
		rec.Redeemed = true
		if result = check(&rec); result == nil {
			id, err := grant(&rec)
			if err != nil {
				// Not the client's fault: the code stays good for a retry
				// within its lifetime.
				return nil, err
			}
			rec.Grant = id
		}
		return json.Marshal(rec)
	})
	if err != nil {
		return err
	}
	return result
}

// errFormAnswered is a consent form posted again.
var errFormAnswered = errors.New("this consent form was already answered; start the sign-in again from the client")

// answerOnce records that the consent form sealed was answered, and
// refuses it if it was before, cluster-wide (under the storage lock of its
// key).
func (s *Server) answerOnce(ctx context.Context, sealed string, expires time.Time) error {
	sum := sha256.Sum256([]byte(sealed))
	key := path.Join(ConsentsPrefix, hex.EncodeToString(sum[:]))
	return storage.Update(ctx, s.cfg.Storage, key, func(old []byte) ([]byte, error) {
		if old != nil {
			return nil, errFormAnswered
		}
		return json.Marshal(struct {
			Expires time.Time `json:"expires"`
		}{expires})
	})
}

// Sweep deletes the records of codes expired longer than the tombstones
// are kept, and of consent forms past theirs, and returns how many it
// deleted. A server runs it from time to time; a code's expiry is checked
// at redemption whether or not it ran.
func (s *Server) Sweep(ctx context.Context) (int, error) {
	n := 0
	for _, prefix := range []string{CodesPrefix, ConsentsPrefix} {
		m, err := s.sweep(ctx, prefix)
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

func (s *Server) sweep(ctx context.Context, prefix string) (int, error) {
	keys, err := s.cfg.Storage.List(ctx, prefix, false)
	if err != nil {
		if storage.IsNotExist(err) {
			return 0, nil
		}
		return 0, err
	}
	cutoff := s.cfg.Now().Add(-tombstoneKeep)
	n := 0
	for _, k := range keys {
		raw, err := s.cfg.Storage.Load(ctx, k)
		if err != nil {
			continue
		}
		var rec codeRecord
		if json.Unmarshal(raw, &rec) == nil && rec.Expires.After(cutoff) {
			continue
		}
		if s.cfg.Storage.Delete(ctx, k) == nil {
			n++
		}
	}
	return n, nil
}

package authserver

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"path"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/storage"
)

// CodesPrefix is where authorization codes are kept in storage, each under
// the SHA-256 of the code: storage never holds a code itself.
const CodesPrefix = "zidane/signin/codes"

// tombstoneKeep is how long a redeemed code's record stays after the
// code's expiry, so that a second redemption within it is seen as reuse
// and revokes the grant (RFC 6749 §4.1.2).
const tombstoneKeep = 10 * time.Minute

// codeRecord is what an authorization code stands for.
type codeRecord struct {
	Client    string    `json:"client"`
	Redirect  string    `json:"redirect_uri"`
	Resource  string    `json:"resource"`
	Challenge string    `json:"code_challenge"`
	JKT       string    `json:"jkt,omitempty"`
	Owner     string    `json:"owner"`
	Scopes    []string  `json:"scopes"`
	Expires   time.Time `json:"expires"`
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

// Sweep deletes the records of codes expired longer than the tombstones
// are kept, and returns how many it deleted. A server runs it from time
// to time; a code's expiry is checked at redemption whether or not it
// ran.
func (s *Server) Sweep(ctx context.Context) (int, error) {
	keys, err := s.cfg.Storage.List(ctx, CodesPrefix, false)
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

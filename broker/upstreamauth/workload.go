package upstreamauth

import (
	"cmp"
	"crypto/sha256"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/Tahul/caddy-zidane-mcp/internal/configfile"
)

// assertionSkew is how close to its expiry a workload's JWT may still be
// sent: the authorization server checks it a moment later.
const assertionSkew = 10 * time.Second

// workloadAssertion reads the workload's current JWT from assertion_file
// for a grant at rec's authorization server, and checks, without
// verifying its signature (that is the authorization server's part), what
// decides whether it may be sent there at all:
//
//   - its audience names this authorization server (its issuer or its
//     token endpoint, RFC 7523 §3): a JWT sent anywhere else could be
//     replayed by whoever received it at the server it is for;
//   - it has not expired;
//   - the authorization server has not refused this very JWT already, for
//     these scopes: SEP-1933 asks clients not to retry a refused
//     assertion, and the platform renews the file.
func (c *Client) workloadAssertion(rec *record, scopes []string) (string, [32]byte, error) {
	var none [32]byte
	raw, err := configfile.Read(c.cfg.AssertionFile)
	if err != nil {
		return "", none, fmt.Errorf("assertion_file: %v", err)
	}
	assertion := strings.TrimSpace(string(raw))
	if assertion == "" {
		return "", none, fmt.Errorf("assertion_file %s is empty; whatever issues the workload's JWT has not written it yet", c.cfg.AssertionFile)
	}
	c.addSecrets(assertion)
	var claims jwt.RegisteredClaims
	if _, _, err := jwt.NewParser().ParseUnverified(assertion, &claims); err != nil {
		return "", none, fmt.Errorf("assertion_file %s does not hold a JWT", c.cfg.AssertionFile)
	}
	if claims.ExpiresAt == nil {
		return "", none, fmt.Errorf("the JWT in assertion_file %s has no exp claim, which RFC 7523 requires", c.cfg.AssertionFile)
	}
	if exp := claims.ExpiresAt.Time; !c.now().Add(assertionSkew).Before(exp) {
		return "", none, fmt.Errorf("the JWT in assertion_file %s expired at %s; whatever writes the file must renew it", c.cfg.AssertionFile, exp.UTC().Format(time.RFC3339))
	}
	if !slices.ContainsFunc(claims.Audience, func(a string) bool {
		return (rec.Issuer != "" && issuersEqual(a, rec.Issuer)) || a == rec.TokenEndpoint
	}) {
		return "", none, fmt.Errorf("the JWT in assertion_file %s has audience %q, not this upstream's authorization server %s; it is not sent there, since that server could present it where it is accepted",
			c.cfg.AssertionFile, clip(strings.Join(claims.Audience, " "), 200), shown(cmp.Or(rec.Issuer, rec.TokenEndpoint)))
	}
	key := sha256.Sum256([]byte(assertion + "\x00" + strings.Join(scopes, " ")))
	c.mu.Lock()
	refused := c.refusedAssertion == key
	c.mu.Unlock()
	if refused {
		return "", none, errors.New("the authorization server refused the JWT in assertion_file for these scopes; it is not presented again, and the next grant waits for a new one")
	}
	return assertion, key, nil
}

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
	assertion, err := c.audienceJWT(c.cfg.AssertionFile, "assertion_file", "whatever issues the workload's JWT has not written it yet", rec)
	if err != nil {
		return "", none, err
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

// audienceJWT reads the JWT in file (the config's option) and checks,
// without its signature, that it has not expired and that its audience
// names rec's authorization server (its issuer or its token endpoint, RFC
// 7523 §3): a JWT sent anywhere else could be replayed by whoever
// received it at the server it is for. empty says why the file may be
// empty.
func (c *Client) audienceJWT(file, option, empty string, rec *record) (string, error) {
	raw, err := configfile.Read(file)
	if err != nil {
		return "", fmt.Errorf("%s: %v", option, err)
	}
	token := strings.TrimSpace(string(raw))
	if token == "" {
		return "", fmt.Errorf("%s %s is empty; %s", option, file, empty)
	}
	c.addSecrets(token)
	var claims jwt.RegisteredClaims
	if _, _, err := jwt.NewParser().ParseUnverified(token, &claims); err != nil {
		return "", fmt.Errorf("%s %s does not hold a JWT", option, file)
	}
	if claims.ExpiresAt == nil {
		return "", fmt.Errorf("the JWT in %s %s has no exp claim, which RFC 7523 requires", option, file)
	}
	if exp := claims.ExpiresAt.Time; !c.now().Add(assertionSkew).Before(exp) {
		return "", fmt.Errorf("the JWT in %s %s expired at %s; whatever writes the file must renew it", option, file, exp.UTC().Format(time.RFC3339))
	}
	if !slices.ContainsFunc(claims.Audience, func(a string) bool {
		return (rec.Issuer != "" && issuersEqual(a, rec.Issuer)) || a == rec.TokenEndpoint
	}) {
		return "", fmt.Errorf("the JWT in %s %s has audience %q, not this upstream's authorization server %s; it is not sent there, since that server could present it where it is accepted",
			option, file, clip(strings.Join(claims.Audience, " "), 200), shown(cmp.Or(rec.Issuer, rec.TokenEndpoint)))
	}
	return token, nil
}

package upstreamauth

import (
	"context"
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/Tahul/caddy-zidane-mcp/storage"
)

// OwnerPrefix is the storage key prefix of the people's records (upstreams
// with credentials per_user): OwnerPrefix + upstream + "/" + a keyed hash
// of the person. The person's name (an email, often) is never in a key in
// clear: keys show in listings and in the storage's own files.
const OwnerPrefix = "zidane/upstream-oauth-owners/"

// OwnerPendingPrefix is where a person's logins await their callback:
// OwnerPendingPrefix + upstream + "/" + the person's keyed hash + "/" + a
// hash of the state. Only that person's client looks there, so a callback
// completes only the login of the person who started it.
const OwnerPendingPrefix = "zidane/upstream-oauth-owner-pending/"

// MaxOwnerLength bounds the name of an owner.
const MaxOwnerLength = 512

// maxCachedOwners bounds the people's clients an upstream's client keeps
// in memory; past it one is dropped, and made again (reading its record)
// at its person's next call.
const maxCachedOwners = 4096

// ownerMACKey derives the key of the owners' hashes from the storage key:
// a key of its own, so that a hash reveals nothing of the sealing key.
func ownerMACKey(key []byte) ([]byte, error) {
	return hkdf.Key(sha256.New, key, nil, "zidane upstream oauth owner hash", 32)
}

// ownerHashOf is the keyed hash of owner that names its records.
func (c *Client) ownerHashOf(owner string) string {
	m := hmac.New(sha256.New, c.ownerMAC)
	m.Write([]byte(owner))
	return hex.EncodeToString(m.Sum(nil)[:16])
}

// ownerDir is the storage directory of this upstream's people's records.
func (c *Client) ownerDir() string { return OwnerPrefix + c.name }

// checkOwner refuses an owner name the records cannot hold.
func checkOwner(owner string) error {
	switch {
	case owner == "":
		return errors.New("a person's upstream token needs the person: the call has no owner")
	case len(owner) > MaxOwnerLength:
		return fmt.Errorf("an owner name is at most %d bytes", MaxOwnerLength)
	case !utf8.ValidString(owner) || strings.ContainsFunc(owner, func(r rune) bool { return r < 0x20 || r == 0x7f }):
		return errors.New("an owner name is UTF-8 text without control characters")
	}
	return nil
}

// OwnerClient is the OAuth client of one person for one upstream whose
// credentials are per_user: it holds that person's own token, sealed under
// (upstream, person), and nobody else's. It has the upstream's settings,
// registration and egress; its logins, refreshes and revocations are its
// own, single flight across goroutines and, through the storage lock,
// across replicas, as the upstream's. It is safe for concurrent use.
type OwnerClient struct {
	c *Client
}

// ForOwner returns the client of person owner (a [policy.Principal]'s
// OwnerID: a signed-in person, a JWT's subject, a token's owner) for this
// upstream. The upstream must take the authorization code grant: each
// person logs in as themselves. Clients are kept, so a warm call reads no
// storage; the person's record is read at the first use.
func (c *Client) ForOwner(owner string) (*OwnerClient, error) {
	if c.parent != nil {
		return nil, errors.New("upstreamauth: ForOwner on a person's client")
	}
	if !c.interactive() && !c.exchanges() {
		return nil, fmt.Errorf("upstream %q uses the %s grant, which has one identity for every caller: it cannot hold a person's own token", c.name, c.cfg.grant())
	}
	if err := checkOwner(owner); err != nil {
		return nil, fmt.Errorf("upstream %q: %w", c.name, err)
	}
	c.ownersMu.Lock()
	defer c.ownersMu.Unlock()
	if oc := c.owners[owner]; oc != nil {
		return &OwnerClient{c: oc}, nil
	}
	h := c.ownerHashOf(owner)
	oc := &Client{
		name:      c.name,
		mcpURL:    c.mcpURL,
		cfg:       c.cfg,
		store:     c.store,
		key:       c.ownerDir() + "/" + h,
		seal:      c.seal.forOwner(h),
		logger:    c.logger,
		egress:    c.egress,
		skew:      c.skew,
		now:       c.now,
		signer:    c.signer,
		alg:       c.alg,
		flight:    make(chan struct{}, 1),
		state:     StateAuthRequired,
		errMsg:    "not connected",
		started:   true,
		parent:    c,
		owner:     owner,
		ownerHash: h,
	}
	c.mu.Lock()
	oc.secretsSet = slices.Clone(c.secretsSet)
	c.mu.Unlock()
	if c.owners == nil {
		c.owners = map[string]*Client{}
	}
	if len(c.owners) >= maxCachedOwners {
		for k, old := range c.owners {
			if old.unwatch != nil {
				old.unwatch()
			}
			delete(c.owners, k)
			break
		}
	}
	if c.watchOwner != nil {
		oc.unwatch = c.watchOwner(oc.key, func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := oc.Reload(ctx); err != nil {
				c.logger.Warn("upstream oauth: cannot read a person's record another replica wrote", "upstream", c.name, "owner", h, "error", c.redact(err.Error()))
			}
		})
	}
	c.owners[owner] = oc
	return &OwnerClient{c: oc}, nil
}

// Owner returns the person this client is for.
func (o *OwnerClient) Owner() string { return o.c.owner }

// Upstream returns the upstream's name.
func (o *OwnerClient) Upstream() string { return o.c.name }

// String describes the client without secrets, and names the person only
// by their hash.
func (o *OwnerClient) String() string {
	return fmt.Sprintf("upstreamauth.OwnerClient{upstream=%s owner=%s state=%s}", o.c.name, o.c.ownerHash, o.c.State().State)
}

// State reports the person's connection: "ready", "auth-required" (not
// connected, or the token can no longer be used) or "error".
func (o *OwnerClient) State() Status { return o.c.State() }

// BeginLogin starts the person's authorization code login (discovery, the
// upstream's registered client, PKCE, resource, DPoP, as
// [Client.BeginLogin]) and returns the URL to send the person's browser
// to. The login awaits its callback under this person alone: only
// [OwnerClient.Callback] of the same person completes it. Binding the
// browser to the person (who is signed in to the gateway) is the caller's
// part.
func (o *OwnerClient) BeginLogin(ctx context.Context) (string, error) {
	if err := o.c.load(ctx); err != nil && !errors.Is(err, errUnseal) {
		return "", fmt.Errorf("upstream %q: connect: %s", o.c.name, o.c.redact(err.Error()))
	}
	return o.c.BeginLogin(ctx)
}

// Callback completes the person's login with the query of the
// authorization response: the state must be of a login this person began
// (unexpired, used once), the iss that of the server (RFC 9207); the code
// is redeemed and the tokens stored, sealed under (upstream, person). Its
// refusals wrap [ErrLogin].
func (o *OwnerClient) Callback(ctx context.Context, query url.Values) error {
	return o.c.Callback(ctx, query)
}

// Transport returns the credentials layer that attaches this person's
// token (see [Client.Transport]). With no usable token the request is not
// sent: the error wraps [ErrConnectRequired].
func (o *OwnerClient) Transport(next http.RoundTripper) http.RoundTripper {
	return o.c.Transport(next)
}

// Reload reads the person's record again (another replica connected,
// refreshed or revoked it).
func (o *OwnerClient) Reload(ctx context.Context) error { return o.c.Reload(ctx) }

// Revoke ends the person's connection: it revokes the tokens at the
// authorization server (RFC 7009) when it has a revocation endpoint, and
// deletes the record, under the storage lock. It reports whether there
// was a record. A failed revocation is returned after the record is
// deleted: the gateway never uses the token again either way.
func (o *OwnerClient) Revoke(ctx context.Context) (bool, error) {
	c := o.c
	if err := c.acquire(ctx); err != nil {
		return false, err
	}
	defer c.release()
	if err := c.store.Lock(ctx, c.key); err != nil {
		return false, fmt.Errorf("upstream %q: disconnect: %s", c.name, c.redact(err.Error()))
	}
	defer c.store.Unlock(context.WithoutCancel(ctx), c.key)
	b, err := c.store.Load(ctx, c.key)
	if storage.IsNotExist(err) {
		c.forget("disconnected")
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("upstream %q: disconnect: %s", c.name, c.redact(err.Error()))
	}
	var revokeErr error
	if rec, err := c.seal.open(b); err == nil {
		revokeErr = c.revokeTokens(ctx, rec)
	}
	if err := c.store.Delete(ctx, c.key); err != nil && !storage.IsNotExist(err) {
		return true, fmt.Errorf("upstream %q: disconnect: deleting the stored token: %s", c.name, c.redact(err.Error()))
	}
	c.forget("disconnected")
	c.logger.Info("upstream oauth: person disconnected", "upstream", c.name, "owner", c.ownerHash)
	if revokeErr != nil {
		return true, fmt.Errorf("upstream %q: the stored tokens are deleted, but %s", c.name, c.redact(revokeErr.Error()))
	}
	return true, nil
}

// forget drops the token in memory: the next use reads storage again.
func (c *Client) forget(reason string) {
	c.mu.Lock()
	c.loaded = false
	c.failed = nil
	c.stepUps, c.stepKey = 0, ""
	c.mu.Unlock()
	c.adopt(&record{Reason: reason})
}

// revokeTokens revokes rec's refresh and access tokens at its
// authorization server's revocation endpoint (RFC 7009), when it has one.
func (c *Client) revokeTokens(ctx context.Context, rec *record) error {
	if rec.RevocationEndpoint == "" {
		return nil
	}
	var revokeErr error
	auth := c.grantAuth(rec.Client, rec.Issuer, rec.TokenEndpoint, rec.AuthMethods)
	for _, t := range []struct{ token, hint string }{
		{rec.RefreshToken, "refresh_token"},
		{rec.AccessToken, "access_token"},
	} {
		if t.token == "" {
			continue
		}
		form := url.Values{"token": {t.token}, "token_type_hint": {t.hint}}
		a := *auth
		if _, err := c.egress.postForm(ctx, rec.RevocationEndpoint, form, &a, nil, c.now(), c.redact); err != nil {
			revokeErr = errors.Join(revokeErr, fmt.Errorf("revoking the %s: %w", strings.ReplaceAll(t.hint, "_", " "), err))
		}
	}
	return revokeErr
}

// OwnerTransport returns the credentials layer of an upstream whose
// credentials are per_user: each request carries the token of the person
// ownerOf finds in its context, and never the upstream's shared token. A
// request with no owner, or whose person has no usable token, is not sent:
// its error wraps [ErrConnectRequired] (or is an [*UnavailableError]).
func (c *Client) OwnerTransport(ownerOf func(context.Context) string) func(next http.RoundTripper) http.RoundTripper {
	return func(next http.RoundTripper) http.RoundTripper {
		return &ownerTransport{c: c, ownerOf: ownerOf, next: next}
	}
}

type ownerTransport struct {
	c       *Client
	ownerOf func(context.Context) string
	next    http.RoundTripper
}

func (t *ownerTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	owner := t.ownerOf(req.Context())
	if owner == "" {
		closeBody(req)
		return nil, &ConnectRequiredError{Upstream: t.c.name, Reason: "the call acts for no person"}
	}
	oc, err := t.c.ForOwner(owner)
	if err != nil {
		closeBody(req)
		return nil, &UnavailableError{Upstream: t.c.name, Err: err}
	}
	return (&transport{c: oc.c, next: t.next}).RoundTrip(req)
}

// Connection is one person's connection to an upstream, as listed: no
// token, no secret.
type Connection struct {
	Upstream string `json:"upstream"`
	Owner    string `json:"owner"`
	// State is "ready" (a token is held), or "auth-required" when the
	// record holds none any more (refused, or expired without a refresh
	// token): the person must connect again.
	State  string    `json:"state"`
	Scopes []string  `json:"scopes,omitempty"`
	Expiry time.Time `json:"expiry,omitzero"`
	// Refreshable says whether the gateway holds a refresh token.
	Refreshable bool `json:"refreshable"`
	// Reason says why there is no token, when there is none.
	Reason string `json:"reason,omitempty"`
}

// maxListedConnections bounds one listing.
const maxListedConnections = 10000

// Connections lists the people connected to this upstream (credentials
// per_user), read from storage; owner, when not empty, keeps that person
// alone. A record that does not open under its key (copied from another
// person's, or sealed with another key) is skipped.
func (c *Client) Connections(ctx context.Context, owner string) ([]Connection, error) {
	if owner != "" {
		if err := checkOwner(owner); err != nil {
			return nil, err
		}
	}
	keys, err := c.store.List(ctx, c.ownerDir(), false)
	if storage.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("upstream %q: listing the connections: %w", c.name, err)
	}
	if owner != "" {
		want := c.ownerDir() + "/" + c.ownerHashOf(owner)
		keys = slices.DeleteFunc(keys, func(k string) bool { return k != want })
	}
	slices.Sort(keys)
	var out []Connection
	for _, k := range keys {
		if len(out) >= maxListedConnections {
			break
		}
		h := k[strings.LastIndexByte(k, '/')+1:]
		b, err := c.store.Load(ctx, k)
		if err != nil {
			continue
		}
		rec, err := c.seal.forOwner(h).open(b)
		if err != nil || rec.Owner == "" || c.ownerHashOf(rec.Owner) != h {
			continue
		}
		conn := Connection{Upstream: c.name, Owner: rec.Owner, State: StateAuthRequired, Reason: rec.Reason,
			Refreshable: rec.RefreshToken != ""}
		if rec.AccessToken != "" {
			conn.State, conn.Scopes, conn.Expiry, conn.Reason = StateReady, slices.Clone(rec.Scopes), rec.Expiry, ""
		}
		out = append(out, conn)
	}
	return out, nil
}

type callOwnerKey struct{}

// WithCallOwner returns a context whose upstream requests act for owner. A
// route that keeps an upstream session per person (the aggregated route)
// marks that session's requests with its person, since the requests of one
// session may run under contexts that carry no principal (a 2025-11-25
// session's handlers). What reads the owner for [Client.OwnerTransport]
// takes it, and refuses a request whose principal names someone else.
func WithCallOwner(ctx context.Context, owner string) context.Context {
	return context.WithValue(ctx, callOwnerKey{}, owner)
}

// CallOwner is the owner [WithCallOwner] set on ctx, if any.
func CallOwner(ctx context.Context) (string, bool) {
	o, ok := ctx.Value(callOwnerKey{}).(string)
	return o, ok
}

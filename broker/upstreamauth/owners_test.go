package upstreamauth

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/cluster"
	"github.com/Tahul/caddy-zidane-mcp/internal/oauthtest"
	"github.com/Tahul/caddy-zidane-mcp/pinnedfetch"
	"github.com/Tahul/caddy-zidane-mcp/storage"
)

type ownerCtxKey struct{}

func withOwner(owner string) context.Context {
	return context.WithValue(context.Background(), ownerCtxKey{}, owner)
}

func ownerOf(ctx context.Context) string { s, _ := ctx.Value(ownerCtxKey{}).(string); return s }

var perUser = Config{RedirectURL: redirect, Credentials: CredentialsPerUser}

// connect runs a person's whole login, the browser signed in at the
// authorization server as user.
func (e *env) connect(c *Client, owner, user string) {
	e.t.Helper()
	oc, err := c.ForOwner(owner)
	if err != nil {
		e.t.Fatal(err)
	}
	q := e.authorizeAs(func(ctx context.Context) (string, error) { return oc.BeginLogin(ctx) }, user)
	if err := oc.Callback(context.Background(), q); err != nil {
		e.t.Fatalf("Callback of %s: %v", owner, err)
	}
}

// authorizeAs begins a login and plays the browser of user at the
// authorization server; it returns the query of the redirect to the
// callback.
func (e *env) authorizeAs(begin func(context.Context) (string, error), user string) url.Values {
	e.t.Helper()
	authURL, err := begin(context.Background())
	if err != nil {
		e.t.Fatalf("BeginLogin: %v", err)
	}
	browser := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := browser.Get(authURL + "&login_hint=" + url.QueryEscape(user))
	if err != nil {
		e.t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusFound {
		e.t.Fatalf("authorization endpoint answered %d", resp.StatusCode)
	}
	loc, err := url.Parse(resp.Header.Get("Location"))
	if err != nil {
		e.t.Fatal(err)
	}
	return loc.Query()
}

// whoami calls the upstream's whoami tool through c's per-person layer,
// in ctx (which names the caller), and returns the user the upstream saw.
func (e *env) whoami(c *Client, ctx context.Context) (string, error) {
	e.t.Helper()
	hc, err := pinnedfetch.New(e.mcp.URL, nil, pinnedfetch.WithCredentials(c.OwnerTransport(ownerOf)))
	if err != nil {
		e.t.Fatal(err)
	}
	body := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"whoami","arguments":{}}}`
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, e.mcp.URL, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
	resp, err := hc.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var out struct {
		Result struct {
			Content []struct {
				Text string `json:"text"`
			} `json:"content"`
		} `json:"result"`
	}
	if err := json.Unmarshal(b, &out); err != nil || len(out.Result.Content) != 1 {
		e.t.Fatalf("whoami answered %d %s", resp.StatusCode, b)
	}
	return strings.TrimPrefix(out.Result.Content[0].Text, "whoami: "), nil
}

// Each person's call carries their own token, and a call that can carry
// none (no person, a person who never connected, a person whose record was
// swapped for another's) never reaches the upstream, with the operator's
// shared token or any other.
func TestPerUserCallsCarryTheCallersOwnToken(t *testing.T) {
	e := newEnv(t, oauthtest.AuthServerOptions{}, nil, "")
	c := e.client(perUser)
	e.connect(c, "alice@example.com", "alice")
	e.connect(c, "bob@example.com", "bob")
	// The operator's login of the same upstream: its shared token must
	// never go out on a per_user call.
	q := e.authorizeAs(c.BeginLogin, "operator")
	if err := c.Callback(context.Background(), q); err != nil {
		t.Fatal(err)
	}
	shared := c.current().AccessToken

	for _, tc := range []struct{ owner, user string }{
		{"alice@example.com", "alice"}, {"bob@example.com", "bob"}, {"alice@example.com", "alice"},
	} {
		got, err := e.whoami(c, withOwner(tc.owner))
		if err != nil || got != tc.user {
			t.Errorf("%s's call ran as %q (%v), want %q", tc.owner, got, err, tc.user)
		}
	}

	// A record copied from Alice's key to Bob's does not open as Bob's.
	aliceKey := OwnerPrefix + testUpstream + "/" + c.ownerHashOf("alice@example.com")
	malloryKey := OwnerPrefix + testUpstream + "/" + c.ownerHashOf("mallory@example.com")
	b, err := e.store.Load(context.Background(), aliceKey)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.store.Store(context.Background(), malloryKey, b); err != nil {
		t.Fatal(err)
	}

	reqs, _ := e.mcp.Stats()
	for _, tc := range []struct {
		name string
		ctx  context.Context
		want string
	}{
		{"no person", context.Background(), "acts for no person"},
		{"a person who never connected", withOwner("carol@example.com"), "not connected"},
		{"a person whose key holds another's record", withOwner("mallory@example.com"), "does not decrypt"},
	} {
		_, err := e.whoami(c, tc.ctx)
		var cre *ConnectRequiredError
		var ue *UnavailableError
		if !errors.As(err, &cre) && !errors.As(err, &ue) {
			t.Errorf("%s: %v, want a refusal before the upstream", tc.name, err)
			continue
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %q does not say %q", tc.name, err, tc.want)
		}
		if errors.As(err, &cre) && !errors.Is(err, ErrConnectRequired) {
			t.Errorf("%s: the error does not wrap ErrConnectRequired", tc.name)
		}
	}
	if after, _ := e.mcp.Stats(); after != reqs {
		t.Errorf("refused calls reached the upstream: %d requests, was %d", after, reqs)
	}
	for _, bearer := range e.mcp.Bearers() {
		if bearer == shared {
			t.Error("the operator's shared token was sent on a per_user call")
		}
	}
	conns, err := c.Connections(context.Background(), "")
	if err != nil {
		t.Fatal(err)
	}
	var owners []string
	for _, cn := range conns {
		owners = append(owners, cn.Owner)
	}
	if !slices.Equal(owners, []string{"alice@example.com", "bob@example.com"}) && !slices.Equal(owners, []string{"bob@example.com", "alice@example.com"}) {
		t.Errorf("connections list %v, want alice and bob (not the swapped record)", owners)
	}
}

// A login begun for one person is completed only by that person's client:
// the same authorization response given to another person's callback is
// refused, and the login stays the first person's.
func TestPerUserCallbackBelongsToThePersonWhoBegan(t *testing.T) {
	e := newEnv(t, oauthtest.AuthServerOptions{}, nil, "")
	c := e.client(perUser)
	alice, _ := c.ForOwner("alice@example.com")
	bob, _ := c.ForOwner("bob@example.com")
	q := e.authorizeAs(alice.BeginLogin, "alice")
	for _, tc := range []struct {
		name string
		cb   func(context.Context, url.Values) error
	}{
		{"bob's callback", bob.Callback},
		{"the operator's callback", c.Callback},
	} {
		if err := tc.cb(context.Background(), q); !errors.Is(err, ErrLogin) || !strings.Contains(err.Error(), "state") {
			t.Errorf("%s with alice's login: %v, want ErrLogin naming the state", tc.name, err)
		}
	}
	if st := bob.State(); st.State != StateAuthRequired {
		t.Errorf("bob's state %q after the refused callback", st.State)
	}
	if err := alice.Callback(context.Background(), q); err != nil {
		t.Fatalf("alice's own callback: %v", err)
	}
	if err := alice.Callback(context.Background(), q); !errors.Is(err, ErrLogin) {
		t.Errorf("alice's callback used twice: %v, want ErrLogin", err)
	}
	if got, err := e.whoami(c, withOwner("alice@example.com")); err != nil || got != "alice" {
		t.Errorf("alice's call ran as %q (%v)", got, err)
	}
}

// The person's name never shows in a storage key, nor a token in the
// listing.
func TestPerUserStorageKeysHideTheOwner(t *testing.T) {
	e := newEnv(t, oauthtest.AuthServerOptions{}, nil, "")
	c := e.client(perUser)
	e.connect(c, "alice@example.com", "alice")
	oc, _ := c.ForOwner("bob@example.com")
	if _, err := oc.BeginLogin(context.Background()); err != nil { // a login left pending
		t.Fatal(err)
	}
	var keys []string
	for _, p := range []string{OwnerPrefix, OwnerPendingPrefix} {
		k, err := e.store.List(context.Background(), strings.TrimSuffix(p, "/"), true)
		if err != nil {
			t.Fatalf("list %s: %v", p, err)
		}
		keys = append(keys, k...)
	}
	if len(keys) < 2 {
		t.Fatalf("keys %v: want alice's record and bob's pending login", keys)
	}
	for _, k := range keys {
		if strings.Contains(k, "alice") || strings.Contains(k, "bob") || strings.Contains(k, "example.com") {
			t.Errorf("storage key %q names the person", k)
		}
	}
	conns, err := c.Connections(context.Background(), "alice@example.com")
	if err != nil || len(conns) != 1 || conns[0].State != StateReady || conns[0].Expiry.IsZero() {
		t.Fatalf("alice's connections: %+v %v", conns, err)
	}
	b, _ := json.Marshal(conns)
	leakCheck(t, e, e.as.Secrets(), string(b), oc.String())
}

// Disconnecting revokes the person's tokens at the authorization server
// (RFC 7009) and deletes them: the next call is refused before the
// upstream, and another person's connection is untouched.
func TestPerUserRevokeEndsThePersonsAccess(t *testing.T) {
	e := newEnv(t, oauthtest.AuthServerOptions{}, nil, "")
	c := e.client(perUser)
	e.connect(c, "alice@example.com", "alice")
	e.connect(c, "bob@example.com", "bob")
	if got, _ := e.whoami(c, withOwner("alice@example.com")); got != "alice" {
		t.Fatalf("alice's call ran as %q", got)
	}
	alice, _ := c.ForOwner("alice@example.com")
	found, err := alice.Revoke(context.Background())
	if err != nil || !found {
		t.Fatalf("Revoke: %v %v", found, err)
	}
	if n := len(e.as.Revocations()); n != 2 {
		t.Errorf("%d tokens revoked at the authorization server, want alice's refresh and access tokens", n)
	}
	reqs, _ := e.mcp.Stats()
	if _, err := e.whoami(c, withOwner("alice@example.com")); !errors.Is(err, ErrConnectRequired) {
		t.Errorf("alice's call after the revocation: %v, want ErrConnectRequired", err)
	}
	// A second replica, which never saw alice's token, reads no record.
	if _, err := e.whoami(e.client(perUser), withOwner("alice@example.com")); !errors.Is(err, ErrConnectRequired) {
		t.Errorf("alice's call on another replica: %v, want ErrConnectRequired", err)
	}
	if after, _ := e.mcp.Stats(); after != reqs {
		t.Errorf("alice's refused calls reached the upstream")
	}
	if got, _ := e.whoami(c, withOwner("bob@example.com")); got != "bob" {
		t.Errorf("bob's call after alice's revocation ran as %q", got)
	}
	conns, _ := c.Connections(context.Background(), "")
	if len(conns) != 1 || conns[0].Owner != "bob@example.com" {
		t.Errorf("connections after the revocation: %+v", conns)
	}
	if found, err := alice.Revoke(context.Background()); found || err != nil {
		t.Errorf("a second revocation: %v %v, want nothing found", found, err)
	}
}

// A person's expired token is refreshed once, across goroutines and two
// replicas that share the storage: the refresh token is never redeemed
// twice.
func TestPerUserRefreshIsSingleFlightAcrossReplicas(t *testing.T) {
	e := newEnv(t, oauthtest.AuthServerOptions{}, nil, "")
	a, b := e.client(perUser), e.client(perUser)
	e.connect(a, "alice@example.com", "alice")
	for _, c := range []*Client{a, b} {
		if got, _ := e.whoami(c, withOwner("alice@example.com")); got != "alice" {
			t.Fatalf("alice's call ran as %q", got)
		}
	}
	e.clock.Advance(2 * time.Hour)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i := range 8 {
		c := a
		if i%2 == 1 {
			c = b
		}
		wg.Go(func() {
			got, err := e.whoami(c, withOwner("alice@example.com"))
			if err == nil && got != "alice" {
				err = errors.New("ran as " + got)
			}
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	grants, _ := e.counts()
	refreshes := 0
	for _, g := range grants {
		if g == "refresh_token" {
			refreshes++
		}
	}
	if refreshes != 1 || e.as.RefreshReuses() != 0 {
		t.Errorf("%d refreshes and %d reuses, want one refresh", refreshes, e.as.RefreshReuses())
	}
}

// per_user is refused where it cannot mean a person's own token.
func TestPerUserConfig(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{Grant: GrantClientCredentials, ClientID: "c", ClientSecret: "s", Credentials: CredentialsPerUser}, "needs grant authorization_code"},
		{Config{RedirectURL: redirect, Credentials: "mine"}, "not supported"},
	} {
		if err := tc.cfg.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", tc.cfg.Credentials, err, tc.want)
		}
	}
	e := newEnv(t, oauthtest.AuthServerOptions{}, nil, "")
	c := e.client(perUser)
	for _, owner := range []string{"", strings.Repeat("a", MaxOwnerLength+1), "a\nb"} {
		if _, err := c.ForOwner(owner); err == nil {
			t.Errorf("ForOwner(%q) accepted", owner)
		}
	}
}

// On NATS storage, a person's connection revoked on one replica is not
// used on another, even where the authorization server has no revocation
// endpoint (the other replica's token stays valid upstream): the other
// replica's watch drops it.
func TestPerUserRevocationReachesOtherReplicas(t *testing.T) {
	e := newEnv(t, oauthtest.AuthServerOptions{NoRevocation: true}, nil, "")
	e.onNATS()
	cs := e.store.(*cluster.Storage)
	watched := Config{RedirectURL: redirect, Credentials: CredentialsPerUser}
	replica := func() *Client {
		c, err := New(context.Background(), testUpstream, e.mcp.URL, watched, Options{
			Storage: e.store, Key: e.key, Now: e.clock.Now,
			WatchOwner: func(key string, changed func()) func() {
				ctx, cancel := context.WithCancel(context.Background())
				go cs.Watch(ctx, key, changed)
				return cancel
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Close)
		return c
	}
	a, b := replica(), replica()
	e.connect(a, "alice@example.com", "alice")
	if got, err := e.whoami(b, withOwner("alice@example.com")); err != nil || got != "alice" {
		t.Fatalf("alice's call on b: %q %v", got, err)
	}
	oa, _ := a.ForOwner("alice@example.com")
	if found, err := oa.Revoke(context.Background()); err != nil || !found {
		t.Fatalf("Revoke on a: %v %v", found, err)
	}
	ob, _ := b.ForOwner("alice@example.com")
	deadline := time.Now().Add(15 * time.Second)
	for ob.State().State == StateReady {
		if time.Now().After(deadline) {
			t.Fatal("b still holds alice's token 15s after a revoked it")
		}
		time.Sleep(10 * time.Millisecond)
	}
	reqs, _ := e.mcp.Stats()
	if _, err := e.whoami(b, withOwner("alice@example.com")); !errors.Is(err, ErrConnectRequired) {
		t.Errorf("alice's call on b after the revocation on a: %v, want ErrConnectRequired", err)
	}
	if after, _ := e.mcp.Stats(); after != reqs {
		t.Error("alice's call on b reached the upstream with her revoked connection's token")
	}
}

// countingStorage counts the reads and locks that reach its storage.
type countingStorage struct {
	storage.Storage
	mu           sync.Mutex
	loads, locks int
}

func (s *countingStorage) Load(ctx context.Context, key string) ([]byte, error) {
	s.mu.Lock()
	s.loads++
	s.mu.Unlock()
	return s.Storage.Load(ctx, key)
}

func (s *countingStorage) Lock(ctx context.Context, name string) error {
	s.mu.Lock()
	s.locks++
	s.mu.Unlock()
	return s.Storage.Lock(ctx, name)
}

func (s *countingStorage) counts() (int, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.loads, s.locks
}

// Once a person's token is warm, their calls read no storage: the
// person's client is kept, and its token is in memory.
func TestPerUserWarmCallReadsNoStorage(t *testing.T) {
	e := newEnv(t, oauthtest.AuthServerOptions{}, nil, "")
	cs := &countingStorage{Storage: e.store}
	e.store = cs
	c := e.client(perUser)
	e.connect(c, "alice@example.com", "alice")
	e.connect(c, "bob@example.com", "bob")
	for _, owner := range []string{"alice@example.com", "bob@example.com"} {
		if _, err := e.whoami(c, withOwner(owner)); err != nil {
			t.Fatal(err)
		}
	}
	loads, locks := cs.counts()
	for i := range 20 {
		owner, want := "alice@example.com", "alice"
		if i%2 == 1 {
			owner, want = "bob@example.com", "bob"
		}
		if got, err := e.whoami(c, withOwner(owner)); err != nil || got != want {
			t.Fatalf("%s's call ran as %q (%v)", owner, got, err)
		}
	}
	if l, k := cs.counts(); l != loads || k != locks {
		t.Errorf("20 warm calls read storage %d times and locked it %d times, want none", l-loads, k-locks)
	}
}

// An authorization response with a parameter given twice is refused
// without taking the login, which the genuine response then completes.
func TestPerUserCallbackRefusesRepeatedParameters(t *testing.T) {
	e := newEnv(t, oauthtest.AuthServerOptions{}, nil, "")
	c := e.client(perUser)
	alice, _ := c.ForOwner("alice@example.com")
	q := e.authorizeAs(alice.BeginLogin, "alice")
	for _, k := range []string{"state", "code"} {
		bad := url.Values{}
		for kk, v := range q {
			bad[kk] = slices.Clone(v)
		}
		bad.Add(k, "other")
		if err := alice.Callback(context.Background(), bad); !errors.Is(err, ErrLogin) || !strings.Contains(err.Error(), k+" more than once") {
			t.Errorf("%s twice: %v, want ErrLogin naming it", k, err)
		}
	}
	if err := alice.Callback(context.Background(), q); err != nil {
		t.Fatalf("the genuine response after the refused ones: %v", err)
	}
}

// With DPoP, each person's token is bound to a key of their own: the
// upstream sees each person's call with the DPoP scheme and a proof of
// that person's key, and still as that person.
func TestPerUserDPoPKeysArePerPerson(t *testing.T) {
	e := newEnv(t, oauthtest.AuthServerOptions{DPoP: true}, nil, "")
	c := e.client(perUser)
	e.connect(c, "alice@example.com", "alice")
	e.connect(c, "bob@example.com", "bob")
	for _, tc := range []struct{ owner, user string }{{"alice@example.com", "alice"}, {"bob@example.com", "bob"}} {
		if got, err := e.whoami(c, withOwner(tc.owner)); err != nil || got != tc.user {
			t.Errorf("%s's call ran as %q (%v)", tc.owner, got, err)
		}
	}
	for _, s := range e.mcp.Schemes() {
		if s != "DPoP" {
			t.Errorf("a person's call used the %s scheme, want DPoP", s)
		}
	}
	keys := map[string]bool{}
	for _, p := range e.mcp.DPoPProofs() {
		keys[p.JKT] = true
	}
	if len(keys) != 2 {
		t.Errorf("the proofs name %d keys, want one per person: %v", len(keys), keys)
	}
}
